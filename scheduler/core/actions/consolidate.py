"""consolidate: when a waiting gang would fit in the free GPUs in total but not on any set of nodes
(fragmentation), move jobs that declared themselves movable (``Job.movable``; elastic jobs by default) so
whole nodes open for it — notice, grace, eviction, and the operator's new pods placed again.

A move is tried only if, in one Statement, the gang fits once the movers left *and* every mover fits
elsewhere beside it, so nobody is moved into a wait. At most ``consolidation_moves_per_cycle`` jobs move
per cycle, and a job moved within ``consolidation_cooldown_s`` is not moved again. Each move is a notice
whose reason says why (the service makes it an Event). ``drain-holds`` (below) is its patient form: only for
a gang that holds nodes, only off those nodes."""

from __future__ import annotations

from scheduler.core.actions.victims import fewest, tell_to_leave
from scheduler.core.framework import Action, Session
from scheduler.core.model import Job, JobPhase, Tier
from scheduler.core.statement import Statement


class Consolidate(Action):
    name = "consolidate"
    doing = "consolidating"  # how the waiting gang's status names the moves

    def execute(self, ssn: Session) -> None:
        sched, cfg, now = self.sched, self.sched.config, ssn.now
        budget = cfg.consolidation_moves_per_cycle
        if budget <= 0:
            return
        jobs, fw = sched.cluster.jobs, sched.framework
        movable = [j for j in jobs.values() if self._movable(j, now) and fw.may_be_victim(j, ssn)]
        if not movable:
            return
        free = sum(n.free_gpu_milli for n in sched.cluster.nodes.values() if n.schedulable)
        waiting = sorted((j for j in sched.pending_jobs()
                          if j.phase is JobPhase.PENDING and j.tier is Tier.GUARANTEED and self._serves(j)
                          and j.gpu_demand() <= free and fw.gated(j, ssn) is None),
                         key=lambda j: (j.submit_time, j.name))
        for job in waiting[: cfg.preemption_attempts]:
            if budget <= 0:
                ssn.result.cut_short = True
                return
            moved = self._try(job, self._movers(job, [m for m in movable if m.phase is JobPhase.RUNNING]), budget, ssn)
            budget -= moved

    def _serves(self, job: Job) -> bool:
        """Which waiting gangs jobs move for: any that fragmentation keeps out."""
        return True

    def _movers(self, job: Job, movable: list[Job]) -> list[Job]:
        """Which running movable jobs may move for ``job``: any."""
        return movable

    def _why(self, job: Job) -> str:
        return f"consolidation for {job.name}: moved so that whole nodes open; its new pods fit elsewhere"

    def _movable(self, job: Job, now: float) -> bool:
        return (job.phase is JobPhase.RUNNING and job.may_move
                and (job.moved_at is None or now - job.moved_at >= self.sched.config.consolidation_cooldown_s))

    def _try(self, job: Job, movable: list[Job], budget: int, ssn: Session) -> int:
        """Move the fewest movable jobs that open room for ``job``; returns how many were told to move."""
        sched, now = self.sched, ssn.now
        excluded = sched.reserved_nodes(except_job=job.name)  # its own hold, if any, is welcome
        gang = sched.gang_part(job)
        nodes = sched.cluster.nodes
        with Statement(sched.placer) as st:
            if st.fits(job, gang, excluded) is not None:
                return 0  # it fits as things are: allocate will start it
            # empty the nodes closest to empty first: the fewest GPUs to move per node opened
            def where(m: Job) -> tuple[int, int, str]:
                held = [nodes[r.node] for r in m.bound() if r.node in nodes]
                most_free = max((n.free_gpu_milli for n in held), default=0)
                return (-most_free, m.gpu_allocated(), m.name)

            chosen: list[Job] = []
            placed = None
            for mover in sorted(movable, key=where):
                if len(chosen) >= budget:
                    break
                st.lift(mover)
                chosen.append(mover)
                placed = st.fits(job, gang, excluded)
                if placed is not None:
                    break
            if placed is None:
                return 0
            fewest(st, job, gang, excluded, chosen, lambda m: -m.gpu_allocated())  # the biggest dropped first
            placed = st.place_gang(job, gang, excluded)
            assert placed is not None, "the gang stopped fitting"
            target = tuple(sorted({p.node for p in placed}))
            keep_off = excluded | frozenset(target)
            for mover in chosen:  # each must find room elsewhere, or nobody moves
                if st.place_gang(mover, mover.pending(), keep_off) is None:
                    return 0
        for mover in chosen:
            mover.moved_at = now
        tell_to_leave(ssn, job, target, chosen, lambda m: self.name, lambda m: self._why(job),
                      f"{self.doing}: moving {len(chosen)} movable job(s) ({', '.join(m.name for m in chosen)}) "
                      "to open whole nodes; it would fit in the free GPUs, but on no set of nodes")
        return len(chosen)


class DrainHolds(Consolidate):
    """drain-holds: a gang that holds nodes (``reserve``: it waited while smaller jobs passed it) need not wait
    for their movable occupants to end: they are moved to free GPUs elsewhere, so the hold opens now.

    ``consolidate`` moves jobs for any gang that fragmentation keeps out, the moment it arrives; under load the
    free GPUs it would gather are taken by arrivals anyway, and every move costs its job a new wait (Philly
    replay with every job movable: Sep x 96 with least attained service 254 -> 269 s average wait). Here a
    gang is served only once it has waited as long as a hold takes, and only its own held nodes are emptied:
    the nodes reserve keeps idle for it already. Same bounds (moves per cycle, cooldown), same checks (the
    gang fits once the movers left, every mover fits elsewhere beside it)."""

    name = "drain-holds"
    doing = "draining its held nodes"

    def _serves(self, job: Job) -> bool:
        return bool(job.reserved_nodes)

    def _movers(self, job: Job, movable: list[Job]) -> list[Job]:
        held = set(job.reserved_nodes)
        return [m for m in movable if any(r.node in held for r in m.bound())]

    def _why(self, job: Job) -> str:
        return f"draining the nodes held for {job.name}: moved to free GPUs elsewhere, where its new pods fit"
