"""What preempt and consolidate share: the fewest jobs that must leave, and telling them."""

from __future__ import annotations

from collections.abc import Callable

from scheduler.core.decisions import JobStatus, NotifyWillEvict
from scheduler.core.framework import Session
from scheduler.core.model import Job, JobPhase, Replica
from scheduler.core.statement import Statement


def work_lost(job: Job, now: float) -> float:
    """Work lost by evicting: GPU-seconds since start (cheaper victims first)."""
    started = job.start_time if job.start_time is not None else now
    return (now - started) * max(job.gpu_allocated(), 1)


def fewest(st: Statement, job: Job, gang: list[Replica], excluded: frozenset[str], chosen: list[Job],
           dearest_first: Callable[[Job], float]) -> None:
    """Drop from ``chosen`` (lifted in ``st``) every job ``job`` can do without, dearest first."""
    for other in sorted(chosen, key=dearest_first):
        st.restore(other)
        if st.fits(job, gang, excluded) is None:
            st.lift(other)
        else:
            chosen.remove(other)


def tell_to_leave(ssn: Session, job: Job, nodes: tuple[str, ...], leaving: list[Job],
                  rule: Callable[[Job], str], why: Callable[[Job], str], status: str) -> None:
    """``job`` holds ``nodes`` and waits (Privileged) for ``leaving`` to go at the end of their grace;
    each is told why (``rule``: its name, as data; ``why``: in words), with its deadline, to checkpoint."""
    sched, now = ssn.sched, ssn.now
    sched.hold(job, nodes)
    job.phase = JobPhase.PRIVILEGED
    job.reason = status
    for other in leaving:
        deadline = now + max(sched.cluster.queues[other.queue].victim_grace_s, 0.0)
        other.phase, other.will_evict_deadline, other.will_evict_by = JobPhase.WILL_EVICT, deadline, job.name
        other.last_victim_cycle = sched.cycles
        sched.victims[job.name][other.name] = None
        other.reason = f"will be evicted at t={deadline:.0f} ({why(other)}); checkpoint now"
        ssn.result.decisions.append(NotifyWillEvict(other.name, deadline, job.name, rule(other), other.reason))
    ssn.result.decisions.append(JobStatus(job.name, JobPhase.PRIVILEGED.value, job.reason))
