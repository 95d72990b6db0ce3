"""What the scheduling core reasons about: nodes with GPU devices, queues, jobs of tasks of replicas.

Plain data, no I/O and no Kubernetes types: the service adapter and the simulators translate into
these. Quantities are integers (CPU and GPU in milli, memory in MiB) so accounting sums exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

GPU_MILLI = 1000


class Tier(IntEnum):
    """Elastic jobs soak up idle GPUs and are the first victims; guaranteed jobs run on their queue's share."""

    ELASTIC = 0
    GUARANTEED = 1


class JobPhase(StrEnum):
    PENDING = "Pending"
    PRIVILEGED = "Privileged"  # a preemptor holding its victims' capacity until they are gone
    RUNNING = "Running"
    WILL_EVICT = "WillEvict"  # a victim told to checkpoint; evicted at its deadline unless cancelled
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    EVICTED = "Evicted"

    @property
    def terminal(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.EVICTED)

    @property
    def holds_resources(self) -> bool:
        return self in (JobPhase.RUNNING, JobPhase.WILL_EVICT)


class ReplicaPhase(StrEnum):
    PENDING = "Pending"
    BOUND = "Bound"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    EVICTED = "Evicted"


class OnReplicaFailure(StrEnum):
    RESTART_TASK = "RestartTask"
    ABORT_JOB = "AbortJob"
    IGNORE = "Ignore"


class SelectorOp(StrEnum):
    """The operators of a Kubernetes node selector requirement."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One requirement of a node-affinity term as Kubernetes states it. ``field``: a requirement on the node's
    name (``matchFields`` on ``metadata.name``, the one field Kubernetes allows) rather than on a label."""

    key: str
    op: SelectorOp
    values: tuple[str, ...] = ()
    field: bool = False

    def admits(self, node: Node) -> bool:
        return self.holds(node.name if self.field else node.labels.get(self.key))

    def holds_for(self, labels: Mapping[str, str]) -> bool:
        """The requirement read as one of a pod label selector's, on a pod's labels."""
        return self.holds(labels.get(self.key))

    def holds(self, value: str | None) -> bool:
        """Whether a label's value (None: no such label) meets the requirement."""
        match self.op:
            case SelectorOp.IN:
                return value in self.values
            case SelectorOp.NOT_IN:
                return value not in self.values
            case SelectorOp.EXISTS:
                return value is not None
            case SelectorOp.DOES_NOT_EXIST:
                return value is None
        # Gt / Lt: both sides whole numbers (Kubernetes' rule); a label that is not one matches neither
        try:
            have, bound = int(value or ""), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return have > bound if self.op is SelectorOp.GT else have < bound

    def __str__(self) -> str:
        values = f" ({', '.join(self.values)})" if self.values else ""
        return f"{self.key} {self.op.value}{values}"


AffinityTerms = tuple[tuple[NodeRequirement, ...], ...]  # ORed terms of ANDed requirements
Preferences = tuple[tuple[int, tuple[NodeRequirement, ...]], ...]  # (weight, ANDed requirements) of preferred terms
HOSTNAME_KEY = "kubernetes.io/hostname"


@dataclass(frozen=True, slots=True)
class PodTerm:
    """A required pod (anti-)affinity term among a job's own replicas: ``term`` (as written) names which of
    them it selects (a replica whose request lists it in ``marks``); its topology domain is the value of
    node label ``key``, the node itself for ``kubernetes.io/hostname``."""

    term: str
    key: str = HOSTNAME_KEY

    def domain(self, node: Node) -> str | None:
        """The node's domain for this term (None: it has no such label, so the term does not apply there)."""
        return node.name if self.key == HOSTNAME_KEY else node.labels.get(self.key)


@dataclass(frozen=True, slots=True)
class Apart(PodTerm):
    """A required pod anti-affinity: a replica with it is never in the domain of a replica the term
    selects, and none of those comes into its domain either (Kubernetes keeps both sides)."""


@dataclass(frozen=True, slots=True)
class Together(PodTerm):
    """A required pod affinity: a replica with it runs in a domain that holds a replica the term selects;
    while none runs, one the term selects itself may start a domain (Kubernetes' rule for the first pod of
    a group), on a node that has the label."""


@dataclass(frozen=True, slots=True)
class Gather(PodTerm):
    """A preferred pod affinity: the replicas it selects go in one domain where one has room for all of them
    at once, else wherever they fit. kube-scheduler scores such a term pod by pod; a gang is placed whole, so
    its replicas can be kept in one domain when they fit there (Kueue's preferred topology, carried by the
    vnode, is one)."""


