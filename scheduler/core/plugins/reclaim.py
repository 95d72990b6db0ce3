"""reclaim: a queue takes back capacity it lent — another queue's jobs that run on borrowed capacity —
up to its guarantee (rule ``reclaim``); beyond it, borrowers share idle capacity by weight, so a
borrower may take from one that, even after losing the victim, borrows more per weight (``fair-share``;
the inequality cannot hold both ways, so this never loops) — but not a gang spanning several nodes for a
smaller job of its tier. Only for queues with the reclaim right.
A job that could take capacity back from a waiting job's queue under ``reclaim`` is not kept off the
nodes held for that job (``reserve``) either, once it has waited its queue's reclaim delay.
In a queue tree both rules compare the queues where their lineages part (two departments, or two teams of
one department), and a victim must run on borrowed capacity at every level from there down to its queue.
A team within its own guarantee may take back what another department borrows even while its own department
holds more than its guarantee: a child's guarantee is carved from its parent's, so a sibling's borrowing
(say, one gang too big to take back without breaking that sibling's own guarantee) does not cancel it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.hierarchy import split, subtree_total
from scheduler.core.model import Job, Queue, Tier


def borrowed(q: Queue, delta: int) -> float:
    """GPU milli above the guarantee per unit of weight, with ``delta`` more allocated."""
    return max(0, q.allocated_gpu + delta - q.guaranteed_gpu) / max(q.weight, 1e-9)


def leaving(victim: Job, ssn: Session, level: Queue | None = None) -> int:
    """What the victim's queue (or its ancestor ``level``) loses: jobs already told to leave, and this one."""
    if level is None or level.name == victim.queue:
        return ssn.doomed.get(victim.queue, 0) + victim.gpu_allocated()
    return subtree_total(ssn.sched.cluster.queues, ssn.doomed, level.name) + victim.gpu_allocated()


def claim(preemptor: Job, ssn: Session, level: Queue | None = None) -> int:
    """What the preemptor's queue (or its ancestor ``level``) is about to take: preemptors already waiting
    for victims, and this job."""
    if level is None or level.name == preemptor.queue:
        return ssn.claims.get(preemptor.queue, 0) + preemptor.gpu_demand()
    return subtree_total(ssn.sched.cluster.queues, ssn.claims, level.name) + preemptor.gpu_demand()


def competing(preemptor: str, victim: str, ssn: Session) -> tuple[list[Queue], list[Queue]]:
    """Where the two queues compete, top first (scheduler/core/hierarchy.py): the queues themselves when
    flat; empty when they are one queue or one holds the other."""
    queues = ssn.sched.cluster.queues
    pq, vq = queues[preemptor], queues[victim]
    if pq.parent is None and vq.parent is None:
        return ([pq], [vq]) if preemptor != victim else ([], [])
    return split(queues, preemptor, victim)


def within(q: Queue, preemptor: Job, ssn: Session) -> bool:
    """``q`` (the preemptor's queue or an ancestor) stays within its guarantee once what it claims starts."""
    return q.allocated_gpu + claim(preemptor, ssn, q) <= q.guaranteed_gpu


def lends(preemptor: Job, victim: Job, ssn: Session) -> bool:
    """``victim`` runs on capacity its queue borrowed — at every level from where the two queues compete
    down to its own — and the preemptor's queue may take such capacity."""
    mine, theirs = competing(preemptor.queue, victim.queue, ssn)
    return (bool(mine) and bool(theirs) and ssn.sched.cluster.queues[preemptor.queue].rights.reclaim
            and all(q.allocated_gpu - leaving(victim, ssn, q) >= q.guaranteed_gpu for q in theirs))


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
        fw.hold_yields.append((self.name, self.could_reclaim))
        fw.due.append((self.name, self.due))

    def due(self, waiting: list[Job], now: float) -> Iterable[float]:
        """A job's queue's delay before reclaiming ends, counted from its arrival: held nodes no longer keep it
        off (``could_reclaim``)."""
        queues = self.sched.cluster.queues
        return (job.submit_time + queues[job.queue].preemptor_delay_s for job in waiting)

    def within_guarantee(self, preemptor: Job, victim: Job, ssn: Session) -> bool:
        if not lends(preemptor, victim, ssn):
            return False
        mine = competing(preemptor.queue, victim.queue, ssn)[0][0]
        return within(mine, preemptor, ssn) or within(self.sched.cluster.queues[preemptor.queue], preemptor, ssn)

    def could_reclaim(self, job: Job, holder: Job, ssn: Session) -> bool:
        """A hold keeps no capacity from a job that could take it back once the holder ran: the job has
        waited its queue's delay before reclaiming, and the rule ``reclaim`` would grant it the holder
        (its queue within its guarantee, the holder's borrowing wherever the two compete). Kept off the
        held nodes, such a job would only turn idle capacity into an eviction later. The delay counts from the
        job's arrival, as the hold and starvation clocks do, not from this run's wait as the preempt action's
        does: counting this run's wait here too was measured and lost least attained service's big-job bound
        at Sep x 88 (docs/results.md, *Sixty-second session*)."""
        delay = self.sched.cluster.queues[job.queue].preemptor_delay_s
        return ssn.now - job.submit_time >= delay and self.within_guarantee(job, holder, ssn)

    def fair_share(self, preemptor: Job, victim: Job, ssn: Session) -> bool:
        """Between two borrowers sharing idle capacity by weight. A gang spanning nodes goes only for a job
        at least as big, unless it is of a lower tier (elastic jobs soak up idle GPUs to give them back):
        placing it again needs whole nodes free at once, which is what made it wait, and a smaller job
        gains less than it loses (the gang that waited hours, started, then was evicted for an 8-GPU job
        minutes later, twice, set the trace's big-job tail)."""
        if (victim.tier >= preemptor.tier and victim.gpu_allocated() > preemptor.gpu_demand()
                and len({r.node for r in victim.bound()}) > 1):
            return False
        if not lends(preemptor, victim, ssn):
            return False
        mine, theirs = (side[0] for side in competing(preemptor.queue, victim.queue, ssn))
        return borrowed(mine, claim(preemptor, ssn, mine)) < borrowed(theirs, -leaving(victim, ssn, theirs))

    def queues(self, preemptor: Job, ssn: Session) -> Iterator[tuple[str, int]]:
        pq = self.sched.cluster.queues[preemptor.queue]
        if not pq.rights.reclaim:
            return
        own = within(pq, preemptor, ssn)
        for q, kept in over_guarantee(preemptor, ssn):
            mine, theirs = competing(pq.name, q.name, ssn)
            if not mine or not theirs:
                continue
            top, other = mine[0], theirs[0]
            wants = claim(preemptor, ssn, top)
            held = kept if other is q else -subtree_total(self.sched.cluster.queues, ssn.doomed, other.name)
            if own or top.allocated_gpu + wants <= top.guaranteed_gpu or borrowed(top, wants) < borrowed(other, held):
                yield q.name, max(Tier)
