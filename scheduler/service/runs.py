"""What a job without a PodGroup keeps of its earlier runs.

A gang's PodGroup outlives its pods, so an evicted gang's next run keeps its place in its queue (the
PodGroup's creation) and what its runs received (the PodGroup's status). A pod without one -- a batch
Job's pod, most one-GPU jobs -- was a new job when its controller made it again: queued behind every job
that arrived while it ran, its hold and starvation clocks started afresh, its attained service (least
attained service) and the time of its eviction (the no-thrash cooldown) forgotten. The trace replays file
an evicted job's next run with its arrival and its history, so the published figures assumed otherwise.

Here the service notes, when it evicts a pod that a controller owns, what the job had, under that
controller's UID (the vnode labels a copy with its tenant controller's, ``UPSTREAM_CONTROLLER_LABEL``);
the controller's next pod in the namespace takes the oldest note, and keeps it on itself
(``EARLIER_RUN_ANNOTATION``, which the service writes), as a gang's PodGroup status keeps its history: a
scheduler that restarts or changes leader while that pod waits or runs reads the run back from the pod.
A note not yet taken is kept too, by the leader, in one ConfigMap of the scheduler's namespace
(:meth:`EarlierRuns.saved`; a leader that starts or takes over restores it before its first cycle,
:meth:`EarlierRuns.restore`), so a restart or a change of leader in the seconds before the controller makes
its next pod loses nothing. A note not taken within ``KEEP_S`` is dropped: that pod is a new job.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ferry.keys import EARLIER_RUN_ANNOTATION, UPSTREAM_CONTROLLER_LABEL
from ferry.kube.owners import controller_ref
from ferry.kube.timestamps import rfc3339, unix

Obj = dict[str, Any]
# what an evicted job keeps for its next run: a gang's PodGroup status fields, and a bare job's next pod's
# EARLIER_RUN_ANNOTATION (with its arrival besides)
ATTAINED_STATUS = "attainedGpuSeconds"
EVICTED_AT_STATUS = "lastEvictionTime"
MOVED_AT_STATUS = "lastMoveTime"
ARRIVAL = "arrivalTime"
KEEP_S = 3600.0  # a note not taken by then is dropped (the controller made no next pod: its job was deleted)
MOST_NOTES = 100_000  # a bound on memory whatever happens to the notes' controllers
SAVED_BYTES = 900_000  # what the saved notes may take of a ConfigMap (1 MiB): the newest first, ~4,000 notes


@dataclass(frozen=True, slots=True)
class EarlierRun:
    """What an evicted job had, as a gang's PodGroup would keep it."""

    submit_time: float
    attained_gpu_s: float
    stopped_at: float
    moved_at: float | None = None

    def fields(self) -> Obj:
        """The run as it is kept (a PodGroup's status fields, plus the arrival)."""
        return {ARRIVAL: rfc3339(self.submit_time),
                **evicted_status(self.attained_gpu_s, self.stopped_at, self.moved_at)}

    def annotation(self) -> str:
        """The run as its next pod keeps it (:meth:`fields`)."""
        return json.dumps(self.fields(), sort_keys=True)

    @classmethod
    def of_fields(cls, kept: Any) -> EarlierRun | None:
        """The run :meth:`fields` wrote, or None: not what the scheduler writes."""
        try:
            moved = kept.get(MOVED_AT_STATUS)
            return cls(unix(kept[ARRIVAL]), float(kept[ATTAINED_STATUS]), unix(kept[EVICTED_AT_STATUS]),
                       unix(moved) if moved else None)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    @classmethod
    def of_pod(cls, pod: Obj) -> EarlierRun | None:
        """The run a pod keeps (:meth:`annotation`), or None: none, or not one the scheduler wrote."""
        text = (pod["metadata"].get("annotations") or {}).get(EARLIER_RUN_ANNOTATION)
        if not text:
            return None
        try:
            return cls.of_fields(json.loads(text))
        except ValueError:
            return None


def evicted_status(attained_gpu_s: float, at: float, moved_at: float | None = None) -> Obj:
    """What a PodGroup's status keeps of an evicted gang for its next run (read back by snapshot's
    ``build``): the GPU-seconds it received (rounded down, so that a live model's own figure stays the
    larger), when, and when it was last told to move."""
    kept: Obj = {ATTAINED_STATUS: math.floor(attained_gpu_s * 1000) / 1000, EVICTED_AT_STATUS: rfc3339(at)}
    if moved_at is not None:
        kept[MOVED_AT_STATUS] = rfc3339(moved_at)
    return kept


def controller_of(pod: Obj) -> tuple[str, str] | None:
    """(namespace, UID of the pod's controller): the tenant controller a vnode's copy names, else the pod's own
    controller in the compute cluster."""
    meta = pod["metadata"]
    uid = (meta.get("labels") or {}).get(UPSTREAM_CONTROLLER_LABEL) or (controller_ref(pod) or {}).get("uid")
    return (meta["namespace"], str(uid)) if uid else None


