"""fifo: one global order — the queue whose first job comes first in job order goes first."""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin
from scheduler.core.model import Queue


class Fifo(Plugin):
    name = "fifo"

    def register(self, fw: Framework) -> None:
        fw.queue_order.append((self.name, self.queue_order))

    def queue_order(self, queue: Queue, tier: int) -> tuple[float, ...]:
        head = self.sched.head(tier, queue.name, set(), set())
        if head is None:
            return (0.0, float("inf"))
        return (0.0, *head[0][:-1])  # its job's order, without the name: ties go to the queue's name
