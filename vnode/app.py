"""One vnode process: caches of both clusters, the work queues that act on them, the virtual Node,
the kubelet API and the health/metrics endpoints, run as one task group.

Nothing is created or deleted before every cache has synced once (a half-filled cache would look
like orphans and missing pods). Shutdown cancels the group; each write is a single API call, so
cancellation leaves no half-done write, and the next start converges from the caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any, cast

import structlog
from aiohttp import web

from ferry.health import make_app, serve
from ferry.keys import POD_GROUP_LABEL
from ferry.kube.rest import Rest, api_client
from ferry.kube.workqueue import WorkQueue
from ferry.memory import give_back_periodically
from ferry.shutdown import run_until_signalled
from vnode import gangs, metrics, naming, status
from vnode.binder import Binder
from vnode.caches import KUEUE_WORKLOADS, Caches
from vnode.config import VnodeConfig
from vnode.events import Backlog, Recorder
from vnode.kubelet import KubeletAPI, ssl_context
from vnode.node import TENANT_ACCESS, VirtualNode, forbidden
from vnode.pods import PodReconciler
from vnode.selection import SelectionHints
from vnode.translate import GangRef, api_service, gang_of, needs_of, used_by
from vnode.volumes import Volumes

Obj = dict[str, Any]
log = structlog.get_logger("ferry.vnode")
RESYNC_S = 120.0
EVENT_TARGET_WAIT_S = 30.0  # how long a compute Event waits for the pod or group it is about to be cached


async def api_endpoint(host: str, port: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``default/kubernetes`` for the compute pods (translate.py ``api_service``), with ``host`` looked up
    once, as the vnode's own pod sees it (kind names the tenant's apiserver ``<cluster>-control-plane``)."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        log.warning("kubernetes.default.svc stays the compute cluster's: the tenant API's host does not resolve",
                    host=host, error=str(exc))
        return None
    # an IPv4 address first: a compute Service is single-stack IPv4 unless its cluster is set up otherwise
    address = str(min(found, key=lambda info: info[0] != socket.AF_INET)[4][0])
    made = api_service(address, port)
    if made is None:
        log.info("kubernetes.default.svc stays the compute cluster's: an EndpointSlice cannot hold the tenant "
                 "API's address (KUBERNETES_SERVICE_HOST still names it)", address=address)
    return made


async def _served(rest: Rest, group_version: str) -> bool:
    """Whether the tenant apiserver serves an API group version, or a group in any version (discovery needs
    no extra rights)."""
    return await rest.get_or_none(f"/apis/{group_version}") is not None


class Vnode:
    def __init__(self, cfg: VnodeConfig, tenant: Rest, compute: Rest, tenant_crds: set[str]) -> None:
        self.cfg = cfg
        self.b = cfg.bridge()
        self.tenant = tenant
        self.compute = compute
        self.caches = Caches(self.b, tenant, compute, tenant_crds, volumes=bool(cfg.storage_class))
        self.recorder = Recorder(tenant, "kube-ferry-vnode", cfg.node)
        self.volumes = (Volumes(self.b, cfg.storage_class, cfg.compute_storage_class or None, tenant, compute,
                                self.caches, self.recorder) if cfg.storage_class else None)
        self.pods = PodReconciler(self.b, tenant, compute, self.caches, self.recorder, cfg.node_ip, cfg.pod_security,
                                  cfg.token_refresh_at, self.volumes)
        self.binder = Binder(self.b, cfg.served_schedulers, tenant, self.caches, self.pods.gangs,
                             kueue_present=KUEUE_WORKLOADS in tenant_crds, recorder=self.recorder)
        # the vnode's own virtual node, then one per GPU pool (each its own capacity, labels and kubelet API)
        self.nodes = [VirtualNode(node, cfg.tenant, cfg.node_ip, port, tenant, self.caches, self.recorder, cfg.max_pods,
                                  cfg.heartbeat_s, cfg.unreachable_after_s, cfg.advertised_labels, self.b.pool_of(node),
                                  cfg.domain_labels)
                      for node, port in cfg.kubelets.items()]
        self.node = self.nodes[0]
        self.hints = SelectionHints(self.recorder, self.caches, lambda: [n.labels() for n in self.nodes],
                                    cfg.advertised_labels + cfg.domain_labels
                                    + tuple(k for _, sel in cfg.gpu_pools for k, _ in sel))
        self.events = WorkQueue("events", max_delay=5.0)
        self.groups = WorkQueue("groups", max_delay=5.0)
        self.backlog = Backlog()  # compute events waiting to be mirrored
        self._wire()

    def _wire(self) -> None:
        c = self.caches

        c.tenant_pods.on_change = self.pods.on_tenant_pod
        c.tenant_unbound.on_change = self._unbound_pod
        c.tenant_nodes.on_change = self.binder.node_changed
        self.binder.on_bound = self.pods.on_tenant_pod
        c.compute_pods.on_change = self.pods.on_compute_pod
        for kind, inf in c.tenant_groups.items():
            inf.on_change = self._tenant_group_changed(kind)
        c.compute_groups.on_change = self._compute_group_changed
        c.compute_events.on_change = self._compute_event
        c.tenant_configmaps.on_change = self._dependency_changed("configMap")
        c.tenant_secrets.on_change = self._dependency_changed("secret")
        c.tenant_services.on_change = self._service_changed
        c.tenant_slices.on_change = self._slice_changed
        c.compute_nodes.on_change = lambda *_: self.nodes_changed()
        c.compute_queues.on_change = lambda *_: self.nodes_changed()
        if self.volumes is not None:
            c.tenant_claims.on_change = self.volumes.on_tenant_claim
            c.tenant_volumes.on_change = self.volumes.on_tenant_volume

    def _unbound_pod(self, kind: str, pod: Obj) -> None:
        self.binder.on_tenant_pod(kind, pod)
        self.hints.on_tenant_pod(kind, pod)

    def _tenant_group_changed(self, group_kind: str) -> Any:
        """A tenant PodGroup seen: besides the binder's work (admit it, its compute group follows it), its bridged
        members that have no compute group are reconciled again. A running member whose compute group went
        while its tenant group was out of sight (deleted and made again) could not get it back then
        (``PodReconciler``: ``Gangs.restore`` waits for the tenant group) and would wait for the resync."""
        to_binder = self.binder.on_tenant_group(group_kind)

        def handler(event: str, group: Obj) -> None:
            to_binder(event, group)
            if event != "ADDED" or not self.caches.synced():
                return  # a group made (again); before the caches sync, every pod's first reconcile comes anyway
            meta = group["metadata"]
            gang = GangRef(cast(gangs.GroupKind, group_kind), meta["namespace"], meta["name"])
            if f"{self.b.namespace}/{gangs.compute_group_name(self.b, gang)}" in self.caches.compute_groups.store:
                return
            for pod in list(self.caches.tenant_pods.store.values()):
                if pod["metadata"]["namespace"] == gang.namespace and gang_of(pod) == gang:
                    self.pods.on_tenant_pod(event, pod)
        return handler

    def _compute_group_changed(self, kind: str, group: Obj) -> None:
        meta = group["metadata"]
        self.groups.add(f"{meta['namespace']}/{meta['name']}")
        if kind == "DELETED":  # members still waiting need it back (PodReconciler -> Gangs.restore)
            members = [p for p in self.caches.compute_pods.store.values()
                       if p["metadata"].get("labels", {}).get(POD_GROUP_LABEL) == meta["name"]]
            for key in filter(None, map(self.pods.tenant_key_of, members)):
                self.pods.queue.add(key)

    def _dependency_changed(self, kind: str) -> Any:
        """A tenant ConfigMap/Secret changed: re-reconcile the forwarded pods that use it."""
        def handler(event: str, obj: Obj) -> None:
            if event == "SYNC" or not self.caches.synced():
                return
            ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
            for pod in list(self.caches.tenant_pods.store.values()):
                if pod["metadata"]["namespace"] != ns or not self.b.serves(pod):
                    continue
                needs = needs_of(pod)
                if name in (needs.configmaps if kind == "configMap" else needs.secrets):
                    self.pods.queue.add(f"{ns}/{pod['metadata']['name']}")
        return handler

    def _service_changed(self, event: str, svc: Obj) -> None:
        """A tenant Service changed: re-reconcile the forwarded pods it selects, or all of its namespace's for
        one that selects no pods (their copy of it follows; one deleted or selecting none of them any more is
        collected by the sweep)."""
        self.pods.copies.on_tenant_service(event, svc)
        if event != "SYNC" and self.caches.synced():
            self._requeue_users(svc)

    def _slice_changed(self, event: str, es: Obj) -> None:
        """A hand-made tenant EndpointSlice changed: its Service's users are re-reconciled, which copies it."""
        of = self.pods.copies.on_tenant_slice(event, es)
        if of is None or event == "SYNC" or not self.caches.synced():
            return
        svc = self.pods.copies.services_in.get(of[0], {}).get(of[1])
        if svc is not None:
            self._requeue_users(svc)

    def _requeue_users(self, svc: Obj) -> None:
        ns = svc["metadata"]["namespace"]
        for pod in list(self.caches.tenant_pods.store.values()):
            meta = pod["metadata"]
            if meta["namespace"] == ns and self.b.serves(pod) \
                    and used_by(svc, meta.get("labels")):
                self.pods.queue.add(f"{ns}/{meta['name']}")

    # --------------------------------------------------------------- events
    def _compute_event(self, kind: str, ev: Obj) -> None:
        key = f"{ev['metadata']['namespace']}/{ev['metadata']['name']}"
        if kind == "DELETED":
            self.backlog.discard(key)
            return
        if kind == "SYNC" and self.caches.compute_events.seen_before(ev):
            return  # a relist after an outage: watched (and queued) before it, not thousands of replays
        # SYNC: read again after a start (or changed during an outage): mirrored before unless missing upstream
        self.events.add(self.backlog.put(key, ev, replayed=kind == "SYNC", since=time.monotonic()))

    async def mirror_events(self, obj: str) -> None:
        """The compute-side Events about one owned pod or group appear on its tenant object, in their
        compute order. An Event can arrive before the pod it is about reaches the cache: it waits for
        it (up to ``EVENT_TARGET_WAIT_S``) instead of being lost."""
        if not self.caches.synced():  # its pod may not be cached yet: dropping it would lose it
            self.events.add_after(obj, 0.5)
            return
        waiting = self.backlog.take(obj)
        if not waiting:
            return
        targets: dict[str, Obj | None] = {}  # per incarnation: compute names repeat
        for key, ev, replayed, since in waiting:
            inv = ev.get("involvedObject") or {}
            uid = str(inv.get("uid") or "")
            if uid not in targets:
                targets[uid] = self._event_target(inv)
            target = targets[uid]
            if target is None:
                if time.monotonic() - since < EVENT_TARGET_WAIT_S:
                    self.backlog.put_back(key, ev, replayed, since)
                    self.events.add_after(obj, 0.5)
                continue
            await self.recorder.mirror(target, ev, only_if_absent=replayed)

    def _event_target(self, inv: Obj) -> Obj | None:
        """The tenant object a compute Event is about: the tenant pod of a compute pod, or the tenant
        PodGroup of a compute PodGroup -- only while both are the incarnations the Event was about
        (compute names repeat when a tenant re-creates a pod or group under the same name)."""
        okey = f"{inv.get('namespace')}/{inv.get('name')}"
        if inv.get("kind") == "Pod":
            cp = self.caches.compute_pods.store.get(okey)
            if cp is None or inv.get("uid") not in (None, "", cp["metadata"].get("uid")):
                return None
            tkey = self.pods.tenant_key_of(cp)
            tp = self.caches.tenant_pods.store.get(tkey) if tkey else None
            if tp is None or tp["metadata"]["uid"] != cp["metadata"].get("labels", {}).get(naming.UPSTREAM_UID_LABEL):
                return None
            return tp
        if inv.get("kind") == "PodGroup":
            cg = self.caches.compute_groups.store.get(okey)
            if cg is None or inv.get("uid") not in (None, "", cg["metadata"].get("uid")):
                return None
            found = self.pods.gangs.tenant_group_of(cg)
            if found is None:
                return None
            kind, group = found
            return gangs.as_object(kind, group)
        return None

    async def reflect_group(self, key: str) -> None:
        if not self.caches.synced():
            self.groups.add_after(key, 0.5)
            return
        group = self.caches.compute_groups.store.get(key)
        if group is not None:
            await self.pods.gangs.reflect(group)

    # ---------------------------------------------------------- maintenance
    async def maintain(self) -> None:
        """After the caches sync: adopt/create/delete everything once; then sweep and resync periodically."""
        await self._until_synced()
        log.info("caches synced", tenant_pods=len(self.caches.tenant_pods.store),
                 compute_pods=len(self.caches.compute_pods.store))
        self.pods.enqueue_all()
        if self.volumes is not None:
            self.volumes.enqueue_all()
        loop = asyncio.get_running_loop()
        last_resync = loop.time()
        was_reachable = True
        last_sweep = loop.time()
        while True:
            await asyncio.sleep(1.0)
            reachable = self.caches.compute_error() is None
            metrics.COMPUTE_REACHABLE.set(1 if reachable else 0)
            self._watch_tenant_access()
            for q in (self.pods.queue, self.binder.queue, self.events, self.groups):
                metrics.QUEUE_DEPTH.labels(q.name).set(len(q))
            metrics.EVENT_BACKLOG.set(len(self.backlog))
            if len(self.pods.queue):  # long work shows progress
                log.info("reconciling", pods_queued=len(self.pods.queue),
                         compute_pods_created=self.pods.created, status_writes=self.pods.status_writes)
            if reachable != was_reachable:
                self.nodes_changed()
                if reachable:
                    self.pods.enqueue_all()
            was_reachable = reachable
            if not reachable:
                continue
            if loop.time() - last_resync > RESYNC_S:
                self.pods.enqueue_all()
                last_resync = loop.time()
            if loop.time() - last_sweep < self.cfg.gc_interval_s:
                continue
            last_sweep = loop.time()
            try:
                await self.binder.make_volcano_queue()
                await self.binder.kueue_runs(fresh=True)
                self.binder.requeue_kept_apart()
                await self.pods.copies.sweep(self.cfg.gc_min_age_s)
                for group in self.pods.gangs.stale_groups(self.cfg.gc_min_age_s):
                    await self.compute.delete(f"/apis/scheduling.kubeferry.io/v1alpha1/namespaces/"
                                              f"{self.b.namespace}/podgroups/{group['metadata']['name']}")
                    self.caches.compute_groups.store.pop(f"{self.b.namespace}/{group['metadata']['name']}", None)
            except Exception as exc:
                log.warning("sweep failed", error=str(exc)[:200])

    async def _until_synced(self) -> None:
        """Wait for every cache. Meanwhile, if the tenant API refuses a list the vnode needs (its RBAC),
        each pod bound here and not yet bridged is told once, on the pod, why it does not start: no pod is served before
        every cache has synced, and ``kubectl describe pod`` is where its user looks."""
        told: set[str] = set()
        while not self.caches.synced():
            denied = self._watch_tenant_access()
            if denied is not None and self.caches.tenant_pods.synced():
                for pod in list(self.caches.tenant_pods.store.values()):
                    waits = not (pod["metadata"].get("deletionTimestamp") or status.terminal(pod)
                                 or status.forwarded(pod))  # a bridged pod runs on in the compute cluster
                    if waits and pod["metadata"]["uid"] not in told:
                        told.add(pod["metadata"]["uid"])
                        await self.recorder.emit(pod, "Warning", "TenantAccessDenied" if forbidden(denied)
                                                 else "TenantAPIFailing",
                                                 f"the virtual node {pod['spec']['nodeName']} starts no pod until it "
                                                 f"can read what it serves ({denied}); see the Node's "
                                                 f"{TENANT_ACCESS} condition", key=f"tenant-access-{denied}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self.caches.wait_synced()

    def _watch_tenant_access(self) -> str | None:
        """The tenant API's refusal that has lasted (None: all answers); the node reports a change."""
        denied = self.node.tenant_denied()
        metrics.TENANT_ACCESS.set(0 if denied else 1)
        if self.node.reported_access() != (denied is None):
            self.nodes_changed()
        return denied

    def nodes_changed(self) -> None:
        """What every virtual node reports may have changed (capacity, conditions)."""
        for n in self.nodes:
            n.changed.set()

    def ready(self) -> bool:
        return self.caches.synced() and all(n.registered.is_set() for n in self.nodes)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for inf in self.caches.all:
                tg.create_task(inf.run())
            for n in self.nodes:
                tg.create_task(n.run())
            tg.create_task(self.pods.queue.run(self.pods.reconcile, self.cfg.workers))
            tg.create_task(self.binder.queue.run(self.binder.reconcile, self.cfg.workers))
            tg.create_task(self.hints.queue.run(self.hints.reconcile, 1))
            tg.create_task(self.events.run(self.mirror_events, 2))
            tg.create_task(self.groups.run(self.reflect_group, 2))
            if self.volumes is not None:
                tg.create_task(self.volumes.queue.run(self.volumes.reconcile, 2))
            tg.create_task(self.maintain())
            tg.create_task(give_back_periodically(metrics.MEMORY_GIVEN_BACK.inc))


async def main(cfg: VnodeConfig) -> None:
    tenant_api, compute_api = await api_client(cfg.tenant_kubeconfig), await api_client(cfg.compute_kubeconfig)
    tenant, compute = Rest(tenant_api), Rest(compute_api)
    crds = set()
    for gv, name in (("scheduling.volcano.sh/v1beta1", "podgroups.scheduling.volcano.sh"),
                     ("scheduling.x-k8s.io/v1alpha1", "podgroups.scheduling.x-k8s.io"),
                     ("kueue.x-k8s.io", KUEUE_WORKLOADS)):  # any version (v1beta2 from Kueue v0.15)
        if await _served(tenant, gv):
            crds.add(name)
    vnode = Vnode(cfg, tenant, compute, crds)
    if cfg.tenant_api is not None:
        vnode.pods.copies.api = await api_endpoint(*cfg.tenant_api)
    runners: list[web.AppRunner] = [await serve(make_app(vnode.ready, metrics.REGISTRY), cfg.metrics_address,
                                                cfg.metrics_port)]
    if cfg.serving_cert and cfg.serving_key:
        for node, port in cfg.kubelets.items():
            api = KubeletAPI(node, cfg.tenant, cfg.namespace, tenant, compute,
                             lambda k: vnode.caches.tenant_pods.store.get(k),
                             lambda k: vnode.caches.compute_pods.store.get(k),
                             naming.owned_selector(vnode.b.tenant, cfg.node))
            runner = web.AppRunner(api.app(), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, cfg.node_ip, port,
                              ssl_context=ssl_context(cfg.serving_cert, cfg.serving_key, cfg.client_ca)).start()
            runners.append(runner)
    log.info("vnode started", tenant=cfg.tenant, node=cfg.node, pools=[n for n, _ in vnode.b.pools],
             compute_namespace=cfg.namespace,
             kueue_served_at_start=KUEUE_WORKLOADS in crds, tenant_gang_crds=sorted(crds))

    async def cleanup() -> None:
        for r in runners:
            with contextlib.suppress(Exception):
                await r.cleanup()
        await tenant_api.close()
        await compute_api.close()

    await run_until_signalled(vnode.run(), cleanup)
