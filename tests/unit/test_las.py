"""Least attained service: in a queue that asks for it, long runners yield to newcomers, in coarse levels."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.decisions import Evict, NotifyWillEvict
from scheduler.core.model import Cluster, JobPhase
from scheduler.core.scheduler import PRESETS, Scheduler, SchedulerConfig
from tests.unit.core_helpers import cluster, gang, node, queue, scheduler

LAS = (*PRESETS["ferry"]["plugins"], "las")
HOUR = 3600.0


def las_cluster(on: bool = True, gpus: int = 8) -> tuple[Cluster, Scheduler]:
    q = queue("team", 8)
    q.least_attained_service = on
    c = cluster([node("n1", gpus)], [q])
    return c, scheduler(c, plugins=LAS, las_thresholds_gpu_s=(HOUR, 10 * HOUR))


def notices(res: object) -> set[str]:
    return {d.job for d in res.of(NotifyWillEvict) if isinstance(d, NotifyWillEvict)}  # type: ignore[attr-defined]


def runner_then_newcomer(s: Scheduler, movable: bool = True) -> object:
    """A job on all 8 GPUs from t=0; another of the queue arrives an hour later: that cycle's result."""
    long = gang("long", "team", 1, 8)
    long.movable = movable
    s.submit(long)
    s.cycle(0)
    s.submit(gang("short", "team", 1, 8, submit=HOUR))
    return s.cycle(HOUR)


def test_a_newcomer_evicts_the_movable_job_that_received_more_and_takes_its_gpus() -> None:
    c, s = las_cluster()
    res = runner_then_newcomer(s)  # 8 GPU-hours received: level 1 of (1 h, 10 h) -> below the newcomer's 0
    assert notices(res) == {"long"} and "least-attained-service by short" in c.jobs["long"].reason
    res = s.cycle(HOUR + 31)
    assert [d.job for d in res.of(Evict)] == ["long"] and c.jobs["short"].phase is JobPhase.RUNNING  # type: ignore[attr-defined]
    assert c.jobs["long"].attained_gpu_s == pytest.approx(8 * (HOUR + 31))


def test_nothing_moves_without_the_queue_flag_or_for_a_job_that_is_not_movable() -> None:
    for on, movable in ((False, True), (True, False)):
        c, s = las_cluster(on)
        assert not notices(runner_then_newcomer(s, movable)) and c.jobs["short"].phase is JobPhase.PENDING


def test_jobs_of_one_level_never_evict_each_other() -> None:
    c, s = las_cluster()
    first = gang("first", "team", 1, 8)
    first.movable = True
    s.submit(first)
    s.cycle(0)
    s.submit(gang("second", "team", 1, 8, submit=60))
    assert not notices(s.cycle(60 + HOUR / 16))  # 8 GPUs x 285 s: under 1 GPU-hour, level 0 like the newcomer
    assert c.jobs["second"].phase is JobPhase.PENDING


def back_behind_a_newcomer(s: Scheduler) -> None:
    """``old`` ran 2 h on 8 GPUs and was evicted at 0; ``new`` arrives at 10; a cycle at 10."""
    old = gang("old", "team", 1, 8, submit=0)
    old.attained_gpu_s, old.stopped_at = 8 * 2 * HOUR, 0.0
    s.submit(old)
    s.submit(gang("new", "team", 1, 8, submit=10))
    s.cycle(10)


def test_a_demoted_job_waits_behind_fresh_ones_until_the_promote_knob_counts_it_afresh() -> None:
    c, s = las_cluster()
    back_behind_a_newcomer(s)
    assert c.jobs["new"].phase is JobPhase.RUNNING and c.jobs["old"].phase is JobPhase.PENDING  # level 1 after 0
    s.finish("new")
    s.remove("new")
    s.submit(gang("newer", "team", 1, 4, submit=20))
    s.submit(gang("newest", "team", 1, 8, submit=30))
    res = s.cycle(30)
    assert c.jobs["old"].phase is JobPhase.PENDING  # newer took 4 GPUs; level 0 still first
    assert 4 * HOUR in s.due(res)  # its promotion: a replay that cycles only on events wakes then too
    s.cycle(4 * HOUR)  # the knob (2) times its 2 h run since it stopped: level 0 again, entered now
    assert c.jobs["old"].attained_gpu_s == 0.0 and c.jobs["old"].promoted_at == 4 * HOUR
    s.submit(gang("latest", "team", 1, 8, submit=4 * HOUR + 1))
    s.finish("newer")
    s.remove("newer")
    s.cycle(4 * HOUR + 1)  # first in, first out at level 0: newest waited there before old came back
    assert c.jobs["newest"].phase is JobPhase.RUNNING and c.jobs["old"].phase is JobPhase.PENDING
    s.finish("newest")
    s.remove("newest")
    s.cycle(4 * HOUR + 2)  # and old before latest, which arrived after its promotion
    assert c.jobs["old"].phase is JobPhase.RUNNING and c.jobs["latest"].phase is JobPhase.PENDING


