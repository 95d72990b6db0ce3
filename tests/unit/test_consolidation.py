"""Consolidation: movable jobs are moved so that a gang finds whole nodes."""

from __future__ import annotations

from scheduler.core.decisions import Evict, NotifyWillEvict
from scheduler.core.model import Cluster, Job, JobPhase
from scheduler.core.scheduler import Scheduler
from tests.unit.core_helpers import cluster, gang, node, scheduler


def phase(c: Cluster, name: str) -> JobPhase:
    return c.jobs[name].phase


def fragmented(movable: bool = True, nodes: int = 2, action: str = "consolidate",
               **cfg: object) -> tuple[Cluster, Scheduler]:
    """Nodes of 8 GPUs, each holding 4 one-GPU jobs (the others ended): 4 free on every node, none whole."""
    c = cluster([node(f"n{i}", 8) for i in range(1, nodes + 1)])
    s = scheduler(c, actions=("allocate", "reserve", "preempt", action), **cfg)
    for i in range(8 * nodes):
        job = gang(f"s{i}", "default", 1, 1, submit=0)
        job.movable = movable
        s.submit(job)
    s.cycle(0)
    by_node: dict[str, list[Job]] = {}
    for i in range(8 * nodes):
        j = c.jobs[f"s{i}"]
        by_node.setdefault(j.replicas[0].node or "", []).append(j)
    for jobs in by_node.values():
        for j in jobs[:4]:
            s.finish(j.name)
            s.remove(j.name)
    return c, s


def notices(res: object) -> list[NotifyWillEvict]:
    return [d for d in res.of(NotifyWillEvict) if isinstance(d, NotifyWillEvict)]  # type: ignore[attr-defined]


def test_a_gang_blocked_by_fragmentation_gets_a_node_emptied_of_movable_jobs() -> None:
    c, s = fragmented()
    s.submit(gang("big", "default", 1, 8, submit=10))
    res = s.cycle(10)
    moved = notices(res)
    assert len(moved) == 4 and all("consolidation for big" in n.reason for n in moved)
    movers = {n.job for n in moved}
    assert len({c.jobs[m].replicas[0].node for m in movers}) == 1  # one node emptied
    assert phase(c, "big") is JobPhase.PRIVILEGED and "consolidating: moving 4 movable job(s)" in c.jobs["big"].reason
    res = s.cycle(10 + 31)  # the movers' grace (30 s) is over
    assert {d.job for d in res.of(Evict) if isinstance(d, Evict)} == movers
    assert phase(c, "big") is JobPhase.RUNNING
    for m in movers:  # their operator makes new pods: they fit in the GPUs the others left
        s.remove(m)
        again = gang(f"{m}-again", "default", 1, 1, submit=41)
        again.movable = True
        s.submit(again)
    s.cycle(42)
    assert all(phase(c, f"{m}-again") is JobPhase.RUNNING for m in movers)


def test_jobs_that_did_not_declare_themselves_movable_stay() -> None:
    c, s = fragmented(movable=False)
    s.submit(gang("big", "default", 1, 8, submit=10))
    assert not notices(s.cycle(10))
    assert phase(c, "big") is JobPhase.PENDING


def test_nobody_moves_when_the_movers_would_find_no_room_elsewhere() -> None:
    _, s = fragmented()
    for i in range(3):  # the other node's free GPUs taken by jobs that stay: the movers could not land
        s.submit(gang(f"stay{i}", "default", 1, 1, submit=5))
    s.cycle(5)
    s.submit(gang("big", "default", 1, 8, submit=10))
    assert not notices(s.cycle(10))


