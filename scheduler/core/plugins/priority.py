"""priority: guaranteed jobs before elastic ones, then higher priority first (age breaks ties)."""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.model import Job


class Priority(Plugin):
    name = "priority"

    def register(self, fw: Framework) -> None:
        fw.job_order.append((self.name, self.job_order))
        fw.victim_order.append((self.name, self.victim_order))

    @staticmethod
    def job_order(job: Job) -> tuple[int, int]:
        return (-int(job.tier), -job.priority)

    @staticmethod
    def victim_order(preemptor: Job, victim: Job, ssn: Session) -> tuple[float, ...]:
        """Elastic jobs, then lower priorities, are victims first."""
        return (int(victim.tier), victim.priority)
