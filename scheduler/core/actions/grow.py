"""grow: idle GPUs go to running elastic jobs below their maximum, outside reservations (simulators; a
service cannot add pods to a job — its operator does)."""

from __future__ import annotations

from scheduler.core.decisions import Bind
from scheduler.core.framework import Action, Session
from scheduler.core.model import JobPhase, Replica, ReplicaPhase


class Grow(Action):
    name = "grow"

    def execute(self, ssn: Session) -> None:
        sched = self.sched
        excluded = sched.reserved_nodes()
        for name in list(sched.elastic):
            job = sched.cluster.jobs[name]
            if job.phase is not JobPhase.RUNNING or job.elastic_max is None:
                continue
            last = job.tasks[-1]
            bound = sum(1 for r in job.replicas if r.task == last.name and r.phase is ReplicaPhase.BOUND)
            while bound < job.elastic_max:
                found = sched.placer.find_for(job, last.request, excluded)
                if found is None:
                    return
                index = max((r.index for r in job.replicas if r.task == last.name), default=-1) + 1
                replica = Replica(last.name, index)
                job.replicas.append(replica)
                sched.placer.bind(job, replica, *found)
                ssn.result.decisions.append(Bind(job.name, last.name, index, found[0], found[1]))
                bound += 1
