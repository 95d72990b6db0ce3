"""A Statement: trial binds and releases on the placer that are either kept (commit) or undone (discard).

Every all-or-nothing trial of a cycle goes through one — does the preemptor fit if these victims left?
would shrinking these replicas be enough? — so no trial can leave the model half changed: leaving the
``with`` block without :meth:`commit` (a failed trial, an exception) undoes everything in reverse order.
Undone means untraceable: each node a discarded trial touched also gets back its place among equal nodes
(:meth:`Placer.refile`), so trying and keeping nothing changes no later decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

from scheduler.core.model import Job, Replica, ReplicaPhase
from scheduler.core.nodeclasses import Filing
from scheduler.core.placement import Placement, Placer


@dataclass(frozen=True, slots=True)
class _Op:
    bound: bool  # True: the statement bound the replica; False: it released it from node/devices
    job: Job
    replica: Replica
    node: str
    devices: tuple[int, ...]
    phase: ReplicaPhase  # the replica's phase before the operation
    filing: Filing | None  # the node's place in the state index before the operation


class Statement:
    def __init__(self, placer: Placer) -> None:
        self.placer = placer
        self._log: list[_Op] = []

    def __enter__(self) -> Statement:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.discard()

    # ------------------------------------------------------------ operations
    def bind(self, job: Job, replica: Replica, node: str, devices: tuple[int, ...]) -> None:
        op = _Op(True, job, replica, node, devices, replica.phase, self.placer.filing(node))
        self.placer.bind(job, replica, node, devices)
        self._log.append(op)

    def release(self, job: Job, replica: Replica) -> None:
        """Take a bound replica off its node (it is pending while the statement lasts)."""
        if replica.phase is not ReplicaPhase.BOUND or replica.node is None:
            return
        op = _Op(False, job, replica, replica.node, replica.devices, replica.phase, self.placer.filing(replica.node))
        self.placer.release(job, replica, ReplicaPhase.PENDING)
        self._log.append(op)

    def lift(self, job: Job) -> None:
        """Release every bound replica of ``job``: as if it had been evicted."""
        for r in job.bound():
            self.release(job, r)

    def restore(self, job: Job) -> None:
        """Put back the replicas of ``job`` this statement released, wherever they are in the log."""
        mine = [op for op in self._log if not op.bound and op.job is job]
        for op in reversed(mine):  # newest first, as a rollback would: each node ends in its first filing
            self.placer.bind(op.job, op.replica, op.node, op.devices)
            self.placer.refile(op.node, op.filing)
        self._log = [op for op in self._log if op.bound or op.job is not job]

    def place_gang(self, job: Job, replicas: list[Replica], excluded: frozenset[str]) -> list[Placement] | None:
        """All of ``replicas`` bound (and recorded), or none."""
        phases = [r.phase for r in replicas]
        placed = self.placer.place_gang(job, replicas, excluded)
        if placed is not None:
            before = dict(zip((id(r) for r in replicas), phases, strict=True))
            self._log += [_Op(True, job, p.replica, p.node, p.devices, before[id(p.replica)], p.before) for p in placed]
        return placed

    def fits(self, job: Job, replicas: list[Replica], excluded: frozenset[str]) -> list[Placement] | None:
        """Where ``replicas`` would go now, all or none; a probe: nothing stays bound."""
        return self.placer.place_gang(job, replicas, excluded, probe=True)

    # ------------------------------------------------------------- outcomes
    def mark(self) -> int:
        return len(self._log)

    def rollback(self, mark: int = 0) -> None:
        """Undo every operation after ``mark``, newest first."""
        while len(self._log) > mark:
            op = self._log.pop()
            if op.bound:
                self.placer.release(op.job, op.replica, op.phase)
            else:
                self.placer.bind(op.job, op.replica, op.node, op.devices)
            self.placer.refile(op.node, op.filing)

    def discard(self) -> None:
        self.rollback(0)

    def commit(self) -> None:
        """Keep everything: the operations become the model's state."""
        self._log.clear()
