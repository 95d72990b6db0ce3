"""The framework's own promises: statements undo whole trials, configurations name real actions and
plugins, a plugin added as a module and a configuration entry takes part, reconfiguring keeps the model."""

from __future__ import annotations

import pytest

from scheduler.core.framework import Framework, Plugin
from scheduler.core.model import Job, JobPhase, Queue, ReplicaPhase, Tier
from scheduler.core.plugins import PLUGINS
from scheduler.core.scheduler import PRESETS, Scheduler, SchedulerConfig
from scheduler.core.statement import Statement
from tests.unit.core_helpers import cluster, gang, node, queue


def _free(s: Scheduler) -> list[int]:
    return [d.free for n in s.cluster.nodes.values() for d in n.devices]


def _running(s: Scheduler, *jobs: Job) -> None:
    for j in jobs:
        s.submit(j)
    s.cycle(0)
    assert all(j.phase is JobPhase.RUNNING for j in jobs)


def test_a_discarded_statement_leaves_the_model_as_it_was() -> None:
    s = Scheduler(cluster([node("n1", 4), node("n2", 4)], [queue("a")]))
    victim, other = gang("victim", "a", 2, 2), gang("other", "a", 1, 2, submit=1)
    _running(s, victim, other)
    before = (_free(s), s.cluster.queues["a"].allocated_gpu, [(r.node, r.devices) for r in victim.replicas])
    newcomer = gang("new", "a", 2, 2, submit=2)
    s.submit(newcomer)
    with Statement(s.placer) as st:
        st.lift(victim)
        assert st.place_gang(newcomer, newcomer.pending(), frozenset()) is not None
        assert all(r.phase is ReplicaPhase.PENDING for r in victim.replicas)
    assert (_free(s), s.cluster.queues["a"].allocated_gpu,
            [(r.node, r.devices) for r in victim.replicas]) == before
    assert all(r.phase is ReplicaPhase.BOUND for r in victim.replicas)
    assert all(r.phase is ReplicaPhase.PENDING for r in newcomer.replicas)


def test_an_exception_inside_a_statement_undoes_it() -> None:
    s = Scheduler(cluster([node("n1", 4)], [queue("a")]))
    job = gang("j", "a", 2, 1)
    _running(s, job)
    before = _free(s)

    def trial() -> None:
        with Statement(s.placer) as st:
            st.lift(job)
            raise RuntimeError("trial failed halfway")

    with pytest.raises(RuntimeError):
        trial()
    assert _free(s) == before and job.allocated == 2000


def test_a_committed_statement_keeps_its_operations_and_restore_undoes_one_job() -> None:
    s = Scheduler(cluster([node("n1", 4)], [queue("a")]))
    a, b = gang("a", "a", 2, 1), gang("b", "a", 2, 1, submit=1)
    _running(s, a, b)
    with Statement(s.placer) as st:
        st.lift(a)
        st.lift(b)
        st.restore(a)  # out of order: b stays lifted
        st.commit()
    assert a.allocated == 2000 and b.allocated == 0
    assert s.cluster.queues["a"].allocated_gpu == 2000


def test_configurations_name_real_actions_and_plugins() -> None:
    with pytest.raises(ValueError, match=r"unknown plugin.*nonesuch; known: priority"):
        SchedulerConfig(plugins=("priority", "nonesuch"))
    with pytest.raises(ValueError, match="unknown action"):
        SchedulerConfig(actions=("allocate", "dance"))
    with pytest.raises(ValueError, match="named twice"):
        SchedulerConfig(plugins=("priority", "priority"))
    with pytest.raises(ValueError, match="unknown preset 'slurm'"):
        SchedulerConfig.preset("slurm")
    for name in PRESETS:
        assert SchedulerConfig.preset(name).actions[0] == "allocate"


class _Maintenance(Plugin):
    """The README's example plugin."""

    name = "maintenance"

    def register(self, fw: Framework) -> None:
        fw.admit.append((self.name, self.admit))

    def admit(self, queue: Queue, job: Job) -> str | None:
        return f"queue {queue.name} is in maintenance" if queue.name.endswith("-maint") else None


def test_a_new_plugin_is_a_module_and_a_configuration_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PLUGINS, "maintenance", _Maintenance)
    plugins = ("priority", "guarantee", "capacity", "maintenance", "protection", "tier-preemption", "reclaim")
    s = Scheduler(cluster([node("n1", 8)], [queue("a"), queue("b-maint")]), SchedulerConfig(plugins=plugins))
    s.submit(gang("a1", "a", 1))
    s.submit(gang("b1", "b-maint", 1))
    res = s.cycle(0)
    assert s.cluster.jobs["a1"].phase is JobPhase.RUNNING
    assert res.pending_reasons["b1"] == "queue b-maint is in maintenance"


def test_reconfiguring_keeps_the_model_and_decisions_in_flight() -> None:
    """fifo → ferry at run time: running jobs, victims and pending order survive; the new policy applies."""
    s = Scheduler(cluster([node("n1", 4)], [queue("a", 4, grace=100)]), SchedulerConfig.preset("ferry",
                                                                                             min_runtime_s=0))
    el = gang("el", "a", 4, tier=Tier.ELASTIC)
    _running(s, el)
    s.submit(gang("g", "a", 2, submit=1))
    s.cycle(1)
    assert el.phase is JobPhase.WILL_EVICT
    s.configure(SchedulerConfig.preset("fifo"))
    s.submit(gang("big", "a", 8, submit=2))  # can never fit: fifo lets nobody pass it...
    s.submit(gang("late", "a", 1, submit=3))
    s.cycle(50)
    assert el.phase is JobPhase.WILL_EVICT  # the notice given under ferry stands
    s.cycle(101)
    assert el.phase is JobPhase.EVICTED and s.cluster.jobs["g"].phase is JobPhase.RUNNING
    assert s.cluster.jobs["late"].phase is JobPhase.PENDING  # ...strict order: behind "big"
    s.configure(SchedulerConfig.preset("ferry", min_runtime_s=0))
    s.cycle(102)
    assert s.cluster.jobs["late"].phase is JobPhase.RUNNING  # ferry backfills past it
