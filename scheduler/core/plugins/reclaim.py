"""reclaim: a queue takes back capacity it lent — another queue's jobs that run on borrowed capacity —
up to its guarantee (rule ``reclaim``); beyond it, borrowers share idle capacity by weight, so a
borrower may take from one that, even after losing the victim, borrows more per weight (``fair-share``;
the inequality cannot hold both ways, so this never loops). Only for queues with the reclaim right."""

from __future__ import annotations

from collections.abc import Iterator

from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.model import Job, Queue, Tier


def borrowed(q: Queue, delta: int) -> float:
    """GPU milli above the guarantee per unit of weight, with ``delta`` more allocated."""
    return max(0, q.allocated_gpu + delta - q.guaranteed_gpu) / max(q.weight, 1e-9)


def leaving(victim: Job, ssn: Session) -> int:
    """What the victim's queue loses: its jobs already told to leave (for others), and this one."""
    return ssn.doomed.get(victim.queue, 0) + victim.gpu_allocated()


def claim(preemptor: Job, ssn: Session) -> int:
    """What the preemptor's queue is about to take: preemptors already waiting for victims, and this job."""
    return ssn.claims.get(preemptor.queue, 0) + preemptor.gpu_demand()


def lends(preemptor: Job, victim: Job, ssn: Session) -> bool:
    """``victim`` runs on capacity its queue borrowed, and the preemptor's queue may take such capacity."""
    queues = ssn.sched.cluster.queues
    vq = queues[victim.queue]
    return (victim.queue != preemptor.queue and queues[preemptor.queue].rights.reclaim
            and vq.allocated_gpu - leaving(victim, ssn) >= vq.guaranteed_gpu)


def over_guarantee(preemptor: Job, ssn: Session) -> Iterator[tuple[Queue, int]]:
    """Other queues that still hold more than their guarantee once their doomed jobs leave."""
    for q in ssn.sched.cluster.queues.values():
        kept = -ssn.doomed.get(q.name, 0)
        if q.name != preemptor.queue and q.allocated_gpu + kept > q.guaranteed_gpu:
            yield q, kept


class Reclaim(Plugin):
    name = "reclaim"

    def register(self, fw: Framework) -> None:
        fw.victim_rule.append(("reclaim", self.within_guarantee))
        fw.victim_rule.append(("fair-share", self.fair_share))
        fw.victim_queues.append((self.name, self.queues))

    def within_guarantee(self, preemptor: Job, victim: Job, ssn: Session) -> bool:
        pq = self.sched.cluster.queues[preemptor.queue]
        return lends(preemptor, victim, ssn) and pq.allocated_gpu + claim(preemptor, ssn) <= pq.guaranteed_gpu

    def fair_share(self, preemptor: Job, victim: Job, ssn: Session) -> bool:
        queues = self.sched.cluster.queues
        return lends(preemptor, victim, ssn) and (
            borrowed(queues[preemptor.queue], claim(preemptor, ssn))
            < borrowed(queues[victim.queue], -leaving(victim, ssn)))

    def queues(self, preemptor: Job, ssn: Session) -> Iterator[tuple[str, int]]:
        pq = self.sched.cluster.queues[preemptor.queue]
        if not pq.rights.reclaim:
            return
        wants = claim(preemptor, ssn)
        within = pq.allocated_gpu + wants <= pq.guaranteed_gpu
        for q, kept in over_guarantee(preemptor, ssn):
            if within or borrowed(pq, wants) < borrowed(q, kept):
                yield q.name, max(Tier)
