"""lend-holds: nodes held for a starving gang take jobs on loan while they drain, and recall them (notice,
grace) once the gang could start without them."""

from __future__ import annotations

from scheduler.core.decisions import Evict, JobStatus, NotifyWillEvict
from scheduler.core.model import Cluster, JobPhase
from scheduler.core.scheduler import PRESETS, Scheduler
from tests.unit.core_helpers import NO_LOANS, cluster, gang, node, passed_big_gang, scheduler

LENDING = PRESETS["ferry"]["plugins"]


def starving_gang(plugins: tuple[str, ...] = LENDING) -> tuple[Cluster, Scheduler, list[str]]:
    """The gang of :func:`passed_big_gang` holding two nodes from t=200 on; and the jobs on them."""
    c, s = passed_big_gang(plugins)
    s.cycle(200)
    held = set(c.jobs["big"].reserved_nodes)
    assert len(held) == 2
    return c, s, [j for j in ("small0", "small1", "small2", "small3", "small4", "filler")
                  if c.jobs[j].replicas[0].node in held]


def test_a_drained_held_node_runs_a_job_on_loan_which_is_recalled_when_the_holder_could_start() -> None:
    c, s, on_held = starving_gang()
    held = set(c.jobs["big"].reserved_nodes)
    s.finish(on_held[0])  # one held node has room; the gang still needs both nodes whole
    s.submit(gang("late", "default", 1, 4, submit=201))
    res = s.cycle(202)
    late = c.jobs["late"]
    assert late.phase is JobPhase.RUNNING and late.replicas[0].node in held
    assert late.on_loan_from == ("big",)
    started = next(d for d in res.of(JobStatus) if isinstance(d, JobStatus) and d.job == "late")
    assert "on loan on node(s) held for big" in started.reason  # its user is told at once
    assert c.jobs["big"].phase is JobPhase.PENDING
    for j in on_held[1:]:  # the gang's own occupants are gone: only the loan stands in its way
        s.finish(j)
    res = s.cycle(300)
    notices = [d for d in res.of(NotifyWillEvict) if isinstance(d, NotifyWillEvict)]
    assert [(n.job, n.preemptor) for n in notices] == [("late", "big")]
    assert "on loan on node(s) held for big" in notices[0].reason
    assert c.jobs["big"].phase is JobPhase.PRIVILEGED
    assert not s.cycle(320).of(Evict)  # the loan keeps its grace period to checkpoint
    assert [d.job for d in s.cycle(331).of(Evict) if isinstance(d, Evict)] == ["late"]
    s.cycle(332)
    assert c.jobs["big"].phase is JobPhase.RUNNING


def test_a_job_on_loan_that_ends_before_the_holder_could_start_is_never_recalled() -> None:
    c, s, on_held = starving_gang()
    s.finish(on_held[0])
    s.submit(gang("late", "default", 1, 4, submit=201))
    s.cycle(202)
    assert c.jobs["late"].on_loan_from == ("big",)
    s.finish("late")
    for j in on_held[1:]:
        s.finish(j)
    res = s.cycle(300)
    assert not res.of(NotifyWillEvict)
    assert c.jobs["big"].phase is JobPhase.RUNNING


def test_only_the_loans_the_holder_needs_gone_are_recalled() -> None:
    # eight full nodes (two 4-GPU jobs each); a one-pod 8-GPU job passed by a 4-GPU one holds two nodes
    # (its hold doubled: it needs one); each held node takes a job on loan; when one held node's own
    # occupant ends, only the loan on that node is recalled
    c = cluster([node(f"n{i}", 8) for i in range(8)])
    s = scheduler(c, reservation_after_s=100.0, plugins=LENDING)
    for i in range(16):
        s.submit(gang(f"run{i}", "default", 1, 4, submit=0))
    s.cycle(0)
    s.submit(gang("big", "default", 1, 8, submit=1))
    s.finish("run0")
    s.submit(gang("filler", "default", 1, 4, submit=2))
    s.cycle(2)
    assert c.jobs["big"].bypassed
    s.cycle(201)
    held = c.jobs["big"].reserved_nodes
    assert len(held) == 2
    occupants = {n: [j.name for j in c.jobs.values() if j.phase is JobPhase.RUNNING and j.replicas[0].node == n]
                 for n in held}
    for i, n in enumerate(held):
        s.finish(occupants[n][0])
        s.submit(gang(f"loan{i}", "default", 1, 4, submit=202 + i))
        s.cycle(202 + i)
        assert c.jobs[f"loan{i}"].replicas[0].node == n and c.jobs[f"loan{i}"].on_loan_from == ("big",)
    s.finish(occupants[held[0]][1])
    res = s.cycle(300)
    assert [d.job for d in res.of(NotifyWillEvict) if isinstance(d, NotifyWillEvict)] == ["loan0"]
    assert c.jobs["big"].reserved_nodes == (held[0],)  # the other held node is free for others again
    assert c.jobs["loan1"].phase is JobPhase.RUNNING


def test_a_job_evicted_within_the_cooldown_does_not_go_on_loan() -> None:
    c, s, on_held = starving_gang()
    s.finish(on_held[0])
    late = gang("late", "default", 1, 4, submit=201)
    late.stopped_at = 150.0  # its last run was evicted 52 s ago
    s.submit(late)
    s.cycle(202)
    assert c.jobs["late"].phase is JobPhase.PENDING
    s.cycle(150.0 + s.config.loan_cooldown_s)
    assert c.jobs["late"].phase is JobPhase.RUNNING and c.jobs["late"].on_loan_from == ("big",)


def test_the_ferry_preset_lends_and_without_lend_holds_a_held_node_stays_empty() -> None:
    assert "lend-holds" in LENDING
    c, s, on_held = starving_gang(NO_LOANS)
    s.finish(on_held[0])
    s.submit(gang("late", "default", 1, 4, submit=201))
    s.cycle(202)
    assert c.jobs["late"].phase is JobPhase.PENDING
