"""dependencies: a job declared to start after other jobs (``Job.depends_on``) waits, with its reason,
until each reached its phase — ``Running`` (it started, or already succeeded) or ``Succeeded``.

A dependency that can never be met — it failed, or it still does not exist ``dependency_timeout_s``
after the job arrived — is the job's pending reason; the job stays, for its owner to delete or fix.
A waiting job is gated, not unfit: it holds no nodes, preempts nobody, and the jobs behind it go on.
"""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.model import Dependency, Job, JobPhase

REACHED = {  # the phases in which a dependency counts as having reached the one asked for
    JobPhase.RUNNING: frozenset({JobPhase.RUNNING, JobPhase.WILL_EVICT, JobPhase.SUCCEEDED}),
    JobPhase.SUCCEEDED: frozenset({JobPhase.SUCCEEDED}),
}
VERB = {JobPhase.RUNNING: "start", JobPhase.SUCCEEDED: "succeed"}


class Dependencies(Plugin):
    name = "dependencies"

    def register(self, fw: Framework) -> None:
        fw.gate.append((self.name, self.gate))

    def gate(self, job: Job, ssn: Session) -> str | None:
        for dep in job.depends_on:
            why = self._unmet(job, dep, ssn)
            if why is not None:
                return why
        return None

    def _unmet(self, job: Job, dep: Dependency, ssn: Session) -> str | None:
        phase = self.sched.phase_of(dep.job)
        verb = VERB.get(dep.phase, dep.phase.value.lower())
        if phase is None:
            waited = ssn.now - job.submit_time
            if waited >= self.sched.config.dependency_timeout_s:
                return (f"can never start: it waits for {dep.job} to {verb}, and {dep.job} still does not exist "
                        f"{waited:.0f} s after this job arrived")
            return f"waiting for {dep.job} to {verb} (it does not exist yet)"
        if phase in REACHED.get(dep.phase, frozenset({dep.phase})):
            return None
        if phase is JobPhase.FAILED:
            return f"can never start: it waits for {dep.job} to {verb}, and {dep.job} failed"
        return f"waiting for {dep.job} to {verb} (it is {phase.value})"
