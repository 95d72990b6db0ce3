"""Job dependencies: a gang starts only after the gangs it names reached their phase."""

from __future__ import annotations

from scheduler.core.decisions import NotifyWillEvict
from scheduler.core.model import Cluster, Dependency, Job, JobPhase, Tier
from tests.unit.core_helpers import cluster, gang, node, queue, scheduler


def after(job: Job, *deps: tuple[str, JobPhase]) -> Job:
    job.depends_on = tuple(Dependency(name, phase) for name, phase in deps)
    return job


def phase(c: Cluster, name: str) -> JobPhase:
    """A job's phase, read afresh (a cycle changes it)."""
    return c.jobs[name].phase


def test_a_job_waits_for_its_dependency_to_succeed_and_the_jobs_behind_it_go_on() -> None:
    c = cluster([node("n1", 8)])
    s = scheduler(c)
    s.submit(gang("prep", "default", 1, 2, submit=0))
    s.submit(after(gang("train", "default", 1, 2, submit=1), ("prep", JobPhase.SUCCEEDED)))
    s.submit(gang("other", "default", 1, 2, submit=2))  # the same shape, behind train in the queue
    res = s.cycle(3)
    assert c.jobs["prep"].phase is JobPhase.RUNNING and c.jobs["other"].phase is JobPhase.RUNNING
    assert c.jobs["train"].phase is JobPhase.PENDING
    assert res.pending_reasons["train"] == "waiting for prep to succeed (it is Running)"
    s.finish("prep", JobPhase.SUCCEEDED)
    s.remove("prep")  # gone from the model: its outcome is remembered
    s.cycle(4)
    assert phase(c, "train") is JobPhase.RUNNING


def test_a_running_dependency_is_met_as_soon_as_it_starts() -> None:
    c = cluster([node("n1", 8)])
    s = scheduler(c)
    s.submit(after(gang("client", "default", 1, 1, submit=0), ("server", JobPhase.RUNNING)))
    s.submit(gang("server", "default", 2, 1, submit=1))
    s.cycle(2)  # client comes first in the queue but waits; server starts in the same cycle
    assert c.jobs["server"].phase is JobPhase.RUNNING
    assert c.jobs["client"].phase is JobPhase.PENDING
    s.cycle(3)
    assert phase(c, "client") is JobPhase.RUNNING


def test_a_failed_dependency_is_reported_as_never_met() -> None:
    c = cluster([node("n1", 8)])
    s = scheduler(c)
    s.submit(gang("prep", "default", 1, 1, submit=0))
    s.submit(after(gang("train", "default", 1, 1, submit=0), ("prep", JobPhase.SUCCEEDED)))
    s.cycle(1)
    s.finish("prep", JobPhase.FAILED, "exit code 1")
    res = s.cycle(2)
    assert c.jobs["train"].phase is JobPhase.PENDING
    assert res.pending_reasons["train"] == "can never start: it waits for prep to succeed, and prep failed"


def test_a_missing_dependency_waits_then_is_reported_after_the_timeout() -> None:
    c = cluster([node("n1", 8)])
    s = scheduler(c, dependency_timeout_s=100.0)
    s.submit(after(gang("train", "default", 1, 1, submit=0), ("prep", JobPhase.SUCCEEDED)))
    assert s.cycle(50).pending_reasons["train"] == "waiting for prep to succeed (it does not exist yet)"
    reason = s.cycle(100).pending_reasons["train"]
    assert reason.startswith("can never start: it waits for prep to succeed, and prep still does not exist")
    s.submit(gang("prep", "default", 1, 1, submit=101))  # late after all: the reason follows the facts
    assert s.cycle(101).pending_reasons["train"] == "waiting for prep to succeed (it is Pending)"
    assert s.cycle(102).pending_reasons["train"] == "waiting for prep to succeed (it is Running)"


def test_a_deleted_job_is_not_taken_for_a_failed_one() -> None:
    c = cluster([node("n1", 8)])
    s = scheduler(c)
    s.submit(gang("prep", "default", 1, 1, submit=0))
    s.cycle(0)
    s.remove("prep")
    assert s.phase_of("prep") is None


def test_the_adapters_record_answers_for_jobs_the_model_does_not_hold() -> None:
    c = cluster([node("n1", 8)])
    s = scheduler(c)
    s.phase_elsewhere = lambda name: JobPhase.SUCCEEDED if name == "ns/prep" else None
    s.submit(after(gang("ns/train", "default", 1, 1), ("ns/prep", JobPhase.SUCCEEDED)))
    s.cycle(0)
    assert c.jobs["ns/train"].phase is JobPhase.RUNNING


def test_a_waiting_job_holds_no_nodes_and_preempts_nobody() -> None:
    c = cluster([node("n1", 8), node("n2", 8)], [queue("a", 8), queue("b", 0)])
    s = scheduler(c, reservation_after_s=10.0, starvation_preempt_after_s=20.0, preemption_retry_s=0.0)
    s.submit(gang("elastic", "b", 1, 8, tier=Tier.ELASTIC, submit=0))
    s.submit(gang("fill", "a", 1, 4, submit=0))
    s.cycle(0)
    s.submit(after(gang("big", "a", 1, 8, submit=1), ("never", JobPhase.SUCCEEDED)))
    s.submit(gang("small", "a", 1, 2, submit=2))
    for t in (2, 15, 30, 60):
        res = s.cycle(t)
        assert not res.of(NotifyWillEvict)
        assert not c.jobs["big"].reserved_nodes
    assert c.jobs["small"].phase is JobPhase.RUNNING
    assert c.jobs["elastic"].phase is JobPhase.RUNNING
