"""Invariants of the scheduling core under random workloads (hypothesis)."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.actions.reserve import LOAN_RECALL
from scheduler.core.decisions import NotifyWillEvict
from scheduler.core.model import GPU_MILLI, Cluster, JobPhase, ReplicaPhase, Tier
from scheduler.core.scheduler import Scheduler
from tests.unit.core_helpers import cluster, gang, node, queue, scheduler

QUEUES = ("a", "b", "c")


def check_accounting(c: Cluster) -> None:
    """No node or GPU over-committed; node, device and queue sums match the bound replicas."""
    used_cpu: dict[str, int] = defaultdict(int)
    used_gpu: dict[tuple[str, int], int] = defaultdict(int)
    pods: dict[str, int] = defaultdict(int)
    per_queue: dict[str, int] = defaultdict(int)
    for job in c.jobs.values():
        tasks = job.task_by_name
        for r in job.replicas:
            if r.phase is not ReplicaPhase.BOUND:
                continue
            req = tasks[r.task].request
            assert r.node is not None
            used_cpu[r.node] += req.cpu_milli
            pods[r.node] += 1
            per_queue[job.queue] += req.gpu_total
            assert len(r.devices) == req.gpus
            for d in r.devices:
                used_gpu[(r.node, d)] += req.gpu_milli
    for n in c.nodes.values():
        assert n.used_cpu == used_cpu[n.name] <= n.cpu_milli
        assert n.pods == pods[n.name]
        for d in n.devices:
            assert 0 <= d.free <= GPU_MILLI
            assert GPU_MILLI - d.free == used_gpu[(n.name, d.index)]
    for q in c.queues.values():
        assert q.allocated_gpu == per_queue[q.name]
        if q.max_gpu is not None:
            assert q.allocated_gpu <= q.max_gpu


def check_gangs(c: Cluster) -> None:
    for job in c.jobs.values():
        bound = len(job.bound())
        if job.phase in (JobPhase.PENDING, JobPhase.PRIVILEGED):
            assert bound == 0, f"{job.name} partly placed while {job.phase}"
        elif job.phase.holds_resources:
            assert bound >= job.gang_size, f"{job.name} runs with {bound} < {job.gang_size}"
        else:
            assert bound == 0


job_spec = st.tuples(
    st.sampled_from(QUEUES),
    st.integers(1, 4),  # pods
    st.sampled_from([1, 1, 2, 4, 8]),  # GPUs per pod
    st.sampled_from([1000, 1000, 500, 250]),  # milli (shares only apply to 1-GPU pods)
    st.sampled_from([Tier.GUARANTEED, Tier.ELASTIC]),
)
op = st.one_of(
    st.tuples(st.just("submit"), job_spec),
    st.tuples(st.just("cycle"), st.integers(1, 40)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4),
    guarantees=st.tuples(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8)),
    rights=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    ops=st.lists(op, min_size=5, max_size=60),
)
def test_invariants_hold_under_random_workloads(sizes: list[int], guarantees: tuple[int, int, int],
                                                rights: tuple[bool, bool, bool], ops: list[tuple[str, object]]) -> None:
    _replay(sizes, guarantees, rights, ops, reservation_after_s=60.0, starvation_preempt_after_s=120.0)


# Long cycles and frequent finishes: small jobs keep overtaking big gangs, which get holds and then
# evict the borrowers that overtook them.
churn = st.one_of(
    st.tuples(st.just("submit"), job_spec),
    st.tuples(st.just("cycle"), st.integers(20, 200)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.just(8), min_size=2, max_size=4),
    guarantees=st.tuples(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8)),
    ops=st.lists(churn, min_size=20, max_size=80),
)
def test_invariants_hold_while_starving_gangs_evict_what_overtook_them(
        sizes: list[int], guarantees: tuple[int, int, int], ops: list[tuple[str, object]]) -> None:
    _replay(sizes, guarantees, (True, True, True), ops, reservation_after_s=60.0, starvation_preempt_after_s=240.0)


def _replay(sizes: list[int], guarantees: tuple[int, int, int], rights: tuple[bool, bool, bool],
            ops: list[tuple[str, object]], **config: object) -> None:
    c = cluster([node(f"n{i}", g, domain=f"r{i % 2}") for i, g in enumerate(sizes)],
                [queue(q, g, reclaim=r, grace=20) for q, g, r in zip(QUEUES, guarantees, rights, strict=True)])
    s = scheduler(c, **config)
    now = 0.0
    serial = 0
    last_victims: set[str] = set()
    for kind, arg in ops:
        if kind == "submit":
            qname, pods, gpus, milli, tier = arg  # type: ignore[misc]
            milli = milli if gpus == 1 else 1000
            s.submit(gang(f"j{serial}", qname, pods, gpus, milli=milli, tier=tier, submit=now))
            serial += 1
        elif kind == "finish":
            running = sorted(j.name for j in c.jobs.values() if j.phase.holds_resources)
            if running:
                s.finish(running[int(arg) % len(running)])  # type: ignore[call-overload]
        else:
            before = {name: (j.queue, j.tier, c.queues[j.queue].allocated_gpu, j.gpu_allocated())
                      for name, j in c.jobs.items()}
            now += float(arg)  # type: ignore[arg-type]
            res = s.cycle(now)
            victims = {d.job for d in res.of(NotifyWillEvict) if isinstance(d, NotifyWillEvict)}
            assert not victims & last_victims, "a job was chosen as victim twice in a row"
            for d in res.of(NotifyWillEvict):
                assert isinstance(d, NotifyWillEvict)
                _check_victim_rule(s, d, before)
            last_victims = victims
        check_accounting(c)
        check_gangs(c)


def _check_victim_rule(s: Scheduler, notice: NotifyWillEvict,
                       before: dict[str, tuple[str, Tier, int, int]]) -> None:
    """Victims only of a lower tier (own queue, or with the privileged right) or of borrowed capacity
    (evicting them leaves their queue at or above its guarantee) when the preemptor's queue may reclaim."""
    c = s.cluster
    vq, vtier, _, _ = before[notice.job]
    pq_name, ptier, _, _ = before[notice.preemptor]
    pq = c.queues[pq_name]
    rules = {name for name, _ in s.framework.victim_rule}
    assert notice.rule == LOAN_RECALL or (notice.rule in rules and f"({notice.rule} by " in notice.reason), notice
    if notice.rule == LOAN_RECALL:  # lend-holds: a job on loan on the preemptor's held nodes, recalled
        assert "on loan" in notice.reason
        assert notice.preemptor in c.jobs[notice.job].on_loan_from
        if vq != pq_name:  # never what its queue needs for its guarantee
            assert c.queues[vq].allocated_gpu - _taken_by_others(c, vq) >= c.queues[vq].guaranteed_gpu
    elif vq == pq_name:
        assert vtier < ptier and pq.rights.preempt_own_elastic
    elif not (pq.rights.privileged and vtier < ptier):
        assert pq.rights.reclaim
        # Own-queue preemption (a guaranteed job replacing its queue's elastic one, maybe later in the
        # same cycle) is the queue's own business: only what other queues take must be borrowed capacity.
        assert c.queues[vq].allocated_gpu - _taken_by_others(c, vq) >= c.queues[vq].guaranteed_gpu


def _taken_by_others(c: Cluster, queue: str) -> int:
    """GPU milli of ``queue``'s jobs told to leave for other queues' jobs."""
    return sum(j.gpu_allocated() for j in c.jobs.values()
               if j.queue == queue and j.phase is JobPhase.WILL_EVICT and _queue_of(c, j.will_evict_by) != queue)


def _queue_of(c: Cluster, job: str | None) -> str | None:
    found = c.jobs.get(job) if job is not None else None
    return found.queue if found is not None else None
