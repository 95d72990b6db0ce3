"""protection: a job is no victim while young (it has not made progress worth losing yet, and evicting
it would thrash) or right after it was a victim (spared or not)."""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.model import Job


class Protection(Plugin):
    name = "protection"

    def register(self, fw: Framework) -> None:
        fw.victim_filter.append((self.name, self.may_be_victim))

    def may_be_victim(self, victim: Job, ssn: Session) -> bool:
        cfg = self.sched.config
        if victim.start_time is not None and ssn.now - victim.start_time < cfg.min_runtime_s:
            return False
        # never a victim twice in a row
        return (self.sched.cycles - victim.last_victim_cycle > 1
                and ssn.now - victim.last_victim_at >= cfg.victim_cooldown_s)
