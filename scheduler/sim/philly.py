"""Event-driven replay of the Microsoft Philly trace through the scheduling core.

Virtual clusters are tenants: each gets a queue whose guarantee is proportional to its node count
in the VC file (scaled to the simulated cluster). A job of up to 8 GPUs is one pod on one node; a
bigger one is a gang of 8-GPU pods. Jobs run for their traced duration once every member is bound.
A preempted job checkpoints when told (its grace period's work is lost) and is resubmitted with
what remains.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler.core.balance import node_imbalance
from scheduler.core.decisions import CancelEviction, Decision, Evict, JobStatus, NotifyWillEvict
from scheduler.core.fairshare import water_fill
from scheduler.core.model import Cluster, Device, Job, JobPhase, Node, Queue, Request, Task
from scheduler.core.scheduler import CYCLE_PERIOD_S, Scheduler, SchedulerConfig
from scheduler.sim.traces import Problems, TraceError, load, parse_int

POLICIES = ("ferry", "fifo", "volcano")
# The simulated tenants' queue settings (each a Queue field an admin sets; `ferry simulate philly` can change
# them): a tenant below its guarantee waits this long for free capacity before reclaiming, and a victim
# gets this notice to checkpoint.
PREEMPTOR_DELAY_S = 300.0
VICTIM_GRACE_S = 60.0
WAKE = 2  # an event that only makes the replay cycle


@dataclass(frozen=True, slots=True)
class TraceJob:
    submit: float
    duration: float
    gpus: int
    tenant: str


def _timestamp(text: str) -> float:
    text = text.strip()
    if not text:
        raise ValueError("timestamp is missing")
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ValueError(f"timestamp={text!r} is neither seconds nor an ISO date") from None


def _job(row: dict[str, str]) -> TraceJob:
    tenant = (row.get("cluster") or "").strip()
    if not tenant:
        raise ValueError("cluster (tenant) is missing")
    duration_text = (row.get("duration") or "").strip()
    try:
        duration = float(duration_text)
    except ValueError:
        raise ValueError(f"duration={duration_text!r} is not a number") from None
    if not math.isfinite(duration) or duration < 0:
        raise ValueError(f"duration={duration_text} must be a non-negative number of seconds")
    return TraceJob(_timestamp(row.get("timestamp", "")), duration, parse_int(row, "num_gpus", minimum=1), tenant)


def load_jobs(path: Path, problems: Problems, strict: bool = False) -> list[TraceJob]:
    jobs = load(path, ("timestamp", "duration", "num_gpus", "cluster"), _job, problems, strict)
    return sorted(jobs, key=lambda j: j.submit)


def load_vc_nodes(path: Path, problems: Problems, strict: bool = False) -> dict[str, int]:
    def parse(row: dict[str, str]) -> tuple[str, int]:
        vc = (row.get("vc") or "").strip()
        if not vc:
            raise ValueError("vc is missing")
        return vc, parse_int(row, "node num", minimum=0)

    return dict(load(path, ("vc", "node num"), parse, problems, strict))


@dataclass
class TenantStats:
    waits: list[float] = field(default_factory=list)  # over all of a job's runs
    first_waits: list[float] = field(default_factory=list)  # before its first run only
    jcts: list[float] = field(default_factory=list)
    received_gpu_s: float = 0.0
    entitled_gpu_s: float = 0.0
    preemptions: int = 0
    wasted_gpu_s: float = 0.0


@dataclass
class _Live:
    trace: TraceJob
    remaining: float
    waited: float = 0.0
    first_wait: float | None = None  # what it waited before its first run
    pending_since: float = 0.0
    started: float | None = None
    notice: float | None = None
    rule: str = ""  # the rule its latest notice named: until its next run is told to leave, what evicted it
    incarnation: int = 0
    moved_at: float | None = None
    attained_gpu_s: float = 0.0  # what its earlier runs received (the las plugin's levels)
    stopped_at: float | None = None


def departments_of(vc_nodes: dict[str, int], count: int, seed: int | None = None) -> dict[str, str]:
    """VC -> department: the VCs dealt out largest first (then by name) to ``count`` departments in turn,
    so each department gets a like mix of big and small teams; with ``seed``, dealt in a random order of
    that seed instead (as many VCs per department): another grouping, for what the grouping itself decides
    (``make bench-philly-groupings``). No departments for ``count`` < 1."""
    if count < 1:
        return {}
    if seed is None:
        ranked = sorted(vc_nodes, key=lambda t: (-vc_nodes[t], t))
    else:
        ranked = sorted(vc_nodes)  # the seed alone decides, not the order the VCs were read in
        random.Random(seed).shuffle(ranked)
    return {t: f"dept-{i % count}" for i, t in enumerate(ranked)}


def entitled(demand: dict[str, float], weight: dict[str, float], dept_of: dict[str, str],
             capacity: float) -> dict[str, float]:
    """Each tenant's fair share now: water-filled by weight, capped at demand — level by level in a
    queue tree (departments by their teams' weights and demands, then teams inside each department's
    share), the order the scheduler lends idle capacity in."""
    if not dept_of:
        return water_fill(demand, weight, capacity)
    groups: dict[str, list[str]] = defaultdict(list)
    for t in demand:
        groups[dept_of.get(t, t)].append(t)
    top = water_fill({g: sum(demand[t] for t in ts) for g, ts in groups.items()},
                     {g: sum(weight[t] for t in ts) for g, ts in groups.items()}, capacity)
    out: dict[str, float] = {}
    for g, ts in groups.items():
        out.update(water_fill({t: demand[t] for t in ts}, {t: weight[t] for t in ts}, top[g]))
    return out


def build_cluster(nodes: int, gpus_per_node: int, vc_nodes: dict[str, int], tenants: set[str],
                  notes: list[str], departments: dict[str, str] | None = None,
                  preemptor_delay_s: float = PREEMPTOR_DELAY_S, victim_grace_s: float = VICTIM_GRACE_S) -> Cluster:
    half = max(gpus_per_node // 2, 1)
    cluster_nodes = {
        f"node-{i:04d}": Node(f"node-{i:04d}", cpu_milli=10**9, mem_mib=10**9, max_pods=10**6,
                              devices=[Device(d, group=d // half) for d in range(gpus_per_node)],
                              domain=f"rack-{i // 8:03d}")
        for i in range(nodes)
    }
    capacity = nodes * gpus_per_node * 1000
    total_vc = sum(vc_nodes.get(t, 0) for t in tenants) or 1
    queues = {}
    for t in sorted(tenants):
        share = vc_nodes.get(t, 0) / total_vc
        if t not in vc_nodes:
            notes.append(f"tenant {t} is not in the VC file: no guarantee, it only borrows idle GPUs")
        queues[t] = Queue(t, guaranteed_gpu=int(capacity * share), weight=max(share, 1e-3),
                          victim_grace_s=victim_grace_s, preemptor_delay_s=preemptor_delay_s)
    for t, dept in (departments or {}).items():  # a department: its teams' guarantees and weights together
        if t not in queues:
            continue
        d = queues.setdefault(dept, Queue(dept, weight=0.0, victim_grace_s=victim_grace_s,
                                          preemptor_delay_s=preemptor_delay_s))
        d.guaranteed_gpu += queues[t].guaranteed_gpu
        d.weight += queues[t].weight
        queues[t].parent = dept
    return Cluster(cluster_nodes, queues)


def with_las(config: SchedulerConfig) -> SchedulerConfig:
    """``config`` with the ``las`` plugin (after the job-order plugins it refines: priority first) and, where
    it holds nodes for passed-over gangs, the ``drain-holds`` action: every job is movable here, so a hold
    need not wait for its occupants to end."""
    plugins = config.plugins if "las" in config.plugins else (*config.plugins, "las")
    moves = "reserve" in config.actions and not {"consolidate", "drain-holds"} & set(config.actions)
    return dataclasses.replace(config, plugins=plugins,
                               actions=(*config.actions, "drain-holds") if moves else config.actions)


def make_scheduler(policy: str, cluster: Cluster, config: SchedulerConfig | None = None) -> Scheduler:
    """The scheduler the service runs, configured by the preset of that name (or by ``config``)."""
    if config is not None:
        return Scheduler(cluster, config)
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    return Scheduler(cluster, SchedulerConfig.preset(policy))


@dataclass
class PhillyResult:
    policy: str
    metrics: dict[str, Any]
    timeline: list[tuple[float, int, int]]  # (t, allocated GPUs, pending jobs)
    tenant_waits: dict[str, list[float]]
    job_waits: list[float] = field(default_factory=list)  # per job the trace could run, in its order


def in_month(jobs: list[TraceJob], month: int) -> list[TraceJob]:
    """The jobs submitted in calendar month ``month`` (1-12, UTC, of any year): the slices the matrix of
    ``make bench-philly`` replays, so that ``ferry simulate philly --month`` replays one of its cells."""
    if not 1 <= month <= 12:
        raise ValueError(f"a month is 1-12, got {month}")
    return [j for j in jobs if datetime.fromtimestamp(j.submit, UTC).month == month]


def jittered(jobs: list[TraceJob], seed: int, seconds: float = 1.0) -> list[TraceJob]:
    """The same jobs, each running ``seconds`` longer, shorter or as long, at random (``seed``; at least 1 s):
    a perturbation no policy can care about, so what it changes in a replay's figures is the replay's
    course, not a rule (``make bench-philly-jitter``). Submission times are kept: so is every slice."""
    rng = random.Random(seed)
    return [TraceJob(j.submit, max(1.0, j.duration + rng.choice((-seconds, 0.0, seconds))), j.gpus, j.tenant)
            for j in jobs]


def window(jobs: list[TraceJob], start: datetime, count: int) -> list[TraceJob]:
    """``count`` consecutive jobs submitted at ``start`` or later (in submission order, as the trace
    lists them): a slice replayed from an empty cluster, as the held-out windows of
    ``make bench-philly-heldout`` and ``ferry simulate philly --from`` are."""
    if count < 1:
        raise ValueError(f"a window holds at least one job, got {count}")
    after = start.timestamp()
    return [j for j in jobs if j.submit >= after][:count]


def simulate(jobs: list[TraceJob], vc_nodes: dict[str, int], policy: str, nodes: int = 96,
             gpus_per_node: int = 8, progress: Callable[[str], None] | None = None,
             notes: list[str] | None = None, config: SchedulerConfig | None = None,
             departments: int = 0, grouping_seed: int | None = None,
             movable: Callable[[TraceJob], bool] | None = None,
             las: bool = False, preemptor_delay_s: float = PREEMPTOR_DELAY_S,
             victim_grace_s: float = VICTIM_GRACE_S, cycle_when_due: bool = True,
             decisions: Callable[[float, list[Decision]], None] | None = None) -> PhillyResult:
    """Replay ``jobs``; with ``departments`` the VCs become teams of that many departments
    (:func:`departments_of`, dealt in the random order of ``grouping_seed`` if given) and fairness is also
    reported per department; ``movable`` says which jobs may be moved by consolidation (all may checkpoint:
    a move loses the work since its notice). With ``las`` every queue orders its jobs by least attained
    service and every job is movable, as Tiresias assumes (the ``las`` plugin is added to the configuration).
    ``preemptor_delay_s`` and ``victim_grace_s`` are every tenant queue's settings of those names. The replay
    cycles on every arrival and completion and, with ``cycle_when_due`` (the default), whenever a rule that
    waits for time falls due (``Scheduler.due``: a victim's deadline, the end of a preemptor delay, ...) and
    one service period after a cycle an action cut short at its budget, as the service, cycling every period,
    does; without it a victim stays until the next event after its deadline (the event-only replay of
    earlier figures, faster).
    ``decisions`` is given every cycle's decisions with the replay's time, in order: what was decided, and
    why, for each job (``j<n>.<run>``: the trace's n-th job the cluster can hold, in arrival order, 0 first;
    its runs counted from 0)."""
    notes = notes if notes is not None else []
    capacity_gpus = nodes * gpus_per_node
    runnable = []
    for j in jobs:
        if j.gpus > capacity_gpus:
            notes.append(f"job at t={j.submit:.0f} of tenant {j.tenant} asks {j.gpus} GPUs, more than the cluster's "
                         f"{capacity_gpus}: impossible, skipped")
        else:
            runnable.append(j)
    tenants = {j.tenant for j in runnable}
    dept_of = departments_of(vc_nodes, departments, grouping_seed)
    if preemptor_delay_s < 0 or victim_grace_s < 0:
        raise ValueError(f"the preemptor delay and the victim grace must not be negative, got {preemptor_delay_s:g} "
                         f"and {victim_grace_s:g} s")
    cluster = build_cluster(nodes, gpus_per_node, vc_nodes, tenants, notes, dept_of, preemptor_delay_s, victim_grace_s)
    if las:
        config = with_las(config or SchedulerConfig.preset(policy))
        for q in cluster.queues.values():
            q.least_attained_service = True
        movable = movable or (lambda _: True)
    sched = make_scheduler(policy, cluster, config)
    teams = {t: q for t, q in cluster.queues.items() if t in tenants}  # the queues jobs are in
    weight = {t: q.weight for t, q in teams.items()}
    stats: dict[str, TenantStats] = defaultdict(TenantStats)
    daily: dict[int, dict[str, list[float]]] = defaultdict(dict)  # day -> tenant -> [received, entitled] GPU-s
    live: dict[str, _Live] = {}
    events: list[tuple[float, int, int, str, int]] = []  # (time, order, seq, job, incarnation)
    seq = 0
    t0 = runnable[0].submit if runnable else 0.0
    for i, j in enumerate(runnable):
        name = f"j{i:06d}"
        live[name] = _Live(j, j.duration)
        events.append((j.submit - t0, 1, seq, name, 0))
        seq += 1
    heapq.heapify(events)
    demand: dict[str, int] = defaultdict(int)  # GPUs asked by each tenant's unfinished jobs
    allocated = 0
    pending = 0
    timeline: list[tuple[float, int, int]] = []
    busy_while_waiting = 0.0
    waiting_time = 0.0
    imbalance = 0.0  # node imbalance of the state since the last event
    imbalance_s = 0.0  # its integral over time
    last_t = 0.0
    preemptions = 0
    notices: Counter[str] = Counter()  # notices to leave given to each run, evicted or withdrawn
    withdrawn = 0
    by_rule: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # rule -> [evictions, new runs' waits]
    wasted = 0.0
    done = 0
    total = len(runnable)

    def account(now: float) -> None:
        nonlocal busy_while_waiting, waiting_time, last_t, imbalance_s
        dt = now - last_t
        if dt > 0:
            imbalance_s += imbalance * dt
            if pending:
                busy_while_waiting += allocated * dt
                waiting_time += dt
            fair = entitled({t: float(d) for t, d in demand.items()}, weight, dept_of, float(capacity_gpus))
            spans = day_spans(last_t, now)
            for t, q in teams.items():
                got, due = q.allocated_gpu / 1000, fair.get(t, 0.0)
                stats[t].received_gpu_s += got * dt
                stats[t].entitled_gpu_s += due * dt
                for day, secs in spans:
                    acc = daily[day].setdefault(t, [0.0, 0.0])
                    acc[0] += got * secs
                    acc[1] += due * secs
        last_t = now

    def submit(name: str, now: float) -> None:
        nonlocal pending
        lj = live[name]
        job_name = f"{name}.{lj.incarnation}"
        g = lj.trace.gpus
        tasks = ([Task("worker", 1, Request(gpus=g))] if g <= gpus_per_node else
                 [Task("worker", math.ceil(g / gpus_per_node), Request(gpus=gpus_per_node))])
        sched.submit(Job(job_name, lj.trace.tenant, tasks, submit_time=lj.trace.submit - t0,
                         movable=bool(movable and movable(lj.trace)), moved_at=lj.moved_at,
                         attained_gpu_s=lj.attained_gpu_s, stopped_at=lj.stopped_at))
        lj.pending_since = now
        pending += 1

    woken: set[float] = set()  # wake-ups already queued
    while events:
        now = events[0][0]
        account(now)
        ended = False
        while events and events[0][0] == now:
            _, kind, _, name, inc = heapq.heappop(events)
            if kind == WAKE:
                continue
            lj = live[name]
            if kind == 1:  # arrival
                demand[lj.trace.tenant] += lj.trace.gpus
                submit(name, now)
            elif inc == lj.incarnation and lj.started is not None:  # completion of the current run
                ended = True
                sched.finish(f"{name}.{inc}", JobPhase.SUCCEEDED)
                sched.remove(f"{name}.{inc}")
                allocated -= lj.trace.gpus
                demand[lj.trace.tenant] -= lj.trace.gpus
                st = stats[lj.trace.tenant]
                st.waits.append(lj.waited)
                assert lj.first_wait is not None, "a job ends only after it started"
                st.first_waits.append(lj.first_wait)
                st.jcts.append(now - (lj.trace.submit - t0))
                done += 1
                if progress and done % 5000 == 0:
                    progress(f"{policy}: {done}/{total} jobs done, t={now / 86400:.1f} d")
        res = sched.cycle(now)
        if decisions is not None and res.decisions:
            decisions(now, res.decisions)
        for d in res.decisions:
            if isinstance(d, JobStatus) and d.phase == JobPhase.RUNNING.value:
                name, inc_s = d.job.rsplit(".", 1)
                lj = live[name]
                lj.started = now
                lj.waited += now - lj.pending_since
                if lj.incarnation:  # a new run: its wait is what the eviction cost it
                    by_rule[lj.rule][1] += now - lj.pending_since
                if lj.first_wait is None:
                    lj.first_wait = lj.waited
                pending -= 1
                allocated += lj.trace.gpus
                heapq.heappush(events, (now + lj.remaining, 0, seq, name, int(inc_s)))
                seq += 1
            elif isinstance(d, NotifyWillEvict):
                lj = live[d.job.rsplit(".", 1)[0]]
                lj.notice, lj.rule = now, d.rule
                notices[d.job] += 1
            elif isinstance(d, CancelEviction):
                withdrawn += 1
            elif isinstance(d, Evict):
                name, inc_s = d.job.rsplit(".", 1)
                lj = live[name]
                assert lj.started is not None
                saved = (lj.notice if lj.notice is not None else now) - lj.started
                lost = (now - lj.started - saved) * lj.trace.gpus
                lj.remaining -= saved
                gone = sched.cluster.jobs[d.job]  # a move's cooldown and the service received outlive the run
                lj.moved_at, lj.attained_gpu_s, lj.stopped_at = gone.moved_at, gone.attained_gpu_s, gone.stopped_at
                allocated -= lj.trace.gpus
                sched.remove(d.job)
                preemptions += 1
                by_rule[lj.rule][0] += 1
                wasted += lost
                st = stats[lj.trace.tenant]
                st.preemptions += 1
                st.wasted_gpu_s += lost
                lj.incarnation += 1
                lj.started = lj.notice = None
                submit(name, now)
        timeline.append((now, allocated, pending))
        if cycle_when_due:
            due = sched.due(res)
            if res.cut_short:  # an action ran out of its per-cycle budget: the service goes on next period
                due.add(now + CYCLE_PERIOD_S)
            for when in due - woken:
                woken.add(when)
                heapq.heappush(events, (when, WAKE, seq, "", 0))
                seq += 1
        if res.decisions or ended:  # the nodes' load changed
            imbalance = node_imbalance(cluster.nodes.values())

    all_waits = [w for s in stats.values() for w in s.waits]
    all_first_waits = [w for s in stats.values() for w in s.first_waits]
    all_jcts = [w for s in stats.values() for w in s.jcts]
    big_waits = [lj.waited for lj in live.values() if lj.trace.gpus > gpus_per_node]
    jain = jain_index([s.received_gpu_s / s.entitled_gpu_s for s in stats.values() if s.entitled_gpu_s > 0])
    days = [jain_index([r / e for r, e in tenants.values() if e > 0]) for tenants in daily.values()]
    by_dept: dict[str, list[float]] = {}
    for t, st in stats.items():  # a department receives and is entitled to what its teams are
        if dept_of and t not in dept_of:
            continue  # a tenant in no department counts among the teams only
        acc = by_dept.setdefault(dept_of.get(t, t), [0.0, 0.0])
        acc[0] += st.received_gpu_s
        acc[1] += st.entitled_gpu_s
    metrics: dict[str, Any] = {
        "policy": policy,
        "jobs": total,
        **summary(all_waits, all_jcts, all_first_waits),
        "gpu_utilization": (round(100 * busy_while_waiting / (capacity_gpus * waiting_time), 2)
                            if waiting_time else None),
        "jain_fairness": round(jain, 4),
        # the departments by their teams' sums (tenants in none count among the teams only); equals
        # jain_fairness without departments
        "jain_departments": round(jain_index([r / e for r, e in by_dept.values() if e > 0]), 4),
        "departments": {d: round(r / e, 4) if e else None for d, (r, e) in sorted(by_dept.items())} if dept_of else {},
        "department_teams": {d: sorted(t for t in dept_of if dept_of[t] == d) for d in sorted(set(dept_of.values()))},
        # Jain over each day's GPU-seconds received vs entitled, averaged over days: fairness over time
        "jain_daily_mean": round(sum(days) / len(days), 4) if days else 1.0,
        "jain_daily_min": round(min(days), 4) if days else 1.0,
        "node_imbalance_pct": round(imbalance_s / last_t, 1) if last_t else 0.0,
        "preemptions": preemptions,
        # what each rule's evictions cost: how many, and how long their victims' new runs waited (in all,
        # and per job of the trace, the share of avg_wait_s they make)
        "evictions_by_rule": {rule: {"evictions": int(n), "new_run_wait_s": round(w, 1),
                                     "per_job_s": round(w / total, 2) if total else 0.0}
                              for rule, (n, w) in sorted(by_rule.items(), key=lambda kv: -kv[1][1])},
        "wasted_gpu_s": round(wasted, 1),
        # notices to checkpoint and leave that were withdrawn (the preemptor started elsewhere first): free
        # here, but each is a checkpoint a real job makes for nothing; and the most one run was given
        "notices_withdrawn": withdrawn,
        "most_notices_one_run": max(notices.values(), default=0),
        "big_jobs_p99_wait_s": round(percentile(big_waits, 99), 1) if big_waits else None,
        "tenants": {
            t: {**summary(s.waits, s.jcts, s.first_waits), "jobs": len(s.waits),
                "received_over_entitled": round(s.received_gpu_s / s.entitled_gpu_s, 4) if s.entitled_gpu_s else None,
                "preemptions": s.preemptions, "wasted_gpu_s": round(s.wasted_gpu_s, 1)}
            for t, s in sorted(stats.items())
        },
    }
    return PhillyResult(policy, metrics, timeline, {t: s.waits for t, s in stats.items()},
                        [lj.waited for lj in live.values()])


def eviction_costs(by_rule: dict[str, dict[str, Any]]) -> str:
    """``evictions_by_rule`` as one line: what each rule's evictions cost the jobs they evicted."""
    return ("evictions by rule (how many, and the wait of their victims' new runs per job of the trace: "
            "avg_wait_s less avg_first_wait_s): "
            + ", ".join(f"{rule} {e['evictions']} ({e['per_job_s']} s)" for rule, e in by_rule.items()))


def jain_index(xs: list[float]) -> float:
    """Jain's index of ``xs`` (1: all equal); 1 for none."""
    square = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * square) if xs and square > 0 else 1.0


