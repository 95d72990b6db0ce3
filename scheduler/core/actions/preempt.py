"""preempt: a waiting job takes capacity from jobs the victim rules let it take — whole jobs, after their
grace period, fewest and cheapest first; shrinking elastic jobs to their minimum comes before killing.

Which jobs may be victims, and why, is the plugins' business (``victim_filter``, ``victim_rule``,
``victim_queues``); this action searches, with every trial inside a :class:`Statement`.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable

from scheduler.core.actions.allocate import WAITING_FOR_CAPACITY
from scheduler.core.actions.victims import fewest, tell_to_leave, work_lost
from scheduler.core.decisions import Shrink
from scheduler.core.framework import Action, OrderKey, Session
from scheduler.core.model import Job, JobPhase, Replica, ReplicaPhase, Tier
from scheduler.core.statement import Statement


class Preempt(Action):
    name = "preempt"

    def execute(self, ssn: Session) -> None:
        sched, fw, cfg, now = self.sched, self.sched.framework, self.sched.config, ssn.now
        if not fw.preempts:
            return
        jobs = sched.cluster.jobs
        # urgent (e.g. starving) jobs first, then by queue (least served first) and job order
        candidates: list[tuple[bool, tuple[float, ...], OrderKey, str]] = []
        for qname, groups in sched.pending[int(Tier.GUARANTEED)].items():
            qkey = fw.queue_key(sched.cluster.queues[qname], int(Tier.GUARANTEED))
            for group in groups.values():
                waiting = (kn for kn in group if jobs[kn[1]].phase is JobPhase.PENDING
                           and fw.gated(jobs[kn[1]], ssn) is None)
                for key, name in itertools.islice(waiting, cfg.preemption_attempts):
                    candidates.append((not fw.is_urgent(jobs[name], ssn), qkey, key, name))
        if not candidates:
            return
        running: dict[tuple[str, int], list[Job]] | None = None  # the jobs that may be victims at all, by
        attempts = 0  # queue and tier: built when a search first needs it (most cycles none does)
        for _, _, _, name in sorted(candidates):
            capped = attempts >= cfg.preemption_attempts
            if capped:
                ssn.result.cut_short = True  # the rest are searched next cycle; they are still told why they wait
            job = jobs[name]
            if job.phase is not JobPhase.PENDING:
                continue
            queue = sched.cluster.queues[job.queue]
            if job.waited(now) < queue.preemptor_delay_s:
                _verdict(job, ssn, f"waiting up to {queue.preemptor_delay_s:g} s for free capacity before "
                         "preempting lower-priority or borrowed jobs (where its queue may)")
                continue
            if now < job.preempt_retry_at or capped:
                if job.search_verdict:  # not searched this cycle: what the last search concluded stands
                    _verdict(job, ssn, job.search_verdict)
                continue
            job.search_verdict = ""
            ssn.refresh_claims()
            if running is None:
                running = defaultdict(list)
                for j in jobs.values():
                    if fw.may_be_victim(j, ssn):
                        running[(j.queue, int(j.tier))].append(j)
            pool = [v for q, top in fw.queues_with_victims(job, ssn).items() for tier in range(top + 1)
                    for v in running.get((q, tier), ()) if fw.victim_reason(job, v, ssn)]
            if not pool:
                job.preempt_retry_at = now + cfg.preemption_retry_s
                job.search_verdict = "no running job may be preempted for it now"
                _verdict(job, ssn, job.search_verdict)
                continue
            attempts += 1
            if not self._try(job, pool, ssn):
                job.preempt_retry_at = now + cfg.preemption_retry_s

    def due(self, waiting: list[Job], now: float) -> Iterable[float]:
        """A job's queue's preemptor delay ends; a job's next victim search."""
        if not self.sched.framework.preempts:
            return
        queues = self.sched.cluster.queues
        for job in waiting:
            yield job.preempt_retry_at
            if job.waiting_since is not None:
                yield job.waiting_since + queues[job.queue].preemptor_delay_s

    def _try(self, job: Job, pool: list[Job], ssn: Session) -> bool:
        sched, fw, now = self.sched, self.sched.framework, ssn.now
        # Other preemptors' nodes stay usable: their victims are already taken out of the pool.
        excluded = sched.reserved_nodes(except_job=job.name, starving_only=True)
        if self._shrink_for(job, pool, excluded, ssn):
            return True
        gang = sched.gang_part(job)
        with Statement(sched.placer) as st:
            # the plugins' order (e.g. lowest tier and priority first), then small jobs (a big gang is hard to
            # place again), then the least work lost
            order = sorted(pool, key=lambda v: (*fw.victim_key(job, v, ssn), v.gpu_allocated(), work_lost(v, now),
                                                v.name))
            chosen: list[Job] = []
            fits = False
            for victim in order:
                if not fw.victim_reason(job, victim, ssn):  # earlier victims may have used up what was borrowed
                    continue
                st.lift(victim)
                chosen.append(victim)
                fits = st.fits(job, gang, excluded) is not None
                if fits:
                    break
            if not fits:
                for victim in chosen:
                    st.restore(victim)
                job.search_verdict = "it cannot start even if every job it may preempt were evicted"
                _verdict(job, ssn, job.search_verdict)
                return False
            fewest(st, job, gang, excluded, chosen, lambda v: -work_lost(v, now))  # most expensive dropped first
            trial = st.fits(job, gang, excluded)
            assert trial is not None, "victim set stopped fitting"
            if not chosen:  # it fits without anyone leaving (on nodes held for others): nothing to do here
                return False
            nodes = tuple(sorted({p.node for p in trial}))
            for victim in chosen:
                st.restore(victim)
            # the victims are back: each one's rule as it stands with the others still running
            rules = {v.name: fw.victim_reason(job, v, ssn) or "preemption" for v in chosen}
        tell_to_leave(ssn, job, nodes, chosen, lambda v: rules[v.name], lambda v: f"{rules[v.name]} by {job.name}",
                      f"preempting {len(chosen)} job(s): {', '.join(v.name for v in chosen)}")
        return True

    def _shrink_for(self, job: Job, pool: list[Job], excluded: frozenset[str], ssn: Session) -> bool:
        """Shrink before kill: stop elastic replicas above their jobs' minimum, newest first, until the
        preemptor fits; if that is not enough, undo and leave the choice to whole-job eviction."""
        sched = self.sched
        gang = sched.gang_part(job)
        with Statement(sched.placer) as st:
            lifted: list[tuple[Job, Replica, str]] = []
            for victim in sorted(pool, key=lambda v: (int(v.tier), v.priority, v.name)):
                shrinkable = max(0, len(victim.bound()) - victim.gang_size)
                for r in sorted(victim.bound(), key=lambda r: -r.index)[:shrinkable]:
                    lifted.append((victim, r, r.node or ""))
                    st.release(victim, r)
                    placed = st.place_gang(job, gang, excluded)
                    if placed is None:
                        continue
                    st.commit()
                    by_job: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
                    for v, rep, node in lifted:
                        rep.phase = ReplicaPhase.EVICTED
                        by_job[v.name].append((rep.task, rep.index, node))
                    for vname, gone in by_job.items():
                        ssn.result.decisions.append(Shrink(vname, tuple(gone), f"shrunk to make room for {job.name}"))
                    sched.started(job, placed, ssn.now, ssn.result)
                    return True
        return False


def _verdict(job: Job, ssn: Session, words: str) -> None:
    """What the search concluded joins why the job did not fit this cycle: allocate's words, or for a job
    holding nodes the hold's (``reserve``'s, said every cycle), never a verdict of an earlier cycle. That
    is what its user can act on. A job that waits for something other than capacity (only cordoned nodes
    could hold it, its queue is at its limit) is told nothing about preempting: it is beside the point."""
    said = job.reason if job.reserved_nodes else ssn.result.pending_reasons.get(job.name)
    if said and (said.endswith(words)  # said already (reserve ran after an earlier search this cycle)
                 or not (job.reserved_nodes or said.startswith(WAITING_FOR_CAPACITY))):
        return
    job.reason = f"{said}; {words}" if said else words
