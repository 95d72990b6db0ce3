"""The scheduler: one long-lived cluster model, and a cycle that runs the configured actions over it.

:class:`Scheduler` owns the model between cycles (jobs arrive with :meth:`submit`, end with
:meth:`replica_done` / :meth:`finish`, leave with :meth:`remove`; nodes with :meth:`add_node`,
:meth:`node_changed`) and keeps indexes that make a cycle cost proportional to what changes, not to
the number of pending jobs. What a cycle does is configuration (:class:`SchedulerConfig`): the
actions it runs in order and the plugins whose callbacks decide (see :mod:`scheduler.core.framework`).
Every cycle opens by evicting victims whose grace ran out and closes by releasing victims nobody
needs any more; both keep promises made in earlier cycles, so they are not optional.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from scheduler.core.actions import ACTIONS
from scheduler.core.decisions import Bind, CancelEviction, CycleResult, Evict, JobStatus, NotifyWillEvict
from scheduler.core.framework import Action, Framework, OrderKey, Plugin, Session, ShapeKey
from scheduler.core.lifecycle import GpuSecondsAccounting, Hooks, on_replica_done
from scheduler.core.model import Cluster, Job, JobPhase, Node, Replica, ReplicaPhase, Request, Tier
from scheduler.core.placement import Placement, Placer
from scheduler.core.plugins import PLUGINS

# How often the scheduler service cycles at most by default (changes wake it sooner); the Philly replay
# cycles this long after a cycle an action cut short, as the service would.
CYCLE_PERIOD_S = 0.5

PRESETS: dict[str, dict[str, Any]] = {
    # guarantees with fair borrowing, reservations against starvation (lent while they drain), whole-job
    # preemption and reclaim
    "ferry": {
        "actions": ("allocate", "reserve", "preempt", "grow"),
        "plugins": ("priority", "guarantee", "capacity", "protection", "tier-preemption", "reclaim", "starvation",
                    "dependencies", "lend-holds", "binpack"),
    },
    # strict gang FIFO: one global order by priority and age; nothing passes a job that does not fit
    "fifo": {"actions": ("allocate",), "plugins": ("priority", "fifo"), "backfill": False},
    # Volcano's default configuration (actions enqueue, allocate, backfill; plugins priority, gang, drf,
    # proportion, binpack): deserved shares water-filled by weight, a queue at its share gets nothing
    # more; no reservation, reclaim or preemption. Enqueue's gate admits what allocate would consider
    # anyway under the default overcommit factor, so it is not modelled.
    "volcano": {"actions": ("allocate",), "plugins": ("priority", "proportion", "capacity", "binpack")},
}


@dataclass(frozen=True)
class SchedulerConfig:
    """Actions (in order), plugins (in order) and the tunables they read. Defaults: the ``ferry`` preset."""

    actions: tuple[str, ...] = PRESETS["ferry"]["actions"]
    plugins: tuple[str, ...] = PRESETS["ferry"]["plugins"]
    backfill: bool = True  # allocate: False is strict FIFO, stop at the first job that does not fit
    reservation_after_s: float | None = 1800.0  # reserve: a job waiting this long holds nodes (None: never)
    max_reserved_fraction: float = 0.25  # reserve: of GPU capacity held (the longest waiting always gets a hold)
    max_hold_doublings: int = 2  # reserve: a starving job's hold doubles per waiting period, this many times at most
    # starvation: a job still waiting this long after arrival, with a hold that has not drained (heavy-tailed
    # run times can keep any node busy for days), may evict the other queues' borrowed-capacity jobs that
    # overtook it (None: never). Only with its queue's reclaim right; victims get their grace to checkpoint.
    starvation_preempt_after_s: float | None = 6 * 3600.0
    preemption_attempts: int = 4  # preempt: victim searches per cycle
    preemption_retry_s: float = 30.0  # preempt: after a fruitless victim search a job waits this long
    victim_cooldown_s: float = 60.0  # protection: a job spared or evicted is not a victim again this soon
    min_runtime_s: float = 300.0  # protection: a job that started less than this ago is not a victim (no thrash)
    usage_half_life_s: float = 86400.0  # fair-over-time: recent GPU usage counts with this half-life
    # consolidate: at most this many movable jobs are told to move per cycle, and none again within the cooldown
    consolidation_moves_per_cycle: int = 4
    consolidation_cooldown_s: float = 3600.0
    # lend-holds: a job whose last run was evicted this recently does not start on loan on held nodes
    loan_cooldown_s: float = 3600.0
    # dependencies: a job whose dependency does not exist this long after it arrived can never start
    dependency_timeout_s: float = 600.0
    # las: levels of GPU-seconds received (coarse, so that jobs are not thrashed), and the promote knob: a job
    # that waited this many times as long as it ran since its last run counts afresh (None: never)
    las_thresholds_gpu_s: tuple[float, ...] = (3600.0, 36000.0)
    las_promote_knob: float | None = 2.0

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SchedulerConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def without_actions(self, *names: str) -> SchedulerConfig:
        return dataclasses.replace(self, actions=tuple(a for a in self.actions if a not in names))

    def __post_init__(self) -> None:
        if self.usage_half_life_s <= 0:
            raise ValueError(f"usage_half_life_s must be positive, got {self.usage_half_life_s}")
        if list(self.las_thresholds_gpu_s) != sorted(set(self.las_thresholds_gpu_s)) or any(
                t <= 0 for t in self.las_thresholds_gpu_s):
            raise ValueError(f"las_thresholds_gpu_s must be positive and increasing, got {self.las_thresholds_gpu_s}")
        if self.las_promote_knob is not None and self.las_promote_knob <= 0:
            raise ValueError(f"las_promote_knob must be positive, got {self.las_promote_knob}")
        if self.dependency_timeout_s < 0:
            raise ValueError(f"dependency_timeout_s must not be negative, got {self.dependency_timeout_s}")
        for kind, names, known in (("action", self.actions, ACTIONS), ("plugin", self.plugins, PLUGINS)):
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"unknown {kind}(s) {', '.join(unknown)}; known: {', '.join(known)}")
            if len(set(names)) != len(names):
                raise ValueError(f"a {kind} is named twice in {', '.join(names)}")


DELETED = "deleted"
OUTCOMES = 100_000  # ended jobs whose outcome the scheduler remembers for dependencies


def _remember(table: dict[str, Any], key: str, value: Any) -> None:
    """Record ``value`` as the newest entry, the oldest dropped beyond OUTCOMES."""
    table.pop(key, None)
    table[key] = value
    if len(table) > OUTCOMES:
        del table[next(iter(table))]


def _later(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _nowhere(name: str) -> JobPhase | None:
    return None


def shape_key(job: Job) -> ShapeKey:
    counts: dict[Request, int] = defaultdict(int)
    tasks = job.task_by_name
    for r in job.pending():
        counts[tasks[r.task].request] += 1
    return tuple(sorted(counts.items(), key=lambda kv: (kv[0].gpus, kv[0].gpu_milli, kv[0].cpu_milli, kv[0].mem_mib,
                                                         sorted(kv[0].models), kv[1])))


class Scheduler:
    def __init__(self, cluster: Cluster, config: SchedulerConfig | None = None, hooks: Hooks | None = None) -> None:
        self.cluster = cluster
        self.hooks: Hooks = hooks or GpuSecondsAccounting()
        self._born = cluster.now  # a job stopped before this was evicted under an earlier model (a restart)
        self.placer = Placer(cluster)
        self.cycles = 0
        # tier -> queue -> shape -> sorted [(order key, job)]
        self.pending: dict[int, dict[str, dict[ShapeKey, list[tuple[OrderKey, str]]]]] = {
            int(t): defaultdict(lambda: defaultdict(list)) for t in Tier}
        self._slot: dict[str, tuple[int, str, ShapeKey, OrderKey]] = {}
        self._slot_gpu: dict[str, int] = {}
        self.pending_gpu: dict[str, int] = defaultdict(int)  # queue -> GPU milli its pending replicas ask for
        self.reserved: dict[str, tuple[str, ...]] = {}  # job -> nodes held for it
        self.elastic: dict[str, None] = {}  # elastic jobs not yet ended, for growing
        self.on_loan: dict[str, None] = {}  # jobs running on loan on nodes held for others (lend-holds)
        # preemptor -> victims in WillEvict (dicts, not sets: iteration order must not depend on hashing)
        self.victims: dict[str, dict[str, None]] = defaultdict(dict)
        self._outside: CycleResult = CycleResult()  # decisions taken between cycles, reported by the next
        self._unstamped: dict[str, None] = {}  # jobs filed as waiting since the last cycle, their wait not yet dated
        # the workload node-order plugins plan for: replicas of the jobs held, by request (or what a
        # simulator says to expect), and how many changes it saw
        self._workload: Counter[Request] = Counter()
        self._workload_of: dict[str, Counter[Request]] = {}
        self._expected: Counter[Request] | None = None
        self.workload_changes = 0  # replicas added or removed since the start
        self.workload_replaced = 0  # how often :meth:`expect` changed what the workload is
        # how jobs the model no longer holds ended (for dependencies), oldest first, at most OUTCOMES kept;
        # an adapter that keeps the record elsewhere (a PodGroup's status) answers first
        self.outcomes: dict[str, JobPhase] = {}
        # evicted jobs' GPU-seconds received, when they stopped and when they were last told to move, for
        # their next run (same bound)
        self._served: dict[str, tuple[float, float, float | None]] = {}
        self.phase_elsewhere: Callable[[str], JobPhase | None] = _nowhere
        self.configure(config or SchedulerConfig())
        for job in cluster.jobs.values():
            self._adopt(job)
            self._count(job)
        for job in cluster.jobs.values():
            if job.phase is JobPhase.WILL_EVICT:
                self._adopt_notice(job)

    def configure(self, config: SchedulerConfig) -> None:
        """Apply a (new) configuration: plugins register anew; the model and decisions in flight stay."""
        if getattr(self, "config", None) == config:
            return
        self.config = config
        self.framework = Framework()
        self.plugins: list[Plugin] = [PLUGINS[name](self) for name in config.plugins]
        for plugin in self.plugins:
            plugin.register(self.framework)
        self.placer.reorder(self.framework)
        self.actions: list[Action] = [ACTIONS[name](self) for name in config.actions]
        if self._slot:  # the job order may have changed: re-sort the pending index
            for name in list(self._slot):
                self.index(self.cluster.jobs[name])

    # ------------------------------------------------------------ job intake
    def _adopt_notice(self, victim: Job) -> None:
        """A victim told to leave before this scheduler existed (a restart): its deadline stands, and a
        preemptor still waiting for it goes back to waiting for its victims rather than choosing anew."""
        preemptor = self.cluster.jobs.get(victim.will_evict_by or "")
        if preemptor is not None and preemptor.phase is JobPhase.PENDING:
            preemptor.phase = JobPhase.PRIVILEGED
        key = preemptor.name if preemptor is not None else f"restart:{victim.name}"
        self.victims[key][victim.name] = None

    def _adopt(self, job: Job) -> None:
        """Account a job already known to the cluster (e.g. bound pods found on restart)."""
        tasks = job.task_by_name
        for r in job.replicas:
            if r.phase is ReplicaPhase.BOUND and r.node is not None:
                node, devices = r.node, r.devices
                r.phase = ReplicaPhase.PENDING
                known = self.cluster.nodes.get(node)
                if known is None:  # bound to a node that is gone: it holds nothing here
                    r.phase = ReplicaPhase.BOUND
                    continue
                req = tasks[r.task].request
                if len(devices) != req.gpus or any(d >= len(known.devices) for d in devices):
                    devices = self.placer.pick_devices(known, req.gpus) or ()  # devices not recorded: assume free ones
                self.placer.bind(job, r, node, devices, strict=False)
        if job.bound() and job.phase is JobPhase.PENDING:
            job.phase = JobPhase.RUNNING
        # What an earlier model (before a restart, under another leader) decided and an adapter kept with the
        # job: a hold stands for a job still waiting, which had been passed over to get it; a job on loan
        # stays recallable by its holders.
        if job.reserved_nodes and job.name not in self.reserved:
            if job.phase is JobPhase.PENDING and not job.bound():
                self.reserved[job.name], job.bypassed = job.reserved_nodes, True
            else:
                job.reserved_nodes = ()
        if job.on_loan_from and job.phase.holds_resources:
            self.on_loan[job.name] = None
        if job.pending() and not job.phase.terminal:
            self.index(job)
        if job.tier is Tier.ELASTIC and not job.phase.terminal:
            self.elastic[job.name] = None

    def submit(self, job: Job) -> None:
        if job.name in self.cluster.jobs:
            raise ValueError(f"job {job.name} already exists")
        if job.queue not in self.cluster.queues:
            raise KeyError(f"job {job.name} names queue {job.queue!r}, which does not exist")
        self.cluster.jobs[job.name] = job
        served = self._served.get(job.name)
        if served is not None:  # a new run of an evicted job: what it had
            if served[0] > job.attained_gpu_s:
                job.attained_gpu_s, job.stopped_at = served[0], served[1]
            job.moved_at = _later(job.moved_at, served[2])
        self._adopt(job)
        self._count(job)

    # ------------------------------------------------------------- workload
    def _count(self, job: Job) -> None:
        self._uncount(job.name)
        if job.phase.terminal:
            return
        tasks = job.task_by_name
        counts = Counter(tasks[r.task].request for r in job.replicas)
        self._workload.update(counts)
        self._workload_of[job.name] = counts
        self.workload_changes += len(job.replicas)

    def _uncount(self, name: str) -> None:
        counts = self._workload_of.pop(name, None)
        if counts is not None:
            self._workload.subtract(counts)
            for req in counts:  # no entry for a request nobody holds any more (shapes come and go)
                if self._workload[req] <= 0:
                    del self._workload[req]
            self.workload_changes += counts.total()

    def workload(self) -> Counter[Request]:
        """Replicas by request: of the jobs held (running or pending), or what :meth:`expect` said."""
        return self._expected if self._expected is not None else self._workload

    def expect(self, workload: Counter[Request] | None) -> None:
        """Plan placements for this distribution of replicas instead of the jobs held (a simulator that
        knows its trace, as FGD's method does); None: the jobs held again."""
        self._expected = workload
        self.workload_replaced += 1

    def replace(self, job: Job) -> None:
        """A job whose spec or members changed (e.g. an informer delta) takes the place of the one of the same
        name, keeping what the scheduler knows of it: its start, its preemption and backfill history, a
        notice it was given or a preemptor's wait, its hold. A job that had ended comes back as a new run."""
        old = self.cluster.jobs[job.name]
        for r in old.replicas:
            if r.phase is ReplicaPhase.BOUND:
                self.placer.release(old, r, ReplicaPhase.PENDING)
        self.unindex(job.name)
        self.elastic.pop(job.name, None)
        job.last_victim_cycle, job.last_victim_at = old.last_victim_cycle, old.last_victim_at
        job.evictions = old.evictions
        if old.attained_gpu_s > job.attained_gpu_s:
            job.attained_gpu_s, job.stopped_at = old.attained_gpu_s, old.stopped_at
        job.moved_at = _later(job.moved_at, old.moved_at)  # consolidation's cooldown outlives a run
        job.promoted_at = _later(job.promoted_at, old.promoted_at)
        if not old.phase.terminal:
            job.bypassed, job.preempt_retry_at = old.bypassed, old.preempt_retry_at
            job.search_verdict = old.search_verdict
            job.waiting_since = old.waiting_since
            job.on_loan_from = old.on_loan_from
            if old.start_time is not None and (job.start_time is None or old.start_time < job.start_time):
                job.start_time = old.start_time
            bound = any(r.phase is ReplicaPhase.BOUND for r in job.replicas)
            if old.phase is JobPhase.WILL_EVICT and bound:  # the model's notice, not the annotations' copy
                job.phase, job.will_evict_deadline, job.will_evict_by = (JobPhase.WILL_EVICT, old.will_evict_deadline,
                                                                        old.will_evict_by)
            elif job.phase is JobPhase.WILL_EVICT and old.phase is not JobPhase.WILL_EVICT:  # cancelled meanwhile
                job.phase, job.will_evict_deadline, job.will_evict_by = JobPhase.PENDING, None, None
            elif old.phase is JobPhase.PRIVILEGED and not bound:
                job.phase = JobPhase.PRIVILEGED
            job.reserved_nodes = self.reserved.get(job.name, ())
        self.cluster.jobs[job.name] = job
        self._adopt(job)
        self._count(job)

    def forget_node(self, name: str) -> None:
        """A node that is gone (its jobs are to be replaced: bound there, they hold nothing here)."""
        self.placer.forget(name)
        self.cluster.nodes.pop(name, None)

    def index(self, job: Job) -> None:
        """(Re-)file a job with pending replicas under its tier, queue, shape and order."""
        self.unindex(job.name)
        slot = (int(job.tier), job.queue, shape_key(job), self.framework.job_key(job))
        bisect.insort(self.pending[slot[0]][slot[1]][slot[2]], (slot[3], job.name))
        self._slot[job.name] = slot
        if job.waiting_since is None:
            self._unstamped[job.name] = None
        demand = job.gpu_demand()
        self._slot_gpu[job.name] = demand
        self.pending_gpu[job.queue] += demand

    def unindex(self, name: str) -> None:
        slot = self._slot.pop(name, None)
        if slot is None:
            return
        tier, queue, shape, key = slot
        self.pending_gpu[queue] -= self._slot_gpu.pop(name, 0)
        group = self.pending[tier][queue][shape]
        i = bisect.bisect_left(group, (key, name))
        if i < len(group) and group[i] == (key, name):
            del group[i]
        if not group:
            del self.pending[tier][queue][shape]
            if not self.pending[tier][queue]:
                del self.pending[tier][queue]

    def smallest_pending_gpu(self, tier: int, queue: str) -> int:
        """GPU milli of the smallest job ``queue`` has waiting in ``tier``: the least it would take next."""
        shapes = self.pending[tier].get(queue)
        if not shapes:
            return 0
        return min(sum(req.gpu_total * n for req, n in shape) for shape in shapes)

    def phase_of(self, name: str) -> JobPhase | None:
        """A job's phase: the model's while it holds the job, else the adapter's record, else how it
        ended here; None for a job never seen."""
        job = self.cluster.jobs.get(name)
        if job is not None:
            return job.phase
        return self.phase_elsewhere(name) or self.outcomes.get(name)

    def pending_jobs(self) -> Iterator[Job]:
        for name in self._slot:
            yield self.cluster.jobs[name]

    def head(self, tier: int, queue: str, skip_shapes: set[ShapeKey], tried: set[str],
             holders: Iterable[str] = ()) -> tuple[OrderKey, str, ShapeKey] | None:
        """The first job of ``queue`` in order, over its shapes (each shape's list is sorted). A shape passed
        over (a job of it did not fit) still yields its ``holders``, jobs of the queue that hold nodes: a
        holder may start on its own held nodes, which every other job of its shape must keep off."""
        best: tuple[OrderKey, str, ShapeKey] | None = None
        for shape, group in self.pending[tier].get(queue, {}).items():
            if shape in skip_shapes:
                continue
            for key, name in group:
                if name in tried:
                    continue
                if best is None or key < best[0]:
                    best = (key, name, shape)
                break
        for name in holders:
            slot = self._slot.get(name)  # None once it started
            if (slot is not None and slot[0] == tier and slot[2] in skip_shapes and name not in tried
                    and (best is None or slot[3] < best[0])):
                best = (slot[3], name, slot[2])
        return best

    # ------------------------------------------------------------ job events
    def replica_done(self, job_name: str, task: str, index: int, phase: ReplicaPhase) -> JobPhase:
        job = self.cluster.jobs[job_name]
        replica = next(r for r in job.replicas if r.task == task and r.index == index)
        if replica.phase is not ReplicaPhase.BOUND:
            return job.phase
        outcome = on_replica_done(job, task, index, phase)
        self.placer.release(job, replica, phase)
        by_key = {(r.task, r.index): r for r in job.replicas}
        for key in outcome.release:
            self.placer.release(job, by_key[key], ReplicaPhase.EVICTED)
        for key in outcome.restart:
            r = by_key[key]
            r.phase, r.restarts = ReplicaPhase.PENDING, r.restarts + 1
        if outcome.job_phase.terminal:
            self._end(job, outcome.job_phase, outcome.reason)
        elif outcome.restart:
            self.index(job)
        return job.phase

    def finish(self, job_name: str, phase: JobPhase = JobPhase.SUCCEEDED, reason: str = "") -> None:
        """The whole job ended (simulators; or every pod of it is gone)."""
        job = self.cluster.jobs[job_name]
        rphase = {JobPhase.SUCCEEDED: ReplicaPhase.SUCCEEDED, JobPhase.FAILED: ReplicaPhase.FAILED}.get(
            phase, ReplicaPhase.EVICTED)
        for r in job.replicas:
            if r.phase in (ReplicaPhase.BOUND, ReplicaPhase.PENDING):
                self.placer.release(job, r, rphase)
        self._end(job, phase, reason)

    def remove(self, job_name: str) -> None:
        """Forget a job (deleted, or ended and reported)."""
        job = self.cluster.jobs.get(job_name)
        if job is None:
            return
        if not job.phase.terminal:
            self.finish(job_name, JobPhase.FAILED, DELETED)
        del self.cluster.jobs[job_name]

    def _end(self, job: Job, phase: JobPhase, reason: str) -> None:
        was_running = job.phase.holds_resources
        job.phase, job.reason = phase, reason
        if phase in (JobPhase.SUCCEEDED, JobPhase.FAILED) and reason != DELETED:  # deleted: nobody knows
            self._served.pop(job.name, None)
            _remember(self.outcomes, job.name, phase)
        self._uncount(job.name)
        self.unindex(job.name)
        self.elastic.pop(job.name, None)
        self.on_loan.pop(job.name, None)
        self.reserved.pop(job.name, None)
        job.reserved_nodes = ()
        for victim in self.victims.pop(job.name, {}):
            self.cancel_victim(victim, f"preemptor {job.name} ended", self._outside)
        if was_running:
            self.hooks.on_end(job, self.cluster.now)

    # ----------------------------------------------------------- node events
    def add_node(self, node: Node) -> None:
        self.cluster.nodes[node.name] = node
        self.placer.refresh([node.name])

    def node_changed(self, name: str) -> None:
        self.placer.refresh([name])

    # ----------------------------------------------------------------- cycle
    def cycle(self, now: float) -> CycleResult:
        self.cycles += 1
        self.cluster.now = now
        result, self._outside = self._outside, CycleResult()
        ssn = Session(self, now, result)
        self._date_waits(now)
        for _, prepare in self.framework.session_open:
            prepare(ssn)
        self._evict_due(now, result)
        for action in self.actions:
            action.execute(ssn)
        self._cancel_needless(result)
        jobs = self.cluster.jobs
        for name in result.pending_reasons:  # what a later action said of a job allocate looked at stands
            job = jobs.get(name)
            if job is not None and job.phase is JobPhase.PENDING and job.reason:
                result.pending_reasons[name] = job.reason
        return result

    def _date_waits(self, now: float) -> None:
        """Date the waits of jobs filed since the last cycle. One not evicted here began waiting when it
        arrived (``submit_time``: its pods' creation, so also a job whose earlier run ended before a restart,
        and one that waited while the scheduler was down or another was leading) or, if later, when an
        earlier model evicted it (``stopped_at`` kept by the adapter); one evicted here began now — dated at
        the cycle, not when filed, because between cycles the model's clock is the last cycle's. Costs what
        arrived, not what waits."""
        jobs = self.cluster.jobs
        for name in self._unstamped:
            job = jobs.get(name)
            if job is None or job.waiting_since is not None or job.phase not in (JobPhase.PENDING,
                                                                                 JobPhase.PRIVILEGED):
                continue
            stopped = job.stopped_at
            if stopped is not None and stopped >= self._born:
                job.waiting_since = now
            else:
                returned = job.submit_time if stopped is None else max(job.submit_time, stopped)
                job.waiting_since = min(now, returned)
        self._unstamped.clear()

    def due(self, result: CycleResult) -> set[float]:
        """The moments after ``result``'s cycle at which a rule that waits for time may decide differently
        with nothing else changed: the notified victims' deadlines, and what the enabled actions and
        plugins report for each job the cycle looked at (the framework's ``due`` extension point: a
        preemptor delay's end, the next victim search, a reservation's next period, ...). The service
        cycles every period and needs none of this; a simulator that cycles only on arrivals and
        completions cycles at these moments too, as the service would."""
        now, jobs = self.cluster.now, self.cluster.jobs
        out = {d.deadline for d in result.decisions if isinstance(d, NotifyWillEvict)}
        waiting = [job for name in result.pending_reasons
                   if (job := jobs.get(name)) is not None and job.phase is JobPhase.PENDING]
        for action in self.actions:
            out.update(action.due(waiting, now))
        for _, fn in self.framework.due:
            out.update(fn(waiting, now))
        return {t for t in out if t > now}

    def reasons(self, result: CycleResult) -> dict[str, str]:
        """Why every pending job waits after ``result``'s cycle: those it looked at, and those it passed over
        because one like them (same queue and request) did not fit. Apart from the cycle, which never pays
        for it: only the service writes every job's reason (a simulator need not)."""
        out = dict(result.pending_reasons)
        jobs = self.cluster.jobs
        for (tier, queue, shape), why in result.passed_over.items():
            by_queue = self.pending.get(tier, {})
            groups = (list(by_queue.get(queue, {}).get(shape, ())) if queue
                      else [entry for shapes in by_queue.values() for group in shapes.values() for entry in group])
            for _, name in groups:
                if name not in out and jobs[name].phase is JobPhase.PENDING:
                    out[name] = why
        if self.framework.job_note:  # what ordered it behind others, where a plugin says so
            for name, why in out.items():
                job = jobs.get(name)
                note = self.framework.note(job) if job is not None and job.phase is JobPhase.PENDING else ""
                if note:
                    out[name] = f"{why}; {note}"
        return out

    def _evict_due(self, now: float, result: CycleResult) -> None:
        """Victims whose grace ran out are evicted."""
        for preemptor, victims in list(self.victims.items()):
            for name in list(victims):
                victim = self.cluster.jobs.get(name)
                if victim is None or victim.phase is not JobPhase.WILL_EVICT:
                    victims.pop(name, None)
                    continue
                if victim.will_evict_deadline is not None and now >= victim.will_evict_deadline:
                    self._evict(victim, f"preempted by {preemptor}", result)
                    victims.pop(name, None)
            if not victims:
                del self.victims[preemptor]

    def _evict(self, job: Job, reason: str, result: CycleResult) -> None:
        ran = tuple((r.task, r.index, r.node or "") for r in job.replicas if r.phase is ReplicaPhase.BOUND)
        job.attained_gpu_s, job.stopped_at = job.attained(self.cluster.now), self.cluster.now
        _remember(self._served, job.name, (job.attained_gpu_s, self.cluster.now, job.moved_at))  # its next run's
        for r in job.replicas:
            if r.phase in (ReplicaPhase.BOUND, ReplicaPhase.PENDING):
                self.placer.release(job, r, ReplicaPhase.EVICTED)
        job.evictions += 1
        job.will_evict_deadline = None
        self._end(job, JobPhase.EVICTED, reason)
        result.decisions.append(Evict(job.name, reason, ran, job.attained_gpu_s, job.moved_at))

    def cancel_victim(self, name: str, reason: str, result: CycleResult) -> None:
        victim = self.cluster.jobs.get(name)
        if victim is None or victim.phase is not JobPhase.WILL_EVICT:
            return
        victim.phase, victim.will_evict_deadline, victim.will_evict_by = JobPhase.RUNNING, None, None
        victim.last_victim_cycle = self.cycles
        victim.last_victim_at = self.cluster.now
        victim.reason = ""
        result.decisions.append(CancelEviction(name, reason))

    def _cancel_needless(self, result: CycleResult) -> None:
        """A preemptor that started without its victims' capacity releases them."""
        for preemptor, victims in list(self.victims.items()):
            job = self.cluster.jobs.get(preemptor)
            if (job is not None and job.phase is JobPhase.PRIVILEGED) or preemptor.startswith("restart:"):
                continue  # still waiting; or notices given before a restart, which are honoured
            for name in victims:
                self.cancel_victim(name, f"capacity for {preemptor} freed up elsewhere", result)
            del self.victims[preemptor]

    # -------------------------------------------------- shared by the actions
    def reserved_nodes(self, except_job: str | None = None, starving_only: bool = False) -> frozenset[str]:
        """Nodes held for jobs (other than ``except_job``, whose own holds are never excluded for it)."""
        own = set(self.reserved.get(except_job, ())) if except_job else set()
        jobs = self.cluster.jobs
        return frozenset(n for j, nodes in self.reserved.items()
                         if j != except_job and not (starving_only and jobs[j].phase is JobPhase.PRIVILEGED)
                         for n in nodes if n not in own)

    def hold(self, job: Job, nodes: tuple[str, ...]) -> None:
        self.reserved[job.name] = nodes
        job.reserved_nodes = nodes

    def unhold(self, job: Job) -> None:
        self.reserved.pop(job.name, None)
        job.reserved_nodes = ()

    @staticmethod
    def gang_part(job: Job) -> list[Replica]:
        """The pending replicas that complete the gang's minimum (all of them for a rigid gang)."""
        missing = max(0, job.gang_size - len(job.bound()))
        return job.pending()[:missing]

    def started(self, job: Job, placed: list[Placement], now: float, result: CycleResult, note: str = "") -> None:
        """Report a job's placed replicas; a job that was waiting is now running (``note``: what its user
        should know of how it runs, e.g. on loan)."""
        was = job.phase
        self.unindex(job.name)
        self.unhold(job)
        job.reason = ""
        for p in placed:
            result.decisions.append(Bind(job.name, p.replica.task, p.replica.index, p.node, p.devices))
        if job.pending():
            self.index(job)
        if was in (JobPhase.PENDING, JobPhase.PRIVILEGED):
            job.phase = JobPhase.RUNNING
            job.start_time = now
            job.waiting_since = None
            result.placed_jobs += 1
            status = f"all members bound; {note}" if note else "all members bound"
            result.decisions.append(JobStatus(job.name, JobPhase.RUNNING.value, status))
            self.hooks.on_start(job, now)
