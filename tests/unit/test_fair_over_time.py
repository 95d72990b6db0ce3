"""fair-over-time: borrowers yield in proportion to what they received recently, not only to what they hold."""

from __future__ import annotations

import math

import pytest

from scheduler.core.decisions import Bind
from scheduler.core.model import Cluster, Device, Job, JobPhase, Node, Queue, Request, Task
from scheduler.core.plugins.fair_over_time import decayed
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.sim.philly import day_spans, jain_index

HOUR = 3600.0


def test_usage_halves_per_half_life_and_a_constant_allocation_converges() -> None:
    assert decayed(100.0, 0.0, HOUR, HOUR) == pytest.approx(50.0)
    steady = 8000 * HOUR / math.log(2)  # 8 GPUs held for ever: the integral of the decay
    u = 0.0
    for _ in range(200):
        u = decayed(u, 8000.0, 600.0, HOUR)
    assert u == pytest.approx(steady, rel=1e-6)
    assert decayed(u, 8000.0, 0.0, HOUR) == u  # no time, no change
    # one step or many: the same usage for the same constant allocation
    many = 0.0
    for _ in range(6):
        many = decayed(many, 500.0, 600.0, HOUR)
    assert decayed(0.0, 500.0, HOUR, HOUR) == pytest.approx(many)


def _one_node(plugins: tuple[str, ...]) -> Scheduler:
    nodes = {"n": Node("n", 64000, 1 << 20, [Device(d) for d in range(8)])}
    queues = {q: Queue(q) for q in ("a", "b")}  # no guarantees: both borrow, same weight
    return Scheduler(Cluster(nodes, queues), SchedulerConfig(
        actions=("allocate",), plugins=plugins, usage_half_life_s=HOUR))


def _whole_node(name: str, queue: str, t: float) -> Job:
    return Job(name, queue, [Task("w", 1, Request(gpus=8))], submit_time=t)


@pytest.mark.parametrize(("plugins", "first"), [
    (("priority", "guarantee", "capacity"), "a"),  # instantaneous: both hold nothing, a by name
    (("priority", "fair-over-time", "capacity"), "b"),  # a used the node for the last hour
])
def test_the_queue_that_used_less_recently_goes_first(plugins: tuple[str, ...], first: str) -> None:
    sched = _one_node(plugins)
    sched.submit(_whole_node("a-old", "a", 0.0))
    assert [d.job for d in sched.cycle(0.0).of(Bind)] == ["a-old"]
    sched.cycle(HOUR / 2)
    sched.finish("a-old", JobPhase.SUCCEEDED)
    sched.submit(_whole_node("a-new", "a", HOUR - 1))
    sched.submit(_whole_node("b-new", "b", HOUR))
    placed = sched.cycle(HOUR).of(Bind)
    assert [d.job for d in placed] == [f"{first}-new"]


def test_without_history_the_order_is_the_guarantee_plugins() -> None:
    sched = _one_node(("priority", "fair-over-time", "capacity"))
    sched.submit(_whole_node("a-new", "a", 1.0))
    sched.submit(_whole_node("b-new", "b", 0.0))
    assert [d.job for d in sched.cycle(10.0).of(Bind)] == ["a-new"]  # as guarantee: equal keys, a by name


def test_daily_spans_and_jain() -> None:
    assert day_spans(86000.0, 87000.0) == [(0, 400.0), (1, 600.0)]
    assert day_spans(10.0, 10.0) == []
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert jain_index([]) == 1.0
