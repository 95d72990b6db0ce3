"""Queue trees: departments and teams."""

from __future__ import annotations

from scheduler.core.decisions import NotifyWillEvict
from scheduler.core.hierarchy import lineage, problems, recount, split
from scheduler.core.model import Cluster, JobPhase, Queue, Tier
from tests.unit.core_helpers import cluster, gang, node, queue, scheduler


def tree(*specs: tuple[str, float, str | None, float]) -> list[Queue]:
    """Queues from (name, guaranteed GPUs, parent, weight)."""
    out = []
    for name, gpus, parent, weight in specs:
        q = queue(name, gpus)
        q.parent, q.weight = parent, weight
        out.append(q)
    return out


def phase(c: Cluster, name: str) -> JobPhase:
    return c.jobs[name].phase


def test_idle_capacity_is_lent_inside_the_department_first() -> None:
    # team a1 is idle: its department's guarantee has room, so its sister a2 borrows before b1, whom a
    # flat comparison (b1 borrows less per weight) would have served first
    for parented, first in ((True, "a2-more"), (False, "b1-more")):
        qs = tree(("A", 8, None, 1.0), ("a1", 4, "A" if parented else None, 1.0),
                  ("a2", 4, "A" if parented else None, 1.0), ("B", 8, None, 4.0))
        c = cluster([node("n1", 8), node("n2", 8)], qs)
        s = scheduler(c, preemption_attempts=0)
        s.submit(gang("a2-run", "a2", 4, 1, submit=0))
        s.submit(gang("b1-run", "B", 8, 1, submit=0))
        s.cycle(0)
        s.submit(gang("b1-more", "B", 1, 4, submit=1))
        s.submit(gang("a2-more", "a2", 1, 4, submit=1))
        s.cycle(1)
        assert phase(c, first) is JobPhase.RUNNING, parented
        assert {phase(c, "a2-more"), phase(c, "b1-more")} == {JobPhase.RUNNING, JobPhase.PENDING}


def test_a_department_takes_back_what_it_lent_before_its_teams_compete() -> None:
    # B borrowed all of A's guarantee; a1 asks 8 GPUs, beyond its team's 4 but within its department's 8
    qs = tree(("A", 8, None, 1.0), ("a1", 4, "A", 1.0), ("a2", 4, "A", 1.0), ("B", 8, None, 1.0))
    c = cluster([node("n1", 8), node("n2", 8)], qs)
    s = scheduler(c)
    s.submit(gang("b-own", "B", 1, 8, submit=0))
    s.submit(gang("b-borrowed", "B", 1, 8, submit=0))
    s.cycle(0)
    s.submit(gang("a1-big", "a1", 1, 8, submit=1))
    notices = s.cycle(1).of(NotifyWillEvict)
    assert [n.job for n in notices if isinstance(n, NotifyWillEvict)] in (["b-own"], ["b-borrowed"])
    assert "reclaim" in notices[0].reason  # type: ignore[attr-defined]
    assert phase(c, "a1-big") is JobPhase.PRIVILEGED


def test_a_team_within_its_own_guarantee_reclaims_while_a_sibling_overfills_their_department() -> None:
    # a2's one 16-GPU gang puts department A over its guarantee, yet taking it back would break a2's own;
    # a1 holds nothing of its 8 guaranteed GPUs, so it takes back what department B borrows
    qs = tree(("A", 14, None, 1.0), ("a1", 8, "A", 1.0), ("a2", 6, "A", 1.0),
              ("B", 8, None, 1.0), ("b1", 8, "B", 1.0))
    c = cluster([node(f"n{i}", 8) for i in range(4)], qs)
    s = scheduler(c)
    s.submit(gang("a2-wide", "a2", 2, 8, submit=0))
    s.submit(gang("b1-own", "b1", 1, 8, submit=0))
    s.submit(gang("b1-borrowed", "b1", 1, 8, submit=0))
    s.cycle(0)
    s.submit(gang("a1-job", "a1", 1, 8, submit=1))
    notices = [n for n in s.cycle(1).of(NotifyWillEvict) if isinstance(n, NotifyWillEvict)]
    assert [n.job for n in notices] in (["b1-own"], ["b1-borrowed"]) and "reclaim" in notices[0].reason
    assert phase(c, "a2-wide") is JobPhase.RUNNING
    s.submit(gang("a1-more", "a1", 1, 8, submit=2))
    assert not s.cycle(2).of(NotifyWillEvict)  # beyond a1's own guarantee, and A is over its own


