"""The scheduling framework: actions run in order each cycle; plugins register callbacks by name.

The shape follows Volcano's session / actions / plugins and kube-scheduler's extension points:

- an **action** is one step of a cycle (allocate, reserve, preempt, grow): the mechanism — it walks the
  pending jobs, tries placements in a :class:`~scheduler.core.statement.Statement` and emits decisions;
- a **plugin** is policy: it registers callbacks at the extension points below, and the actions ask
  the framework, never a plugin directly. Which actions run, in which order, and which plugins are on
  is configuration (:class:`~scheduler.core.scheduler.SchedulerConfig`, presets ``ferry``, ``fifo``,
  ``volcano``);
- a :class:`Session` is one cycle: the time, the decisions so far, and what the cycle computed once.

Extension points and how several plugins' answers combine:

========================  ===================================================================
``job_order``             sort key parts, concatenated in plugin order (then age, then name)
``queue_order``           sort key parts, concatenated in plugin order (least first)
``job_note``              words for a waiting job's pending reason on why its place in its queue is
                          what it is (e.g. demoted by least attained service): joined, empty ones left out
``admit``                 why a job may not start in its queue now: the first plugin that objects
                          (queue-wide: the queue's other jobs of that shape are passed over too)
``gate``                  why this one job may not start yet, whatever the capacity (e.g. a
                          dependency): the first that objects; a gated job holds no nodes and
                          preempts nobody, and the jobs behind it are not held up
``urgent``                a pending job that should be looked at first by victim searches: any
``victim_filter``         whether a running job may be a victim at all, whoever asks: every plugin must agree
``victim_rule``           the rule under which it may be evicted for a preemptor: the first that grants
``victim_order``          which victims a search tries first: key parts concatenated (then the smallest
                          and cheapest)
``victim_queues``         (queue, highest tier) that may hold victims for a preemptor (a cheap
                          prefilter, so a search looks at few running jobs): union, highest tier
``hold_yields``           whether nodes held for one waiting job (by ``reserve``) may take another
                          waiting job all the same: any plugin grants
``hold_lends``            whether a job that fits nowhere else may start on nodes held for a waiting
                          job *on loan*: it is recalled (notice, grace) as soon as the holder could
                          start without it (``reserve``): any plugin grants
``loan_recall``           which of the jobs on loan on a holder's nodes (cheapest first) the
                          holder may recall: each plugin filters what the previous kept
``session_open``          per-cycle preparation (e.g. deserved shares)
``node_order``            how good a node state is for a request (keys compared highest first,
                          concatenated in plugin order; none registered: tightest fit); the
                          placer asks once per state and request shape, so a plugin whose scores
                          change (a new expected workload) calls :meth:`Framework.node_order_changed`
``device_order``          which device of a node a GPU share takes (concatenated; then the fullest)
``due``                   after a cycle, the moments at which a rule of the plugin may decide
                          differently with nothing else changed (a delay ends, a threshold is
                          reached), given the waiting jobs the cycle looked at: union, with the
                          actions' own (:meth:`Action.due`).
                          The service cycles every period and needs none of this; a replay that cycles
                          only on arrivals and completions also cycles then, as the service would
========================  ===================================================================
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from scheduler.core.decisions import CycleResult
from scheduler.core.model import Job, JobPhase, Queue, Request
from scheduler.core.placement import Option, tightest_fit

if TYPE_CHECKING:
    from scheduler.core.scheduler import Scheduler

OrderKey = tuple[Any, ...]
ShapeKey = tuple[tuple[Request, int], ...]  # a pending job's replicas: how many of each request
QueueOrderFn = Callable[[Queue, int], tuple[float, ...]]
JobOrderFn = Callable[[Job], tuple[Any, ...]]
AdmitFn = Callable[[Queue, Job], "str | None"]
GateFn = Callable[[Job, "Session"], "str | None"]
UrgentFn = Callable[[Job, "Session"], bool]
VictimFilterFn = Callable[[Job, "Session"], bool]
VictimRuleFn = Callable[[Job, Job, "Session"], bool]
VictimOrderFn = Callable[[Job, Job, "Session"], tuple[float, ...]]  # (preemptor, victim) -> key part
VictimQueuesFn = Callable[[Job, "Session"], Iterable[tuple[str, int]]]  # (queue, highest victim tier)
HoldYieldsFn = Callable[[Job, Job, "Session"], bool]  # (waiting job, holder)
HoldLendsFn = Callable[[Job, Job, "Session"], bool]  # (waiting job, holder)
LoanRecallFn = Callable[[Job, list[Job], "Session"], list[Job]]  # (holder, loans) -> the recallable ones
SessionFn = Callable[["Session"], None]
NodeOrderFn = Callable[[Request, Sequence[Option]], list[tuple[float, ...]]]  # one key per option
DueFn = Callable[[list[Job], float], Iterable[float]]  # (waiting jobs a cycle looked at, now) -> moments
JobNoteFn = Callable[[Job], str]  # why a waiting job's place in its queue is what it is ("": nothing to say)

_VERSIONS = itertools.count(1)  # node-order versions, unique across frameworks (a reload makes a new one)


@dataclass
class Session:
    """One scheduling cycle."""

    sched: Scheduler
    now: float
    result: CycleResult
    never: dict[Request, str | None] = field(default_factory=dict)  # why a request fits no node at all
    claims: dict[str, int] = field(default_factory=dict)  # queue -> GPU milli its preemptors are about to take
    doomed: dict[str, int] = field(default_factory=dict)  # queue -> GPU milli of its jobs already told to leave

    def refresh_claims(self) -> None:
        """Recount claims and doomed capacity (before each victim search: the previous one changed them)."""
        claims: dict[str, int] = {}
        doomed: dict[str, int] = {}
        jobs = self.sched.cluster.jobs
        for preemptor, victims in self.sched.victims.items():
            job = jobs.get(preemptor)
            if job is not None and job.phase is JobPhase.PRIVILEGED:
                claims[job.queue] = claims.get(job.queue, 0) + job.gpu_demand()
            for name in victims:
                victim = jobs.get(name)
                if victim is not None and victim.phase is JobPhase.WILL_EVICT:
                    doomed[victim.queue] = doomed.get(victim.queue, 0) + victim.gpu_allocated()
        self.claims, self.doomed = claims, doomed


class Framework:
    """Callbacks registered by the enabled plugins, by extension point, in configuration order."""

    def __init__(self) -> None:
        self.queue_order: list[tuple[str, QueueOrderFn]] = []
        self.job_order: list[tuple[str, JobOrderFn]] = []
        self.admit: list[tuple[str, AdmitFn]] = []
        self.gate: list[tuple[str, GateFn]] = []
        self.urgent: list[tuple[str, UrgentFn]] = []
        self.victim_filter: list[tuple[str, VictimFilterFn]] = []
        self.victim_rule: list[tuple[str, VictimRuleFn]] = []
        self.victim_order: list[tuple[str, VictimOrderFn]] = []
        self.victim_queues: list[tuple[str, VictimQueuesFn]] = []
        self.hold_yields: list[tuple[str, HoldYieldsFn]] = []
        self.hold_lends: list[tuple[str, HoldLendsFn]] = []
        self.loan_recall: list[tuple[str, LoanRecallFn]] = []
        self.session_open: list[tuple[str, SessionFn]] = []
        self.node_order: list[tuple[str, NodeOrderFn]] = []
        self.device_order: list[tuple[str, NodeOrderFn]] = []
        self.due: list[tuple[str, DueFn]] = []
        self.job_note: list[tuple[str, JobNoteFn]] = []
        self.node_order_version = next(_VERSIONS)
        self.ties_by_name = False  # a node-order plugin that wants FGD's tie-break (fixed node priority)

    @property
    def settled_ties(self) -> bool:
        return not (self.node_order and self.ties_by_name)

    def node_order_changed(self) -> None:
        """Keys given before no longer hold: the placer ranks every node state anew."""
        self.node_order_version = next(_VERSIONS)

    def node_keys(self, req: Request, options: Sequence[Option]) -> list[tuple[float, ...]]:
        if not self.node_order:
            return tightest_fit(req, options)
        keys: list[tuple[float, ...]] = [() for _ in options]
        for _, fn in self.node_order:
            keys = [k + part for k, part in zip(keys, fn(req, options), strict=True)]
        return keys

    def device_keys(self, req: Request, options: Sequence[Option]) -> list[tuple[float, ...]]:
        keys: list[tuple[float, ...]] = [() for _ in options]
        for _, fn in self.device_order:
            keys = [k + part for k, part in zip(keys, fn(req, options), strict=True)]
        return keys

    # combined answers --------------------------------------------------------
    def queue_key(self, queue: Queue, tier: int) -> tuple[float, ...]:
        key: tuple[float, ...] = ()
        for _, fn in self.queue_order:
            key += fn(queue, tier)
        return key

    def job_key(self, job: Job) -> OrderKey:
        key: OrderKey = ()
        for _, fn in self.job_order:
            key += fn(job)
        return (*key, job.submit_time, job.name)

    def note(self, job: Job) -> str:
        """What the plugins that order jobs say of this one's place (joined), for its pending reason."""
        return "; ".join(text for _, fn in self.job_note if (text := fn(job)))

    def blocked(self, queue: Queue, job: Job) -> str | None:
        for _, fn in self.admit:
            why = fn(queue, job)
            if why is not None:
                return why
        return None

    def gated(self, job: Job, ssn: Session) -> str | None:
        for _, fn in self.gate:
            why = fn(job, ssn)
            if why is not None:
                return why
        return None

    def is_urgent(self, job: Job, ssn: Session) -> bool:
        return any(fn(job, ssn) for _, fn in self.urgent)

    def may_be_victim(self, victim: Job, ssn: Session) -> bool:
        """Running, and no plugin protects it (checked once per cycle: it does not depend on the preemptor)."""
        return victim.phase is JobPhase.RUNNING and all(fn(victim, ssn) for _, fn in self.victim_filter)

    def victim_reason(self, preemptor: Job, victim: Job, ssn: Session) -> str | None:
        """The rule under which ``victim`` (one that :meth:`may_be_victim`) may be evicted for ``preemptor``
        now, or None."""
        if victim.phase is not JobPhase.RUNNING or victim.name == preemptor.name:
            return None
        for name, fn in self.victim_rule:
            if fn(preemptor, victim, ssn):
                return name
        return None

    def victim_key(self, preemptor: Job, victim: Job, ssn: Session) -> tuple[float, ...]:
        key: tuple[float, ...] = ()
        for _, fn in self.victim_order:
            key += fn(preemptor, victim, ssn)
        return key

    def queues_with_victims(self, preemptor: Job, ssn: Session) -> dict[str, int]:
        """Queue -> the highest tier among which victims may be found there."""
        out: dict[str, int] = {}
        for _, fn in self.victim_queues:
            for queue, tier in fn(preemptor, ssn):
                out[queue] = max(tier, out.get(queue, tier))
        return out

    def yields_hold(self, job: Job, holder: Job, ssn: Session) -> bool:
        """Whether the nodes held for ``holder`` may take ``job`` all the same."""
        return any(fn(job, holder, ssn) for _, fn in self.hold_yields)

    def lends_hold(self, job: Job, holder: Job, ssn: Session) -> bool:
        """Whether ``job`` may start on loan on the nodes held for ``holder``."""
        return any(fn(job, holder, ssn) for _, fn in self.hold_lends)

    def recallable(self, holder: Job, loans: list[Job], ssn: Session) -> list[Job]:
        """Which of the ``loans`` on its nodes (cheapest first) ``holder`` may recall."""
        for _, fn in self.loan_recall:
            loans = fn(holder, loans, ssn)
        return loans

    @property
    def preempts(self) -> bool:
        return bool(self.victim_rule)


class Plugin:
    """Policy: registers callbacks with the framework. One instance lives as long as its scheduler."""

    name: ClassVar[str]

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def register(self, fw: Framework) -> None:
        raise NotImplementedError


class Action:
    """One step of a cycle. One instance lives as long as its scheduler."""

    name: ClassVar[str]

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def execute(self, ssn: Session) -> None:
        raise NotImplementedError

    def due(self, waiting: list[Job], now: float) -> Iterable[float]:
        """The moments after ``now`` at which this action may decide differently for the ``waiting`` jobs
        a cycle looked at, with nothing else changed (the framework's ``due`` extension point, for actions)."""
        return ()
