"""fair-over-time: borrowers yield in proportion to what they received recently, not only to what they hold."""

from __future__ import annotations

import dataclasses
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


def _a_used_the_node_for_half_an_hour(sched: Scheduler) -> None:
    sched.submit(_whole_node("a-old", "a", 0.0))
    sched.cycle(0.0)
    sched.cycle(HOUR / 2)
    sched.finish("a-old", JobPhase.SUCCEEDED)


def test_a_new_configuration_keeps_the_usage_counted_so_far() -> None:
    """Plugins register anew when the configuration changes (a ConfigMap edit): the usage lives on the
    queues, so the queue that used the node still yields afterwards."""
    sched = _one_node(("priority", "fair-over-time", "capacity"))
    _a_used_the_node_for_half_an_hour(sched)
    sched.configure(dataclasses.replace(sched.config, victim_cooldown_s=sched.config.victim_cooldown_s + 1))
    sched.submit(_whole_node("a-new", "a", HOUR - 1))
    sched.submit(_whole_node("b-new", "b", HOUR))
    assert [d.job for d in sched.cycle(HOUR).of(Bind)] == ["b-new"]
    assert sched.cluster.queues["a"].recent_usage > 0 and sched.cluster.queues["b"].recent_usage == 0


def test_a_model_built_after_a_restart_continues_from_the_recorded_usage() -> None:
    """The service records each queue's usage in its status (:func:`usage_status`) and a new model starts
    from it (:func:`recorded_usage`), decayed over the time since it was recorded."""
    from scheduler.service.snapshot import recorded_usage, usage_status

    before = _one_node(("priority", "fair-over-time", "capacity"))
    _a_used_the_node_for_half_an_hour(before)
    before.cycle(HOUR / 2 + 1)
    recorded = {q: usage_status(before.cluster.queues[q]) for q in ("a", "b")}
    assert recorded["a"] is not None and recorded["a"]["gpuSeconds"] == pytest.approx(
        decayed(0.0, 8000.0, HOUR / 2, HOUR) / 1000 * 2 ** (-1 / HOUR), abs=0.1)

    after = _one_node(("priority", "fair-over-time", "capacity"))
    for name, queue in after.cluster.queues.items():
        for key, value in recorded_usage(recorded[name]).items():
            setattr(queue, key, value)
    after.submit(_whole_node("a-new", "a", HOUR - 1))
    after.submit(_whole_node("b-new", "b", HOUR))
    assert [d.job for d in after.cycle(HOUR).of(Bind)] == ["b-new"]  # a fresh model would start a (by name)
    assert after.cluster.queues["a"].recent_usage == pytest.approx(
        recorded["a"]["gpuSeconds"] * 1000 * 2 ** -((HOUR - (HOUR / 2 + 1)) / HOUR), rel=1e-3)


def test_a_borrower_is_told_its_queues_recent_usage_orders_it() -> None:
    sched = _one_node(("priority", "fair-over-time", "capacity"))
    _a_used_the_node_for_half_an_hour(sched)
    sched.submit(_whole_node("a-new", "a", HOUR - 1))
    sched.submit(_whole_node("b-new", "b", HOUR))
    reasons = sched.reasons(sched.cycle(HOUR))
    assert reasons["a-new"].endswith("; fair-over-time: queues borrow idle GPUs least recent usage first (half-life "
                                     "1 h; each queue's: kubectl ferry status -o wide)")
    plain = _one_node(("priority", "guarantee", "capacity"))
    _a_used_the_node_for_half_an_hour(plain)
    plain.submit(_whole_node("a-new", "a", HOUR - 1))
    plain.submit(_whole_node("b-new", "b", HOUR))
    waiting = plain.reasons(plain.cycle(HOUR))
    assert waiting and "fair-over-time" not in " ".join(waiting.values())
