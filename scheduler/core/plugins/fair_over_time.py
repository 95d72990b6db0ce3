"""fair-over-time: guarantee, with borrowers ordered by the GPU time they received recently.

Queues below their guarantee are served first, exactly as ``guarantee`` does. Queues borrowing idle
capacity are ordered by their usage decayed with a half-life (SLURM's fair-share decay, KAI's
time-aware fairness) plus what they hold now, per unit of weight: with no history this is
``guarantee``'s order, and a tenant that used a lot yesterday yields to one that used little. It
replaces ``guarantee`` in a configuration (``usageHalfLifeSeconds`` sets the half-life);
instantaneous fairness stays the presets' default.
"""

from __future__ import annotations

import math

from scheduler.core.framework import Framework, Session
from scheduler.core.model import Job, Queue
from scheduler.core.plugins.guarantee import Guarantee


def decayed(usage: float, allocated: float, dt: float, half_life: float) -> float:
    """Usage after ``dt`` more seconds holding ``allocated``: the old usage decays, and the new is the
    integral of ``allocated`` weighted by the same decay (exact for an allocation constant over ``dt``)."""
    if dt <= 0:
        return usage
    keep = math.exp(-math.log(2) * dt / half_life)
    return usage * keep + allocated * half_life / math.log(2) * (1.0 - keep)


class FairOverTime(Guarantee):
    name = "fair-over-time"

    def register(self, fw: Framework) -> None:
        fw.session_open.append((self.name, self.open))
        fw.queue_order.append((self.name, self.queue_order))
        fw.job_note.append((self.name, self.note))

    def open(self, ssn: Session) -> None:
        """Add the time since each queue's usage was last brought up to date, at the allocations the last
        cycle left. The usage lives on the queues (the model), not here: a new configuration registers new
        plugins and keeps it, and an adapter seeds it after a restart (a Queue's status)."""
        half_life = self.sched.config.usage_half_life_s
        for q in self.sched.cluster.queues.values():
            if q.usage_at is not None:
                q.recent_usage = decayed(q.recent_usage, float(q.allocated_gpu), ssn.now - q.usage_at, half_life)
            q.usage_at = ssn.now

    def note(self, job: Job) -> str:
        """A job that would borrow is told that recent usage orders the borrowers. No figure: its reason must
        stay the same while it waits (each change is written again, with an Event)."""
        queue = self.sched.cluster.queues[job.queue]
        if queue.recent_usage <= 0 or not queue.over_guarantee(job.min_gpu()):
            return ""
        return (f"fair-over-time: queues borrow idle GPUs least recent usage first (half-life "
                f"{self.sched.config.usage_half_life_s / 3600:g} h; each queue's: kubectl ferry status -o wide)")

    def recent_share(self, queue: Queue) -> float:
        """The queue's decayed usage as a share of the whole cluster over the decay's mean lifetime."""
        window = self.sched.config.usage_half_life_s / math.log(2)
        capacity = max(self.sched.placer.capacity, 1)
        return queue.recent_usage / (capacity * window)

    def borrowing(self, queue: Queue) -> float:
        """Recent usage plus what it holds now (which moves within a cycle), as shares of the cluster."""
        return self.recent_share(queue) + super().borrowing(queue)
