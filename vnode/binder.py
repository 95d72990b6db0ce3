"""The vnode as its tenant cluster's gang scheduler: bind gang pods and pods addressed to a served
scheduler name to the virtual node (and pods the tenant's scheduler keeps off it only by a rule per node,
:mod:`vnode.apart`), admit their PodGroups, lift Kueue's gates where no Kueue runs, and
make Volcano's ``default`` Queue, which Volcano's own scheduler makes at its start (its job webhook refuses
every vcjob while that Queue is missing).

Binding is per pod and immediate: the all-or-nothing decision is taken in the compute cluster,
where the gang waits (with a reason) until every member can start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from ferry.kube.rest import STRATEGIC, Rest, path, status_of
from ferry.kube.workqueue import WorkQueue
from ferry.whypending import NODE_REFUSES
from vnode import metrics
from vnode.apart import fits_but_for_own_domains
from vnode.caches import Caches
from vnode.events import Recorder
from vnode.gangs import Gangs
from vnode.node import TAINTS
from vnode.selection import refusal, tolerates_vnode, unschedulable
from vnode.status import unschedulable_condition
from vnode.translate import KUEUE_GATES, Bridge, gang_of, node_for

Obj = dict[str, Any]
log = structlog.get_logger("ferry.vnode.binder")
VOLCANO_QUEUES = path("scheduling.volcano.sh", "v1beta1", "queues")
KUEUE_API = "/apis/kueue.x-k8s.io"  # the group's discovery: served while Kueue's CRDs are installed
# as Volcano's scheduler makes it (pkg/scheduler/cache: newDefaultQueue); its queue controller opens it
VOLCANO_DEFAULT_QUEUE: Obj = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                              "metadata": {"name": "default"}, "spec": {"reclaimable": True, "weight": 1}}
KEPT_APART = "BoundByVirtualNode"
OWN_TAINTS = frozenset(t["key"] for t in TAINTS)


class Binder:
    def __init__(self, b: Bridge, served: tuple[str, ...], tenant: Rest, caches: Caches, gangs: Gangs,
                 kueue_present: bool, recorder: Recorder) -> None:
        self.b = b
        self.recorder = recorder
        self.served = set(served)
        self.tenant = tenant
        self.caches = caches
        self.gangs = gangs
        self._kueue_served = kueue_present  # as last asked; see kueue_runs
        self.queue = WorkQueue("bind", max_delay=5.0)
        self.on_bound: Callable[[str, Obj], None] | None = None  # a pod this vnode just bound
        self.volcano_queue_made = "volcano" not in self.served  # nothing to make unless it plays Volcano's
        self._queue_refused = False
        self._refused: dict[str, str] = {}  # pod UID -> why its virtual node refuses it, as told
        self._node_specs: dict[str, tuple[bool, str]] = {}  # virtual node -> (cordoned, its taints) as last seen

    async def kueue_runs(self, fresh: bool = False) -> bool:
        """Whether the tenant cluster serves Kueue's API. Kueue may be installed after the vnode started, and
        lifting a gate Kueue owns would start a pod past the tenant's quota (Kueue then deletes it), so a
        "no" is asked again before every lift. A "yes" is asked again at each sweep (``fresh``); once Kueue is
        gone, the pods it left gated are the vnode's to lift."""
        if self._kueue_served and not fresh:
            return True
        served = await self.tenant.get_or_none(KUEUE_API) is not None
        if self._kueue_served and not served:
            log.info("Kueue's API is gone: lifting the Kueue gates it left on pods of a scheduler served here")
            for key, pod in self.caches.tenant_unbound.store.items():
                if (gates := _gates(pod)) and gates <= KUEUE_GATES and self.wants(pod):
                    self.queue.add(f"pod/{key}")
        self._kueue_served = served
        return served

    async def make_volcano_queue(self) -> None:
        """Make Volcano's ``default`` Queue once the tenant serves Queues (Volcano may be installed after the
        vnode started); afterwards leave it to the tenant admin, as Volcano's scheduler does."""
        if self.volcano_queue_made:
            return
        try:
            await self.tenant.create(VOLCANO_QUEUES, VOLCANO_DEFAULT_QUEUE)
            log.info("made Volcano's default Queue, as Volcano's scheduler does")
        except Exception as exc:
            if status_of(exc) == 404:  # Volcano's Queue CRD not installed (yet)
                return
            if status_of(exc) != 409:
                if not self._queue_refused:  # said once, tried again at every sweep
                    log.warning("cannot make Volcano's default Queue; vcjobs are refused until it exists",
                                error=str(exc)[:200])
                self._queue_refused = True
                return
        self.volcano_queue_made = True

    def wants(self, pod: Obj) -> bool:
        spec, meta = pod.get("spec", {}), pod["metadata"]
        if spec.get("nodeName") or meta.get("deletionTimestamp"):
            return False
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return False
        return ((gang := gang_of(pod)) is not None and gang.bound_by_vnode) or spec.get("schedulerName") in self.served

    def may_keep_apart(self, pod: Obj) -> bool:
        """Whether a pod of another scheduler may be one the tenant's scheduler keeps off the virtual node only by
        a rule per node (decided in ``reconcile``, which reads the Node and the pods bound to it)."""
        spec, meta = pod.get("spec", {}), pod["metadata"]
        return (not spec.get("nodeName") and not meta.get("deletionTimestamp") and not spec.get("schedulingGates")
                and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
                and unschedulable(pod) and tolerates_vnode(pod))

    def on_tenant_pod(self, kind: str, pod: Obj) -> None:
        if kind == "DELETED":
            self._refused.pop(pod["metadata"].get("uid", ""), None)
        elif self.wants(pod) or self.may_keep_apart(pod):
            self.queue.add("pod/" + f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")

    def requeue_kept_apart(self) -> None:
        """Look again at every pod the tenant's scheduler found no node for (level-triggered: a pod it refused
        before the vnode saw the pod that keeps it off is taken at the next sweep)."""
        for key, pod in self.caches.tenant_unbound.store.items():
            if self.may_keep_apart(pod):
                self.queue.add(f"pod/{key}")

    def on_tenant_group(self, kind_of_group: str) -> Any:
        def handler(kind: str, group: Obj) -> None:
            if kind != "DELETED":
                meta = group["metadata"]
                self.queue.add(f"group/{kind_of_group}/{meta['namespace']}/{meta['name']}")
        return handler

    async def reconcile(self, key: str) -> None:
        what, rest = key.split("/", 1)
        if what == "group":
            kind, gkey = rest.split("/", 1)
            group = self.caches.tenant_groups[kind].store.get(gkey)
            if group is not None:
                await self.gangs.admit(kind, group)
                await self.gangs.follow(kind, group)
            return
        pod = self.caches.tenant_unbound.store.get(rest)
        if pod is None:
            return
        if not self.wants(pod):
            if self.may_keep_apart(pod) and (node := await self._kept_apart(pod)) is not None:
                await self._bind(rest, pod, node, kept_apart=True)
            return
        meta = pod["metadata"]
        node = node_for(pod, self.b)  # a pod that asks for a GPU pool: the pool's node
        if not await self._admitted(pod, node):
            return
        if gates := _gates(pod):
            if not gates <= KUEUE_GATES:
                return  # someone else's gate: the pod is not ready to be scheduled
            if await self.kueue_runs():
                return  # Kueue's to lift
            await self.tenant.patch(path("", "v1", "pods", meta["namespace"], meta["name"]),
                                    [{"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
                                     {"op": "replace", "path": "/spec/schedulingGates", "value": []}],
                                    content_type="application/json-patch+json")
            log.info("lifted Kueue scheduling gates", pod=rest, gates=sorted(gates))
        await self._bind(rest, pod, node)

    async def _admitted(self, pod: Obj, node: str) -> bool:
        """Whether the virtual node takes the pod as kube-scheduler's NodeUnschedulable and TaintToleration
        filters would: not while an admin has cordoned it, nor with a taint of theirs the pod does not tolerate
        (the virtual node's own taints keep other schedulers off; the pods it binds need not tolerate them).
        A pod kept off is told once why; it is looked at again when the Node changes."""
        obj = self.caches.tenant_nodes.store.get(node)
        why = None if obj is None else refusal(pod, obj, OWN_TAINTS)
        uid = pod["metadata"]["uid"]
        if why is None:
            self._refused.pop(uid, None)
            return True
        if self._refused.get(uid) != why:
            self._refused[uid] = why
            await self.recorder.emit(pod, "Warning", NODE_REFUSES,
                                     f"the virtual node {node} takes no new pods now: {why}; the pod waits until "
                                     f"an admin lifts it (kubectl uncordon {node}, or a toleration on the pod)",
                                     key=f"{NODE_REFUSES}-{uid}")
            await self._unschedulable(pod, f"0/1 nodes are available: the virtual node {node} takes no new pods "
                                           f"now: {why}")
            log.info("a pod waits: its virtual node refuses new pods", pod=f"{pod['metadata']['namespace']}/"
                     f"{pod['metadata']['name']}", node=node, why=why)
        return False

    async def _unschedulable(self, pod: Obj, message: str) -> None:
        """Write the scheduler's verdict on a pod it cannot bind now (the binding, once made, turns it True)."""
        meta = pod["metadata"]
        try:
            await self.tenant.patch(path("", "v1", "pods", meta["namespace"], meta["name"], "status"),
                                    {"metadata": {"uid": meta["uid"]},
                                     "status": {"conditions": [unschedulable_condition(message)]}},
                                    content_type=STRATEGIC)
        except Exception as exc:
            if status_of(exc) not in (404, 409):  # deleted, or a new pod of the name
                raise

    def node_changed(self, kind: str, node: Obj) -> None:
        """A virtual node's Node changed: if an admin cordoned or uncordoned it, or changed its taints, look again
        at every pod the binder may bind (not at each status write of a heartbeat)."""
        spec = node.get("spec", {})
        seen = (bool(spec.get("unschedulable")), repr(spec.get("taints") or []))
        if self._node_specs.get(node["metadata"]["name"]) == seen:
            return
        self._node_specs[node["metadata"]["name"]] = seen
        for key, pod in self.caches.tenant_unbound.store.items():
            if self.wants(pod):
                self.queue.add(f"pod/{key}")

    async def _kept_apart(self, pod: Obj) -> str | None:
        """The virtual node the tenant's scheduler keeps ``pod`` off only by a rule per node or per domain of
        its own (:mod:`vnode.apart`), else None."""
        node = node_for(pod, self.b)
        if not self.caches.tenant_pods.synced():
            return None
        bound = [p for p in self.caches.tenant_pods.by_node[node].store.values()
                 if not p["metadata"].get("deletionTimestamp")
                 and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        node_obj = self.caches.tenant_nodes.store.get(node)
        return node if node_obj is not None and fits_but_for_own_domains(pod, node_obj, bound) else None

    async def _bind(self, rest: str, pod: Obj, node: str, kept_apart: bool = False) -> None:
        meta = pod["metadata"]
        binding = {"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            await self.tenant.create(path("", "v1", "pods", meta["namespace"], meta["name"], "binding"), binding)
            metrics.PODS_BOUND.inc()
        except Exception as exc:
            if status_of(exc) not in (404, 409):  # deleted, or bound meanwhile
                raise
            return
        # Assume the binding (as kube-scheduler does): forwarding starts now, not once the pod's watch
        # event has come back through a busy tenant apiserver. The event replaces this copy.
        bound = {**pod, "spec": {**pod.get("spec", {}), "nodeName": node}}
        self.caches.tenant_unbound.store.pop(rest, None)  # its watch event moves it to the node's cache
        self.caches.tenant_pods.remember(bound)
        if self.on_bound is not None:
            self.on_bound("ASSUMED", self.caches.tenant_pods.store.get(rest, bound))
        if kept_apart:
            log.info("bound a pod the tenant's scheduler keeps off the virtual node by a rule per node",
                     pod=rest, node=node)
            await self.recorder.emit(
                bound, "Normal", KEPT_APART,
                f"the tenant's scheduler keeps this pod off {node} only by a rule per node or per topology "
                f"domain (a required pod anti-affinity or a topology spread constraint over kubernetes.io/hostname, "
                f"or over a rack or zone key {node} carries its own name for); {node} stands for many nodes and "
                "domains of the shared cluster, whose scheduler applies the rule over those, so the virtual node "
                "bound it")


def _gates(pod: Obj) -> set[str]:
    """The names of a pod's scheduling gates."""
    return {str(g.get("name")) for g in pod.get("spec", {}).get("schedulingGates") or []}