def test_the_service_received_outlives_an_evicted_run_of_the_same_name() -> None:
    _, s = las_cluster()
    runner_then_newcomer(s)
    s.cycle(HOUR + 31)
    s.remove("long")
    again = gang("long", "team", 1, 8)  # its operator makes new pods: the same job (PodGroup)
    s.submit(again)
    assert again.attained_gpu_s == pytest.approx(8 * (HOUR + 31)) and again.stopped_at == HOUR + 31


def test_bad_thresholds_are_refused() -> None:
    for bad in ((10.0, 5.0), (0.0,), (5.0, 5.0)):
        with pytest.raises(ValueError, match="las_thresholds_gpu_s"):
            SchedulerConfig(las_thresholds_gpu_s=bad)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.floats(0, 20 * HOUR)), min_size=2, max_size=8))
def test_a_victim_always_received_more_than_its_preemptor(jobs: list[tuple[int, float]]) -> None:
    """Whatever runs, every notice the las rule gives goes to a job at a lower level than its preemptor."""
    c, s = las_cluster()
    for i, (gpus, _) in enumerate(jobs):
        j = gang(f"r{i}", "team", 1, gpus)
        j.movable = True
        s.submit(j)
    s.cycle(0)
    t = 0.0
    for i, (gpus, later) in enumerate(jobs):
        t += later
        s.submit(gang(f"p{i}", "team", 1, gpus, submit=t))
        res = s.cycle(t)
        plugin = next(p for p in s.plugins if p.name == "las")
        for d in res.of(NotifyWillEvict):  # type: ignore[attr-defined]
            if "least-attained-service" not in d.reason:
                continue  # another rule's notice (a hold recalling the jobs it lent its nodes to)
            v = c.jobs[d.job]
            by = c.jobs[v.will_evict_by or ""]
            assert plugin.level(v.attained(t)) > plugin.level(by.attained_gpu_s)  # type: ignore[attr-defined]


def test_a_demoted_job_is_told_why_newer_jobs_go_first_and_when_it_counts_afresh() -> None:
    _, s = las_cluster()
    back_behind_a_newcomer(s)
    s.submit(gang("newer", "team", 1, 8, submit=20))
    reasons = s.reasons(s.cycle(20))
    assert reasons["old"].endswith("; least attained service: it received 16.0 GPU-hours (level 2), so jobs of "
                                   "queue team that received less go first; it counts afresh 14400 s after its "
                                   "last run ended")
    assert "least attained service" not in reasons["newer"]
    _, plain = las_cluster(on=False)
    back_behind_a_newcomer(plain)
    assert "least attained service" not in " ".join(plain.reasons(plain.cycle(11)).values())


def test_a_promoted_job_goes_first_for_free_capacity_but_evicts_nobody() -> None:
    """Two long runners of a queue must not take turns evicting each other: counted afresh by the promote
    knob, a job waits for capacity that frees; only a job that has not run since (a newcomer) evicts."""
    c, s = las_cluster()
    runner = gang("runner", "team", 1, 8)
    runner.movable = True
    s.submit(runner)
    s.cycle(0)
    back = gang("back", "team", 1, 8, submit=0)
    back.attained_gpu_s, back.stopped_at = 8 * 0.5 * HOUR, 0.0  # ran 30 min, evicted at 0
    s.submit(back)
    s.cycle(10)
    s.cycle(HOUR)  # promoted (2 x its 30 min): level 0 against the runner's level 1
    assert c.jobs["back"].promoted_at == HOUR and c.jobs["back"].attained_gpu_s == 0.0
    assert not notices(s.cycle(HOUR + 400)) and c.jobs["runner"].phase is JobPhase.RUNNING
    s.submit(gang("fresh", "team", 1, 8, submit=HOUR + 500))
    assert notices(s.cycle(HOUR + 500)) == {"runner"}  # a newcomer still does
    assert "least-attained-service by fresh" in c.jobs["runner"].reason
