"""starvation: a job still waiting ``starvation_preempt_after_s`` after arrival, with a hold that has not
drained (heavy-tailed run times can keep any node busy for days), comes first in victim searches and may
evict the other queues' borrowed-capacity jobs that started after it arrived (they overtook it: strict
FIFO would never have allowed it). The only thing that bounds a big gang's wait when no held node drains.
Only with its queue's reclaim right."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.model import Job, JobPhase
from scheduler.core.plugins.reclaim import lends, over_guarantee


class Starvation(Plugin):
    name = "starvation"

    def register(self, fw: Framework) -> None:
        fw.urgent.append((self.name, self.starving))
        fw.victim_rule.append(("starvation", self.overtook))
        fw.victim_queues.append((self.name, self.queues))
        fw.due.append((self.name, self.due))

    def due(self, waiting: list[Job], now: float) -> Iterable[float]:
        """A job's threshold: it then comes first in victim searches."""
        after = self.sched.config.starvation_preempt_after_s
        return () if after is None else (job.submit_time + after for job in waiting)

    def starving(self, job: Job, ssn: Session) -> bool:
        after = self.sched.config.starvation_preempt_after_s
        return (after is not None and job.phase is JobPhase.PENDING and job.name in self.sched.reserved
                and ssn.now - job.submit_time >= after)

    def overtook(self, preemptor: Job, victim: Job, ssn: Session) -> bool:
        if not self.starving(preemptor, ssn) or victim.start_time is None or not lends(preemptor, victim, ssn):
            return False
        return victim.start_time > preemptor.submit_time and victim.tier <= preemptor.tier

    def queues(self, preemptor: Job, ssn: Session) -> Iterator[tuple[str, int]]:
        if self.sched.cluster.queues[preemptor.queue].rights.reclaim and self.starving(preemptor, ssn):
            yield from ((q.name, int(preemptor.tier)) for q, _ in over_guarantee(preemptor, ssn))
