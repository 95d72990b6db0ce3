"""The virtual Node in the tenant cluster: registration, Lease heartbeat, capacity and conditions.

Capacity is what the tenant may use: its Queue's maximum where set, never more than the compute
cluster's Ready capacity, never negative. The node stays Ready while the compute cluster is
unreachable (a NotReady node would make the tenant's controllers evict every pod); a separate
condition and an Event say what is wrong. So it does when the tenant API refuses a list the vnode needs
(its RBAC): the heartbeat still works, but no pod bound here is served until every cache has synced.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import structlog

from ferry.aio import wait_event
from ferry.keys import PREFIX
from ferry.kube import quantity
from ferry.kube.rest import STRATEGIC, Rest, path, status_of
from ferry.kube.timestamps import now
from vnode.caches import Caches
from vnode.events import Recorder
from vnode.translate import LABEL_VALUE, domain_value, node_labels

Obj = dict[str, Any]
TAINT = {"key": "virtual-kubelet.io/provider", "value": "kube-ferry", "effect": "NoSchedule"}
# Local first: a pod that tolerates the virtual node by its key does not tolerate this one, so the
# tenant's scheduler scores the tenant's own nodes higher while they have room (TaintToleration) and
# overflows to the shared cluster when they are full. Tolerating it too opts out of the preference.
OVERFLOW_TAINT = {"key": "kubeferry.io/overflow", "value": "shared-cluster", "effect": "PreferNoSchedule"}
TAINTS = (TAINT, OVERFLOW_TAINT)
REACHABLE = "ComputeClusterReachable"
TENANT_ACCESS = "TenantClusterAccess"
RBAC_HINT = "apply the vnode's RBAC of this release (manifests/tenant/rbac-vnode.yaml) before its Deployment"
VERSION = "v1.36.3-kube-ferry"
LEASE_S = 40
ADVERTISED_ANNOTATION = PREFIX + "advertised-labels"  # on the Node: the keys ``advertise_labels`` wrote
log = structlog.get_logger("ferry.vnode.node")


def capacity(nodes: list[Obj], queue: Obj | None, max_pods: int) -> dict[str, str]:
    """Sum of Ready compute nodes' allocatable, capped by the queue's maximum GPUs."""
    cpu_m = mem_mi = gpus = 0.0
    for n in nodes:
        if not _ready(n) or n.get("spec", {}).get("unschedulable"):
            continue
        alloc = n.get("status", {}).get("allocatable") or {}
        cpu_m += quantity.milli(alloc.get("cpu", "0"))
        mem_mi += quantity.mebi(alloc.get("memory", "0"))
        gpus += float(alloc.get("nvidia.com/gpu", 0) or 0)
    cap = ((queue or {}).get("spec", {}).get("max") or {}).get("gpu")
    if cap is not None:
        gpus = min(gpus, float(cap))
    return {"cpu": f"{max(int(cpu_m), 0)}m", "memory": f"{max(int(mem_mi), 0)}Mi",
            "nvidia.com/gpu": str(max(int(gpus), 0)), "pods": str(max_pods)}


def advertised(nodes: list[Obj], keys: tuple[str, ...]) -> dict[str, str]:
    """The labels every Ready, schedulable GPU node of the compute cluster carries with one value, among
    ``keys`` (a key, or a prefix ending in "." or "/"): what the virtual node may say of itself, so a tenant
    pod that selects GPU nodes by them (``nvidia.com/gpu.present``, a GPU product a Kueue ResourceFlavor
    names) fits it. Its copy keeps the selector, which every such compute node meets."""
    gpu_nodes = schedulable_gpu_nodes(nodes)
    if not gpu_nodes or not keys:
        return {}

    first = {k: v for k, v in (gpu_nodes[0].get("metadata", {}).get("labels") or {}).items() if among(k, keys)}
    return {k: v for k, v in first.items()
            if all((n.get("metadata", {}).get("labels") or {}).get(k) == v for n in gpu_nodes[1:])}


def domains(nodes: list[Obj], keys: tuple[str, ...], node: str) -> dict[str, str]:
    """The topology keys among ``keys`` that every Ready, schedulable GPU node carries with more than one value
    (racks, zones), each with ``domain_value(node)`` (the virtual node's name and a suffix) for value. The
    virtual node stands for many such domains and is one of its own to the tenant's scheduler, as it has a
    hostname of its own: a rule per domain is met there (JobSet's exclusive placement reads its leader's node's
    domain; a pod anti-affinity over racks keeps the tenant's replicas apart there, and the vnode binds the
    rest, :mod:`vnode.apart`; Kueue's topology-aware scheduling places a pod set in it) and over the compute
    nodes' domains by the compute cluster's scheduler, since the copies keep the rules (a selector of this
    value means the virtual node: the copies drop it). Nothing when that value is no label value."""
    gpu_nodes = schedulable_gpu_nodes(nodes)
    if not gpu_nodes or not keys or not LABEL_VALUE.match(domain_value(node)):
        return {}
    values: dict[str, set[str]] = {}
    for n in gpu_nodes:
        labels = n.get("metadata", {}).get("labels") or {}
        for k, v in labels.items():
            if among(k, keys):
                values.setdefault(k, set()).add(v)
    return {k: domain_value(node) for k, vs in values.items()
            if len(vs) > 1 and all(k in (n.get("metadata", {}).get("labels") or {}) for n in gpu_nodes)}


def among(key: str, keys: tuple[str, ...]) -> bool:
    """Whether a label key is one of ``keys`` (a key, or a prefix ending in "." or "/")."""
    return any(key == k or (k.endswith((".", "/")) and key.startswith(k)) for k in keys)


def schedulable_gpu_nodes(nodes: list[Obj]) -> list[Obj]:
    """The Ready, schedulable compute nodes with GPUs."""
    return [n for n in nodes if _ready(n) and not n.get("spec", {}).get("unschedulable")
            and float((n.get("status", {}).get("allocatable") or {}).get("nvidia.com/gpu", 0) or 0) > 0]


def in_pool(nodes: list[Obj], pool: dict[str, str]) -> list[Obj]:
    """The compute nodes a GPU pool's selector picks (every node for the vnode's own virtual node: {})."""
    return [n for n in nodes if all((n.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in pool.items())]


def _ready(node: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions") or [])


class Outage:
    """A failure that counts once it has lasted longer than a grace: an apiserver that is starting (429,
    storage initialising) or a single dropped watch is not an outage worth an Event."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._since: float | None = None

    def check(self, why: str | None) -> tuple[bool, str | None]:
        """(still fine, why it fails) for the failure seen now (``why``; None while it works)."""
        if why is None:
            self._since = None
            return True, None
        now_s = time.monotonic()
        if self._since is None:
            self._since = now_s
        return now_s - self._since < self.grace_s, why


def forbidden(why: str) -> bool:
    """The informer's failure is a refusal (401/403), not an outage."""
    return re.search(r"\bHTTP 40[13]\b|\(40[13]\)", why) is not None


class VirtualNode:
    def __init__(self, name: str, tenant_label: str, ip: str, port: int, tenant: Rest, caches: Caches,
                 recorder: Recorder, max_pods: int, heartbeat_s: float, unreachable_after_s: float = 10.0,
                 advertise: tuple[str, ...] = (), pool: dict[str, str] | None = None,
                 domain_keys: tuple[str, ...] = ()) -> None:
        self.name = name
        self.pool = pool or {}  # a GPU pool's node labels: its capacity and labels are that pool's
        self.tenant_label = tenant_label
        self.ip = ip
        self.port = port
        self.rest = tenant
        self.caches = caches
        self.events = recorder
        self.max_pods = max_pods
        self.heartbeat_s = heartbeat_s
        self.registered = asyncio.Event()
        self.changed = asyncio.Event()  # capacity inputs changed
        self._reported: tuple[dict[str, str], bool, bool] | None = None
        self._uid = ""
        self.compute_outage = Outage(unreachable_after_s)
        self.tenant_outage = Outage(unreachable_after_s)
        self.advertise = advertise
        self.domain_keys = domain_keys
        self._advertised: dict[str, str] | None = None  # as last written (None: not yet this run)

    def _object(self) -> Obj:
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "labels": {**node_labels(self.name, self.tenant_label), **self.pool}},
            "spec": {"taints": list(TAINTS)},
        }

    async def register(self) -> None:
        url = path("", "v1", "nodes")
        try:
            node = await self.rest.create(url, self._object())
        except Exception as exc:
            if status_of(exc) != 409:
                raise
            want = self._object()
            node = await self.rest.patch(f"{url}/{self.name}", {"metadata": {"labels": want["metadata"]["labels"]}})
            ours = {t["key"] for t in TAINTS}
            taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") not in ours]
            node = await self.rest.patch(f"{url}/{self.name}", {"spec": {"taints": [*taints, *TAINTS]}})
        self._uid = node["metadata"]["uid"]
        await self.update_status(force=True)
        self.registered.set()
        log.info("virtual node registered", node=self.name)

    def _status(self, cap: dict[str, str], reachable: bool, why: str | None, access: bool, denied: str | None) -> Obj:
        stamp = now()
        reach = {"type": REACHABLE, "status": "True" if reachable else "False", "lastHeartbeatTime": stamp,
                 "reason": "ComputeAPIAnswers" if reachable else "ComputeAPIUnreachable",
                 "message": "the compute cluster answers" if reachable else
                 f"the compute cluster does not answer ({why}); pods stay in place and converge on its return"}
        tenant = {"type": TENANT_ACCESS, "status": "True" if access else "False", "lastHeartbeatTime": stamp,
                  "reason": "TenantAPIAnswers", "message": "every list and watch of this cluster the node needs "
                  "answers"}
        if not access:
            refused = forbidden(denied or "")
            tenant["reason"] = "Forbidden" if refused else "TenantAPIFailing"
            tenant["message"] = (f"the virtual node {'may not read' if refused else 'cannot read'} what it serves "
                                 f"({denied}); until it can, a pod bound here that needs it waits (before the "
                                 "first read, every pod)"
                                 + (f": {RBAC_HINT}" if refused else ""))
        return {
            "capacity": cap, "allocatable": cap,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": stamp,
                 "message": "kube-ferry virtual node is ready"},
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                 "lastHeartbeatTime": stamp},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
                 "lastHeartbeatTime": stamp},
                {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
                 "lastHeartbeatTime": stamp},
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated",
                 "lastHeartbeatTime": stamp},
                reach,
                tenant,
            ],
            "addresses": [{"type": "InternalIP", "address": self.ip}, {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            # The kubelet API relays WebSocket upgrades as they come (vnode.streams): a 1.36+ apiserver
            # may then pass kubectl's WebSocket streams through instead of translating them to SPDY.
            "declaredFeatures": ["ExtendWebSocketsToKubelet"],
            "nodeInfo": {"kubeletVersion": VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "kube-ferry://1",
                         "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "Kube-Ferry"},
        }

    def labels(self) -> dict[str, str]:
        """The labels the Node carries (those advertised as last written)."""
        return {**node_labels(self.name, self.tenant_label), **self.pool, **(self._advertised or {})}

    def compute_nodes(self) -> list[Obj]:
        """The compute nodes behind this virtual node: its pool's, or all."""
        return in_pool(list(self.caches.compute_nodes.store.values()), self.pool)

    def tenant_denied(self) -> str | None:
        """What the tenant API has refused or failed for longer than the grace (None: all answers)."""
        ok, why = self.tenant_outage.check(self.caches.tenant_error())
        return None if ok else why

    def reported_access(self) -> bool | None:
        """Whether the node last said the tenant API answers (None: nothing reported yet)."""
        return None if self._reported is None else self._reported[2]

    async def advertise_labels(self) -> None:
        """Carry ``advertised`` labels of the compute cluster, and no longer those it stopped sharing (the keys
        written are recorded on the Node, so a restarted vnode removes what an earlier run wrote)."""
        if not self.caches.compute_nodes.synced.is_set():
            return
        # a pool's own labels stay while it has no node: its pods select it by them
        nodes = self.compute_nodes()
        want = (advertised(nodes, self.advertise + self.domain_keys) | domains(nodes, self.domain_keys, self.name)
                | self.pool)
        if want == self._advertised:
            return
        url = path("", "v1", "nodes", None, self.name)
        node = await self.rest.get(url)
        meta = node.get("metadata", {})
        before = [k for k in (meta.get("annotations") or {}).get(ADVERTISED_ANNOTATION, "").split(",") if k]
        labels: dict[str, str | None] = {k: None for k in before if k not in want}
        labels |= want
        await self.rest.patch(url, {"metadata": {"labels": labels, "annotations": {
            ADVERTISED_ANNOTATION: ",".join(sorted(want))}}})
        if want != {k: v for k, v in (meta.get("labels") or {}).items() if k in before}:
            log.info("virtual node labels follow the compute cluster's GPU nodes", labels=want,
                     removed=sorted(k for k, v in labels.items() if v is None))
        self._advertised = want

    async def update_status(self, force: bool = False) -> None:
        reachable, why = self.compute_outage.check(self.caches.compute_error())
        denied = self.tenant_denied()
        cap = capacity(self.compute_nodes(),
                       next(iter(self.caches.compute_queues.store.values()), None), self.max_pods)
        if not self.caches.compute_nodes.synced.is_set() and self._reported is not None:
            cap = self._reported[0]  # never report zero before the compute cache is filled
        state = (cap, reachable, denied is None)
        if not force and state == self._reported:
            return
        await self.rest.patch(path("", "v1", "nodes", None, self.name, "status"),
                              {"status": self._status(cap, reachable, why, denied is None, denied)},
                              content_type=STRATEGIC)
        ref = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "uid": self._uid}}
        if (self._reported is None or self._reported[2]) and denied is not None:
            await self.events.emit(ref, "Warning", "TenantAccessDenied" if forbidden(denied) else "TenantAPIFailing",
                                   f"the virtual node cannot read {denied}; pods bound here that need it wait"
                                   + (f"; {RBAC_HINT}" if forbidden(denied) else ""), key=f"tenant-access-{now()}")
        elif self._reported is not None and not self._reported[2] and denied is None:
            await self.events.emit(ref, "Normal", "TenantAccessRestored", "every list and watch of this cluster "
                                   "answers again", key=f"tenant-access-{now()}")
        if self._reported is not None and self._reported[1] != reachable:
            if reachable:
                await self.events.emit(ref, "Normal", "ComputeClusterReachable", "the compute cluster answers again",
                                       key=f"reachable-{now()}")
            else:
                await self.events.emit(ref, "Warning", "ComputeClusterUnreachable",
                                       f"the compute cluster does not answer: {why}", key=f"unreachable-{now()}")
        self._reported = state

    async def _renew_lease(self) -> None:
        url = path("coordination.k8s.io", "v1", "leases", "kube-node-lease")
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": "kube-node-lease",
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.name,
                                                  "uid": self._uid}]},
                "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_S,
                         "renewTime": now().replace("Z", ".000000Z")}}
        try:
            await self.rest.patch(f"{url}/{self.name}", {"spec": body["spec"]})
        except Exception as exc:
            if status_of(exc) != 404:
                raise
            await self.rest.create(url, body)

    async def run(self) -> None:
        """Heartbeat the Lease; refresh status on change and at least every minute (as kubelets do)."""
        last_full = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                if not self.registered.is_set():
                    await self.register()
                await self._renew_lease()
                await self.advertise_labels()
                force = loop.time() - last_full > 60
                await self.update_status(force=force)
                if force:
                    last_full = loop.time()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("node heartbeat failed", error=str(exc)[:200])
            self.changed.clear()
            await wait_event(self.changed, self.heartbeat_s)
