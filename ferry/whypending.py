"""``kubectl ferry why-pending POD | podgroup/NAME``: why a pod or gang is not running, in plain words,
and what would let it run — from whatever cluster the user points at.

In the compute cluster the scheduler's verdict is the PodGroup's ``Scheduled`` condition; a pod without
a group has it as its latest Event. In a tenant cluster the same Events are mirrored onto the tenant
pod and group by its virtual node; a refused pod carries the refusal in its status; a pod no node took
yet has the tenant scheduler's ``PodScheduled`` condition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ferry.keys import API_GROUP, API_VERSION
from ferry.kube.rest import Rest, path

Obj = dict[str, Any]
KUBE_FERRY = (API_GROUP, API_VERSION)
TENANT_GROUPS = (("scheduling.volcano.sh", "v1beta1"), ("scheduling.x-k8s.io", "v1alpha1"))
GROUP_LABELS = ("kubeferry.io/pod-group", "scheduling.x-k8s.io/pod-group", "volcano.sh/job-name")
GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name",)
NO_VIRTUAL_NODE = "NoVirtualNodeSelected"  # the vnode's word on a pod no virtual node meets (vnode/selection.py)
NODE_REFUSES = "VirtualNodeUnschedulable"  # the vnode's word on a pod its cordoned or tainted node refuses (binder)
OUR_REASONS = (NO_VIRTUAL_NODE, NODE_REFUSES, "FailedScheduling", "Waiting", "Preempting", "WillEvict", "Preempted",
               "FailedMount", "GangNotReady", "Refused", "Scheduled")

# (reason, or a phrase of the message) -> what would let it run; the first match wins
HINTS = (
    (NO_VIRTUAL_NODE, "it selects GPU nodes no virtual node of this cluster stands for: ask the admin for a GPU pool "
                      "of them (the message names the vnode's flag), or select labels every GPU node has"),
    (NODE_REFUSES, "an admin has cordoned or tainted the virtual node: it starts once they uncordon it (kubectl "
                   "uncordon) or lift the taint, or with a toleration for that taint"),
    ("preempting:", "its victims are checkpointing: it starts when their grace period ends or they leave"),
    ("recalling", "jobs that ran on loan on the nodes held for it are checkpointing: it starts when their grace "
                  "period ends or they leave"),
    ("Insufficient nvidia.com/gpu", "no node of this cluster has that many GPUs free, the virtual node included: "
                                    "it offers what the compute cluster has Ready, capped by the tenant Queue's "
                                    "maximum"),
    ("(required pod anti-affinity)", "its replicas must each run on a node (or zone) of their own and the compute "
                                     "cluster has too few that could hold them: ask for fewer replicas, or drop "
                                     "the anti-affinity"),
    ("(required pod affinity)", "its replicas must run together on one node (or zone) and no node or zone of the "
                                "compute cluster could hold them all: ask for fewer or smaller replicas, or keep "
                                "them together by a wider topology key"),
    ("(topology spread constraint)", "its replicas must spread by a node label no compute node that could hold "
                                     "them carries: spread by one the compute cluster's nodes have "
                                     "(kubernetes.io/hostname, a zone)"),
    ("cannot be scheduled", "no node of the compute cluster could ever hold it: ask for less (GPUs per replica, "
                            "CPU, memory) or for GPU models and labels that exist"),
    ("waiting for a node", "the nodes that could hold it are cordoned or not Ready: it starts when one is "
                           "schedulable again (an admin uncordons it, or it comes back)"),
    ("would exceed its maximum", "its queue is at its maximum: it starts when the queue's own jobs finish, or when "
                                 "an admin raises the Queue's spec.max"),
    ("least attained service:", "its queue runs the jobs that received the least GPU time first, and this one "
                                "has run before: it starts when GPUs free up that no such job waits for, or once "
                                "it counts afresh (when, the message says)"),
    ("fair-over-time: queues borrow", "it would borrow beyond its queue's guarantee, and queues that used fewer GPUs "
                                      "recently borrow first: it starts when GPUs free up that they do not wait for"),
    ("holding node(s)", "it has waited long, so nodes are held for it: no new job starts there (short ones "
                        "on loan aside) and it starts once their running jobs finish"),
    ("its pod affinity and anti-affinity rule out", "its required pod (anti-)affinity leaves it only nodes "
                                                    "without room: it starts as GPUs free up there, or as the pods "
                                                    "it keeps away from leave (or those it keeps beside arrive), "
                                                    "or sooner with preferred terms instead"),
    ("on the nodes it may use", "its node selector, node affinity or GPU model leaves it few nodes, and they "
                                "have too little free: it starts as those nodes free up, or sooner if it may use "
                                "more nodes"),
    ("no running job may be preempted for it", "no running job may be taken for it now: the others run within "
                                               "their queues' guarantees or are protected for now (started or "
                                               "moved recently), or its queue may not reclaim: it starts as "
                                               "GPUs free up"),
    ("even if every job it may preempt were evicted", "even evicting every job it may take would not free enough "
                                                      "GPUs on few enough nodes at once: it starts as other jobs "
                                                      "finish"),
    ("can never start: it waits for", "a job it depends on failed or never appeared: run that job again, or "
                                      "resubmit this one without the dependency"),
    ("(it does not exist yet)", "it depends on a job that has not been submitted yet: it starts once that job "
                                "reaches the phase it waits for"),
    ("to start (it is", "it depends on a job that has not started yet: it starts once that one runs"),
    ("to succeed (it is", "it depends on a job that has not succeeded yet: it starts once that one succeeds"),
    ("is at its deserved share", "its queue holds its deserved share of the cluster: it starts when the queue's "
                                 "own jobs finish or other queues need less"),
    ("waiting for capacity", "GPUs must free up: jobs finishing, elastic jobs shrinking, or jobs borrowing "
                             "beyond their queue's guarantee being reclaimed if its queue is below its guarantee"),
    ("Waiting", "the gang's other members (or its PodGroup) must exist first: check that the operator "
                "created them"),
    ("Preempting", "its victims are checkpointing: it starts when their grace period ends or they leave"),
    ("InvalidSpec", "fix the spec as the message says; nothing is scheduled until then"),
    ("Refused", "Kube-Ferry will not run this spec: change what the message names and submit it again"),
    ("FailedMount", "create the ConfigMap or Secret it refers to"),
    ("nodes are available", "the tenant cluster's scheduler found no node: tolerate the virtual node "
                            "(virtual-kubelet.io/provider) or free a local node"),
)


@dataclass
class Verdict:
    target: str
    state: str  # Pending, Running, Failed, ...
    reason: str = ""
    message: str = ""
    source: str = ""
    hint: str = ""

    def text(self) -> str:
        if self.state != "Pending":
            lines = [f"{self.target} is not pending: {self.state}" + (f" ({self.reason})" if self.reason else "")]
            if self.message:
                lines.append(f"  {self.message}")
            if self.hint:
                lines.append(f"What would let it run: {self.hint}")
            return "\n".join(lines)
        lines = [f"{self.target} is pending."]
        lines.append(f"Why: {self.message or 'no reason recorded yet (the scheduler has not looked at it)'}"
                     + (f"  [{self.reason}, {self.source}]" if self.reason else ""))
        if self.hint:
            lines.append(f"What would let it run: {self.hint}")
        return "\n".join(lines)

    def as_dict(self) -> Obj:
        return asdict(self)


def hint_for(reason: str, message: str) -> str:
    for key, hint in HINTS:
        if reason == key or message.startswith(key) or (" " in key and key in message):
            return hint
    return ""


def _scheduled_condition(group: Obj) -> Obj | None:
    return next((c for c in (group.get("status") or {}).get("conditions") or [] if c.get("type") == "Scheduled"),
                None)


async def _latest_event(rest: Rest, ns: str, uid: str) -> Obj | None:
    events = (await rest.get(path("", "v1", "events", ns), fieldSelector=f"involvedObject.uid={uid}"))["items"]
    ours = [e for e in events if e.get("reason") in OUR_REASONS]
    if not ours:
        return None
    # Times have one-second resolution; of two Events in the same second the later write wins.
    latest: Obj = max(ours, key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "",
                                           int(e["metadata"].get("resourceVersion") or 0)))
    return latest


async def _group(rest: Rest, ns: str, name: str) -> tuple[Obj, bool] | None:
    """The named PodGroup and whether it is Kube-Ferry's own (compute) or a tenant convention's."""
    for api, ours in ((KUBE_FERRY, True), *((g, False) for g in TENANT_GROUPS)):
        try:
            obj = await rest.get_or_none(path(*api, "podgroups", ns, name))
        except Exception:  # the CRD is not installed in this cluster
            continue
        if obj is not None:
            return obj, ours
    return None


async def explain(rest: Rest, ns: str, target: str) -> Verdict:
    """Why ``target`` (a pod name, or ``podgroup/NAME``) in ``ns`` is not running."""
    if target.startswith(("podgroup/", "podgroups/", "pg/")):
        name = target.split("/", 1)[1]
        found = await _group(rest, ns, name)
        if found is None:
            raise LookupError(f"no PodGroup {ns}/{name} (Kube-Ferry, Volcano or scheduler-plugins)")
        return await _explain_group(rest, ns, f"podgroup/{name}", *found)
    pod = await rest.get_or_none(path("", "v1", "pods", ns, target))
    if pod is None:
        raise LookupError(f"no pod {ns}/{target}")
    return await _explain_pod(rest, pod)


async def _explain_group(rest: Rest, ns: str, label: str, group: Obj, ours: bool) -> Verdict:
    st = group.get("status") or {}
    phase = st.get("phase") or "Pending"
    if phase not in ("Pending", "Inqueue", "Scheduling", "Privileged"):
        return Verdict(label, phase, message=f"running {st.get('running', 0)}, succeeded "
                                             f"{st.get('succeeded', 0)}, failed {st.get('failed', 0)}")
    cond = _scheduled_condition(group) if ours else None
    if cond is not None and cond.get("status") != "True":
        reason, message = cond.get("reason", ""), cond.get("message", "")
        return Verdict(label, "Pending", reason, message, "the Kube-Ferry scheduler", hint_for(reason, message))
    if not label.startswith("pod/"):  # a tenant group: its members carry the scheduler's current words
        name = group["metadata"]["name"]
        for pod in (await rest.get(path("", "v1", "pods", ns)))["items"]:
            meta = pod["metadata"]
            if name in ([(meta.get("labels") or {}).get(k) for k in GROUP_LABELS]
                        + [(meta.get("annotations") or {}).get(k) for k in GROUP_ANNOTATIONS]):
                verdict = await _explain_pod(rest, pod, grouped=False)
                if verdict.state == "Pending" and verdict.reason:
                    verdict.target = f"{label} (member pod/{meta['name']})"
                    return verdict
    event = await _latest_event(rest, ns, group["metadata"]["uid"])
    if event is not None and event.get("reason") != "Scheduled":
        reason, message = event.get("reason", ""), event.get("message", "")
        return Verdict(label, "Pending", reason, message, event.get("source", {}).get("component", "an Event"),
                       hint_for(reason, message))
    return Verdict(label, "Pending")


async def _explain_pod(rest: Rest, pod: Obj, grouped: bool = True) -> Verdict:
    meta, spec, st = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    label = f"pod/{meta['name']}"
    phase = st.get("phase") or "Pending"
    if phase == "Failed":
        reason, message = st.get("reason", ""), st.get("message", "")
        return Verdict(label, "Failed", reason, message, "", hint_for(reason, message))
    if phase != "Pending":
        return Verdict(label, phase, message=f"on node {spec.get('nodeName')}")
    if not spec.get("nodeName"):  # not bound by the scheduler it names
        cond = next((c for c in st.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        if cond is not None and cond.get("status") == "False" and spec.get("schedulerName") != "kube-ferry":
            told = await _latest_event(rest, meta["namespace"], meta["uid"])
            if told is not None and (said := told.get("reason", "")) in (NO_VIRTUAL_NODE, NODE_REFUSES):
                # the vnode knows what is missing, or is the scheduler that does not bind it now
                return Verdict(label, "Pending", said, told.get("message", ""), "the virtual node",
                               hint_for(said, told.get("message", "")))
            reason, message = cond.get("reason", ""), cond.get("message", "")
            return Verdict(label, "Pending", reason, message, f"scheduler {spec.get('schedulerName', 'default')}",
                           hint_for(reason, message))
    group_name = next((v for k in GROUP_LABELS if (v := (meta.get("labels") or {}).get(k))), None) or next(
        (v for k in GROUP_ANNOTATIONS if (v := (meta.get("annotations") or {}).get(k))), None)
    if group_name and grouped:
        found = await _group(rest, meta["namespace"], group_name)
        if found is not None:
            verdict = await _explain_group(rest, meta["namespace"], label, *found)
            if verdict.reason:
                return verdict
    event = await _latest_event(rest, meta["namespace"], meta["uid"])
    if event is not None and event.get("reason") != "Scheduled":
        reason, message = event.get("reason", ""), event.get("message", "")
        return Verdict(label, "Pending", reason, message, event.get("source", {}).get("component", "an Event"),
                       hint_for(reason, message))
    return Verdict(label, "Pending")
