"""guarantee: queues below their guaranteed share are served first (least served first), then queues
borrowing idle capacity by their use per unit of weight — fair borrowing."""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin
from scheduler.core.model import Queue


class Guarantee(Plugin):
    name = "guarantee"

    def register(self, fw: Framework) -> None:
        fw.queue_order.append((self.name, self.queue_order))

    def queue_order(self, queue: Queue, tier: int) -> tuple[float, ...]:
        if queue.guaranteed_gpu > 0 and queue.allocated_gpu < queue.guaranteed_gpu:
            return (0.0, queue.allocated_gpu / queue.guaranteed_gpu)
        return (1.0, self.borrowing(queue) / max(queue.weight, 1e-9))

    def borrowing(self, queue: Queue) -> float:
        """How much a queue at or over its guarantee has, for the order among borrowers (share of the cluster)."""
        return queue.allocated_gpu / max(self.sched.placer.capacity, 1)
