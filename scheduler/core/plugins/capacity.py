"""capacity: a queue never holds more than its maximum."""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin
from scheduler.core.model import Job, Queue


class Capacity(Plugin):
    name = "capacity"

    def register(self, fw: Framework) -> None:
        fw.admit.append((self.name, self.admit))

    @staticmethod
    def admit(queue: Queue, job: Job) -> str | None:
        if queue.max_gpu is not None and queue.allocated_gpu + job.gpu_demand() > queue.max_gpu:
            return (f"queue {queue.name} would exceed its maximum of {queue.max_gpu / 1000:g} GPUs "
                    f"({queue.allocated_gpu / 1000:g} in use, job needs {job.gpu_demand() / 1000:g})")
        return None
