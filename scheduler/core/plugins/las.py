"""las: least attained service for movable jobs (Tiresias' discretised 2D-LAS, NSDI'19) — short jobs go
first without anyone knowing run times.

In a queue with ``least_attained_service`` a job's level is set by the GPU-seconds it has received (GPUs ×
time run, over all its runs): level 0 below the first of ``las_thresholds_gpu_s``, one level further down
past each threshold. Lower levels come first in the queue's order and, as Tiresias' queues are, each level
is first in, first out by when a job entered it: a new job at its arrival, a demoted one when it was
evicted, a promoted one when it was promoted (so a long runner that comes back does not jump ahead of
the jobs already waiting at its level). A waiting job may evict, with the queue's notice and grace, a
running **movable** job of its own queue at a lower level — one that has received more (rule
``least-attained-service``). Levels are coarse so that jobs are not thrashed: jobs of one level never
evict each other, and the usual protection (a minimum run, a cooldown) holds.

Starvation (Tiresias' promote knob): a job that has waited since its last run ``las_promote_knob`` times as
long as it ran is counted afresh, at level 0. It goes first for capacity that frees, but evicts nobody: it
is a long runner, not a short job, and two promoted long runners of a queue would evict each other in turn
(traced in the Philly replay: two 32-GPU gangs, each new run waiting over an hour). Other queues are not
touched: across queues guarantees and reclaim decide, so a tenant's LAS reorders only its own work.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator

from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.model import Job, JobPhase


class LeastAttainedService(Plugin):
    name = "las"

    def register(self, fw: Framework) -> None:
        self._due: list[tuple[float, str]] = []  # (when, job): demoted waiting jobs' promotions, stale ones skipped
        fw.session_open.append((self.name, self.promote))
        fw.job_order.append((self.name, self.job_order))
        fw.victim_rule.append(("least-attained-service", self.yields))  # the rule names itself in notices
        fw.victim_order.append((self.name, self.victim_order))
        fw.victim_queues.append((self.name, self.queues))
        fw.due.append((self.name, self.due))
        fw.job_note.append((self.name, self.note))

    def level(self, attained_gpu_s: float) -> int:
        return bisect.bisect_right(self.sched.config.las_thresholds_gpu_s, attained_gpu_s)

    def _on(self, job: Job) -> bool:
        return self.sched.cluster.queues[job.queue].least_attained_service

    def job_order(self, job: Job) -> tuple[int, float]:
        """(level, when it entered the level). Asked whenever a waiting job is filed: a demoted one's
        promotion is noted for later."""
        if not self._on(job):
            return (0, job.submit_time)
        level = self.level(job.attained_gpu_s)
        if level and job.stopped_at is not None:
            if self.sched.config.las_promote_knob is not None:
                heapq.heappush(self._due, (self._promotion(job), job.name))
            return (level, job.stopped_at)
        if _promoted(job):
            assert job.promoted_at is not None
            return (0, job.promoted_at)
        return (level, job.submit_time)

    def _promotion(self, job: Job) -> float:
        assert job.stopped_at is not None and self.sched.config.las_promote_knob is not None
        ran_s = job.attained_gpu_s * 1000 / max(job.min_gpu(), 1)
        return job.stopped_at + self.sched.config.las_promote_knob * ran_s

    def note(self, job: Job) -> str:
        """A demoted job is told why newer jobs go first, and when it counts afresh (words that stay the same
        while it waits: the service writes a reason again only when it changes)."""
        if not self._on(job):
            return ""
        level = self.level(job.attained_gpu_s)
        if not level:
            return ""
        text = (f"least attained service: it received {job.attained_gpu_s / 3600:.1f} GPU-hours (level {level}), "
                f"so jobs of queue {job.queue} that received less go first")
        if job.stopped_at is not None and self.sched.config.las_promote_knob is not None:
            text += f"; it counts afresh {self._promotion(job) - job.stopped_at:.0f} s after its last run ended"
        return text

    def due(self, waiting: list[Job], now: float) -> tuple[float, ...]:
        """The next demoted job's promotion, whether or not the cycle looked at it (one passed over for its
        shape is promoted all the same)."""
        if self._due and self._due[0][0] > now:
            return (self._due[0][0],)  # the heap's head is the earliest
        later = [when for when, _ in self._due if when > now]  # the head is due at once: the next cycle's
        return (min(later),) if later else ()

    def promote(self, ssn: Session) -> None:
        """Jobs that waited ``las_promote_knob`` times their run since their last run start afresh."""
        jobs = self.sched.cluster.jobs
        while self._due and self._due[0][0] <= ssn.now:
            when, name = heapq.heappop(self._due)
            job = jobs.get(name)
            if (job is None or job.phase is not JobPhase.PENDING or not self.level(job.attained_gpu_s)
                    or job.stopped_at is None or self._promotion(job) != when):
                continue  # gone, started, promoted already, or filed again since
            job.attained_gpu_s, job.promoted_at = 0.0, when
            job.reason = "waited long after its last run: counted afresh (least attained service)"
            self.sched.index(job)  # its order key changed

    def yields(self, preemptor: Job, victim: Job, ssn: Session) -> bool:
        return (victim.may_move and victim.queue == preemptor.queue and self._on(preemptor)
                and victim.tier <= preemptor.tier and not _promoted(preemptor)
                and self.level(victim.attained(ssn.now)) > self.level(preemptor.attained_gpu_s))

    def victim_order(self, preemptor: Job, victim: Job, ssn: Session) -> tuple[float]:
        """The job that received the most goes first."""
        return (-self.level(victim.attained(ssn.now)) if self._on(victim) else 0,)

    def queues(self, preemptor: Job, ssn: Session) -> Iterator[tuple[str, int]]:
        if self._on(preemptor):
            yield preemptor.queue, int(preemptor.tier)


def _promoted(job: Job) -> bool:
    """Counted afresh by the promote knob since it last ran (not merely once, in an earlier wait)."""
    return job.promoted_at is not None and (job.stopped_at is None or job.promoted_at >= job.stopped_at)