def test_moves_per_cycle_are_bounded_and_a_moved_job_waits_out_its_cooldown() -> None:
    _, s = fragmented(consolidation_moves_per_cycle=3)
    s.submit(gang("big", "default", 1, 8, submit=10))
    assert not notices(s.cycle(10))  # emptying a node takes 4 moves, more than the 3 allowed
    c2, s2 = fragmented(nodes=3, consolidation_cooldown_s=1000.0)
    s2.submit(gang("big", "default", 1, 8, submit=10))
    movers = {n.job for n in notices(s2.cycle(10))}
    nodes = {c2.jobs[m].replicas[0].node for m in movers}
    others = [j for j in c2.jobs if j.startswith("s") and j not in movers]
    drained = sorted({c2.jobs[j].replicas[0].node or "" for j in others})[0]
    for j in others:  # another node drains before the grace ends: big starts there, the moves are called off
        if c2.jobs[j].replicas[0].node == drained:
            s2.finish(j)
            s2.remove(j)
    s2.cycle(20)
    assert phase(c2, "big") is JobPhase.RUNNING and c2.jobs["big"].replicas[0].node == drained
    assert all(phase(c2, m) is JobPhase.RUNNING and c2.jobs[m].moved_at == 10 for m in movers)
    s2.submit(gang("big2", "default", 1, 8, submit=30))
    second = {n.job for n in notices(s2.cycle(30))}
    assert len(second) == 4 and not (second & movers)  # the jobs of the third node move instead
    assert {c2.jobs[m].replicas[0].node for m in second}.isdisjoint(nodes | {drained})
    action = next(a for a in s2.actions if a.name == "consolidate")
    mover = c2.jobs[next(iter(movers))]
    assert not action._movable(mover, 1009) and action._movable(mover, 1010)  # type: ignore[attr-defined]


def test_a_moved_jobs_cooldown_outlives_its_run_when_its_operator_makes_it_again() -> None:
    """The job moved: evicted, then its operator makes new pods under the same job (PodGroup). The new run
    still counts its move, whether the model forgot the job in between or replaced it in place."""
    c, s = fragmented(consolidation_cooldown_s=1000.0)
    s.submit(gang("big", "default", 1, 8, submit=10))
    movers = sorted(n.job for n in notices(s.cycle(10)))
    evicted = [d for d in s.cycle(41).of(Evict) if isinstance(d, Evict)]
    assert sorted(d.job for d in evicted) == movers and all(d.moved_at == 10 for d in evicted)
    forgotten, replaced = movers[0], movers[1]
    s.remove(forgotten)
    again = gang(forgotten, "default", 1, 1, submit=45)
    again.movable = True
    s.submit(again)
    in_place = gang(replaced, "default", 1, 1, submit=45)
    in_place.movable = True
    s.replace(in_place)
    assert c.jobs[forgotten].moved_at == 10 and c.jobs[replaced].moved_at == 10
    action = next(a for a in s.actions if a.name == "consolidate")
    s.cycle(50)
    assert phase(c, forgotten) is JobPhase.RUNNING
    assert not action._movable(c.jobs[forgotten], 1009) and action._movable(c.jobs[forgotten], 1010)  # type: ignore[attr-defined]


def test_drain_holds_moves_only_the_movable_jobs_on_a_passed_over_gangs_held_node() -> None:
    """drain-holds waits as long as a hold takes, then empties the held node, not the emptiest ones."""
    c, s = fragmented(nodes=3, action="drain-holds", reservation_after_s=100.0)
    s.submit(gang("big", "default", 1, 8, submit=10))
    assert not notices(s.cycle(10))  # fragmented, but it has not waited: nothing moves (consolidate would)
    s.submit(gang("passer", "default", 1, 1, submit=20))
    s.cycle(20)
    assert phase(c, "passer") is JobPhase.RUNNING and c.jobs["big"].bypassed
    moved = notices(s.cycle(110))
    held = c.jobs["big"].reserved_nodes
    assert len(held) == 1 and len(moved) == 4
    assert {c.jobs[n.job].replicas[0].node for n in moved} == set(held)
    assert all("draining the nodes held for big" in n.reason for n in moved)
    assert phase(c, "big") is JobPhase.PRIVILEGED and c.jobs["big"].reason.startswith("draining its held nodes")
    res = s.cycle(110 + 31)  # the movers' grace is over: big starts on the node it held
    assert {d.job for d in res.of(Evict) if isinstance(d, Evict)} == {n.job for n in moved}  # type: ignore[attr-defined]
    assert phase(c, "big") is JobPhase.RUNNING and c.jobs["big"].replicas[0].node == held[0]
