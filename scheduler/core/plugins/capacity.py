"""capacity: a queue never holds more than its maximum (a parent's counts its children's jobs)."""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin
from scheduler.core.hierarchy import lineage
from scheduler.core.model import Job, Queue


class Capacity(Plugin):
    name = "capacity"

    def register(self, fw: Framework) -> None:
        fw.admit.append((self.name, self.admit))

    def admit(self, queue: Queue, job: Job) -> str | None:
        levels = [queue] if queue.parent is None else lineage(self.sched.cluster.queues, queue.name)
        for q in levels:  # a parent's maximum bounds its children together
            if q.max_gpu is not None and q.allocated_gpu + job.gpu_demand() > q.max_gpu:
                return (f"queue {q.name} would exceed its maximum of {q.max_gpu / 1000:g} GPUs "
                        f"({q.allocated_gpu / 1000:g} in use, job needs {job.gpu_demand() / 1000:g})")
        return None
