"""What the demo shows while it runs, read from the clusters the way ``kubectl get`` would.

One :class:`Picture` per sample: the compute cluster's Queue status, the demo's jobs as each tenant sees
its pods (phase, reason, eviction notice), the GPUs each tenant holds in the compute cluster, and the
Events the tenants see. The samples' GPU counts make the timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ferry.demo.objects import NAMESPACE
from ferry.keys import API_GROUP, API_VERSION, WILL_EVICT_CONDITION
from ferry.kube.rest import Rest, path
from ferry.status import gpus_of, queue_rows
from vnode.naming import TENANT_LABEL

Obj = dict[str, Any]


@dataclass
class JobRow:
    tenant: str
    name: str
    tier: str
    pods: int
    running: int
    state: str


@dataclass
class Picture:
    at: float = 0.0
    queues: list[Obj] = field(default_factory=list)
    jobs: list[JobRow] = field(default_factory=list)
    gpus: dict[str, float] = field(default_factory=dict)  # tenant -> GPUs its compute pods hold
    capacity: float = 0.0
    events: list[str] = field(default_factory=list)


def will_evict(pod: Obj) -> str | None:
    """The time a pod's eviction notice names, if it has one."""
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == WILL_EVICT_CONDITION and c.get("status") == "True":
            return str(c.get("message") or "soon")
    return None


def job_state(pods: list[Obj]) -> str:
    """One line a user would say about a job from its pods."""
    phases = [p.get("status", {}).get("phase", "Pending") for p in pods]
    reasons = sorted({str(p["status"]["reason"]) for p in pods if p.get("status", {}).get("reason")})
    if any(will_evict(p) for p in pods) and "Failed" not in phases:
        return "Running, eviction notice"
    if phases and all(ph == "Running" for ph in phases):
        return "Running"
    if "Failed" in phases:
        return "Failed" + (f" ({', '.join(reasons)})" if reasons else "")
    if phases and all(ph == "Succeeded" for ph in phases):
        return "Succeeded"
    return "Pending"


def jobs_of(tenant: str, pods: list[Obj]) -> list[JobRow]:
    by_job: dict[str, list[Obj]] = defaultdict(list)
    for p in pods:
        by_job[p["metadata"].get("labels", {}).get("app", p["metadata"]["name"])].append(p)
    return [JobRow(tenant, name, ps[0]["metadata"].get("labels", {}).get("tier", "-"), len(ps),
                   sum(1 for p in ps if p.get("status", {}).get("phase") == "Running"), job_state(ps))
            for name, ps in sorted(by_job.items())]


def _event_time(e: Obj) -> str:
    return str(e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp") or "")


def event_lines(events: list[tuple[str, Obj]], limit: int) -> list[str]:
    recent = sorted(events, key=lambda te: _event_time(te[1]))[-limit:]
    out = []
    for tenant, e in recent:
        obj = e.get("involvedObject") or e.get("regarding") or {}
        when = _event_time(e)[11:19]
        message = str(e.get("message") or e.get("note") or "").replace("\n", " ")
        out.append(f"{when} {tenant} {obj.get('kind', '').lower()}/{obj.get('name', '')} "
                   f"{e.get('reason', '')}: {message}")
    return out


class Observer:
    """Samples the clusters every ``period`` seconds until stopped; keeps the latest picture and the
    GPU series."""

    def __init__(self, compute: Rest, tenants: dict[str, Rest], period: float = 1.0, events: int = 8) -> None:
        self.compute = compute
        self.tenants = tenants
        self.period = period
        self.events = events
        self.t0 = time.time()
        self.picture = Picture()
        self.series: list[tuple[float, dict[str, float]]] = []

    async def sample(self) -> Picture:
        queues = (await self.compute.get(path(API_GROUP, API_VERSION, "queues")))["items"]
        nodes = (await self.compute.get(path("", "v1", "nodes")))["items"]
        capacity = sum(float((n.get("status", {}).get("allocatable") or {}).get("nvidia.com/gpu", 0)) for n in nodes)
        compute_pods = (await self.compute.get(path("", "v1", "pods"), labelSelector=TENANT_LABEL))["items"]
        gpus: dict[str, float] = dict.fromkeys(self.tenants, 0.0)
        for p in compute_pods:
            if p.get("spec", {}).get("nodeName") and p.get("status", {}).get("phase") in ("Pending", "Running") \
                    and not p["metadata"].get("deletionTimestamp"):
                tenant = p["metadata"]["labels"][TENANT_LABEL]
                gpus[tenant] = gpus.get(tenant, 0.0) + gpus_of(p)
        jobs: list[JobRow] = []
        events: list[tuple[str, Obj]] = []
        for tenant, rest in self.tenants.items():
            jobs += jobs_of(tenant, (await rest.get(path("", "v1", "pods", NAMESPACE)))["items"])
            events += [(tenant, e) for e in (await rest.get(path("", "v1", "events", NAMESPACE)))["items"]]
        pic = Picture(time.time() - self.t0, queue_rows(queues), jobs, gpus, capacity,
                      event_lines(events, self.events))
        self.picture = pic
        self.series.append((pic.at, dict(gpus)))
        return pic

    async def run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a slow or restarting apiserver: keep the last picture
                await self.sample()
            await asyncio.sleep(self.period)  # a sampling period, not synchronisation
