"""From cached API objects to the scheduling core's model, and back to what must be written.

Everything policy-related stays in the core; this module only translates: nodes (allocatable,
GPU topology annotation, domain and model labels), Kube-Ferry pods grouped into jobs by their
PodGroup, queues from Queue objects, and the resources that pods of other schedulers already use.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from ferry.keys import (
    DEVICES_ANNOTATION,
    DOMAIN_LABEL,
    GPU,
    GPU_MILLI_ANNOTATION,
    MODEL_LABEL,
    MOVABLE_ANNOTATION,
    POD_GROUP_LABEL,
    QUEUE_ANNOTATION,
    SCHEDULER_NAME,
    TASK_LABEL,
    TOPOLOGY_ANNOTATION,
    WILL_EVICT_AT,
    WILL_EVICT_BY,
)
from ferry.kube import quantity
from ferry.kube.labels import label_selector_selects, with_label_keys
from ferry.kube.timestamps import rfc3339, unix
from scheduler.core import hierarchy
from scheduler.core.model import (
    GPU_MILLI,
    AffinityTerms,
    Apart,
    Avoid,
    Cluster,
    Dependency,
    Device,
    Gather,
    Job,
    JobPhase,
    Near,
    Node,
    NodeRequirement,
    Preferences,
    Queue,
    QueueRights,
    Replica,
    ReplicaPhase,
    Request,
    SelectorOp,
    Spread,
    Task,
    Tier,
    Together,
)
from scheduler.service.runs import (
    ATTAINED_STATUS,
    EVICTED_AT_STATUS,
    MOVED_AT_STATUS,
    EarlierRun,
    EarlierRuns,
)

DEFAULT_QUEUE = "default"
# PodGroup status fields the service keeps at an eviction are runs.py's (evicted_status); those it keeps while
# they hold: the nodes held for a waiting gang (reserve), the holders a gang runs on loan from (lend-holds)
HELD_NODES_STATUS = "heldNodes"
ON_LOAN_STATUS = "onLoanFrom"
# the Queue status field that keeps fair-over-time's usage for a scheduler built after a restart
RECENT_USAGE_STATUS = "recentUsage"

Obj = dict[str, Any]


class BadSpec(ValueError):
    """A pod or PodGroup the scheduler cannot act on; the message is shown to the user."""


@dataclass(frozen=True)
class GangCounts:
    """A gang's members by phase, ended ones included: a member that finished was present."""

    pending: int = 0  # not bound to a node yet
    running: int = 0  # bound and not ended
    succeeded: int = 0
    failed: int = 0

    @property
    def live(self) -> int:
        return self.pending + self.running

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed

    def terminal_phase(self) -> str | None:
        """``Succeeded`` / ``Failed`` once every member has ended, else None (the cycle decides)."""
        if self.live or not self.ended:
            return None
        return "Failed" if self.failed else "Succeeded"

    def status(self) -> dict[str, int]:
        return {"running": self.running, "succeeded": self.succeeded, "failed": self.failed}


def gang_counts(live: list[Obj], ended: list[Obj]) -> GangCounts:
    bound = sum(1 for p in live if p.get("spec", {}).get("nodeName"))
    failed = sum(1 for p in ended if p.get("status", {}).get("phase") == "Failed")
    return GangCounts(pending=len(live) - bound, running=bound, succeeded=len(ended) - failed, failed=failed)


@dataclass
class Snapshot:
    cluster: Cluster
    pods_of: dict[str, dict[tuple[str, int], Obj]]  # job -> (task, index) -> pod (members not ended)
    group_of: dict[str, Obj | None]  # job -> its PodGroup object (None for a single pod)
    problems: dict[str, str] = field(default_factory=dict)  # job -> why it cannot be scheduled at all
    waiting: dict[str, str] = field(default_factory=dict)  # job -> why it is not ready to schedule yet
    counts: dict[str, GangCounts] = field(default_factory=dict)  # job with a PodGroup -> its members by phase


