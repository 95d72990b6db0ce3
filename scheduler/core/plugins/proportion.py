"""proportion (Volcano's): each queue deserves capacity water-filled by weight, capped at what it asks
for; queues are served by use per deserved share, and a queue at its deserved share gets nothing more."""

from __future__ import annotations

from scheduler.core.fairshare import water_fill
from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.model import Job, Queue


class Proportion(Plugin):
    name = "proportion"
    deserved: dict[str, float]

    def register(self, fw: Framework) -> None:
        self.deserved = {}
        fw.session_open.append((self.name, self.open))
        fw.queue_order.append((self.name, self.queue_order))
        fw.admit.append((self.name, self.admit))

    def open(self, ssn: Session) -> None:
        queues = self.sched.cluster.queues
        pending = self.sched.pending_gpu
        request = {q: float(queues[q].allocated_gpu + pending.get(q, 0)) for q in queues}
        self.deserved = water_fill(request, {q: queues[q].weight for q in queues}, float(self.sched.placer.capacity))

    def queue_order(self, queue: Queue, tier: int) -> tuple[float, ...]:
        deserved = self.deserved.get(queue.name, 0.0)
        return (queue.allocated_gpu / deserved if deserved > 0 else float("inf"),)

    def admit(self, queue: Queue, job: Job) -> str | None:
        deserved = self.deserved.get(queue.name, 0.0)
        if queue.allocated_gpu >= deserved - 1e-6:  # the proportion plugin's "overused"
            return f"queue {queue.name} is at its deserved share ({deserved / 1000:.1f} GPUs)"
        return None
