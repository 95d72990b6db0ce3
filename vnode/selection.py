"""Why a pod meant for the shared cluster waits in its tenant cluster when it selects a kind of GPU node.

The tenant's kube-scheduler says only that no node matched the pod's node selector or affinity. The vnode
sees the compute cluster's GPU nodes, so it says the rest on the pod, where its user looks: whether any GPU
node there has what the pod selects, and, where some do but not all, that a GPU pool of the vnode (one
virtual node for them) is what is missing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from ferry.kube.workqueue import WorkQueue
from ferry.whypending import NO_VIRTUAL_NODE
from vnode.caches import Caches
from vnode.events import Recorder
from vnode.node import TAINT, among, schedulable_gpu_nodes
from vnode.translate import admits

Obj = dict[str, Any]
REASON = NO_VIRTUAL_NODE
log = structlog.get_logger("ferry.vnode.selection")


def tolerates(pod: Obj, taint: Obj) -> bool:
    """Kubernetes' toleration rule for one taint."""
    for t in pod.get("spec", {}).get("tolerations") or []:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def refusal(pod: Obj, node: Obj, ignored: frozenset[str] = frozenset()) -> str | None:
    """Why kube-scheduler's NodeUnschedulable and TaintToleration filters would keep ``pod`` off ``node`` (None:
    they let it on): the node is cordoned, or it has a taint the pod does not tolerate (taints of ``ignored``
    keys aside)."""
    spec = node.get("spec", {})
    if spec.get("unschedulable") and not tolerates(pod, UNSCHEDULABLE_TAINT):
        return "it is cordoned (unschedulable)"
    for t in spec.get("taints") or []:
        if t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in ignored and not tolerates(pod, t):
            value = f"={t['value']}" if t.get("value") else ""
            return f"the pod does not tolerate its taint {t.get('key')}{value}:{t.get('effect')}"
    return None


def tolerates_vnode(pod: Obj) -> bool:
    """Whether the pod may go to a virtual node (it tolerates the taint every virtual node has)."""
    return tolerates(pod, TAINT)


def unschedulable(pod: Obj) -> bool:
    """Whether the tenant's scheduler found no node for the pod."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in pod.get("status", {}).get("conditions") or [])


def selected_keys(pod: Obj) -> set[str]:
    """The node label keys a pod's nodeSelector and required node affinity name."""
    spec = pod.get("spec", {})
    keys = set(spec.get("nodeSelector") or {})
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        keys |= {str(e.get("key", "")) for e in term.get("matchExpressions") or []}
    return keys


def unmet_selection(pod: Obj, virtual: list[dict[str, str]], compute: list[Obj], gpu_keys: tuple[str, ...]
                    ) -> str | None:
    """What to tell a pod whose selection of GPU node labels (keys among ``gpu_keys``) no virtual node
    (``virtual``: their labels) meets, from the compute cluster's nodes; None when a virtual node meets it
    (the pod waits for another reason) or it selects no GPU node label."""
    keys = {k for k in selected_keys(pod) if among(k, gpu_keys)}
    if not keys or any(admits(pod, labels, keys) for labels in virtual):
        return None
    gpu_nodes = schedulable_gpu_nodes(compute)
    matching = [n for n in gpu_nodes if admits(pod, n.get("metadata", {}).get("labels") or {}, keys)]
    said = ", ".join(sorted(keys))
    if not matching:
        return (f"no schedulable GPU node of the shared cluster has the {said} this pod selects "
                f"({len(gpu_nodes)} GPU nodes there): it can run only on this cluster's own nodes")
    sample = {k: v for k, v in (matching[0].get("metadata", {}).get("labels") or {}).items() if k in keys}
    pool = ",".join(f"{k}={v}" for k, v in sorted(sample.items()))
    return (f"{len(matching)} of the shared cluster's {len(gpu_nodes)} schedulable GPU nodes have the {said} this "
            f"pod selects, but no virtual node carries it: they are not all alike, and the virtual node has no GPU "
            f"pool for them (an admin adds one to the vnode: --gpu-pool NAME={pool})")


class SelectionHints:
    """Tells each pod that tolerates the virtual nodes, selects GPU node labels and was found unschedulable by
    its tenant's scheduler what the compute cluster has of what it selects (once per message)."""

    def __init__(self, recorder: Recorder, caches: Caches, virtual: Callable[[], list[dict[str, str]]],
                 gpu_keys: tuple[str, ...]) -> None:
        self.recorder = recorder
        self.caches = caches
        self.virtual = virtual
        self.gpu_keys = gpu_keys
        self.queue = WorkQueue("selection-hints", max_delay=30.0)
        self.told: dict[str, str] = {}  # pod UID -> the message it was given

    def on_tenant_pod(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        if kind == "DELETED":
            self.told.pop(meta.get("uid", ""), None)
        elif unschedulable(pod) and tolerates_vnode(pod) and selected_keys(pod):
            self.queue.add(f"{meta['namespace']}/{meta['name']}")

    async def reconcile(self, key: str) -> None:
        pod = self.caches.tenant_unbound.store.get(key)
        if pod is None or not unschedulable(pod) or not self.caches.compute_nodes.synced.is_set():
            return
        message = unmet_selection(pod, self.virtual(), list(self.caches.compute_nodes.store.values()),
                                  self.gpu_keys)
        uid = pod["metadata"]["uid"]
        if message is None or self.told.get(uid) == message:
            return
        await self.recorder.emit(pod, "Warning", REASON, message, key=f"{REASON}-{uid}")
        self.told[uid] = message
        log.info("told a pod why no virtual node meets its GPU node selection", pod=key)