class EarlierRuns:
    def __init__(self, keep_s: float = KEEP_S, most: int = MOST_NOTES) -> None:
        self.keep_s = keep_s
        self.most = most
        self._notes: dict[tuple[str, str], deque[tuple[float, EarlierRun]]] = {}
        self._count = 0
        # each job's answer, decided when its pod is first seen and kept while that pod lives: an evicted pod
        # re-derived before it is gone must not take its own note, and a job's arrival must not change under
        # it. By the pod's UID too: a pod made again under the same name (a StatefulSet's) is the next pod.
        self._decided: dict[str, tuple[str, EarlierRun | None]] = {}
        self._to_keep: list[tuple[Obj, EarlierRun]] = []  # notes taken, for the service to write on their pods
        self.generation = 0  # counts changes to the notes not taken, so the service saves them when they change

    def evicted(self, pods: Iterable[Obj], run: EarlierRun, now: float) -> None:
        """The service evicts these pods of one job: each pod a controller owns leaves a note for its next one."""
        for pod in pods:
            key = controller_of(pod)
            if key is None or self._count >= self.most:
                continue
            self._notes.setdefault(key, deque()).append((now + self.keep_s, run))
            self._count += 1
            self.generation += 1

    def withdraw(self, pods: Iterable[Obj], run: EarlierRun) -> int:
        """The eviction that left ``run``'s notes for these pods was refused (a disruption budget): the job runs
        on, and its controller's next pod (after an ordinary end) is not its continuation. Returns how many
        notes were withdrawn."""
        withdrawn = 0
        for pod in pods:
            key = controller_of(pod)
            notes = self._notes.get(key) if key is not None else None
            found = next((n for n in reversed(notes) if n[1] == run), None) if notes else None
            if notes is None or found is None:
                continue
            notes.remove(found)
            self._count -= 1
            self.generation += 1
            withdrawn += 1
            if not notes and key is not None:
                del self._notes[key]
        return withdrawn

    def of(self, job: str, pod: Obj, now: float) -> EarlierRun | None:
        """The earlier run bare job ``job`` (its pod ``pod``) continues, if any."""
        uid = str(pod["metadata"].get("uid", ""))
        if (decided := self._decided.get(job)) is not None and decided[0] == uid:
            return decided[1]
        found = EarlierRun.of_pod(pod)  # taken before, perhaps by another scheduler
        if found is None and (key := controller_of(pod)) is not None and (notes := self._notes.get(key)):
            while notes and found is None:
                until, run = notes.popleft()
                self._count -= 1
                self.generation += 1
                found = run if until >= now else None  # one not taken in time: dropped
            if not notes:
                del self._notes[key]
            if found is not None:
                self._to_keep.append((pod, found))
        self._decided[job] = (uid, found)
        return found

    def taken(self) -> list[tuple[Obj, EarlierRun]]:
        """The notes taken since the last call, each with the pod that took it: the service writes each on
        its pod (:meth:`EarlierRun.annotation`)."""
        out, self._to_keep = self._to_keep, []
        return out

    def forget(self, job: str) -> None:
        """Job ``job`` is gone (ended, or evicted and gone: its note is already made)."""
        self._decided.pop(job, None)

    def keep_only(self, jobs: set[str]) -> None:
        for job in [j for j in self._decided if j not in jobs]:
            del self._decided[job]

    def notes(self) -> int:
        """Notes not taken yet (for tests and metrics)."""
        return self._count

    def saved(self, now: float, most_bytes: int = SAVED_BYTES) -> str:
        """The notes not taken and not expired, as JSON (``{"namespace/controller UID": [[until, run], ...]}``),
        the newest first up to ``most_bytes``: what a leader hands its successor."""
        newest = sorted(((until, key, run) for key, notes in self._notes.items() for until, run in notes
                         if until >= now), key=lambda n: -n[0])
        out: dict[str, list[list[Any]]] = {}
        size = 2
        for until, (ns, uid), run in newest:
            entry = [rfc3339(until), run.fields()]
            size += len(json.dumps(entry)) + len(ns) + len(uid) + 8
            if size > most_bytes:
                break
            out.setdefault(f"{ns}/{uid}", []).append(entry)
        for entries in out.values():
            entries.reverse()  # oldest first, as they are taken
        return json.dumps(out, sort_keys=True)

    def restore(self, text: str, pods: Iterable[Obj], now: float) -> int:
        """Replace the notes not taken with those ``text`` (:meth:`saved`) keeps, less the expired ones and
        those a pod already keeps (taken, then saved again before the old leader could write it). Returns
        how many there are; a text that is not :meth:`saved`'s restores none (and says so: ValueError)."""
        kept = json.loads(text)
        if not isinstance(kept, dict):
            raise ValueError("not a map of notes")
        taken = {(key, run) for pod in pods if (key := controller_of(pod)) is not None
                 and (run := EarlierRun.of_pod(pod)) is not None}
        notes: dict[tuple[str, str], deque[tuple[float, EarlierRun]]] = {}
        count = 0
        for name, entries in kept.items():
            ns, _, uid = str(name).partition("/")
            for entry in entries if isinstance(entries, list) else []:
                try:
                    until, run = unix(entry[0]), EarlierRun.of_fields(entry[1])
                except (ValueError, TypeError, IndexError, KeyError):
                    continue
                if run is None or until < now or ((ns, uid), run) in taken or count >= self.most:
                    continue
                notes.setdefault((ns, uid), deque()).append((until, run))
                count += 1
        self._notes, self._count = notes, count
        self.generation += 1
        return count
