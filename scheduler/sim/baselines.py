"""Baseline schedulers for side-by-side runs, built on the core's extension points.

- ``fifo``: strict gang FIFO: one global order by submit time, nothing passes a job that does not fit.
- ``volcano``: Volcano's default configuration (actions enqueue, allocate, backfill; plugins priority,
  gang, drf, proportion, binpack): queues ordered by share of their *deserved* capacity, which the
  proportion plugin water-fills by weight over what queues request; a queue at or over its deserved
  share gets nothing more; jobs by priority then age; gangs all-or-nothing; no reservation, so a job
  that does not fit is simply passed by (greedy backfill); no reclaim or preemption (not in the
  default action list). Enqueue's admission gate is not modelled: with the default overcommit
  factor it admits what allocate would consider anyway.
"""

from __future__ import annotations

from scheduler.core.fairshare import water_fill
from scheduler.core.model import Cluster, Job, Queue
from scheduler.core.scheduler import Scheduler, SchedulerConfig


def fifo(cluster: Cluster) -> Scheduler:
    return Scheduler(cluster, SchedulerConfig(fair_share=False, backfill=False, reservation_after_s=None,
                                              reclaim=False, preempt=False, grow_elastic=False))


class VolcanoLike(Scheduler):
    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster, SchedulerConfig(fair_share=True, backfill=True, reservation_after_s=None,
                                                  reclaim=False, preempt=False, grow_elastic=False))
        self._deserved: dict[str, float] = {}

    def cycle(self, now: float):  # type: ignore[no-untyped-def]
        self._deserved = self.deserved()
        return super().cycle(now)

    def deserved(self) -> dict[str, float]:
        """The proportion plugin: capacity water-filled by weight, each queue capped at its request."""
        queues = self.cluster.queues
        request = {q: float(queues[q].allocated_gpu + self.pending_gpu.get(q, 0)) for q in queues}
        return water_fill(request, {q: queues[q].weight for q in queues}, float(self.placer.capacity))

    def queue_key(self, queue: Queue, tier: int) -> tuple[float, ...]:
        deserved = self._deserved.get(queue.name, 0.0)
        return (queue.allocated_gpu / deserved if deserved > 0 else float("inf"),)

    def queue_blocked(self, queue: Queue, job: Job) -> str | None:
        deserved = self._deserved.get(queue.name, 0.0)
        if queue.allocated_gpu >= deserved - 1e-6:  # the proportion plugin's "overused"
            return f"queue {queue.name} is at its deserved share ({deserved / 1000:.1f} GPUs)"
        return super().queue_blocked(queue, job)
