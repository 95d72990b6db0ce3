"""tier-preemption: guaranteed jobs evict their own queue's elastic jobs (rule ``preempt``, where the
queue allows it), and a privileged queue's jobs evict lower-tier jobs of any queue (``privileged``)."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.model import Job, Tier


class TierPreemption(Plugin):
    name = "tier-preemption"

    def register(self, fw: Framework) -> None:
        fw.victim_rule.append(("preempt", self.own_elastic))
        fw.victim_rule.append(("privileged", self.privileged))
        fw.victim_queues.append((self.name, self.queues))

    def own_elastic(self, preemptor: Job, victim: Job, ssn: Session) -> bool:
        pq = self.sched.cluster.queues[preemptor.queue]
        return (victim.queue == preemptor.queue and pq.rights.preempt_own_elastic
                and victim.tier < preemptor.tier and preemptor.tier is Tier.GUARANTEED)

    def privileged(self, preemptor: Job, victim: Job, ssn: Session) -> bool:
        pq = self.sched.cluster.queues[preemptor.queue]
        return victim.queue != preemptor.queue and pq.rights.privileged and victim.tier < preemptor.tier

    def queues(self, preemptor: Job, ssn: Session) -> Iterable[tuple[str, int]]:
        below = int(preemptor.tier) - 1  # both rules take lower tiers only
        if below < 0:
            return
        if preemptor.tier is Tier.GUARANTEED:
            yield preemptor.queue, below
        if self.sched.cluster.queues[preemptor.queue].rights.privileged:
            yield from ((q, below) for q in self.sched.cluster.queues if q != preemptor.queue)
