"""The trace replay's pure parts: the job window, compression, the ledger that turns pod events into the
simulator's figures, and the scaled scheduler configuration."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.contenders import KubeFerry
from bench.replay import Ledger, ReplayJob, compress, trace_window
from scheduler.core.model import Queue
from scheduler.core.scheduler import SchedulerConfig
from scheduler.service.settings import Settings, parse
from scheduler.sim.philly import TraceJob


def pod(name: str, node: str | None = None, phase: str = "Pending", notice: bool = False) -> dict[str, Any]:
    annotations = {"kubeferry.io/will-evict-at": "2026-01-01T00:00:00Z"} if notice else {}
    return {"metadata": {"name": name, "namespace": "vc-a", "annotations": annotations},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


def ledger(*jobs: ReplayJob, factor: float = 10.0) -> Ledger:
    queues = {"a": Queue("a", guaranteed_gpu=8000, weight=0.5), "b": Queue("b", guaranteed_gpu=8000, weight=0.5)}
    return Ledger(list(jobs), queues, capacity=16, factor=factor)


def test_the_window_starts_at_the_day_and_is_compressed_by_one_factor() -> None:
    trace, vc = trace_window(datetime(2017, 10, 16, tzinfo=UTC), 50)
    assert len(trace) == 50 and vc
    assert trace[0].submit >= datetime(2017, 10, 16, tzinfo=UTC).timestamp()
    jobs = compress(trace, 60.0)
    assert jobs[0].arrival == 0.0
    assert jobs[-1].arrival == pytest.approx((trace[-1].submit - trace[0].submit) / 60)
    assert all(j.duration == pytest.approx(t.duration / 60) for j, t in zip(jobs, trace, strict=True))


def test_a_big_job_is_a_gang_of_whole_nodes() -> None:
    (job,) = compress([TraceJob(0.0, 100.0, 20, "a")], 1.0)
    assert (job.pods, job.gpus_per_pod) == (3, 8)
    (small,) = compress([TraceJob(0.0, 100.0, 4, "a")], 1.0)
    assert (small.pods, small.gpus_per_pod) == (1, 4)


def test_a_gang_starts_when_its_last_member_is_bound() -> None:
    job = ReplayJob("j1", "a", 16, 0.0, 5.0)
    book = ledger(job)
    lj = book.live["j1"]
    names = book.submit(lj, now=1.0)
    assert names == ["j1-0-0", "j1-0-1"]
    book.observe("MODIFIED", pod(names[0], "n1"), now=2.0)
    assert lj.started is None
    book.observe("MODIFIED", pod(names[1], "n2"), now=3.5)
    assert lj.started == 3.5 and lj.waited == 2.5
    assert book.finished()
    assert book.metrics(now=4.0)["avg_wait_s"] == 25.0  # trace seconds: 2.5 s × factor 10


def test_an_evicted_job_keeps_the_work_done_until_its_notice_and_waits_again() -> None:
    job = ReplayJob("j1", "a", 1, 0.0, 10.0)
    book = ledger(job)
    lj = book.live["j1"]
    (name,) = book.submit(lj, now=0.0)
    book.observe("MODIFIED", pod(name, "n1", "Running"), now=1.0)
    book.observe("MODIFIED", pod(name, "n1", "Running", notice=True), now=4.0)
    again = book.observe("DELETED", pod(name, "n1", "Running", notice=True), now=6.0)
    assert again is lj and book.preemptions == 1
    assert lj.remaining == pytest.approx(7.0)  # 3 s checkpointed at the notice, the grace's 2 s lost
    assert book.observe("MODIFIED", pod(name, "n1", "Running"), now=6.5) is None  # the old incarnation is ignored
    (name2,) = book.submit(lj, now=6.0)
    assert name2 == "j1-1-0" and not book.finished()
    book.observe("MODIFIED", pod(name2, "n2", "Running"), now=9.0)
    assert lj.waited == pytest.approx(1.0 + 3.0)
    book.observe("MODIFIED", pod(name2, "n2", "Succeeded"), now=16.0)
    assert lj.done and book.observe("DELETED", pod(name2, "n2", "Succeeded"), now=17.0) is None
    assert book.preemptions == 1


def test_utilisation_and_fairness_follow_the_simulators_definitions() -> None:
    a, b = ReplayJob("ja", "a", 8, 0.0, 10.0), ReplayJob("jb", "b", 16, 0.0, 10.0)
    book = ledger(a, b)
    (pa,) = book.submit(book.live["ja"], now=0.0)
    book.submit(book.live["jb"], now=0.0)
    book.observe("MODIFIED", pod(pa, "n1", "Running"), now=0.0)
    book.sample(dt=2.0, now=2.0)  # a runs 8 GPUs, b waits for 16 on a 16-GPU cluster
    m = book.metrics(now=2.0)
    assert m["gpu_utilization"] == 50.0
    assert m["still_waiting"] == 1 and m["p99_wait_s"] == pytest.approx(19.8)  # jb: 2 s so far, × 10
    # entitled: a 8, b 8 (water-fill of demands 8 and 16 by equal weight); received 8 and 0
    assert m["jain_fairness"] == pytest.approx(0.5)
    assert book.timeline == [(20.0, 8, 1)]


def test_the_compressed_configuration_is_one_the_scheduler_accepts(tmp_path: Path) -> None:
    ferry = KubeFerry().compressed(tmp_path, 60.0)
    (flag,) = ferry.args
    path = Path(flag.removeprefix("--config="))
    base = Settings(SchedulerConfig(), 0.5)
    got = parse(path.read_text(), base, str(path)).core
    ref = SchedulerConfig()
    assert got.min_runtime_s == pytest.approx(ref.min_runtime_s / 60)
    assert got.reservation_after_s == pytest.approx(ref.reservation_after_s / 60)  # type: ignore[operator]
    assert got.starvation_preempt_after_s == pytest.approx(ref.starvation_preempt_after_s / 60)  # type: ignore[operator]
    assert got.victim_cooldown_s == pytest.approx(ref.victim_cooldown_s / 60)


def test_utilisation_over_the_arrivals_counts_the_same_span_whoever_schedules() -> None:
    a, b = ReplayJob("ja", "a", 8, 0.0, 10.0), ReplayJob("jb", "b", 8, 4.0, 10.0)
    book = ledger(a, b)
    (pa,) = book.submit(book.live["ja"], now=0.0)
    book.observe("MODIFIED", pod(pa, "n1", "Running"), now=0.0)
    book.sample(dt=2.0, now=2.0)  # nobody waits: utilisation while jobs wait has nothing to say
    (pb,) = book.submit(book.live["jb"], now=4.0)
    book.observe("MODIFIED", pod(pb, "n2", "Running"), now=4.0)
    book.sample(dt=2.0, now=4.0)
    book.sample(dt=2.0, now=6.0)  # after the last arrival: not counted
    m = book.metrics(now=6.0)
    assert m["gpu_utilization"] is None and m["gpu_utilization_arrivals"] == 75.0  # 8 then 16 of 16 GPUs
