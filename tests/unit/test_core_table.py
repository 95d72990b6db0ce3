"""The scheduling core's policies as a table: cluster, queues, configuration, steps → expected decisions.

Each step is a job submitted, ended or removed, or a cycle at a time with what it must decide: the
jobs it starts, notifies (WillEvict), evicts, spares (CancelEviction) or shrinks — an empty set means
"none"; omitted means "not checked" — and substrings of the reasons of jobs that must still wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler.core.decisions import CancelEviction, CycleResult, Evict, JobStatus, NotifyWillEvict, Shrink
from scheduler.core.model import Job, JobPhase, Queue, Tier
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from tests.unit.core_helpers import cluster, gang, node, queue


@dataclass(frozen=True)
class Submit:
    job: Job


@dataclass(frozen=True)
class Finish:
    job: str


@dataclass(frozen=True)
class Remove:
    job: str


@dataclass(frozen=True)
class Cycle:
    at: float
    started: set[str] | None = None
    notified: set[str] | None = None
    evicted: set[str] | None = None
    spared: set[str] | None = None
    shrunk: set[str] | None = None
    waiting: dict[str, str] = field(default_factory=dict)  # job -> part of its reason
    rule: dict[str, str] = field(default_factory=dict)  # victim -> the rule named in its notice


Step = Submit | Finish | Remove | Cycle


@dataclass(frozen=True)
class Case:
    id: str
    nodes: list[tuple[str, int]]
    queues: list[Queue]
    steps: list[Step]
    config: dict[str, Any] = field(default_factory=dict)
    preset: str = "ferry"


def _el(name: str, q: str, pods: int, gpus: int = 1, **kw: Any) -> Job:
    return gang(name, q, pods, gpus, tier=Tier.ELASTIC, **kw)


CASES = [
    Case("gang-all-or-nothing", [("n1", 4), ("n2", 4)], [queue("default")], [
        Submit(gang("blocker", "default", 1)),
        Cycle(0, started={"blocker"}),
        Submit(gang("g8", "default", 8, submit=1)),
        Cycle(1, started=set(), waiting={"g8": "gang of 8 replica(s) needs 8 GPUs all at once"}),
        Finish("blocker"),
        Cycle(2, started={"g8"}),
    ]),
    Case("impossible-request-is-named", [("n1", 8)], [queue("default")], [
        Submit(gang("huge", "default", 1, 16)),
        Cycle(0, started=set(), waiting={"huge": "cannot be scheduled: no node has 16 GPUs"}),
    ]),
    Case("reclaim-lent-capacity-after-grace", [("n1", 4), ("n2", 4)], [queue("a", 4), queue("b", 4, grace=30)], [
        Submit(gang("a-own", "a", 4)),
        Submit(gang("a-borrow", "a", 4, submit=1)),
        Cycle(0, started={"a-own", "a-borrow"}),
        Submit(gang("b-job", "b", 2, submit=2)),
        # only what a borrowed is taken back: a-own keeps a at its guarantee
        Cycle(1, started=set(), notified={"a-borrow"}, rule={"a-borrow": "reclaim"}),
        Cycle(20, evicted=set(), waiting={"b-job": "preempting: waiting for 1 job(s)"}),
        Cycle(32, evicted={"a-borrow"}, started={"b-job"}),
    ]),
    Case("reclaim-never-takes-a-queue-below-its-guarantee", [("n1", 8)], [queue("a", 4), queue("b", 4)], [
        Submit(gang("a-big", "a", 8)),
        Cycle(0, started={"a-big"}),
        Submit(gang("b-job", "b", 2, submit=1)),
        Cycle(1, started=set(), notified=set()),
    ]),
    Case("no-reclaim-right-no-victims", [("n1", 8)], [queue("a", 4), queue("b", 4, reclaim=False)], [
        Submit(gang("a-big", "a", 8)),
        Cycle(0, started={"a-big"}),
        Submit(gang("b-job", "b", 2, submit=1)),
        Cycle(1, started=set(), notified=set()),
        Cycle(100, notified=set()),
    ]),
    Case("fair-share-between-borrowers", [("n1", 8), ("n2", 4)], [queue("a"), queue("b")], [
        Submit(gang("a1", "a", 1, 4, submit=0)),
        Submit(gang("a2", "a", 1, 4, submit=1)),
        Cycle(0, started={"a1", "a2"}),
        Submit(gang("a3", "a", 1, 4, submit=2)),
        Cycle(5, started={"a3"}),  # the youngest: the least work lost
        Submit(gang("b1", "b", 1, 4, submit=3)),
        Cycle(10, notified={"a3"}, rule={"a3": "fair-share"}),
        Submit(gang("b2", "b", 1, 4, submit=4)),
        # b would borrow 8 of 12 against a's 4 after the victim: not fairer, no second victim
        Cycle(100, notified=set()),
    ]),
    # a's single-node job is protected while young (min_runtime 300 s); its 2-node gang is not a
    # victim for b's 4-GPU job meanwhile, the single-node job is once it may be
    Case("fair-share-spares-a-gang-spanning-nodes-for-a-smaller-job", [("n1", 8), ("n2", 8), ("n3", 8)],
         [queue("a"), queue("b")], [
             Submit(gang("a-gang", "a", 2, 8)),
             Cycle(0, started={"a-gang"}),
             Submit(gang("a-one", "a", 1, 8, submit=200)),
             Cycle(200, started={"a-one"}),
             Submit(gang("b1", "b", 1, 4, submit=400)),
             Cycle(400, notified=set(), started=set()),
             Cycle(510, notified={"a-one"}, rule={"a-one": "fair-share"}),
         ], config={"min_runtime_s": 300.0}),
    Case("fair-share-takes-a-gang-spanning-nodes-for-one-as-big", [(f"n{i}", 8) for i in range(5)],
         [queue("a"), queue("b")], [
             Submit(gang("a-gang", "a", 2, 8)),
             Cycle(0, started={"a-gang"}),
             *(Submit(gang(f"a-{i}", "a", 1, 8, submit=200)) for i in range(3)),
             Cycle(200, started={"a-0", "a-1", "a-2"}),
             Submit(gang("b-big", "b", 2, 8, submit=400)),
             Cycle(400, notified={"a-gang"}, rule={"a-gang": "fair-share"}),
         ], config={"min_runtime_s": 300.0}),
    Case("guaranteed-job-preempts-its-own-elastic-job", [("n1", 4)], [queue("a", 4, grace=10)], [
        Submit(_el("el", "a", 4)),
        Cycle(0, started={"el"}),
        Submit(gang("g", "a", 2, submit=1)),
        Cycle(1, notified={"el"}, rule={"el": "preempt"}),
        Cycle(5, evicted=set(), started=set()),
        Cycle(12, evicted={"el"}, started={"g"}),
    ]),
    Case("no-preempting-own-elastic-without-the-right", [("n1", 4)], [queue("a", 4, preempt_own_elastic=False)], [
        Submit(_el("el", "a", 4)),
        Cycle(0, started={"el"}),
        Submit(gang("g", "a", 2, submit=1)),
        Cycle(1, notified=set()),
    ]),
    Case("privileged-queue-preempts-lower-tiers-anywhere", [("n1", 4)],
         [queue("ops", 0, privileged=True), queue("b", 4)], [
        Submit(_el("b-el", "b", 4)),
        Cycle(0, started={"b-el"}),
        Submit(gang("urgent", "ops", 2, submit=1)),
        Cycle(1, notified={"b-el"}, rule={"b-el": "privileged"}),
    ]),
    Case("young-jobs-are-protected", [("n1", 4)], [queue("a", 4, grace=0)], [
        Submit(_el("el", "a", 4)),
        Cycle(0, started={"el"}),
        Submit(gang("g", "a", 2, submit=1)),
        Cycle(100, notified=set()),
        Cycle(301, notified={"el"}),
    ], config={"min_runtime_s": 300.0}),
    Case("eviction-cancelled-when-capacity-frees-elsewhere", [("n1", 4)], [queue("a", 4, grace=60)], [
        Submit(_el("el", "a", 2)),
        Submit(gang("other", "a", 2, submit=0.5)),
        Cycle(0, started={"el", "other"}),
        Submit(gang("g", "a", 2, submit=1)),
        Cycle(1, notified={"el"}),
        Finish("other"),
        Cycle(2, started={"g"}, spared={"el"}),
    ]),
    Case("shrink-before-kill", [("n1", 4)], [queue("a", 4)], [
        Submit(_el("el", "a", 4, min_member=2)),
        Cycle(0, started={"el"}),
        Submit(gang("g", "a", 2, submit=1)),
        Cycle(1, started={"g"}, shrunk={"el"}, notified=set()),
    ]),
    Case("queue-maximum", [("n1", 8)], [queue("a", 0, max_gpus=4)], [
        Submit(gang("a1", "a", 4)),
        Submit(gang("a2", "a", 1, submit=1)),
        Cycle(0, started={"a1"}, waiting={"a2": "would exceed its maximum of 4 GPUs"}),
    ]),
    Case("ferry-backfills-past-a-gang-that-does-not-fit", [("n1", 4)], [queue("default")], [
        Submit(gang("small", "default", 1, 2)),
        Cycle(0, started={"small"}),
        Submit(gang("big", "default", 4, submit=1)),
        Submit(gang("after", "default", 1, 1, submit=2)),
        Cycle(1, started={"after"}),
    ]),
    Case("fifo-passes-nobody", [("n1", 4)], [queue("default")], [
        Submit(gang("small", "default", 1, 2)),
        Cycle(0, started={"small"}),
        Submit(gang("big", "default", 4, submit=1)),
        Submit(gang("after", "default", 1, 1, submit=2)),
        Cycle(1, started=set()),
    ], preset="fifo"),
    Case("volcano-stops-a-queue-at-its-deserved-share", [("n1", 4)], [queue("a"), queue("b")], [
        Submit(gang("a1", "a", 1, 2)),
        Submit(gang("a2", "a", 1, 2, submit=1)),
        Submit(gang("b1", "b", 1, 2, submit=2)),
        Submit(gang("b2", "b", 1, 2, submit=3)),
        Cycle(0, started={"a1", "b1"}, waiting={"a2": "at its deserved share"}),
    ], preset="volcano"),
    Case("volcano-never-preempts", [("n1", 4)], [queue("a", 2), queue("b", 2)], [
        Submit(gang("a-big", "a", 4)),
        Cycle(0, started={"a-big"}),
        Submit(gang("b-job", "b", 2, submit=1)),
        Cycle(1000, notified=set(), started=set()),
    ], preset="volcano"),
]


def _names(result: CycleResult, kind: type) -> set[str]:
    return {d.job for d in result.of(kind)}  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_policy_table(case: Case) -> None:
    c = cluster([node(name, gpus) for name, gpus in case.nodes], case.queues)
    config = {"min_runtime_s": 0.0, **case.config}
    s = Scheduler(c, SchedulerConfig.preset(case.preset, **config))
    for i, step in enumerate(case.steps):
        where = f"step {i} ({step})"
        if isinstance(step, Submit):
            s.submit(step.job)
        elif isinstance(step, Finish):
            s.finish(step.job)
        elif isinstance(step, Remove):
            s.remove(step.job)
        else:
            res = s.cycle(step.at)
            started = {d.job for d in res.of(JobStatus) if isinstance(d, JobStatus) and d.phase == "Running"}
            for expected, got in ((step.started, started), (step.notified, _names(res, NotifyWillEvict)),
                                  (step.evicted, _names(res, Evict)), (step.spared, _names(res, CancelEviction)),
                                  (step.shrunk, _names(res, Shrink))):
                if expected is not None:
                    assert got == expected, where
            for job, reason in step.waiting.items():
                assert c.jobs[job].phase in (JobPhase.PENDING, JobPhase.PRIVILEGED), where
                assert reason in c.jobs[job].reason, (where, c.jobs[job].reason)
            for victim, rule in step.rule.items():
                (notice,) = [d for d in res.of(NotifyWillEvict) if isinstance(d, NotifyWillEvict) and d.job == victim]
                assert notice.rule == rule and f"({rule} by " in notice.reason, (where, notice.rule, notice.reason)
        _check_accounting(s)


def _check_accounting(s: Scheduler) -> None:
    """After every step: node and queue accounting equal a recount from the replicas."""
    c = s.cluster
    used: dict[str, int] = dict.fromkeys(c.nodes, 0)
    per_queue: dict[str, int] = dict.fromkeys(c.queues, 0)
    for job in c.jobs.values():
        for r in job.bound():
            req = job.task_by_name[r.task].request
            used[r.node or ""] += req.gpu_total
            per_queue[job.queue] += req.gpu_total
    for name, n in c.nodes.items():
        assert n.gpu_capacity - n.free_gpu_milli == used[name], name
    for name, q in c.queues.items():
        assert q.allocated_gpu == per_queue[name], name
