"""priority: guaranteed jobs before elastic ones, then higher priority first (age breaks ties)."""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin
from scheduler.core.model import Job


class Priority(Plugin):
    name = "priority"

    def register(self, fw: Framework) -> None:
        fw.job_order.append((self.name, self.job_order))

    @staticmethod
    def job_order(job: Job) -> tuple[int, int]:
        return (-int(job.tier), -job.priority)
