"""Job / task / replica state machine: what replica events do to a job, and hooks on job start/end."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.core.model import Job, JobPhase, OnReplicaFailure, ReplicaPhase


class Hooks(Protocol):
    def on_start(self, job: Job, now: float) -> None: ...

    def on_end(self, job: Job, now: float) -> None: ...


@dataclass
class GpuSecondsAccounting:
    """GPU-seconds (in GPU units) consumed per queue, counted from a job's start to its end."""

    per_queue: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _open: dict[str, tuple[float, int]] = field(default_factory=dict)

    def on_start(self, job: Job, now: float) -> None:
        self._open[job.name] = (now, job.gpu_allocated())

    def on_end(self, job: Job, now: float) -> None:
        started = self._open.pop(job.name, None)
        if started is not None:
            since, milli = started
            self.per_queue[job.queue] += (now - since) * milli / 1000


class NoHooks:
    def on_start(self, job: Job, now: float) -> None:
        return None

    def on_end(self, job: Job, now: float) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a replica event did: the job's new phase, replicas to release, replicas to re-place."""

    job_phase: JobPhase
    release: tuple[tuple[str, int], ...] = ()
    restart: tuple[tuple[str, int], ...] = ()
    reason: str = ""


def on_replica_done(job: Job, task: str, index: int, phase: ReplicaPhase) -> Outcome:
    """Apply a replica's end (SUCCEEDED or FAILED) to its job following the job's policies."""
    if phase not in (ReplicaPhase.SUCCEEDED, ReplicaPhase.FAILED):
        raise ValueError(f"a replica ends Succeeded or Failed, not {phase}")
    spec = job.task_by_name[task]
    others = tuple((r.task, r.index) for r in job.replicas
                   if r.phase is ReplicaPhase.BOUND and (r.task, r.index) != (task, index))
    if phase is ReplicaPhase.SUCCEEDED:
        if job.main_task == task:
            return Outcome(JobPhase.SUCCEEDED, others, reason=f"main task {task} succeeded")
        live = [r for r in job.replicas if r.phase in (ReplicaPhase.BOUND, ReplicaPhase.PENDING)
                and (r.task, r.index) != (task, index)]
        if not live:
            return Outcome(JobPhase.SUCCEEDED, reason="all replicas succeeded")
        return Outcome(job.phase)
    if spec.on_failure is OnReplicaFailure.ABORT_JOB:
        return Outcome(JobPhase.FAILED, others, reason=f"replica {task}-{index} failed")
    if spec.on_failure is OnReplicaFailure.RESTART_TASK:
        same = tuple((r.task, r.index) for r in job.replicas if r.task == task and r.phase is ReplicaPhase.BOUND
                     and r.index != index)
        return Outcome(job.phase, same, ((task, index), *same), reason=f"restarting task {task}")
    return Outcome(job.phase, reason=f"replica {task}-{index} failed (ignored)")
