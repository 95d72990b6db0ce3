"""The vnode's informer caches of both clusters (only the compute objects it owns)."""

from __future__ import annotations

import asyncio
from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any

from ferry.keys import PREFIX
from ferry.kube.informer import Informer
from ferry.kube.rest import Rest, path
from vnode import metrics, naming
from vnode.translate import MANAGED_BY_LABEL, SLICE_CONTROLLER, Bridge

Obj = dict[str, Any]
OnChange = Callable[[str, Obj], None]
VOLCANO_PG = ("scheduling.volcano.sh", "v1beta1", "podgroups")
PLUGINS_PG = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
FERRY_PG = ("scheduling.kubeferry.io", "v1alpha1", "podgroups")
QUEUES = ("scheduling.kubeferry.io", "v1alpha1", "queues")
KUEUE_WORKLOADS = "workloads.kueue.x-k8s.io"
SLICES = ("discovery.k8s.io", "v1", "endpointslices")


def slim_event(ev: Obj) -> Obj:
    """Only what mirroring an Event upstream reads (compute namespaces can hold many Events)."""
    meta = ev.get("metadata", {})
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
            **{k: ev[k] for k in ("involvedObject", "reason", "message", "type", "count", "firstTimestamp",
                                    "lastTimestamp", "eventTime") if k in ev}}


class PodsOnNodes:
    """The tenant pods bound to any of the vnode's virtual nodes, read as one cache over one informer per node
    (a field selector names one node; a pod's node never changes, so no key is in two of them)."""

    def __init__(self, by_node: dict[str, Informer]) -> None:
        self.by_node = by_node
        self.informers = list(by_node.values())

    @property
    def store(self) -> Mapping[str, Obj]:
        if len(self.informers) == 1:  # the common case: no view in the way
            return self.informers[0].store
        return ChainMap(*(i.store for i in self.informers))

    @property
    def on_change(self) -> OnChange | None:
        return self.informers[0].on_change

    @on_change.setter
    def on_change(self, handler: OnChange | None) -> None:
        for i in self.informers:
            i.on_change = handler

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    def remember(self, obj: Obj, replaces: Obj | None = None) -> None:
        """As ``Informer.remember``, in the cache of the pod's node."""
        if (i := self.by_node.get(obj.get("spec", {}).get("nodeName", ""))) is not None:
            i.remember(obj, replaces)


