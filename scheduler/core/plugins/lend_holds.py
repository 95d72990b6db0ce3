"""lend-holds: nodes held for a starving job (``reserve``) are lent, not left idle, while they drain.

A hold keeps new work off nodes until they empty for a gang that smaller jobs kept passing. Its cost is
the capacity it idles: GPUs freed on a held node stay free until the last occupant of the hold ends,
which with heavy-tailed run times can be hours. With this plugin a job that fits nowhere else may start
there *on loan*: ``reserve`` recalls it (notice and grace to checkpoint, like any victim) the moment the
holder could start if the jobs on loan left. The holder then starts within a grace period of when it
would have without loans, and the idle capacity ran jobs meanwhile — most of them short enough to end
before any recall.

A job may go on loan unless its last run was evicted less than ``loan_cooldown_s`` ago (a recalled job
is not lent again at once, so no job is thrashed between holds), and only to a holder still draining
(one that already recalls its loans lends nothing more). A job on loan that its queue (or an ancestor)
needs for its guarantee is not recalled, as no occupant would be: recalling it would only hand the
capacity to a reclaim against the holder later."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.hierarchy import lineage, subtree_total
from scheduler.core.model import Job, JobPhase


class LendHolds(Plugin):
    name = "lend-holds"

    def register(self, fw: Framework) -> None:
        fw.hold_lends.append((self.name, self.may_borrow))
        fw.loan_recall.append((self.name, self.beyond_guarantee))
        fw.due.append((self.name, self.due))

    def due(self, waiting: list[Job], now: float) -> Iterable[float]:
        """An evicted job may go on loan again once its cooldown ends."""
        cooldown = self.sched.config.loan_cooldown_s
        return (job.stopped_at + cooldown for job in waiting if job.stopped_at is not None)

    def may_borrow(self, job: Job, holder: Job, ssn: Session) -> bool:
        recently_stopped = job.stopped_at is not None and ssn.now - job.stopped_at < self.sched.config.loan_cooldown_s
        return holder.phase is JobPhase.PENDING and not recently_stopped

    def beyond_guarantee(self, holder: Job, loans: list[Job], ssn: Session) -> list[Job]:
        """The loans (cheapest first) whose recall keeps every queue of their lineage at or above its
        guarantee, counting the jobs already told to leave and the loans recalled before them."""
        queues = self.sched.cluster.queues
        leaving: dict[str, int] = dict(ssn.doomed)
        out: list[Job] = []
        for job in loans:
            if job.queue != holder.queue:
                line = lineage(queues, job.queue)
                if any(q.allocated_gpu - subtree_total(queues, leaving, q.name) - job.gpu_allocated() < q.guaranteed_gpu
                       for q in line):
                    continue
            leaving[job.queue] = leaving.get(job.queue, 0) + job.gpu_allocated()
            out.append(job)
        return out
