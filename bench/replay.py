"""Trace replay on real control planes: the same Philly jobs through Kube-Ferry and through Volcano.

Consecutive jobs of the shipped Philly trace (from a start date on), their arrival gaps and run times
divided by one factor so the load is unchanged, are submitted to a compute control plane of kwok GPU
nodes as their users would: a job of up to 8 GPUs is one pod, a bigger one a gang of 8-GPU pods with
its PodGroup; kwok ends each pod ``kubeferry.io/sim-duration`` after it starts. Tenants are the
virtual clusters, each with a queue whose share is proportional to its node count in the VC file
(guarantee and weight for Kube-Ferry, weight for Volcano's proportion plugin), as ``ferry simulate
philly`` builds them. A job evicted by preemption is submitted again with the work it has left (what
ran until the eviction notice counts as checkpointed), as the simulator does.

Measured from the cluster, with the simulator's definitions: a job's wait (arrival to all members
bound, summed over its submissions), GPU utilisation while some job waits, Jain's index of
received over entitled GPU-time per tenant (entitled: the weighted water-fill of demand), and
preemptions. The run ends when every job has been submitted and none is waiting (jobs still running
then change no wait), or at a horizon where jobs still waiting count with the wait they have had.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench.contenders import Contender
from bench.throughput import until
from ferry import binaries
from ferry.cluster.planes import COMPUTE, ControlPlanes, Shape
from ferry.kube.informer import Informer
from ferry.kube.rest import Rest, api_client
from scheduler.core.fairshare import water_fill
from scheduler.sim import philly
from scheduler.sim.traces import TRACES, Problems

Obj = dict[str, Any]
Say = Callable[[str], None]
GPUS_PER_NODE = 8
WILL_EVICT_AT = "kubeferry.io/will-evict-at"
JOB_LABEL = "replay-job"
HORIZON = 1.5  # the replay stops this many arrival spans (plus 5 minutes) after it began
SAMPLE_S = 0.5  # utilisation and fairness are integrated over samples this far apart
# Time constants of the scheduler and queues, in trace seconds (``ferry simulate philly``'s values);
# the replay divides them by the compression factor like every other duration.
VICTIM_GRACE_S, PREEMPTOR_DELAY_S = philly.VICTIM_GRACE_S, philly.PREEMPTOR_DELAY_S


@dataclass(frozen=True, slots=True)
class ReplayJob:
    name: str
    tenant: str
    gpus: int
    arrival: float  # seconds after the first job, compressed
    duration: float  # seconds, compressed

    @property
    def pods(self) -> int:
        return 1 if self.gpus <= GPUS_PER_NODE else math.ceil(self.gpus / GPUS_PER_NODE)

    @property
    def gpus_per_pod(self) -> int:
        return self.gpus if self.gpus <= GPUS_PER_NODE else GPUS_PER_NODE


def trace_window(start: datetime, count: int) -> tuple[list[philly.TraceJob], dict[str, int]]:
    """``count`` consecutive Philly jobs from ``start`` on, and the VC node counts."""
    problems = Problems([])
    jobs = philly.load_jobs(TRACES / "philly" / "philly_2017-09_10.csv", problems)
    vc = philly.load_vc_nodes(TRACES / "philly" / "philly_vc_nodes.csv", problems)
    return philly.window(jobs, start, count), vc


def compress(trace: list[philly.TraceJob], factor: float) -> list[ReplayJob]:
    t0 = trace[0].submit if trace else 0.0
    return [ReplayJob(f"j{i:05d}", j.tenant, j.gpus, (j.submit - t0) / factor, j.duration / factor)
            for i, j in enumerate(trace)]


def namespace_of(tenant: str) -> str:
    return f"vc-{tenant.lower()}"


@dataclass
class _Live:
    job: ReplayJob
    remaining: float
    incarnation: int = 0
    submitted: bool = False
    pending_since: float | None = None  # seconds since the replay began
    started: float | None = None
    notice: float | None = None
    waited: float = 0.0
    bound: set[str] = field(default_factory=set)
    done: bool = False


@dataclass
class ReplayResult:
    contender: str
    jobs: int
    factor: float
    nodes: int
    seconds: float
    metrics: Obj
    timeline: list[tuple[float, int, int]]  # (trace seconds, allocated GPUs, waiting jobs)


class Ledger:
    """What the replay knows of every job, from the pods it sees (pure: no API calls, so it is unit-tested).
    Times are seconds since the replay began."""

    def __init__(self, jobs: list[ReplayJob], queues: dict[str, Any], capacity: int, factor: float) -> None:
        self.live = {j.name: _Live(j, j.duration) for j in jobs}
        self.queues = queues  # tenant -> scheduler.core.model.Queue (shares as the simulator has them)
        self.capacity = capacity
        self.factor = factor
        self.by_pod: dict[str, str] = {}  # pod name -> job name (current incarnation's pods only)
        self.preemptions = 0
        self.received: dict[str, float] = defaultdict(float)  # tenant -> GPU-seconds received
        self.entitled: dict[str, float] = defaultdict(float)
        self.timeline: list[tuple[float, int, int]] = []  # (trace seconds, allocated GPUs, waiting jobs)
        self.busy_while_waiting = 0.0
        self.waiting_time = 0.0
        # allocation from the first arrival to the last: the same span for every contender, so comparable
        # where few jobs wait (utilisation while jobs wait then covers different moments per scheduler)
        self.last_arrival = max((j.arrival for j in jobs), default=0.0)
        self.busy_arrivals = 0.0
        self.arrivals_time = 0.0

    def submit(self, lj: _Live, now: float) -> list[str]:
        """A job (or its next incarnation) is being submitted: the names of its pods."""
        base = f"{lj.job.name}-{lj.incarnation}"
        lj.pending_since, lj.started, lj.notice, lj.bound, lj.submitted = now, None, None, set(), True
        names = [f"{base}-{i}" for i in range(lj.job.pods)]
        self.by_pod.update(dict.fromkeys(names, lj.job.name))
        return names

    def observe(self, kind: str, pod: Obj, now: float) -> _Live | None:
        """A pod event; returns a job evicted while running, to be submitted again with what it has left
        (what ran until the eviction notice counts as checkpointed, as in the simulator)."""
        name = pod["metadata"]["name"]
        job_name = self.by_pod.get(name)
        if job_name is None:
            return None  # an earlier incarnation's pod, or not ours
        lj = self.live[job_name]
        status = pod.get("status", {})
        if kind == "DELETED" or status.get("phase") == "Failed":
            for other in [p for p, j in self.by_pod.items() if j == job_name]:
                del self.by_pod[other]
            if lj.started is None or lj.done:
                return None
            lj.remaining -= (lj.notice if lj.notice is not None else now) - lj.started
            lj.incarnation += 1
            self.preemptions += 1
            return lj
        if (pod["metadata"].get("annotations") or {}).get(WILL_EVICT_AT) and lj.notice is None:
            lj.notice = now
        if status.get("phase") == "Succeeded":
            lj.done = True
        if pod.get("spec", {}).get("nodeName") and name not in lj.bound:
            lj.bound.add(name)
            if len(lj.bound) == lj.job.pods and lj.started is None and lj.pending_since is not None:
                lj.started = now
                lj.waited += now - lj.pending_since
                lj.pending_since = None
        return None

    def sample(self, dt: float, now: float) -> None:
        """Integrate allocation, demand and the fair share over the last ``dt`` seconds."""
        alloc: dict[str, int] = defaultdict(int)
        demand: dict[str, float] = defaultdict(float)
        waiting = 0
        for lj in self.live.values():
            if not lj.submitted or lj.done:
                continue
            demand[lj.job.tenant] += lj.job.gpus
            if lj.started is not None:
                alloc[lj.job.tenant] += lj.job.gpus
            elif lj.pending_since is not None:
                waiting += 1
        total = sum(alloc.values())
        if waiting:
            self.busy_while_waiting += total * dt
            self.waiting_time += dt
        if now <= self.last_arrival:
            self.busy_arrivals += total * dt
            self.arrivals_time += dt
        fair = water_fill(dict(demand), {t: q.weight for t, q in self.queues.items()}, float(self.capacity))
        for t in self.queues:
            self.received[t] += alloc.get(t, 0) * dt
            self.entitled[t] += fair.get(t, 0.0) * dt
        self.timeline.append((now * self.factor, total, waiting))

    def started(self) -> int:
        return sum(lj.started is not None or lj.done for lj in self.live.values())

    def finished(self) -> bool:
        """Every job submitted and running or done: no wait can change any more."""
        return all((lj.submitted and lj.started is not None) or lj.done for lj in self.live.values())

    def metrics(self, now: float) -> Obj:
        """In trace seconds (compressed times multiplied back), with the simulator's definitions. A job still
        waiting at ``now`` (the horizon) counts with the wait it has had so far."""
        waiting = [lj for lj in self.live.values() if lj.pending_since is not None]
        waits = sorted((lj.waited + (now - lj.pending_since if lj.pending_since is not None else 0.0)) * self.factor
                       for lj in self.live.values())
        xs = [self.received[t] / self.entitled[t] for t in self.queues if self.entitled[t] > 0]
        jain = (sum(xs) ** 2) / (len(xs) * sum(x * x for x in xs)) if xs else 1.0
        return {
            "avg_wait_s": round(sum(waits) / len(waits), 1) if waits else None,
            "p50_wait_s": round(philly.percentile(waits, 50), 1) if waits else None,
            "p99_wait_s": round(philly.percentile(waits, 99), 1) if waits else None,
            "gpu_utilization": (round(100 * self.busy_while_waiting / (self.capacity * self.waiting_time), 2)
                                if self.waiting_time else None),
            "gpu_utilization_arrivals": (round(100 * self.busy_arrivals / (self.capacity * self.arrivals_time), 2)
                                         if self.arrivals_time else None),
            "jain_fairness": round(jain, 4),
            "preemptions": self.preemptions,
            "still_waiting": len(waiting),
            "never_submitted": sum(not lj.submitted for lj in self.live.values()),
        }


class Replay:
    """One contender replaying the jobs on its control plane: submits at the trace's arrival times, feeds
    the pods it watches to a :class:`Ledger`, resubmits evicted jobs, samples until no job waits."""

    def __init__(self, contender: Contender, jobs: list[ReplayJob], queues: dict[str, Any], factor: float,
                 nodes: int, api: client.ApiClient, say: Say) -> None:
        self.c = contender
        self.jobs = jobs
        self.factor = factor
        self.ledger = Ledger(jobs, queues, nodes * GPUS_PER_NODE, factor)
        self.core = client.CoreV1Api(api)
        self.rest = Rest(api)
        self.say = say
        self.t0 = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def setup(self) -> None:
        """A namespace and a queue per tenant, before the clock starts."""
        grace = max(1, round(VICTIM_GRACE_S / self.factor))
        delay = max(0, round(PREEMPTOR_DELAY_S / self.factor))
        queues = self.ledger.queues
        for tenant, q in sorted(queues.items()):
            ns = namespace_of(tenant)
            await self.core.create_namespace({"metadata": {"name": ns}})
            weight = min(1000, max(1, round(q.weight * 1000)))
            url, body = self.c.queue(ns, ns, q.guaranteed_gpu // 1000, weight, grace, delay)
            group, version, plural = url.split("/")
            await self.rest.create(f"/apis/{group}/{version}/{plural}", body)
            await self.c.open_queue(self.rest, f"/apis/{group}/{version}/{plural}/{ns}")

        async def accounts() -> bool:
            sas = await self.core.list_service_account_for_all_namespaces(field_selector="metadata.name=default")
            return {namespace_of(t) for t in queues} <= {sa.metadata.namespace for sa in sas.items}

        await until(accounts, 120, "a default ServiceAccount in every tenant namespace")

    async def _submit(self, lj: _Live) -> None:
        job = lj.job
        ns = namespace_of(job.tenant)
        names = self.ledger.submit(lj, self.now())
        base = names[0].rsplit("-", 1)[0]
        g = self.c.group(base, job.pods, ns)
        if g is not None:
            group, version, plural = g[0].split("/")
            await self.rest.create(f"/apis/{group}/{version}/namespaces/{ns}/{plural}", g[1])
        annotations = {"kubeferry.io/sim-duration": f"{max(lj.remaining, 0.001):.3f}s"}
        for name in names:
            body = self.c.pod(name, base if g is not None else None, job.gpus_per_pod, annotations)
            body["metadata"]["labels"][JOB_LABEL] = job.name
            await self.rest.create(f"/api/v1/namespaces/{ns}/pods", body)

    async def _resubmit(self, lj: _Live) -> None:
        if lj.job.pods > 1:  # the evicted incarnation's remaining members go with it
            await self.core.delete_collection_namespaced_pod(
                namespace_of(lj.job.tenant), label_selector=f"{JOB_LABEL}={lj.job.name}", grace_period_seconds=0)
        await self._submit(lj)

    async def _arrivals(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for job in self.jobs:
                delay = job.arrival - self.now()
                if delay > 0:
                    await asyncio.sleep(delay)  # the trace's arrival gap (the workload's clock, not a wait)
                tg.create_task(self._submit(self.ledger.live[job.name]))

    def _on_pod(self, kind: str, pod: Obj) -> None:
        evicted = self.ledger.observe(kind, pod, self.now())
        if evicted is not None:
            task = asyncio.get_running_loop().create_task(self._resubmit(evicted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def run(self, horizon_s: float) -> ReplayResult:
        """Until no job waits, or the horizon (jobs still waiting then count with the wait they have had)."""
        informer = Informer("replay-pods", functools.partial(self.core.list_pod_for_all_namespaces,
                                                             label_selector=JOB_LABEL), self._on_pod)
        watching = asyncio.create_task(informer.run())
        await informer.synced.wait()
        self.t0 = time.monotonic()
        arrivals = asyncio.create_task(self._arrivals())
        last, last_report = 0.0, 0.0
        ledger = self.ledger
        try:
            while not (arrivals.done() and ledger.finished()):
                if arrivals.done() and (exc := arrivals.exception()) is not None:
                    raise exc
                if self.now() > horizon_s:
                    self.say(f"  [{self.c.name}] horizon of {horizon_s:.0f} s reached with jobs still waiting")
                    break
                await asyncio.sleep(SAMPLE_S)  # the sampling clock
                now = self.now()
                ledger.sample(now - last, now)
                last = now
                if now - last_report >= 60:
                    last_report = now
                    _, gpus, waiting = ledger.timeline[-1]
                    self.say(f"  [{self.c.name}] replay {now:.0f} s: {ledger.started()}/{len(self.jobs)} jobs "
                             f"started, {gpus} GPUs allocated, {waiting} waiting, {ledger.preemptions} preemptions")
        finally:
            arrivals.cancel()
            watching.cancel()
            for task in self._tasks:
                task.cancel()
        return ReplayResult(self.c.name, len(self.jobs), self.factor, ledger.capacity // GPUS_PER_NODE, self.now(),
                            ledger.metrics(self.now()), ledger.timeline)


async def replay(contender: Contender, workdir: Path, trace: list[philly.TraceJob], vc_nodes: dict[str, int],
                 factor: float, nodes: int, say: Say) -> ReplayResult:
    """The jobs through one contender on control planes of its own (stopped at the end)."""
    planes = ControlPlanes(workdir, Shape(tenants=0, gpu_nodes=nodes, gpus_per_node=GPUS_PER_NODE), binaries.ensure())
    planes.prepare()
    await asyncio.to_thread(planes.start)
    cluster = philly.build_cluster(nodes, GPUS_PER_NODE, vc_nodes, {j.tenant for j in trace}, [])
    jobs = compress(trace, factor)
    api = await api_client(planes.kubeconfig(COMPUTE))
    try:
        rest = Rest(api)
        await contender.prepare(planes, rest)
        contender = contender.compressed(planes.dir, factor)
        component = await asyncio.to_thread(contender.start, planes)
        await contender.ready(rest)
        run = Replay(contender, jobs, cluster.queues, factor, nodes, api, say)
        await run.setup()
        span = jobs[-1].arrival if jobs else 0.0
        say(f"  [{contender.name}] replaying {len(jobs)} jobs over {span:.0f} s ({factor:g}× compressed) "
            f"on {nodes} nodes × {GPUS_PER_NODE} GPUs")
        result = await run.run(horizon_s=span * HORIZON + 300)
        await asyncio.to_thread(component.stop)
        return result
    finally:
        await api.close()
        await asyncio.to_thread(planes.stop)


def simulated(trace: list[philly.TraceJob], vc_nodes: dict[str, int], nodes: int) -> Obj:
    """The same jobs through ``ferry simulate philly``'s ferry and volcano presets."""
    out: Obj = {}
    for policy in ("ferry", "volcano"):
        m = philly.simulate(trace, vc_nodes, policy, nodes=nodes, gpus_per_node=GPUS_PER_NODE).metrics
        out[policy] = {k: m[k] for k in ("avg_wait_s", "p50_wait_s", "p99_wait_s", "gpu_utilization",
                                         "jain_fairness", "preemptions")}
    return out


def start_date(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)