class Caches:
    def __init__(self, b: Bridge, tenant: Rest, compute: Rest, tenant_crds: set[str], volumes: bool = False) -> None:
        owned = naming.owned_selector(b.tenant, b.node)
        ns = b.namespace
        backoff = 1.0  # reconnect fast: convergence after an outage is bounded by this

        def inf(name: str, rest: Rest, url: str, transform: Any = None, cache: bool = True, **q: Any) -> Informer:
            made = Informer(name, rest.lister(url, **q), max_backoff_s=backoff, transform=transform, cache=cache)
            metrics.CACHED_OBJECTS.labels(name).set_function(lambda: len(made.store))
            return made

        # As a kubelet: the pods on this vnode's nodes (a field selector names one node: an informer each), and
        # (for the binder) the pods not on any node yet -- never the tenant's pods on its other nodes.
        self.tenant_pods = PodsOnNodes({
            node: inf("tenant-pods" if node == b.node else f"tenant-pods-{node}", tenant, path("", "v1", "pods"),
                      fieldSelector=f"spec.nodeName={node}") for node in b.nodes})
        self.tenant_unbound = inf("tenant-unbound-pods", tenant, path("", "v1", "pods"), fieldSelector="spec.nodeName=")
        # the virtual nodes' own Node objects, as an admin changes them (a cordon, a taint: the binder heeds both)
        self.tenant_nodes = inf("tenant-virtual-nodes", tenant, path("", "v1", "nodes"),
                                labelSelector=f"{PREFIX}role=virtual-node")
        self.tenant_configmaps = inf("tenant-configmaps", tenant, path("", "v1", "configmaps"))
        self.tenant_secrets = inf("tenant-secrets", tenant, path("", "v1", "secrets"))
        # Services whose selector chooses pods of this node are copied (vnode/copies.py), so their names resolve
        self.tenant_services = inf("tenant-services", tenant, path("", "v1", "services"))
        # and, for Services without a selector, their hand-made EndpointSlices (not the controller's many)
        self.tenant_slices = inf("tenant-endpointslices", tenant, path(*SLICES),
                                 labelSelector=f"{MANAGED_BY_LABEL}!={SLICE_CONTROLLER}")
        self.tenant_groups: dict[str, Informer] = {}
        if "podgroups.scheduling.volcano.sh" in tenant_crds:
            self.tenant_groups["volcano"] = inf("tenant-volcano-podgroups", tenant, path(*VOLCANO_PG))
        if "podgroups.scheduling.x-k8s.io" in tenant_crds:
            self.tenant_groups["scheduler-plugins"] = inf("tenant-plugins-podgroups", tenant, path(*PLUGINS_PG))
        self.compute_pods = inf("compute-pods", compute, path("", "v1", "pods", ns), labelSelector=owned)
        self.compute_configmaps = inf("compute-configmaps", compute, path("", "v1", "configmaps", ns),
                                      labelSelector=owned)
        self.compute_secrets = inf("compute-secrets", compute, path("", "v1", "secrets", ns), labelSelector=owned)
        self.compute_services = inf("compute-services", compute, path("", "v1", "services", ns),
                                    labelSelector=owned)
        self.compute_slices = inf("compute-endpointslices", compute, path(*SLICES, ns), labelSelector=owned)
        self.compute_groups = inf("compute-podgroups", compute, path(*FERRY_PG[:2], "podgroups", ns),
                                  labelSelector=owned)
        # a stream: each Event waits in the app's Backlog until mirrored, none is cached
        self.compute_events = inf("compute-events", compute, path("", "v1", "events", ns), transform=slim_event,
                                  cache=False)
        self.compute_nodes = inf("compute-nodes", compute, path("", "v1", "nodes"))
        self.compute_queues = inf("compute-queues", compute, path(*QUEUES), fieldSelector=f"metadata.name={b.queue}")
        # persistent volumes (vnode/volumes.py), when the vnode provisions a storage class: the tenant's
        # claims, the volumes it made for them, and their compute claims
        self.volume_side: list[Informer] = []
        self.tenant_volume_side: list[Informer] = []
        if volumes:
            self.tenant_claims = inf("tenant-claims", tenant, path("", "v1", "persistentvolumeclaims"))
            self.tenant_volumes = inf("tenant-volumes", tenant, path("", "v1", "persistentvolumes"),
                                      labelSelector=owned)
            self.compute_claims = inf("compute-claims", compute, path("", "v1", "persistentvolumeclaims", ns),
                                      labelSelector=owned)
            self.volume_side = [self.tenant_claims, self.tenant_volumes, self.compute_claims]
            self.tenant_volume_side = [self.tenant_claims, self.tenant_volumes]

    @property
    def tenant_side(self) -> list[Informer]:
        return [*self.tenant_pods.informers, self.tenant_unbound, self.tenant_nodes, self.tenant_configmaps,
                self.tenant_secrets, self.tenant_services, self.tenant_slices, *self.tenant_groups.values()]

    @property
    def compute_side(self) -> list[Informer]:
        return [self.compute_pods, self.compute_configmaps, self.compute_secrets, self.compute_services,
                self.compute_slices, self.compute_groups, self.compute_events, self.compute_nodes, self.compute_queues]

    @property
    def all(self) -> list[Informer]:
        return [*self.tenant_side, *self.compute_side, *self.volume_side]

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.all)

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.all))

    def compute_error(self) -> str | None:
        """Why the compute API does not answer (None while it does)."""
        return next((i.error for i in self.compute_side if i.error), None)

    def tenant_error(self) -> str | None:
        """Which list or watch of the tenant API fails, and why (None while all answer). While the vnode
        heartbeats fine this is most often its RBAC: a Deployment upgraded before its ClusterRole, or a
        rule an admin removed. No pod is served before every cache has synced, so it must be said."""
        return next((f"{i.name}: {i.error}" for i in [*self.tenant_side, *self.tenant_volume_side] if i.error), None)