def day_spans(start: float, end: float, day: float = 86400.0) -> list[tuple[int, float]]:
    """(day index, seconds) of the interval [start, end) in each day it touches."""
    out: list[tuple[int, float]] = []
    t = start
    while t < end:
        d = int(t // day)
        stop = min(end, (d + 1) * day)
        out.append((d, stop - t))
        t = stop
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(waits: list[float], jcts: list[float], first_waits: list[float]) -> dict[str, float | None]:
    """Waits count every run of a job (an evicted job waits again); ``avg_first_wait_s`` only what jobs
    waited before their first run, the queueing delay before a job first starts."""
    if not waits:
        return {"avg_wait_s": None, "p50_wait_s": None, "p99_wait_s": None, "max_wait_s": None, "avg_jct_s": None,
                "avg_first_wait_s": None}
    return {
        "avg_wait_s": round(statistics.fmean(waits), 1),
        "p50_wait_s": round(percentile(waits, 50), 1),
        "p99_wait_s": round(percentile(waits, 99), 1),
        "max_wait_s": round(max(waits), 1),
        "avg_jct_s": round(statistics.fmean(jcts), 1),
        "avg_first_wait_s": round(statistics.fmean(first_waits), 1),
    }


__all__ = ["POLICIES", "PhillyResult", "TraceError", "load_jobs", "load_vc_nodes", "simulate"]