@dataclass(frozen=True, slots=True)
class Spread(PodTerm):
    """A topology spread constraint that may not be broken (``whenUnsatisfiable: DoNotSchedule``): a
    replica with it goes only to a domain where the pods the term selects would then number at most
    ``max_skew`` more than in the emptiest domain its node selector and affinity admit (counted as 0 while
    fewer than ``min_domains`` such domains exist), on a node that has the label. The pods counted are its
    job's bound replicas the term selects (``Request.marks``) and, where ``namespace`` is set, the bound pods
    of other jobs of that namespace whose labels meet ``selector`` (a Deployment's replicas, each a job)."""

    max_skew: int = 1
    min_domains: int = 1
    namespace: str | None = None
    selector: tuple[NodeRequirement, ...] = ()

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether a pod of another job counts (never without ``namespace``)."""
        return namespace == self.namespace and all(r.holds_for(labels) for r in self.selector)


@dataclass(frozen=True, slots=True)
class PeerTerm(PodTerm):
    """A required pod term that selects pods of any job: those in ``namespaces`` (None: every namespace) whose
    labels meet ``selector``."""

    namespaces: frozenset[str] | None = None
    selector: tuple[NodeRequirement, ...] = ()

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return (self.namespaces is None or namespace in self.namespaces) and all(
            r.holds_for(labels) for r in self.selector)


@dataclass(frozen=True, slots=True)
class Avoid(PeerTerm):
    """A required pod anti-affinity with any pod the term selects, of any job: a replica with it is never in
    the domain of such a pod, and no pod comes into the domain of a replica whose term selects it
    (kube-scheduler's InterPodAffinity filter, both sides)."""


@dataclass(frozen=True, slots=True)
class Near(PeerTerm):
    """A required pod affinity with pods of other jobs the term selects: a replica with it runs only in a domain
    holding such a pod; while none runs, only if the term selects the replica itself (Kubernetes' rule for
    the first pod of a group), on a node that has the label."""


def describe_affinity(terms: AffinityTerms) -> str:
    """Terms as a user reads them in a pending reason."""
    return " or ".join(" and ".join(map(str, term)) or "(an empty term)" for term in terms)


@dataclass(frozen=True, slots=True)
class Request:
    """What one replica needs. ``gpus`` whole devices of ``gpu_milli`` each; a share is gpus=1, milli<1000."""

    cpu_milli: int = 0
    mem_mib: int = 0
    gpus: int = 0
    gpu_milli: int = GPU_MILLI
    models: frozenset[str] = frozenset()
    selector: frozenset[tuple[str, str]] = frozenset()  # node labels the replica requires
    affinity: AffinityTerms = ()  # its required node affinity; none: any node
    preferred: Preferences = ()  # its preferred node affinity: nodes of the highest weight first (``preference``)
    apart: frozenset[Apart] = frozenset()  # its required anti-affinities among its job's replicas
    together: frozenset[Together] = frozenset()  # its required pod affinities among its job's replicas
    gather: frozenset[Gather] = frozenset()  # its preferred pod affinities among its job's replicas
    spread: frozenset[Spread] = frozenset()  # its topology spread constraints among its job's replicas
    marks: frozenset[str] = frozenset()  # the terms of its job's pod (anti-)affinities and spreads that select it
    avoid: frozenset[Avoid] = frozenset()  # its required pod anti-affinities with pods of any job
    near: frozenset[Near] = frozenset()  # its required pod affinities with pods of other jobs

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.mem_mib < 0 or self.gpus < 0:
            raise ValueError(f"negative request {self}")
        if not 0 < self.gpu_milli <= GPU_MILLI:
            raise ValueError(f"gpu_milli must be in 1..{GPU_MILLI}, got {self.gpu_milli}")
        if self.gpus > 1 and self.gpu_milli != GPU_MILLI:
            raise ValueError("a share of a GPU (gpu_milli < 1000) is for one GPU only")

    def admits(self, node: Node) -> bool:
        """Whether the replica may run on ``node`` by what it states about nodes: its node selector and its
        required node affinity (terms ORed, a term's requirements ANDed; an empty term matches no node)."""
        return (all(node.labels.get(k) == v for k, v in self.selector)
                and (not self.affinity or any(term and all(r.admits(node) for r in term) for term in self.affinity)))

    @property
    def states_placement(self) -> bool:
        """Whether it states where to run beyond its node selector and required affinity: pod terms among its
        job's replicas or preferred nodes (``Placer.find_for`` weighs them)."""
        return bool(self.apart or self.marks or self.together or self.spread or self.preferred or self.avoid
                    or self.near)

    def preference(self, node: Node) -> int:
        """The summed weight of the preferred terms ``node`` meets (an empty term meets none, as in Kubernetes)."""
        return sum(w for w, term in self.preferred if term and all(r.admits(node) for r in term))

    @property
    def selects(self) -> bool:
        """Whether it states anything about nodes' labels (a selector or an affinity)."""
        return bool(self.selector or self.affinity)

    @property
    def gpu_total(self) -> int:
        """GPU milli this replica occupies."""
        return self.gpus * self.gpu_milli

    @property
    def is_share(self) -> bool:
        return self.gpus == 1 and self.gpu_milli < GPU_MILLI


@dataclass(slots=True)
class Device:
    index: int
    free: int = GPU_MILLI
    group: int = 0  # GPUs with fast links between them share a group


@dataclass(slots=True)
class Node:
    name: str
    cpu_milli: int
    mem_mib: int
    devices: list[Device]
    max_pods: int = 110
    model: str = ""
    domain: str = ""  # topology domain across nodes (rack / switch)
    schedulable: bool = True
    labels: dict[str, str] = field(default_factory=dict)
    used_cpu: int = 0
    used_mem: int = 0
    pods: int = 0

    @property
    def free_cpu(self) -> int:
        return self.cpu_milli - self.used_cpu

    @property
    def free_mem(self) -> int:
        return self.mem_mib - self.used_mem

    @property
    def free_whole(self) -> int:
        return sum(1 for d in self.devices if d.free == GPU_MILLI)

    @property
    def free_gpu_milli(self) -> int:
        return sum(d.free for d in self.devices)

    @property
    def gpu_capacity(self) -> int:
        return len(self.devices) * GPU_MILLI


@dataclass
class QueueRights:
    """What a queue's jobs may do to others'."""

    preempt_own_elastic: bool = True  # guaranteed jobs may evict this queue's elastic jobs
    reclaim: bool = True  # may take back lent capacity (borrowed jobs of other queues) up to the guarantee
    privileged: bool = False  # may preempt lower-tier jobs of any queue even beyond its guarantee


@dataclass
class Queue:
    name: str
    guaranteed_gpu: int = 0  # milli
    max_gpu: int | None = None  # milli; None: no cap
    weight: float = 1.0
    rights: QueueRights = field(default_factory=QueueRights)
    preemptor_delay_s: float = 0.0  # a preemptor waits this long for capacity before evicting anyone
    victim_grace_s: float = 30.0  # a victim gets this long to checkpoint
    parent: str | None = None  # the queue it is part of (department -> team); see scheduler/core/hierarchy.py
    # its movable jobs are ordered by the GPU time they received (the las plugin): the least first, and
    # long runners yield to newcomers
    least_attained_service: bool = False
    # fair-over-time's usage: GPU milli-seconds decayed with the half-life, and when last brought up to date
    # (None: not yet). Kept on the model, not in the plugin, so that a new configuration keeps it; an adapter
    # seeds it from what it recorded when it builds a model after a restart.
    recent_usage: float = 0.0
    usage_at: float | None = None
    allocated_gpu: int = 0  # milli, its own jobs' and its descendants', kept by the core's accounting
    own_gpu: int = 0  # milli, its own jobs'

    def over_guarantee(self, extra: int = 0) -> bool:
        return self.allocated_gpu + extra > self.guaranteed_gpu


@dataclass(slots=True)
class Replica:
    task: str
    index: int
    phase: ReplicaPhase = ReplicaPhase.PENDING
    node: str | None = None
    devices: tuple[int, ...] = ()
    restarts: int = 0


@dataclass
class Task:
    name: str
    replicas: int
    request: Request
    min_available: int | None = None  # None: all replicas
    on_failure: OnReplicaFailure = OnReplicaFailure.ABORT_JOB
    labels: Mapping[str, str] = field(default_factory=dict)  # its pods' labels, which other pods' terms select

    @property
    def minimum(self) -> int:
        return self.replicas if self.min_available is None else self.min_available


@dataclass(frozen=True, slots=True)
class Dependency:
    """A job starts only once ``job`` (another job's name) reached ``phase``: ``Running`` (it started, or
    already ended well) or ``Succeeded``."""

    job: str
    phase: JobPhase = JobPhase.SUCCEEDED


@dataclass
class Job:
    """A gang: scheduled all-or-nothing for ``min_member`` replicas (default: every task's minimum)."""

    name: str
    queue: str
    tasks: list[Task]
    submit_time: float = 0.0
    namespace: str = ""  # its pods' namespace, where pod terms select pods
    tier: Tier = Tier.GUARANTEED
    priority: int = 0
    min_member: int | None = None
    elastic_max: int | None = None  # elastic jobs may grow their last task up to this many replicas
    main_task: str | None = None  # its success completes the job and stops the rest
    depends_on: tuple[Dependency, ...] = ()
    movable: bool = False  # it may be moved (evicted with notice, placed again) to consolidate; elastic jobs may anyway
    moved_at: float | None = None  # when it was last told to move (consolidation's cooldown)
    attained_gpu_s: float = 0.0  # GPU-seconds its earlier runs received (evicted runs; the las plugin)
    stopped_at: float | None = None  # when its last run was evicted
    promoted_at: float | None = None  # when least attained service last counted it afresh (the las plugin)
    phase: JobPhase = JobPhase.PENDING
    replicas: list[Replica] = field(default_factory=list)
    start_time: float | None = None
    will_evict_deadline: float | None = None
    will_evict_by: str | None = None  # the preemptor
    # when this run began waiting for capacity (its arrival, or the first cycle after it came back to pending
    # from an eviction): a queue's preemptor delay counts from here, for every waiting job alike
    waiting_since: float | None = None
    last_victim_cycle: int = -10
    last_victim_at: float = float("-inf")
    evictions: int = 0
    reason: str = ""
    reserved_nodes: tuple[str, ...] = ()
    # it started on nodes held for these waiting jobs, on loan: recalled when one of them could start
    on_loan_from: tuple[str, ...] = ()
    bypassed: bool = False  # a smaller job started while this one could not: backfill may starve it
    allocated: int = 0  # GPU milli of its bound replicas, kept by the placer
    preempt_retry_at: float = float("-inf")
    # what its last victim search concluded: said with its reason until the next search, so that the
    # explanation a user reads does not change between searches (each change is a write and an Event)
    search_verdict: str = ""
    _tasks_cache: dict[str, Task] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.replicas:
            self.replicas = [Replica(t.name, i) for t in self.tasks for i in range(t.replicas)]

    @property
    def task_by_name(self) -> dict[str, Task]:
        cached = self._tasks_cache
        if cached is None or len(cached) != len(self.tasks):
            cached = self._tasks_cache = {t.name: t for t in self.tasks}
        return cached

    @property
    def gang_size(self) -> int:
        return self.min_member if self.min_member is not None else sum(t.minimum for t in self.tasks)

    def bound(self) -> list[Replica]:
        return [r for r in self.replicas if r.phase is ReplicaPhase.BOUND]

    def pending(self) -> list[Replica]:
        return [r for r in self.replicas if r.phase is ReplicaPhase.PENDING]

    def waited(self, now: float) -> float:
        """How long this run has waited for capacity (0 before the scheduler's first cycle dated it)."""
        return 0.0 if self.waiting_since is None else now - self.waiting_since

    def gpu_demand(self) -> int:
        """GPU milli of the replicas still pending."""
        tasks = self.task_by_name
        return sum(tasks[r.task].request.gpu_total for r in self.replicas if r.phase is ReplicaPhase.PENDING)

    def gpu_allocated(self) -> int:
        return self.allocated

    @property
    def may_move(self) -> bool:
        """It can checkpoint and start again elsewhere: it said so, or it is elastic."""
        return self.movable or self.tier is Tier.ELASTIC

    def attained(self, now: float) -> float:
        """GPU-seconds received so far: earlier runs and the current one."""
        if self.start_time is None or not self.phase.holds_resources:
            return self.attained_gpu_s
        return self.attained_gpu_s + max(0.0, now - self.start_time) * self.allocated / 1000

    def min_gpu(self) -> int:
        tasks = self.task_by_name
        return sum(tasks[r.task].request.gpu_total for r in self.replicas[: self.gang_size])


@dataclass
class Cluster:
    """The state a cycle works on. The core keeps node and queue accounting in step with replicas."""

    nodes: dict[str, Node]
    queues: dict[str, Queue]
    jobs: dict[str, Job] = field(default_factory=dict)
    now: float = 0.0

    @property
    def gpu_capacity(self) -> int:
        return sum(n.gpu_capacity for n in self.nodes.values() if n.schedulable)
