"""What a scheduling cycle decides. Adapters turn these into API writes; simulators apply them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Bind:
    job: str
    task: str
    index: int
    node: str
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NotifyWillEvict:
    """Tell a victim it will be evicted at ``deadline`` so it can checkpoint. ``rule`` names why, as data
    (metrics and replays count by it): the victim rule that granted it (``reclaim``, ``fair-share``,
    ``starvation``, ``preempt``, ``least-attained-service``, ...), ``loan-recall`` for a job on loan on a
    hold, or the moving action (``consolidate``, ``drain-holds``)."""

    job: str
    deadline: float
    preemptor: str
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class CancelEviction:
    job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict every replica of the job (whole-job preemption)."""

    job: str
    reason: str
    replicas: tuple[tuple[str, int, str], ...]  # (task, index, node) that were running
    # GPU-seconds its runs received up to now: an adapter keeps them with the job (least attained service
    # orders its next run by them), so that a scheduler built after a restart still knows them
    attained_gpu_s: float = 0.0
    moved_at: float | None = None  # when it was last told to move (consolidation's cooldown), kept the same way


@dataclass(frozen=True, slots=True)
class Shrink:
    """Stop some replicas of an elastic job above its minimum."""

    job: str
    replicas: tuple[tuple[str, int, str], ...]
    reason: str


@dataclass(frozen=True, slots=True)
class JobStatus:
    job: str
    phase: str
    reason: str


Decision = Bind | NotifyWillEvict | CancelEviction | Evict | Shrink | JobStatus


@dataclass
class CycleResult:
    decisions: list[Decision] = field(default_factory=list)
    pending_reasons: dict[str, str] = field(default_factory=dict)  # the jobs the cycle looked at
    # (tier, queue, request shape) -> why the jobs of that group it passed over wait: one like them did
    # not fit (or none of the tier may pass the first, queue ""); Scheduler.reasons names every such job
    passed_over: dict[tuple[int, str, tuple[Any, ...]], str] = field(default_factory=dict)
    placed_jobs: int = 0
    attempts: int = 0
    # an action stopped at its per-cycle budget with work left (victim searches, moves): the next cycle
    # goes on, which the service runs one period later and a replay must also run
    cut_short: bool = False

    def of(self, kind: type) -> list[Decision]:
        return [d for d in self.decisions if isinstance(d, kind)]