def _terminal(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


_REQUESTS: dict[tuple[str, int, str | None], Request] = {}
_REQUESTS_MAX = 200_000


def pod_request(pod: Obj) -> Request:
    """What a pod asks for; memoised per pod spec generation (parsing quantities dominated cycles)."""
    meta = pod.get("metadata", {})
    uid = meta.get("uid")
    if not uid:
        return _pod_request(pod)
    key = (uid, int(meta.get("generation") or 0), (meta.get("annotations") or {}).get(GPU_MILLI_ANNOTATION))
    hit = _REQUESTS.get(key)
    if hit is None:
        if len(_REQUESTS) >= _REQUESTS_MAX:
            _REQUESTS.clear()
        hit = _REQUESTS[key] = _pod_request(pod)
    return hit


def _pod_request(pod: Obj) -> Request:
    cpu = mem = gpus = 0
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources", {}) or {}
        req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        cpu += quantity.milli(req.get("cpu", 0))
        mem += quantity.mebi(req.get("memory", 0))
        gpus += int(quantity.parse((res.get("limits") or {}).get(GPU, req.get(GPU, 0))))
    milli = GPU_MILLI
    share = pod.get("metadata", {}).get("annotations", {}).get(GPU_MILLI_ANNOTATION)
    if share is not None:
        try:
            milli = int(share)
        except ValueError:
            raise BadSpec(f"annotation {GPU_MILLI_ANNOTATION}={share!r} is not a whole number of milli-GPUs") from None
        if not 1 <= milli <= GPU_MILLI:
            raise BadSpec(f"annotation {GPU_MILLI_ANNOTATION}={milli} must be between 1 and {GPU_MILLI}")
        if gpus > 1:
            raise BadSpec(f"a pod asks {gpus} whole GPUs and a share ({GPU_MILLI_ANNOTATION}); ask one or the other")
        gpus = 1
    spec = pod.get("spec", {})
    selector = frozenset((spec.get("nodeSelector") or {}).items())
    return Request(cpu_milli=cpu, mem_mib=mem, gpus=gpus, gpu_milli=milli, selector=selector,
                   affinity=node_affinity(spec), preferred=preferred_affinity(spec))


def node_affinity(spec: Obj) -> AffinityTerms:
    """A pod's required node affinity as the core checks it."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    return tuple(_node_term(term) for term in required.get("nodeSelectorTerms") or [])


def preferred_affinity(spec: Obj) -> Preferences:
    """A pod's preferred node affinity: (weight, requirements) of each term."""
    preferred = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution") or []
    return tuple((int(p.get("weight") or 0), _node_term(p.get("preference") or {})) for p in preferred)


def _node_term(term: Obj) -> tuple[NodeRequirement, ...]:
    reqs = [_requirement(e, field=False) for e in term.get("matchExpressions") or []]
    reqs += [_requirement(f, field=True) for f in term.get("matchFields") or []]
    return tuple(reqs)


class OwnTerms(NamedTuple):
    """What a task states about where it runs beside the other pods of its job (``Request``'s fields)."""

    apart: frozenset[Apart]
    together: frozenset[Together]
    gather: frozenset[Gather]
    spread: frozenset[Spread]
    marks: frozenset[str]  # the job's terms that select the task's pods


def own_pod_terms(first: Mapping[str, Obj]) -> dict[str, OwnTerms]:
    """Task -> its required pod anti-affinities, pod affinities and topology spread constraints that may not
    be broken, and its preferred pod affinities, among the job's own pods, and the job's terms that select it,
    from one pod of each task (``first``). A term that selects none of the job's pods is about other pods,
    which placement does not weigh (README, Limitations)."""
    # task -> (what the core makes of it, term as written, selector)
    terms: dict[str, list[tuple[Apart | Together | Gather | Spread, str, Obj | None]]] = {}
    for task, pod in first.items():
        affinity = pod.get("spec", {}).get("affinity") or {}
        own_ns, labels = pod["metadata"].get("namespace"), pod["metadata"].get("labels") or {}
        terms[task] = []
        for kind, make in (("podAntiAffinity", Apart), ("podAffinity", Together)):
            for t in (affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
                if t.get("topologyKey") and _in_own_namespace(t, own_ns):
                    term = json.dumps(t, sort_keys=True)
                    terms[task].append((make(term, str(t["topologyKey"])), term, t.get("labelSelector")))
        liked = affinity.get("podAffinity") or {}
        for weighted in liked.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
            t = weighted.get("podAffinityTerm") or {}
            if t.get("topologyKey") and _in_own_namespace(t, own_ns):
                term = json.dumps({"preferred": t}, sort_keys=True)  # the same term required is another term
                terms[task].append((Gather(term, str(t["topologyKey"])), term, t.get("labelSelector")))
        for c in pod.get("spec", {}).get("topologySpreadConstraints") or []:
            if c.get("whenUnsatisfiable") == "DoNotSchedule" and c.get("topologyKey"):
                sel = with_label_keys(c, labels)  # each pod counts the pods its own labels pick: a term of its own
                term = json.dumps({**c, "labelSelector": sel}, sort_keys=True)
                reqs = _selector_requirements(sel)  # None: it selects nothing (or nothing the API server lets in)
                terms[task].append((Spread(term, str(c["topologyKey"]), int(c.get("maxSkew") or 1),
                                           int(c.get("minDomains") or 1), None if reqs is None else own_ns or "",
                                           reqs or ()), term, sel))
    selectors = {term: sel for ts in terms.values() for _, term, sel in ts}
    selected = {task: frozenset(term for term, sel in selectors.items()
                                if label_selector_selects(sel, pod["metadata"].get("labels") or {}))
                for task, pod in first.items()}
    out: dict[str, OwnTerms] = {}
    for task in first:  # a spread that counts other jobs' pods holds even if it selects none of its job's
        own = [made for made, term, _ in terms[task] if any(term in marks for marks in selected.values())
               or (isinstance(made, Spread) and made.namespace is not None)]
        found = OwnTerms(frozenset(m for m in own if isinstance(m, Apart)),
                         frozenset(m for m in own if isinstance(m, Together)),
                         frozenset(m for m in own if isinstance(m, Gather)),
                         frozenset(m for m in own if isinstance(m, Spread)), selected[task])
        if any(found):
            out[task] = found
    return out


def task_terms(task_pods: list[Obj]) -> Obj:
    """The pod that stands for a task in what its pods state about placement: the first, with every required
    pod (anti-)affinity term of the others too. A task's pods are to state the same; where an operator's
    leader states more than its followers (JobSet's exclusive placement), the task keeps the leader's terms
    whichever pod's name sorts first."""
    first = task_pods[0]
    affinity = first.get("spec", {}).get("affinity")
    if all(p.get("spec", {}).get("affinity") == affinity for p in task_pods[1:]):
        return first
    merged: Obj = {**(affinity or {})}
    for kind in ("podAffinity", "podAntiAffinity"):
        terms: dict[str, Obj] = {}
        for p in task_pods:
            for t in (((p.get("spec", {}).get("affinity") or {}).get(kind) or {})
                      .get("requiredDuringSchedulingIgnoredDuringExecution") or []):
                terms.setdefault(json.dumps(t, sort_keys=True), t)
        if terms:
            merged[kind] = {**(merged.get(kind) or {}),
                            "requiredDuringSchedulingIgnoredDuringExecution": list(terms.values())}
    return {**first, "spec": {**first.get("spec", {}), "affinity": merged}}


def peer_terms(pod: Obj) -> tuple[frozenset[Avoid], frozenset[Near]]:
    """A pod's required pod anti-affinities and pod affinities as they reach pods of any job: the namespaces a
    term looks at (its own by default, those listed, every one for ``namespaceSelector: {}``) and its label
    selector. A term with a namespace selector by labels is left out (the core does not know namespaces'
    labels), as is one whose selector is null (it selects nothing)."""
    affinity = pod.get("spec", {}).get("affinity") or {}
    own_ns = pod["metadata"].get("namespace", "")
    found: dict[str, set[Avoid | Near]] = {"podAntiAffinity": set(), "podAffinity": set()}
    for kind, make in (("podAntiAffinity", Avoid), ("podAffinity", Near)):
        for t in (affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            selector, by_label = t.get("labelSelector"), t.get("namespaceSelector")
            if not t.get("topologyKey") or selector is None or by_label not in (None, {}):
                continue
            listed = frozenset(str(n) for n in t.get("namespaces") or ())
            namespaces = None if by_label == {} else (listed or frozenset({own_ns}))
            if (reqs := _selector_requirements(selector)) is not None:
                found[kind].add(make(json.dumps(t, sort_keys=True), str(t["topologyKey"]), namespaces, reqs))
    return (frozenset(a for a in found["podAntiAffinity"] if isinstance(a, Avoid)),
            frozenset(n for n in found["podAffinity"] if isinstance(n, Near)))


def _selector_requirements(selector: Obj | None) -> tuple[NodeRequirement, ...] | None:
    """A pod term's label selector as requirements on pod labels (None: a null selector, which selects nothing,
    or an operator the API server does not let through)."""
    if selector is None:
        return None
    reqs = [NodeRequirement(str(k), SelectorOp.IN, (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    try:
        reqs += [_requirement(e, field=False) for e in selector.get("matchExpressions") or []]
    except BadSpec:
        return None
    return tuple(reqs)


def _in_own_namespace(term: Obj, namespace: str | None) -> bool:
    """Whether a pod-affinity term looks at its pod's own namespace: no namespaces and no selector (its
    own), its namespace listed, or a namespace selector that selects every namespace ({})."""
    listed, by_label = term.get("namespaces") or [], term.get("namespaceSelector")
    return (not listed and by_label is None) or namespace in listed or by_label == {}


def _requirement(expr: Obj, *, field: bool) -> NodeRequirement:
    try:
        op = SelectorOp(str(expr.get("operator")))
    except ValueError:
        raise BadSpec(f"node affinity: operator {expr.get('operator')!r} of {expr.get('key')!r} is not one of "
                      f"{', '.join(o.value for o in SelectorOp)}") from None
    return NodeRequirement(str(expr.get("key", "")), op, tuple(str(v) for v in expr.get("values") or ()), field)


def build_node(obj: Obj) -> Node:
    meta, status = obj.get("metadata", {}), obj.get("status", {})
    alloc = status.get("allocatable", {})
    gpus = int(quantity.parse(alloc.get(GPU, 0)))
    groups: dict[int, int] = {}
    topo = meta.get("annotations", {}).get(TOPOLOGY_ANNOTATION)
    if topo:
        try:
            for gi, members in enumerate(json.loads(topo).get("nvlinkGroups", [])):
                for d in members:
                    groups[int(d)] = gi
        except (ValueError, TypeError, AttributeError):
            groups = {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    labels = meta.get("labels", {})
    return Node(
        name=meta["name"],
        cpu_milli=quantity.milli(alloc.get("cpu", 0)),
        mem_mib=quantity.mebi(alloc.get("memory", 0)),
        max_pods=int(quantity.parse(alloc.get("pods", 110))),
        devices=[Device(i, group=groups.get(i, 0)) for i in range(gpus)],
        model=labels.get(MODEL_LABEL, ""),
        domain=labels.get(DOMAIN_LABEL, ""),
        schedulable=ready and not obj.get("spec", {}).get("unschedulable", False),
        labels=dict(labels),
    )


def build_queue(obj: Obj) -> Queue:
    spec = obj.get("spec", {})
    pre = spec.get("preemption", {})
    guaranteed = spec.get("guaranteed", {}).get("gpu")
    maximum = spec.get("max", {}).get("gpu")
    return Queue(
        name=obj["metadata"]["name"],
        guaranteed_gpu=quantity.milli(guaranteed) if guaranteed is not None else 0,
        max_gpu=quantity.milli(maximum) if maximum is not None else None,
        weight=float(spec.get("weight", 1)),
        rights=QueueRights(preempt_own_elastic=pre.get("preemptOwnElastic", True), reclaim=pre.get("reclaim", True),
                           privileged=pre.get("privileged", False)),
        preemptor_delay_s=float(pre.get("preemptorDelaySeconds", 0)),
        victim_grace_s=float(pre.get("victimGraceSeconds", 30)),
        parent=spec.get("parent") or None,
        least_attained_service=bool(pre.get("leastAttainedService", False)),
        **recorded_usage((obj.get("status") or {}).get(RECENT_USAGE_STATUS)),
    )


def usage_status(queue: Queue) -> Obj | None:
    """What a Queue's status keeps of its fair-over-time usage (None: no usage kept for it)."""
    if queue.usage_at is None:
        return None
    return {"gpuSeconds": round(queue.recent_usage / GPU_MILLI, 1), "time": rfc3339(queue.usage_at)}


def recorded_usage(status: Obj | None) -> dict[str, Any]:
    """The Queue fields :func:`usage_status` wrote, for a model built after a restart (nothing if absent)."""
    if not status or not status.get("time"):
        return {}
    return {"recent_usage": float(status.get("gpuSeconds") or 0.0) * GPU_MILLI, "usage_at": _ts(status["time"])}


class Filed(NamedTuple):
    """Where a pod counts: a job's live member, a gang's ended member, a charge on a node, or nowhere."""

    kind: Literal["member", "ended", "charge", "none"]
    key: str  # the job (member, ended) or the node (charge)


def file_pod(pod: Obj) -> Filed:
    spec, meta = pod.get("spec", {}), pod["metadata"]
    node_name = spec.get("nodeName")
    if spec.get("schedulerName") != SCHEDULER_NAME or meta.get("deletionTimestamp"):
        # another scheduler's (or bound by hand), or ours and leaving: its node is not free until it is gone
        # (a kubelet would refuse newcomers)
        return Filed("charge", node_name) if node_name and not _terminal(pod) else Filed("none", "")
    if spec.get("schedulingGates"):  # gated: not ready to schedule
        return Filed("none", "")
    group = meta.get("labels", {}).get(POD_GROUP_LABEL)
    if _terminal(pod):
        return Filed("ended", f"{meta['namespace']}/{group}") if group else Filed("none", "")
    return Filed("member", f"{meta['namespace']}/{group}" if group else f"{meta['namespace']}/pod/{meta['name']}")


@dataclass
class JobView:
    """Everything the service knows of one job: the core's Job when it can be scheduled, else why not."""

    job: Job | None
    pods: dict[tuple[str, int], Obj]
    group: Obj | None
    counts: GangCounts | None
    problem: str | None = None
    waiting: str | None = None


def assemble(name: str, live: list[Obj], ended: list[Obj], groups: Mapping[str, Obj], ns_queue: dict[str, str],
             queues: dict[str, Queue], cache: ShapeCache, now: float, runs: EarlierRuns | None = None) -> JobView:
    """One job from its live and ended member pods and its PodGroup (a job without one: and the earlier run
    it continues, which ``runs`` knows)."""
    if not live:  # a gang whose every member ended
        return JobView(None, {}, groups.get(name), gang_counts([], ended))
    ns = live[0]["metadata"]["namespace"]
    group_name = live[0]["metadata"].get("labels", {}).get(POD_GROUP_LABEL)
    group = groups.get(f"{ns}/{group_name}") if group_name else None
    counts = gang_counts(live, ended) if group_name else None
    try:
        job, by_replica = _job(name, live, group, ns_queue, queues, cache)
    except BadSpec as exc:
        return JobView(None, {(p["metadata"]["name"], 0): p for p in live}, group, counts, problem=str(exc))
    if group_name and group is None:
        return JobView(None, by_replica, group, counts, waiting=f"PodGroup {group_name} does not exist (yet)")
    if len(job.replicas) + len(ended) < job.gang_size:
        return JobView(None, by_replica, group, counts, waiting=(
            f"waiting for gang members: {len(job.replicas) + len(ended)} of {job.gang_size} pods exist"))
    if not group_name and runs is not None and (run := runs.of(name, live[0], now)) is not None:
        continue_run(job, run)
    if job.bound() and job.start_time is None:  # bound, not started yet: young, as far as we know
        job.start_time = now
    if ended and job.min_member is not None:  # members that ended were part of the gang's minimum
        job.min_member = max(1, job.min_member - len(ended))
    return JobView(job, by_replica, group, counts)


def continue_run(job: Job, run: EarlierRun) -> None:
    """Job ``job`` is the next run of an evicted one: its place, clocks and history are that job's, as a
    gang's come from its PodGroup (``_shape``)."""
    job.submit_time = min(job.submit_time, run.submit_time)
    job.attained_gpu_s = max(job.attained_gpu_s, run.attained_gpu_s)
    job.stopped_at = run.stopped_at
    job.moved_at = run.moved_at


def record(snap: Snapshot, name: str, view: JobView) -> None:
    """Put what the service shows of a job into the snapshot (replacing what it showed before)."""
    snap.problems.pop(name, None)
    snap.waiting.pop(name, None)
    snap.counts.pop(name, None)
    if view.problem is not None:
        snap.problems[name] = view.problem
    if view.waiting is not None:
        snap.waiting[name] = view.waiting
    if view.counts is not None:
        snap.counts[name] = view.counts
    snap.group_of[name] = view.group
    if view.pods:
        snap.pods_of[name] = view.pods
    else:
        snap.pods_of.pop(name, None)


def build(nodes: dict[str, Obj], pods: dict[str, Obj], groups: dict[str, Obj], queues: dict[str, Obj],
          now: float, cache: ShapeCache | None = None, runs: EarlierRuns | None = None) -> Snapshot:
    cluster_nodes = {}
    for obj in nodes.values():
        node = build_node(obj)
        cluster_nodes[node.name] = node
    cluster_queues = build_queues(queues)
    ns_queue = namespace_queues(queues)
    snap = Snapshot(Cluster(cluster_nodes, cluster_queues, now=now), {}, {})
    members: dict[str, list[Obj]] = defaultdict(list)
    ended: dict[str, list[Obj]] = defaultdict(list)  # gang members that finished: present, holding nothing
    for pod in pods.values():
        kind, key = file_pod(pod)
        if kind == "charge":
            if key in cluster_nodes:
                charge(cluster_nodes[key], pod)
        elif kind == "member":
            members[key].append(pod)
        elif kind == "ended":
            ended[key].append(pod)
    cache = cache if cache is not None else ShapeCache()
    cache.keep_only(set(members))
    if runs is not None:
        runs.keep_only(set(members))
    for name in [*members, *(k for k in ended if k not in members)]:
        view = assemble(name, members.get(name, []), ended.get(name, []), groups, ns_queue, cluster_queues, cache,
                        now, runs)
        record(snap, name, view)
        if view.job is not None:
            snap.cluster.jobs[name] = view.job
    return snap


def _as_written(queues: Mapping[str, Obj]) -> dict[str, Queue]:
    out = {q.name: q for q in (build_queue(o) for o in queues.values())}
    out.setdefault(DEFAULT_QUEUE, Queue(DEFAULT_QUEUE))
    return out


def build_queues(queues: Mapping[str, Obj]) -> dict[str, Queue]:
    """The queues, each parent link that cannot stand dropped (:func:`queue_problems` says why)."""
    out = _as_written(queues)
    for name in hierarchy.problems(out):
        out[name].parent = None
    return out


def queue_problems(queues: Mapping[str, Obj]) -> dict[str, str]:
    """Queue -> why its parent link is ignored (unknown parent, a loop, children guaranteed too much)."""
    return hierarchy.problems(_as_written(queues))


def _recorded_devices(pod: Obj) -> set[int]:
    recorded = (pod["metadata"].get("annotations") or {}).get(DEVICES_ANNOTATION)
    return {int(d) for d in recorded.split(",") if d.strip().isdigit()} if recorded else set()


def charge(node: Node, pod: Obj) -> None:
    """What a pod the core does not place holds on its node: a terminating pod of ours the devices it
    recorded, until it is gone; a pod of another scheduler (or bound by hand) whole free GPUs."""
    try:
        req = pod_request(pod)
    except (BadSpec, ValueError):
        return
    node.used_cpu += req.cpu_milli
    node.used_mem += req.mem_mib
    node.pods += 1
    if devices := _recorded_devices(pod):
        for d in node.devices:
            if d.index in devices:
                d.free = max(0, d.free - req.gpu_milli)
        return
    free = [d for d in node.devices if d.free == GPU_MILLI]
    for d in free[: req.gpus]:
        d.free = 0


@dataclass(frozen=True)
class JobShape:
    """Everything a job's pods and PodGroup say about it."""

    queue: str
    tasks: tuple[tuple[str, int, Request, int | None], ...]
    replicas: tuple[tuple[str, int, str | None, tuple[int, ...]], ...]
    by_replica: dict[tuple[str, int], Obj]
    submit_time: float
    tier: Tier
    priority: int
    min_member: int | None
    elastic_max: int | None
    main_task: str | None
    will_evict_at: str | None
    will_evict_by: str | None
    started: float | None  # when it last started: its PodGroup's scheduledTime, else its pods' start
    depends_on: tuple[Dependency, ...] = ()
    movable: bool = False
    # what its earlier runs received and when the last was evicted: its PodGroup's status, which the service
    # writes at each eviction (least attained service orders by them; a restarted scheduler reads them back)
    attained_gpu_s: float = 0.0
    stopped_at: float | None = None
    moved_at: float | None = None  # when it was last told to move (consolidation's cooldown), kept the same way
    held_nodes: tuple[str, ...] = ()  # nodes held for it while it waits (its status, see :func:`held_status`)
    labels: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()  # task -> its pods' labels (its first pod's)
    on_loan_from: tuple[str, ...] = ()  # the waiting gangs whose held nodes it runs on, on loan


@dataclass
class ShapeCache:
    """Job shapes (or why a job's spec is bad) kept between cycles while none of the job's pods, its
    PodGroup or its namespace's queue changed: an informer replaces an object on each update, so
    identity means unchanged. Deriving them for every running job dominated a cycle's snapshot."""

    entries: dict[str, tuple[tuple[Obj, ...], Obj | None, str | None, JobShape | str]] = field(default_factory=dict)

    def shape(self, name: str, pods: list[Obj], group: Obj | None, ns_queue: dict[str, str]) -> JobShape:
        nsq = ns_queue.get(pods[0]["metadata"]["namespace"])
        hit = self.entries.get(name)
        if (hit is not None and hit[1] is group and hit[2] == nsq and len(hit[0]) == len(pods)
                and all(a is b for a, b in zip(hit[0], pods, strict=True))):
            found = hit[3]
        else:
            try:
                found = _shape(pods, group, nsq)
            except BadSpec as exc:
                found = str(exc)
            self.entries[name] = (tuple(pods), group, nsq, found)
        if isinstance(found, str):
            raise BadSpec(found)
        return found

    def keep_only(self, names: set[str]) -> None:
        for name in [n for n in self.entries if n not in names]:
            del self.entries[name]


def _job(name: str, pods: list[Obj], group: Obj | None, ns_queue: dict[str, str],
         queues: dict[str, Queue], cache: ShapeCache) -> tuple[Job, dict[tuple[str, int], Obj]]:
    shape = cache.shape(name, pods, group, ns_queue)
    if shape.queue not in queues:
        raise BadSpec(f"queue {shape.queue!r} does not exist")
    labels = dict(shape.labels)
    job = Job(name, shape.queue, [Task(t, n, req, min_available=m, labels=dict(labels.get(t, ())))
                                  for t, n, req, m in shape.tasks], namespace=name.split("/", 1)[0],
              submit_time=shape.submit_time, tier=shape.tier, priority=shape.priority, min_member=shape.min_member,
              replicas=[Replica(t, i, ReplicaPhase.BOUND if node else ReplicaPhase.PENDING, node, devices)
                        for t, i, node, devices in shape.replicas],
              elastic_max=shape.elastic_max, main_task=shape.main_task, depends_on=shape.depends_on,
              movable=shape.movable, attained_gpu_s=shape.attained_gpu_s, stopped_at=shape.stopped_at,
              moved_at=shape.moved_at)
    if job.bound():
        job.start_time = shape.started
        job.on_loan_from = shape.on_loan_from  # of this run: a new run waits, and holds or borrows anew
    else:
        job.reserved_nodes = shape.held_nodes
    if shape.will_evict_at and job.bound():
        job.phase = JobPhase.WILL_EVICT
        job.will_evict_deadline = _ts(shape.will_evict_at)
        job.will_evict_by = shape.will_evict_by
    return job, shape.by_replica


def _claim_order(queue: Obj) -> tuple[str, str]:
    meta = queue["metadata"]
    return str(meta.get("creationTimestamp") or ""), str(meta["name"])


def namespace_queues(queues: Mapping[str, Obj]) -> dict[str, str]:
    """Namespace -> the Queue that claimed it first (oldest, then by name): the same answer on every
    replica and after every restart, whatever order the objects were listed in."""
    out: dict[str, str] = {}
    for o in sorted(queues.values(), key=_claim_order):
        for ns in o.get("spec", {}).get("namespaces", []) or []:
            out.setdefault(ns, o["metadata"]["name"])
    return out


def namespace_conflicts(queues: Mapping[str, Obj]) -> dict[str, dict[str, str]]:
    """Queue -> {namespace it lists: the older Queue that has it}: a claim that does not take effect."""
    owner = namespace_queues(queues)
    out: dict[str, dict[str, str]] = {}
    for o in queues.values():
        name = o["metadata"]["name"]
        for ns in o.get("spec", {}).get("namespaces", []) or []:
            if owner.get(ns, name) != name:
                out.setdefault(name, {})[ns] = owner[ns]
    return out


def queue_of(group: Obj | None, pod: Obj, namespace_queue: str | None) -> str:
    """A job's queue: its PodGroup's, else its pod's annotation, else its namespace's, else the default."""
    annotations = pod["metadata"].get("annotations") or {}
    return str((group or {}).get("spec", {}).get("queue") or annotations.get(QUEUE_ANNOTATION)
               or namespace_queue or DEFAULT_QUEUE)


def _shape(pods: list[Obj], group: Obj | None, namespace_queue: str | None) -> JobShape:
    gspec = (group or {}).get("spec", {})
    queue = queue_of(group, pods[0], namespace_queue)
    by_task: dict[str, list[Obj]] = defaultdict(list)
    for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
        by_task[p["metadata"].get("labels", {}).get(TASK_LABEL, "worker")].append(p)
    tasks: list[tuple[str, int, Request, int | None]] = []
    replicas: list[tuple[str, int, str | None, tuple[int, ...]]] = []
    by_replica: dict[tuple[str, int], Obj] = {}
    min_task = gspec.get("minTaskMember", {}) or {}
    stating = {task: task_terms(task_pods) for task, task_pods in by_task.items()}
    own_terms = own_pod_terms(stating)
    for task, task_pods in by_task.items():
        requests = {pod_request(p) for p in task_pods}
        if len(requests) > 1:
            raise BadSpec(f"pods of task {task!r} ask for different resources; give each role its own "
                          f"{TASK_LABEL} label")
        (req,) = requests
        if task in own_terms:
            req = replace(req, **own_terms[task]._asdict())
        avoid, near = peer_terms(stating[task])
        # an affinity its job's own pods meet is the gang's to keep (``Together``); the rest reach other jobs
        near = frozenset(n for n in near if n.term not in {t.term for t in req.together})
        if avoid or near:
            req = replace(req, avoid=avoid, near=near)
        tasks.append((task, len(task_pods), req, min_task.get(task)))
        for i, p in enumerate(task_pods):
            by_replica[(task, i)] = p
            recorded = (p["metadata"].get("annotations") or {}).get(DEVICES_ANNOTATION)
            devices = tuple(int(d) for d in recorded.split(",") if d.strip().isdigit()) if recorded else ()
            replicas.append((task, i, p.get("spec", {}).get("nodeName"), devices))
    # A job's place in its queue is when it arrived. Its PodGroup outlives its pods, so a gang evicted and
    # made again by its operator keeps the place it had (as Volcano orders jobs by their PodGroup's
    # creation, and as the trace replays file a victim's new run): its new pods' creation would send it
    # behind every job that arrived while it ran. A pod without a PodGroup is a new job when made again.
    created = min((p["metadata"].get("creationTimestamp", "") for p in pods), default="")
    group_created = str(((group or {}).get("metadata") or {}).get("creationTimestamp") or "")
    if group_created and (not created or group_created < created):
        created = group_created
    bound = [p["metadata"].get("annotations", {}) for p in pods if p.get("spec", {}).get("nodeName")]
    # The later of the two: a PodGroup's scheduledTime may be an earlier incarnation's until it is rewritten.
    gstatus = (group or {}).get("status") or {}
    scheduled = gstatus.get("scheduledTime") or ""
    evicted = gstatus.get(EVICTED_AT_STATUS) or ""
    moved = gstatus.get(MOVED_AT_STATUS) or ""
    started = max(scheduled, min((t for p in pods if p.get("spec", {}).get("nodeName")
                                  and (t := (p.get("status") or {}).get("startTime"))), default=""))
    return JobShape(
        labels=tuple((task, tuple(sorted((task_pods[0]["metadata"].get("labels") or {}).items())))
                     for task, task_pods in by_task.items()),
        queue=queue, tasks=tuple(tasks),
        replicas=tuple(replicas), by_replica=by_replica, submit_time=_ts(created),
        tier=Tier.ELASTIC if gspec.get("tier") == "Elastic" else Tier.GUARANTEED,
        priority=int(gspec.get("priority", 0)), min_member=gspec.get("minMember") if group else None,
        elastic_max=(gspec.get("elastic") or {}).get("max"), main_task=gspec.get("mainTask"),
        will_evict_at=next((a[WILL_EVICT_AT] for a in bound if a.get(WILL_EVICT_AT)), None),
        will_evict_by=next((a[WILL_EVICT_BY] for p in pods
                            if (a := p["metadata"].get("annotations", {})).get(WILL_EVICT_BY)), None),
        started=_ts(started) if started else None,
        depends_on=dependencies(pods[0]["metadata"]["namespace"], gspec.get("dependsOn")),
        movable=any((o["metadata"].get("annotations") or {}).get(MOVABLE_ANNOTATION) == "true"
                    for o in (*pods, *([group] if group else []))),
        attained_gpu_s=float(gstatus.get(ATTAINED_STATUS) or 0.0), stopped_at=_ts(evicted) if evicted else None,
        moved_at=_ts(moved) if moved else None,
        held_nodes=_names(gstatus.get(HELD_NODES_STATUS)), on_loan_from=_names(gstatus.get(ON_LOAN_STATUS)),
    )


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def held_status(job: Job | None) -> Obj:
    """What a PodGroup's status keeps of the model's holds and loans while they last (read back by
    :func:`build`): a scheduler built after a restart or by a new leader keeps the hold of a gang that was
    passed over and can still recall the jobs on loan there. Absent (None) when there is none, so that a
    merge patch removes the field."""
    if job is None or job.phase.terminal:
        return {HELD_NODES_STATUS: None, ON_LOAN_STATUS: None}
    return {HELD_NODES_STATUS: list(job.reserved_nodes) or None, ON_LOAN_STATUS: list(job.on_loan_from) or None}


def group_phase(group: Obj | None) -> JobPhase | None:
    """The phase a PodGroup's status records (the service wrote it), or None."""
    phase = str(((group or {}).get("status") or {}).get("phase") or "")
    return JobPhase(phase) if phase in set(JobPhase) else None


def dependencies(namespace: str, value: Any) -> tuple[Dependency, ...]:
    """A PodGroup's ``spec.dependsOn`` (PodGroups of its namespace, each with the phase to reach; the
    CRD validates the form) as the core's dependencies."""
    out = []
    for item in value or ():
        phase = item.get("phase") or "Succeeded"
        if phase not in ("Running", "Succeeded"):
            raise BadSpec(f"dependsOn {item.get('name')!r}: phase {phase!r} is not Running or Succeeded")
        out.append(Dependency(f"{namespace}/{item['name']}", JobPhase(phase)))
    return tuple(out)


def _ts(text: str) -> float:
    if not text:
        return 0.0
    return unix(text)