def test_teams_of_one_department_reclaim_only_up_to_their_own_guarantee() -> None:
    qs = tree(("A", 16, None, 1.0), ("a1", 8, "A", 1.0), ("a2", 8, "A", 1.0))
    c = cluster([node("n1", 8), node("n2", 8)], qs)
    s = scheduler(c)
    s.submit(gang("a2-own", "a2", 1, 8, submit=0))
    s.submit(gang("a2-borrowed", "a2", 1, 8, submit=0))
    s.cycle(0)
    s.submit(gang("a1-job", "a1", 1, 8, submit=1))
    notices = [n for n in s.cycle(1).of(NotifyWillEvict) if isinstance(n, NotifyWillEvict)]
    assert len(notices) == 1  # one of a2's two jobs: a2 keeps its own guarantee
    s.submit(gang("a1-more", "a1", 1, 8, submit=2))
    assert not s.cycle(2).of(NotifyWillEvict)  # beyond a1's guarantee, and a2 is at its own


def test_a_departments_maximum_bounds_its_teams_together() -> None:
    qs = tree(("A", 0, None, 1.0), ("a1", 0, "A", 1.0), ("a2", 0, "A", 1.0))
    qs[0].max_gpu = 4000
    c = cluster([node("n1", 8)], qs)
    s = scheduler(c)
    s.submit(gang("a1-job", "a1", 1, 3, submit=0))
    s.submit(gang("a2-job", "a2", 1, 3, submit=0))
    res = s.cycle(0)
    ran = [j for j in ("a1-job", "a2-job") if phase(c, j) is JobPhase.RUNNING]
    (waiting,) = {"a1-job", "a2-job"} - set(ran)
    assert len(ran) == 1 and "queue A would exceed its maximum of 4 GPUs" in res.pending_reasons[waiting]
    team = c.jobs[ran[0]].queue
    assert (c.queues["A"].allocated_gpu, c.queues[team].allocated_gpu, c.queues[team].own_gpu) == (3000, 3000, 3000)


def test_lineage_split_recount_and_the_links_that_cannot_stand() -> None:
    qs = {q.name: q for q in tree(("A", 8, None, 1.0), ("a1", 4, "A", 1.0), ("a1x", 2, "a1", 1.0),
                                  ("B", 8, None, 1.0))}
    assert [q.name for q in lineage(qs, "a1x")] == ["A", "a1", "a1x"]
    assert [[q.name for q in side] for side in split(qs, "a1x", "B")] == [["A", "a1", "a1x"], ["B"]]
    assert [[q.name for q in side] for side in split(qs, "a1x", "a1")] == [["a1x"], []]
    qs["a1x"].own_gpu, qs["B"].own_gpu = 2000, 1000
    recount(qs)
    assert [qs[n].allocated_gpu for n in ("A", "a1", "a1x", "B")] == [2000, 2000, 2000, 1000]
    assert problems(qs) == {}
    bad = {q.name: q for q in tree(("A", 8, None, 1.0), ("a1", 6, "A", 1.0), ("a2", 6, "A", 1.0),
                                   ("x", 0, "nope", 1.0), ("l1", 0, "l2", 1.0), ("l2", 0, "l1", 1.0))}
    found = problems(bad)
    assert found["x"] == "parent queue 'nope' does not exist"
    assert "may not form a loop" in found["l1"] and "may not form a loop" in found["l2"]
    assert "guaranteed 12 GPUs, more than its 8" in found["a1"] and found["a1"] == found["a2"]
    assert [q.name for q in lineage(bad, "l1")] == ["l2", "l1"]  # the core's guard: a loop ends the walk


def test_elastic_jobs_of_a_team_are_preempted_like_any_borrowers() -> None:
    qs = tree(("A", 8, None, 1.0), ("a1", 8, "A", 1.0), ("B", 0, None, 1.0))
    c = cluster([node("n1", 8)], qs)
    s = scheduler(c)
    s.submit(gang("b-elastic", "B", 1, 8, tier=Tier.ELASTIC, submit=0))
    s.cycle(0)
    s.submit(gang("a1-job", "a1", 1, 8, submit=1))
    assert [n.job for n in s.cycle(1).of(NotifyWillEvict) if isinstance(n, NotifyWillEvict)] == ["b-elastic"]


def test_status_shows_the_tree_indented_and_a_broken_link_at_the_top() -> None:
    from ferry.status import queue_rows

    qs = [{"metadata": {"name": n}, "spec": {"parent": p} if p else {}}
          for n, p in (("team-b", "dept"), ("dept", None), ("team-a", "dept"), ("orphan", "gone"))]
    assert [r["NAME"] for r in queue_rows(qs)] == ["dept", "  team-a", "  team-b", "orphan"]
