"""The scheduling cycle: timers → allocate (fair share, gangs, backfill) → reserve → reclaim/preempt → grow.

:class:`Scheduler` owns the cluster model between cycles (jobs arrive with :meth:`submit`, end with
:meth:`replica_done` / :meth:`finish`, leave with :meth:`remove`) and keeps indexes that make a
cycle cost proportional to what changes, not to the number of pending jobs. Ordering policy is in
overridable methods (``queue_key``, ``queue_blocked``), the extension points baselines use.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from scheduler.core.decisions import (
    Bind,
    CancelEviction,
    CycleResult,
    Evict,
    JobStatus,
    NotifyWillEvict,
    Shrink,
)
from scheduler.core.lifecycle import GpuSecondsAccounting, Hooks, on_replica_done
from scheduler.core.model import (
    Cluster,
    Job,
    JobPhase,
    Node,
    Queue,
    Replica,
    ReplicaPhase,
    Request,
    Tier,
)
from scheduler.core.placement import Placement, Placer

ShapeKey = tuple[tuple[Request, int], ...]
OrderKey = tuple[int, int, float, str]


@dataclass
class SchedulerConfig:
    fair_share: bool = True  # order queues by share of their guarantee; False: one global FIFO order
    backfill: bool = True  # False: strict FIFO, stop at the first job that does not fit
    reservation_after_s: float | None = 1800.0  # a job waiting this long reserves nodes (None: never)
    max_reserved_fraction: float = 0.25  # of GPU capacity held for starving jobs (the longest waiting always gets one)
    max_hold_doublings: int = 2  # a starving job's hold doubles per waiting period, this many times at most
    # A job still waiting this long after arrival, with a hold that has not drained (heavy-tailed run times
    # can keep any node busy for days), may evict the other queues' borrowed-capacity jobs that overtook it
    # (None: never). Only with its queue's reclaim right; victims get their grace to checkpoint.
    starvation_preempt_after_s: float | None = 6 * 3600.0
    reclaim: bool = True
    preempt: bool = True
    grow_elastic: bool = True
    preemption_attempts: int = 4  # per cycle, bounds the victim search
    victim_cooldown_s: float = 60.0
    min_runtime_s: float = 300.0  # a job that started less than this ago is not a victim (no thrash)
    preemption_retry_s: float = 30.0  # after a fruitless victim search a job waits this long to search again


def order_key(job: Job) -> OrderKey:
    return (-int(job.tier), -job.priority, job.submit_time, job.name)


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
        self.config = config or SchedulerConfig()
        self.hooks: Hooks = hooks or GpuSecondsAccounting()
        self.placer = Placer(cluster)
        self.cycles = 0
        # tier -> queue -> shape -> sorted [(order key, job)]
        self._pending: dict[int, dict[str, dict[ShapeKey, list[tuple[OrderKey, str]]]]] = {
            int(t): defaultdict(lambda: defaultdict(list)) for t in Tier}
        self._slot: dict[str, tuple[int, str, ShapeKey, OrderKey]] = {}
        self._slot_gpu: dict[str, int] = {}
        self.pending_gpu: dict[str, int] = defaultdict(int)  # queue -> GPU milli its pending replicas ask for
        self._reserved: dict[str, tuple[str, ...]] = {}  # job -> nodes held for it
        self._elastic: dict[str, None] = {}  # elastic jobs not yet ended, for growing
        # preemptor -> victims in WillEvict (dicts, not sets: iteration order must not depend on hashing)
        self._victims: dict[str, dict[str, None]] = defaultdict(dict)
        self._outside: CycleResult = CycleResult()  # decisions taken between cycles, reported by the next
        self._claims: dict[str, int] = {}
        self._doomed: dict[str, int] = {}  # queue -> GPU milli of its jobs already told to leave
        self._never: dict[Request, str | None] = {}  # per cycle: why a request fits no node at all
        for job in cluster.jobs.values():
            self._adopt(job)
        for job in cluster.jobs.values():
            if job.phase is JobPhase.WILL_EVICT:
                self._adopt_notice(job)

    # ------------------------------------------------------------ job intake
    def _adopt_notice(self, victim: Job) -> None:
        """A victim told to leave before this scheduler existed (a restart): its deadline stands, and a
        preemptor still waiting for it goes back to waiting for its victims rather than choosing anew."""
        preemptor = self.cluster.jobs.get(victim.will_evict_by or "")
        if preemptor is not None and preemptor.phase is JobPhase.PENDING:
            preemptor.phase = JobPhase.PRIVILEGED
        key = preemptor.name if preemptor is not None else f"restart:{victim.name}"
        self._victims[key][victim.name] = None

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
                self.placer.bind(job, r, node, devices)
        if job.bound() and job.phase is JobPhase.PENDING:
            job.phase = JobPhase.RUNNING
        if job.pending() and not job.phase.terminal:
            self._index(job)
        if job.tier is Tier.ELASTIC and not job.phase.terminal:
            self._elastic[job.name] = None

    def submit(self, job: Job) -> None:
        if job.name in self.cluster.jobs:
            raise ValueError(f"job {job.name} already exists")
        if job.queue not in self.cluster.queues:
            raise KeyError(f"job {job.name} names queue {job.queue!r}, which does not exist")
        self.cluster.jobs[job.name] = job
        self._adopt(job)

    def _index(self, job: Job) -> None:
        self._unindex(job.name)
        slot = (int(job.tier), job.queue, shape_key(job), order_key(job))
        bisect.insort(self._pending[slot[0]][slot[1]][slot[2]], (slot[3], job.name))
        self._slot[job.name] = slot
        demand = job.gpu_demand()
        self._slot_gpu[job.name] = demand
        self.pending_gpu[job.queue] += demand

    def _unindex(self, name: str) -> None:
        slot = self._slot.pop(name, None)
        if slot is None:
            return
        tier, queue, shape, key = slot
        self.pending_gpu[queue] -= self._slot_gpu.pop(name, 0)
        group = self._pending[tier][queue][shape]
        i = bisect.bisect_left(group, (key, name))
        if i < len(group) and group[i] == (key, name):
            del group[i]
        if not group:
            del self._pending[tier][queue][shape]
            if not self._pending[tier][queue]:
                del self._pending[tier][queue]

    def pending_jobs(self) -> Iterator[Job]:
        for name in self._slot:
            yield self.cluster.jobs[name]

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
            self._index(job)
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
            self.finish(job_name, JobPhase.FAILED, "deleted")
        del self.cluster.jobs[job_name]

    def _end(self, job: Job, phase: JobPhase, reason: str) -> None:
        was_running = job.phase.holds_resources
        job.phase, job.reason = phase, reason
        self._unindex(job.name)
        self._elastic.pop(job.name, None)
        self._reserved.pop(job.name, None)
        job.reserved_nodes = ()
        for victim in self._victims.pop(job.name, {}):
            self._cancel_victim(victim, f"preemptor {job.name} ended", self._outside)
        if was_running:
            self.hooks.on_end(job, self.cluster.now)

    # ----------------------------------------------------------- node events
    def add_node(self, node: Node) -> None:
        self.cluster.nodes[node.name] = node
        self.placer = Placer(self.cluster) if len(node.devices) > self.placer.max_gpus else self.placer
        self.placer.refresh([node.name])

    def node_changed(self, name: str) -> None:
        self.placer.refresh([name])

    # --------------------------------------------------------------- policy
    def queue_key(self, queue: Queue, tier: int) -> tuple[float, ...]:
        """Queues below their guarantee first (least served first), then borrowers by weighted use."""
        if not self.config.fair_share:
            head = self._head(tier, queue.name, set(), set())
            return (0.0, *(head[0][:3] if head else (0, 0, float("inf"))))
        capacity = max(self.placer.capacity, 1)
        if queue.guaranteed_gpu > 0 and queue.allocated_gpu < queue.guaranteed_gpu:
            return (0.0, queue.allocated_gpu / queue.guaranteed_gpu)
        return (1.0, queue.allocated_gpu / (max(queue.weight, 1e-9) * capacity))

    def queue_blocked(self, queue: Queue, job: Job) -> str | None:
        """Why ``job`` may not start in ``queue`` now, or None."""
        if queue.max_gpu is not None and queue.allocated_gpu + job.gpu_demand() > queue.max_gpu:
            return (f"queue {queue.name} would exceed its maximum of {queue.max_gpu / 1000:g} GPUs "
                    f"({queue.allocated_gpu / 1000:g} in use, job needs {job.gpu_demand() / 1000:g})")
        return None

    # ------------------------------------------------------------- carry-over
    def carry_over(self, previous: Scheduler) -> None:
        """Take over the decisions in flight of the scheduler that ran the previous cycle on an older
        snapshot of the same cluster (services rebuild the model from their caches every cycle): victims
        and their deadlines, preemptors, holds, and each job's preemption and backfill history."""
        self.cycles = previous.cycles
        jobs = self.cluster.jobs
        for name, old in previous.cluster.jobs.items():
            job = jobs.get(name)
            if job is None or job.phase.terminal:
                continue
            job.last_victim_cycle, job.last_victim_at = old.last_victim_cycle, old.last_victim_at
            job.bypassed, job.preempt_retry_at = old.bypassed, old.preempt_retry_at
            job.privileged_since = old.privileged_since
            if old.phase is JobPhase.WILL_EVICT and job.phase is JobPhase.RUNNING:
                job.phase, job.will_evict_deadline = JobPhase.WILL_EVICT, old.will_evict_deadline
                job.will_evict_by = old.will_evict_by
            elif old.phase is JobPhase.PRIVILEGED and job.phase is JobPhase.PENDING:
                job.phase = JobPhase.PRIVILEGED
        for name, nodes in previous._reserved.items():
            if name in jobs and not jobs[name].phase.terminal and jobs[name].pending():
                self._reserved[name] = tuple(n for n in nodes if n in self.cluster.nodes)
                jobs[name].reserved_nodes = self._reserved[name]
        for preemptor, victims in previous._victims.items():
            if preemptor in jobs or preemptor.startswith("restart:"):
                for v in victims:
                    if v in jobs and jobs[v].phase is JobPhase.WILL_EVICT:
                        self._victims[preemptor][v] = None

    # ----------------------------------------------------------------- cycle
    def cycle(self, now: float) -> CycleResult:
        self.cycles += 1
        self.cluster.now = now
        result, self._outside = self._outside, CycleResult()
        self._never.clear()
        self._timers(now, result)
        for tier in (Tier.GUARANTEED, Tier.ELASTIC):
            self._allocate(int(tier), now, result)
        if self.config.reservation_after_s is not None:
            self._reserve(now)
        if self.config.reclaim or self.config.preempt:
            self._preempt(now, result)
        if self.config.grow_elastic:
            self._grow(result)
        self._cancel_needless(result)
        return result

    # timers: victims whose grace ran out are evicted
    def _timers(self, now: float, result: CycleResult) -> None:
        for preemptor, victims in list(self._victims.items()):
            for name in list(victims):
                victim = self.cluster.jobs.get(name)
                if victim is None or victim.phase is not JobPhase.WILL_EVICT:
                    victims.pop(name, None)
                    continue
                if victim.will_evict_deadline is not None and now >= victim.will_evict_deadline:
                    self._evict(victim, f"preempted by {preemptor}", result)
                    victims.pop(name, None)
            if not victims:
                del self._victims[preemptor]

    def _evict(self, job: Job, reason: str, result: CycleResult) -> None:
        ran = tuple((r.task, r.index, r.node or "") for r in job.replicas if r.phase is ReplicaPhase.BOUND)
        for r in job.replicas:
            if r.phase in (ReplicaPhase.BOUND, ReplicaPhase.PENDING):
                self.placer.release(job, r, ReplicaPhase.EVICTED)
        job.evictions += 1
        job.will_evict_deadline = None
        self._end(job, JobPhase.EVICTED, reason)
        result.decisions.append(Evict(job.name, reason, ran))

    def _cancel_victim(self, name: str, reason: str, result: CycleResult) -> None:
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
        for preemptor, victims in list(self._victims.items()):
            job = self.cluster.jobs.get(preemptor)
            if (job is not None and job.phase is JobPhase.PRIVILEGED) or preemptor.startswith("restart:"):
                continue  # still waiting; or notices given before a restart, which are honoured
            for name in victims:
                self._cancel_victim(name, f"capacity for {preemptor} freed up elsewhere", result)
            del self._victims[preemptor]

    # allocate: fair order across queues, priority/age within, all-or-nothing gangs, backfill
    def _head(self, tier: int, queue: str, skip_shapes: set[ShapeKey],
              tried: set[str]) -> tuple[OrderKey, str, ShapeKey] | None:
        best: tuple[OrderKey, str, ShapeKey] | None = None
        for shape, group in self._pending[tier].get(queue, {}).items():
            if shape in skip_shapes:
                continue
            for key, name in group:
                if name in tried:
                    continue
                if best is None or key < best[0]:
                    best = (key, name, shape)
                break
        return best

    def reserved_nodes(self, except_job: str | None = None, starving_only: bool = False) -> frozenset[str]:
        """Nodes held for jobs (other than ``except_job``, whose own holds are never excluded for it)."""
        own = set(self._reserved.get(except_job, ())) if except_job else set()
        jobs = self.cluster.jobs
        return frozenset(n for j, nodes in self._reserved.items()
                         if j != except_job and not (starving_only and jobs[j].phase is JobPhase.PRIVILEGED)
                         for n in nodes if n not in own)

    def _allocate(self, tier: int, now: float, result: CycleResult) -> None:
        queues = self.cluster.queues
        pending = self._pending[tier]
        if not pending:
            return
        blocked_all = frozenset(self.reserved_nodes())
        unfit_shapes: set[ShapeKey] = set()  # with the shared reservations excluded, nothing of this shape fits
        queue_skip: dict[str, set[ShapeKey]] = defaultdict(set)
        tried: set[str] = set()
        unfit: list[Job] = []  # failed this cycle: a smaller job starting after them bypasses them
        heap = [(self.queue_key(queues[q], tier), q) for q in pending]
        heapq.heapify(heap)
        while heap:
            key, qname = heapq.heappop(heap)
            queue = queues[qname]
            if key != self.queue_key(queue, tier):
                heapq.heappush(heap, (self.queue_key(queue, tier), qname))
                continue
            head = self._head(tier, qname, unfit_shapes | queue_skip[qname], tried)
            if head is None:
                continue
            _, name, shape = head
            job = self.cluster.jobs[name]
            result.attempts += 1
            why = self.queue_blocked(queue, job)
            placed: list[Placement] | None = None
            if why is None:
                own = name in self._reserved
                privileged = job.phase is JobPhase.PRIVILEGED
                # A preemptor competes for its victims' capacity with other preemptors, as its victim
                # search assumed; everyone else keeps off every hold.
                excluded = (self.reserved_nodes(except_job=name, starving_only=privileged) if own
                            else blocked_all)
                placed = self._place(job, excluded)
                if placed is None:
                    why = self._why_unfit(job, bool(excluded))
                    if own:
                        tried.add(name)
                    else:
                        unfit_shapes.add(shape)
                    if privileged and not self._victims.get(name):
                        # its victims are gone and it still does not fit: search again next cycle
                        job.phase = JobPhase.PENDING
                        self._reserved.pop(name, None)
                        job.reserved_nodes = ()
                    elif privileged:
                        victims = list(self._victims[name])
                        why = (f"preempting: waiting for {len(victims)} job(s) to leave at the end of their "
                               f"grace period ({', '.join(victims[:3])}{', ...' if len(victims) > 3 else ''})")
            else:
                queue_skip[qname].add(shape)
            if placed is not None:
                self._started(job, placed, now, result)
                demand = job.min_gpu()
                for f in unfit:
                    if f.min_gpu() > demand:
                        f.bypassed = True
            else:
                if len(unfit) < 64 and why is not None and not why.startswith("queue"):
                    unfit.append(job)
                job.reason = why or ""
                result.pending_reasons[name] = job.reason
                if not self.config.backfill:
                    return  # strict FIFO: nothing may pass the first job that does not fit
            heapq.heappush(heap, (self.queue_key(queue, tier), qname))

    def _gang_part(self, job: Job) -> list[Replica]:
        """The pending replicas that complete the gang's minimum (all of them for a rigid gang)."""
        missing = max(0, job.gang_size - len(job.bound()))
        return job.pending()[:missing]

    def _place(self, job: Job, excluded: frozenset[str]) -> list[Placement] | None:
        """The gang's minimum all-or-nothing, then any replicas beyond it one by one, as room allows."""
        pending = job.pending()
        core = self._gang_part(job)
        placed: list[Placement] = []
        if core:
            got = self.placer.place_gang(job, core, excluded)
            if got is None:
                return None
            placed += got
        for replica in pending[len(core):]:
            extra = self.placer.place_gang(job, [replica], excluded)
            if extra:
                placed += extra
        return placed or None

    def _never_fits(self, req: Request) -> str | None:
        """Why no node of the cluster could host ``req`` even if it were empty, or None."""
        nodes = [n for n in self.cluster.nodes.values() if n.schedulable]
        if not nodes:
            return "no schedulable node"
        if not any(len(n.devices) >= req.gpus for n in nodes):
            return f"no node has {req.gpus} GPUs (the largest has {max(len(n.devices) for n in nodes)})"
        if not any(n.cpu_milli >= req.cpu_milli and n.mem_mib >= req.mem_mib for n in nodes):
            return f"no node has {req.cpu_milli}m CPU and {req.mem_mib} MiB memory"
        if req.models and not any(n.model in req.models for n in nodes):
            return f"no node has a GPU of model {' or '.join(sorted(req.models))}"
        if req.selector and not any(all(n.labels.get(k) == v for k, v in req.selector) for n in nodes):
            wanted = ",".join(f"{k}={v}" for k, v in sorted(req.selector))
            return f"no node matches the node selector {wanted}"
        return None

    def _why_unfit(self, job: Job, reservations: bool) -> str:
        tasks = job.task_by_name
        need = [tasks[r.task].request for r in job.pending()]
        for req in set(need):
            if req not in self._never:  # node capacities do not change within a cycle
                self._never[req] = self._never_fits(req)
            never = self._never[req]
            if never is not None:
                return f"cannot be scheduled: {never}"
        gpus = sum(r.gpu_total for r in need) / 1000
        biggest = max((r.gpus for r in need), default=0)
        largest = self.placer.max_free_whole()
        msg = (f"waiting for capacity: gang of {len(need)} replica(s) needs {gpus:g} GPUs all at once "
               f"(largest replica {biggest} GPU(s) on one node; largest free block now {largest})")
        if reservations:
            msg += "; some nodes are held for a longer-waiting job"
        return msg

    def _started(self, job: Job, placed: list[Placement], now: float, result: CycleResult) -> None:
        was = job.phase
        self._unindex(job.name)
        self._reserved.pop(job.name, None)
        job.reserved_nodes = ()
        job.reason = ""
        for p in placed:
            result.decisions.append(Bind(job.name, p.replica.task, p.replica.index, p.node, p.devices))
        if job.pending():
            self._index(job)
        if was in (JobPhase.PENDING, JobPhase.PRIVILEGED):
            job.phase = JobPhase.RUNNING
            job.start_time = now
            job.privileged_since = None
            result.placed_jobs += 1
            result.decisions.append(JobStatus(job.name, JobPhase.RUNNING.value, "all members bound"))
            self.hooks.on_start(job, now)

    # reservation: a job that waited too long holds nodes until they drain for it
    def _reserve(self, now: float) -> None:
        """Jobs that waited past the threshold while smaller jobs passed them (longest first) hold the
        nodes that should drain soonest. A job nobody passes needs no hold: it gets the next capacity.

        Holds are recomputed every cycle: held nodes get no new work, so they only get emptier and
        normally stay chosen; a node stuck behind a long job is swapped for one that drains sooner."""
        cfg = self.config
        assert cfg.reservation_after_s is not None
        previous = {j: self._reserved.pop(j) for j in list(self._reserved)
                    if self.cluster.jobs[j].phase is not JobPhase.PRIVILEGED}
        for name in previous:
            self.cluster.jobs[name].reserved_nodes = ()
        starving: list[tuple[OrderKey, str]] = []
        for tier in self._pending.values():
            for groups in tier.values():
                for group in groups.values():
                    for key, name in group[:3]:
                        job = self.cluster.jobs[name]
                        if now - job.submit_time < cfg.reservation_after_s:
                            break
                        if job.phase is JobPhase.PENDING and job.bypassed:
                            starving.append(((key[0], key[1], job.submit_time, name), name))
        if not starving:
            return
        capacity = self.placer.capacity
        held = self._gpu_size(self.reserved_nodes())
        age = self._occupant_age(now)
        for _, name in sorted(starving):
            job = self.cluster.jobs[name]
            # The hold doubles with every further threshold period waited, up to max_hold_doublings and
            # within the budget: the longer a job has waited, the more nodes drain for it (the first to
            # empty take it).
            periods = int((now - job.submit_time) // cfg.reservation_after_s) - 1
            nodes = self._pick_reservation(job, age, min(periods, cfg.max_hold_doublings), previous.get(name, ()))
            if nodes is None:
                continue
            size = self._gpu_size(nodes)
            budget = cfg.max_reserved_fraction * capacity - held
            if size > budget:  # trim the hedge to the budget, never below what the gang needs
                keep = len(job.pending())
                while keep < len(nodes) and self._gpu_size(nodes[: keep + 1]) <= budget:
                    keep += 1
                nodes = nodes[:keep]
                size = self._gpu_size(nodes)
                if held and size > budget:
                    break  # the longest-waiting job always gets its hold; later ones share what is left
            held += size
            self._reserved[name] = nodes
            job.reserved_nodes = nodes
            job.reason = (f"waited {now - job.submit_time:.0f} s: holding node(s) {', '.join(nodes)} "
                          "until they drain; backfill continues elsewhere")

    def _gpu_size(self, names: Iterable[str]) -> int:
        """GPU milli of whole nodes."""
        return sum(len(self.cluster.nodes[n].devices) * 1000 for n in names)

    def _occupant_age(self, now: float) -> dict[str, float]:
        """Per node, how long its longest-running job has run. Job run times are heavy-tailed: the
        longer a job has run, the longer it is likely to go on, so young occupants drain first."""
        age: dict[str, float] = defaultdict(float)
        for job in self.cluster.jobs.values():
            if job.phase.holds_resources and job.start_time is not None:
                for r in job.replicas:
                    if r.node is not None:
                        age[r.node] = max(age[r.node], now - job.start_time)
        return age

    def _pick_reservation(self, job: Job, age: dict[str, float], extra: int = 0,
                          held: tuple[str, ...] = ()) -> tuple[str, ...] | None:
        """Nodes that should drain soonest for the gang, keeping the ones already held (they only get
        emptier). Run times are heavy-tailed, so a node whose oldest job is young drains first; after
        ``extra`` doublings the hold is that many times larger, hedging against nodes that do not drain."""
        tasks = job.task_by_name
        taken = set(self.reserved_nodes(except_job=job.name))
        need = sorted((tasks[r.task].request for r in job.pending()), key=lambda q: -q.gpu_total)
        if not need:
            return None
        biggest = need[0]
        want = len(need) * (2 ** max(extra, 0) if biggest.gpus > 1 else 1)

        def usable(n: Node) -> bool:
            return (n.schedulable and n.name not in taken and len(n.devices) >= biggest.gpus
                    and n.cpu_milli >= biggest.cpu_milli and n.mem_mib >= biggest.mem_mib
                    and (not biggest.models or n.model in biggest.models))

        nodes = self.cluster.nodes
        chosen = [n for n in held if n in nodes and usable(nodes[n])][:want]
        if len(chosen) < want:
            picked = set(chosen)
            domain = nodes[chosen[0]].domain if chosen else None
            options = sorted((n for n in nodes.values() if usable(n) and n.name not in picked),
                             key=lambda n: (age.get(n.name, 0.0), n.domain != domain, -n.free_gpu_milli, n.name))
            chosen += [n.name for n in options[: want - len(chosen)]]
        return tuple(chosen) if len(chosen) >= len(need) else None

    # preemption and reclaim: whole-job victims, fewest and cheapest, with grace
    def _victim_ok(self, preemptor: Job, victim: Job, now: float) -> str | None:
        """The rule under which ``victim`` may be evicted for ``preemptor``, or None."""
        if victim.phase is not JobPhase.RUNNING or victim.name == preemptor.name:
            return None
        if victim.start_time is not None and now - victim.start_time < self.config.min_runtime_s:
            return None
        if (self.cycles - victim.last_victim_cycle <= 1
                or now - victim.last_victim_at < self.config.victim_cooldown_s):  # never a victim twice in a row
            return None
        pq = self.cluster.queues[preemptor.queue]
        vq = self.cluster.queues[victim.queue]
        if victim.queue == preemptor.queue:
            if (self.config.preempt and pq.rights.preempt_own_elastic and victim.tier < preemptor.tier
                    and preemptor.tier is Tier.GUARANTEED):
                return "preempt"
            return None
        if pq.rights.privileged and victim.tier < preemptor.tier and self.config.preempt:
            return "privileged"
        # what the victim's queue keeps: its jobs already told to leave (for other preemptors) are gone
        leaving = self._doomed.get(vq.name, 0) + victim.gpu_allocated()
        if not (self.config.reclaim and pq.rights.reclaim
                and vq.allocated_gpu - leaving >= vq.guaranteed_gpu):  # only borrowed capacity
            return None
        # what the preemptor's queue will hold: running jobs, preemptors already waiting for victims, and this job
        claim = self._claims.get(pq.name, 0) + preemptor.gpu_demand()
        if pq.allocated_gpu + claim <= pq.guaranteed_gpu:
            return "reclaim"
        # Fair borrowing: idle capacity is shared among borrowers by weight. A borrower may take from
        # one that, even after losing the victim, borrows more (weighted) than it will. The inequality
        # cannot hold both ways, so this never loops.
        if self._borrowed(pq, claim) < self._borrowed(vq, -leaving):
            return "fair-share"
        if self._overtook_starving(preemptor, victim, now):
            return "starvation"
        return None

    def _starving(self, job: Job, now: float) -> bool:
        """Waited past the starvation threshold while holding nodes that did not drain for it."""
        after = self.config.starvation_preempt_after_s
        return (after is not None and job.phase is JobPhase.PENDING and job.name in self._reserved
                and now - job.submit_time >= after)

    def _overtook_starving(self, preemptor: Job, victim: Job, now: float) -> bool:
        """``victim`` started after the starving ``preemptor`` arrived (it overtook it): evicting it undoes
        an overtaking strict FIFO would never have allowed. The only thing bounding a big gang's wait when
        no held node drains. (The caller has checked the rest: another queue, borrowed capacity, rights.)"""
        if not self._starving(preemptor, now) or victim.start_time is None:
            return False
        return victim.start_time > preemptor.submit_time and victim.tier <= preemptor.tier

    def _borrowed(self, q: Queue, delta: int) -> float:
        return max(0, q.allocated_gpu + delta - q.guaranteed_gpu) / max(q.weight, 1e-9)

    def _victim_queues(self, job: Job, now: float) -> list[str]:
        """Queues that may hold victims for ``job`` (a cheap filter before looking at their jobs)."""
        pq = self.cluster.queues[job.queue]
        claim = self._claims.get(pq.name, 0) + job.gpu_demand()
        out = [pq.name] if self.config.preempt and job.tier is Tier.GUARANTEED else []
        may_reclaim = pq.rights.reclaim and self.config.reclaim
        within = pq.allocated_gpu + claim <= pq.guaranteed_gpu
        starving = self._starving(job, now)
        for q in self.cluster.queues.values():
            kept = -self._doomed.get(q.name, 0)
            if q.name == pq.name or (q.allocated_gpu + kept <= q.guaranteed_gpu and not pq.rights.privileged):
                continue
            if pq.rights.privileged or (may_reclaim and (within or starving
                                                         or self._borrowed(pq, claim) < self._borrowed(q, kept))):
                out.append(q.name)
        return out

    def _compute_doomed(self) -> dict[str, int]:
        """GPU milli of each queue's jobs in WillEvict: a queue's guarantee must survive their leaving too."""
        out: dict[str, int] = defaultdict(int)
        for victims in self._victims.values():
            for name in victims:
                job = self.cluster.jobs.get(name)
                if job is not None and job.phase is JobPhase.WILL_EVICT:
                    out[job.queue] += job.gpu_allocated()
        return out

    def _compute_claims(self) -> dict[str, int]:
        """GPU milli that preemptors (Privileged jobs) of each queue are about to take."""
        out: dict[str, int] = defaultdict(int)
        for name in self._victims:
            job = self.cluster.jobs.get(name)
            if job is not None and job.phase is JobPhase.PRIVILEGED:
                out[job.queue] += job.gpu_demand()
        return out

    def _preempt(self, now: float, result: CycleResult) -> None:
        attempts = 0
        # starving jobs first, then by queue (least served first) and job order
        candidates: list[tuple[bool, tuple[float, ...], OrderKey, str]] = []
        for tier, queues in self._pending.items():
            if tier != int(Tier.GUARANTEED):
                continue
            for qname, groups in queues.items():
                qkey = self.queue_key(self.cluster.queues[qname], tier)
                for group in groups.values():
                    waiting = (kn for kn in group if self.cluster.jobs[kn[1]].phase is JobPhase.PENDING)
                    for key, name in itertools.islice(waiting, self.config.preemption_attempts):
                        candidates.append((not self._starving(self.cluster.jobs[name], now), qkey, key, name))
        if not candidates:
            return
        running: dict[str, list[Job]] = defaultdict(list)
        for j in self.cluster.jobs.values():
            if j.phase is JobPhase.RUNNING:
                running[j.queue].append(j)
        for _, _, _, name in sorted(candidates):
            if attempts >= self.config.preemption_attempts:
                return
            job = self.cluster.jobs[name]
            if job.phase is JobPhase.PRIVILEGED or job.phase is not JobPhase.PENDING:
                continue
            queue = self.cluster.queues[job.queue]
            if job.privileged_since is None:
                job.privileged_since = now
            if now - job.privileged_since < queue.preemptor_delay_s:
                job.reason = (f"waiting up to {queue.preemptor_delay_s:g} s for free capacity before "
                              "preempting lower-priority or borrowed jobs (where its queue may)")
                continue
            if now < job.preempt_retry_at:
                continue
            self._claims, self._doomed = self._compute_claims(), self._compute_doomed()
            pool = [v for q in self._victim_queues(job, now) for v in running.get(q, ())
                    if self._victim_ok(job, v, now)]
            if not pool:
                job.preempt_retry_at = now + self.config.preemption_retry_s
                continue
            attempts += 1
            if not self._try_preempt(job, pool, now, result):
                job.preempt_retry_at = now + self.config.preemption_retry_s

    def _try_preempt(self, job: Job, pool: list[Job], now: float, result: CycleResult) -> bool:
        # Other preemptors' nodes stay usable: their victims are already taken out of the pool.
        excluded = self.reserved_nodes(except_job=job.name, starving_only=True)
        if self._shrink_for(job, pool, excluded, now, result):
            return True
        saved: dict[str, list[tuple[Replica, str, tuple[int, ...]]]] = {}
        # lowest tier and priority first; then small jobs (a big gang is hard to place again); then least work lost
        order = sorted(pool, key=lambda v: (int(v.tier), v.priority, v.gpu_allocated(), self._cost(v, now), v.name))
        chosen: list[Job] = []
        fit: list[Placement] | None = None
        for victim in order:
            if not self._victim_ok(job, victim, now):  # earlier victims may have used up what was borrowed
                continue
            saved[victim.name] = self._lift(victim)
            chosen.append(victim)
            fit = self.placer.place_gang(job, self._gang_part(job), excluded)
            if fit is not None:
                break
        if fit is None:
            for victim in chosen:
                self._restore(victim, saved[victim.name])
            job.reason = "cannot start even if every job it may preempt were evicted"
            return False
        for p in fit:
            self.placer.release(job, p.replica, ReplicaPhase.PENDING)
        # fewest victims: drop any victim the gang does not need after all (most expensive first)
        for victim in sorted(chosen, key=lambda v: -self._cost(v, now)):
            self._restore(victim, saved[victim.name])
            trial = self.placer.place_gang(job, self._gang_part(job), excluded)
            if trial is None:
                saved[victim.name] = self._lift(victim)
                continue
            for p in trial:
                self.placer.release(job, p.replica, ReplicaPhase.PENDING)
            chosen.remove(victim)
        trial = self.placer.place_gang(job, self._gang_part(job), excluded)
        assert trial is not None, "victim set stopped fitting"
        if not chosen:  # it fits without anyone leaving (on nodes held for others): nothing to do here
            for p in trial:
                self.placer.release(job, p.replica, ReplicaPhase.PENDING)
            return False
        nodes = tuple(sorted({p.node for p in trial}))
        for p in trial:
            self.placer.release(job, p.replica, ReplicaPhase.PENDING)
        for victim in chosen:
            self._restore(victim, saved[victim.name])
        rules = {v.name: self._victim_ok(job, v, now) or "preemption" for v in chosen}
        self._reserved[job.name] = nodes
        job.reserved_nodes = nodes
        job.phase = JobPhase.PRIVILEGED
        job.reason = f"preempting {len(chosen)} job(s): {', '.join(v.name for v in chosen)}"
        for victim in chosen:
            vq = self.cluster.queues[victim.queue]
            deadline = now + max(vq.victim_grace_s, 0.0)
            rule = rules[victim.name]
            victim.phase, victim.will_evict_deadline, victim.will_evict_by = JobPhase.WILL_EVICT, deadline, job.name
            victim.last_victim_cycle = self.cycles
            self._victims[job.name][victim.name] = None
            victim.reason = f"will be evicted at t={deadline:.0f} ({rule} by {job.name}); checkpoint now"
            result.decisions.append(NotifyWillEvict(victim.name, deadline, job.name, victim.reason))
        result.decisions.append(JobStatus(job.name, JobPhase.PRIVILEGED.value, job.reason))
        return True

    def _shrink_for(self, job: Job, pool: list[Job], excluded: frozenset[str], now: float,
                    result: CycleResult) -> bool:
        """Shrink before kill: stop elastic replicas above their jobs' minimum, newest first, until the
        preemptor fits; if that is not enough, undo and leave the choice to whole-job eviction."""
        lifted: list[tuple[Job, Replica, str, tuple[int, ...]]] = []
        for victim in sorted(pool, key=lambda v: (int(v.tier), v.priority, v.name)):
            extra = sorted(victim.bound(), key=lambda r: -r.index)[: self._shrinkable(victim)]
            for r in extra:
                lifted.append((victim, r, r.node or "", r.devices))
                self.placer.release(victim, r, ReplicaPhase.PENDING)
                placed = self.placer.place_gang(job, self._gang_part(job), excluded)
                if placed is None:
                    continue
                by_job: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
                for v, rep, node, _ in lifted:
                    rep.phase = ReplicaPhase.EVICTED
                    by_job[v.name].append((rep.task, rep.index, node))
                for vname, gone in by_job.items():
                    result.decisions.append(Shrink(vname, tuple(gone), f"shrunk to make room for {job.name}"))
                self._started(job, placed, now, result)
                return True
        for v, rep, node, devices in reversed(lifted):
            self.placer.bind(v, rep, node, devices)
        return False

    @staticmethod
    def _cost(job: Job, now: float) -> float:
        """Work lost by evicting: GPU-seconds since start (cheaper victims first)."""
        started = job.start_time if job.start_time is not None else now
        return (now - started) * max(job.gpu_allocated(), 1)

    def _shrinkable(self, job: Job) -> int:
        return max(0, len(job.bound()) - job.gang_size)

    def _lift(self, job: Job) -> list[tuple[Replica, str, tuple[int, ...]]]:
        saved = [(r, r.node or "", r.devices) for r in job.bound()]
        for r, _, _ in saved:
            self.placer.release(job, r, ReplicaPhase.PENDING)
        return saved

    def _restore(self, job: Job, saved: list[tuple[Replica, str, tuple[int, ...]]]) -> None:
        for r, node, devices in saved:
            self.placer.bind(job, r, node, devices)

    # elastic growth: idle GPUs go to elastic jobs below their maximum, outside reservations
    def _grow(self, result: CycleResult) -> None:
        excluded = self.reserved_nodes()
        for name in list(self._elastic):
            job = self.cluster.jobs[name]
            if job.phase is not JobPhase.RUNNING or job.elastic_max is None:
                continue
            last = job.tasks[-1]
            bound = sum(1 for r in job.replicas if r.task == last.name and r.phase is ReplicaPhase.BOUND)
            while bound < job.elastic_max:
                found = self.placer.find(last.request, excluded)
                if found is None:
                    return
                index = max((r.index for r in job.replicas if r.task == last.name), default=-1) + 1
                replica = Replica(last.name, index)
                job.replicas.append(replica)
                self.placer.bind(job, replica, *found)
                result.decisions.append(Bind(job.name, last.name, index, found[0], found[1]))
                bound += 1
