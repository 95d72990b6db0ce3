"""guarantee: queues below their guaranteed share are served first (least served first), then queues
borrowing idle capacity by their use per unit of weight — fair borrowing. In a queue tree each level is
compared in turn (scheduler/core/hierarchy.py): a team of a department under its guarantee comes before
the teams of departments that borrow.

A queue with no guarantee is ranked by what it would hold once its smallest waiting job started. By
its use alone, such a queue holding nothing would outrank every borrower whatever its weight, and take
a whole node the moment one frees. Under overload a tenant of almost no weight then received several
times its fair share (Philly, 88 nodes: 3.9x, Jain 0.70), while tenants of real weight with jobs that
fit waited."""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin
from scheduler.core.hierarchy import lineage
from scheduler.core.model import Queue


class Guarantee(Plugin):
    name = "guarantee"

    def register(self, fw: Framework) -> None:
        fw.queue_order.append((self.name, self.queue_order))

    def queue_order(self, queue: Queue, tier: int) -> tuple[float, ...]:
        """The key of each level of the queue's lineage, root first: departments compare as departments,
        then their teams among themselves (flat queues: one level)."""
        if queue.parent is None:
            return self._level(queue, queue.name, tier)
        key: tuple[float, ...] = ()
        for q in lineage(self.sched.cluster.queues, queue.name):
            key += self._level(q, queue.name, tier)
        return key

    def _level(self, queue: Queue, leaf: str, tier: int) -> tuple[float, float]:
        if queue.guaranteed_gpu > 0 and queue.allocated_gpu < queue.guaranteed_gpu:
            return (0.0, queue.allocated_gpu / queue.guaranteed_gpu)
        share = self.borrowing(queue)
        if queue.guaranteed_gpu <= 0:
            share += self.sched.smallest_pending_gpu(tier, leaf) / max(self.sched.placer.capacity, 1)
        return (1.0, share / max(queue.weight, 1e-9))

    def borrowing(self, queue: Queue) -> float:
        """How much a queue at or over its guarantee has, for the order among borrowers (share of the cluster)."""
        return queue.allocated_gpu / max(self.sched.placer.capacity, 1)
