"""Accounting records (SLURM's ``sacct`` for the shared cluster): as each pod the scheduler placed ends —
finishes, fails, is evicted or deleted — its run (start, end, GPU milli) is written into the
``UsageRecord`` of its job, one per job incarnation (cluster-scoped: records outlive pods, PodGroups,
namespaces and scheduler restarts); ``kubectl ferry usage`` sums them over a time range.

Writes are JSON merge patches keyed by pod UID, so writing an entry twice (after a restart the cache
lists every terminal pod again) changes nothing. Only the leader writes; a pod deleted while no scheduler
ran is not recorded (its end is unknown) — a limitation the README states. A write the API refuses for
good (4xx) is logged and dropped; only transient failures are retried.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from ferry.keys import API_GROUP, API_VERSION, POD_GROUP_LABEL, SCHEDULER_NAME
from ferry.kube import timestamps
from ferry.kube.rest import Rest, path, status_of
from scheduler.service.snapshot import BadSpec, namespace_queues, pod_request, queue_of

Obj = dict[str, Any]
GROUP, VERSION = API_GROUP, API_VERSION
REMEMBER = 200_000  # pod UIDs already written, before the memory is reset (writes are idempotent anyway)
log = structlog.get_logger("ferry.scheduler.accounting")


@dataclass(frozen=True)
class PodRun:
    namespace: str
    job: str
    job_uid: str
    queue: str
    uid: str
    name: str
    start: str
    end: str
    gpu_milli: int

    @property
    def record(self) -> str:
        """The record's name: the job's, plus a digest of its incarnation (a job re-created under the
        same name starts a new record)."""
        digest = hashlib.sha256(f"{self.namespace}/{self.job}/{self.job_uid}".encode()).hexdigest()[:10]
        return f"{self.namespace}.{self.job[:180]}-{digest}"


def run_of(pod: Obj, groups: Mapping[str, Obj], queues: Mapping[str, Obj], deleted_at: str) -> PodRun | None:
    """The run of a pod the scheduler placed that has ended (terminal, or ``deleted_at``), else None."""
    meta, spec, st = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    if spec.get("schedulerName") != SCHEDULER_NAME or not spec.get("nodeName") or not st.get("startTime"):
        return None
    finished = [cs["state"]["terminated"].get("finishedAt") for cs in st.get("containerStatuses") or []
                if (cs.get("state") or {}).get("terminated")]
    end = max((f for f in finished if f), default=None) or deleted_at
    try:
        gpu_milli = pod_request(pod).gpu_total
    except BadSpec:
        gpu_milli = 0
    ns = meta["namespace"]
    group_name = (meta.get("labels") or {}).get(POD_GROUP_LABEL)
    group = groups.get(f"{ns}/{group_name}") if group_name else None
    queue = queue_of(group, pod, namespace_queues(queues).get(ns))
    return PodRun(ns, group_name or meta["name"], (group or {}).get("metadata", {}).get("uid") or meta["uid"],
                  queue, meta["uid"], meta["name"], st["startTime"], end, gpu_milli)


class Accountant:
    def __init__(self, rest: Rest, groups: Callable[[], Mapping[str, Obj]],
                 queues: Callable[[], Mapping[str, Obj]]) -> None:
        """``groups`` and ``queues``: the informer caches (looked up per event; a relist replaces them)."""
        self.rest = rest
        self.groups, self.queues = groups, queues
        self.todo: dict[str, PodRun] = {}
        self.written: set[str] = set()
        self.wake = asyncio.Event()

    def pod_changed(self, kind: str, pod: Obj) -> None:
        """Note a pod that ended; cheap, called from the informer for every pod event."""
        uid = pod.get("metadata", {}).get("uid", "")
        if uid in self.written or uid in self.todo:
            return
        if kind != "DELETED" and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            return
        run = run_of(pod, self.groups(), self.queues(), timestamps.now())
        if run is not None:
            self.todo[uid] = run
            self.wake.set()

    async def run(self, leading: asyncio.Event) -> None:
        while True:
            await self.wake.wait()
            await leading.wait()
            self.wake.clear()
            batch, self.todo = self.todo, {}
            results = await asyncio.gather(*(self._write(r) for r in batch.values()), return_exceptions=True)
            for r, res in zip(batch.values(), results, strict=True):
                if isinstance(res, BaseException):
                    code = status_of(res)
                    lasting = 400 <= code < 500 and code not in (409, 429)
                    log.warning("usage record write failed" + (", dropped" if lasting else ", will retry"),
                                job=f"{r.namespace}/{r.job}", pod=r.name, status=code, error=str(res)[:200])
                    if not lasting:
                        self.todo.setdefault(r.uid, r)
                        continue
                if len(self.written) >= REMEMBER:  # written, or refused for good: not again
                    self.written.clear()
                self.written.add(r.uid)
            if self.todo:  # retry what failed, not at once
                await asyncio.sleep(2.0)
                self.wake.set()

    async def _write(self, r: PodRun) -> None:
        entry = {"name": r.name, "start": r.start, "end": r.end, "gpuMilli": r.gpu_milli}
        url = path(GROUP, VERSION, "usagerecords")
        patch = {"spec": {"pods": {r.uid: entry}}}
        try:
            await self.rest.patch(f"{url}/{r.record}", patch)
            return
        except Exception as exc:
            if status_of(exc) != 404:
                raise
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "UsageRecord",
                "metadata": {"name": r.record, "labels": {"kubeferry.io/queue": r.queue}},
                "spec": {"queue": r.queue, "namespace": r.namespace, "job": r.job, "jobUID": r.job_uid,
                         "pods": {r.uid: entry}}}
        try:
            await self.rest.create(url, body)
        except Exception as exc:
            if status_of(exc) != 409:
                raise
            await self.rest.patch(f"{url}/{r.record}", patch)  # written meanwhile by another pod's end
