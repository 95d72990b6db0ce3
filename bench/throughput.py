"""Scheduling throughput and gang latency of one contender on fresh control planes (1,000 kwok nodes ×
8 GPUs by default), in two modes:

- **stream**: pods are created as fast as the machine takes them while the scheduler runs; pods/s is
  counted from the first create to the last bind, and *lag* is how far the last bind trails the last
  create (the apiserver caps creation on this machine, so lag is what tells schedulers apart here);
- **backlog**: the pods are created while the scheduler is stopped, then it starts; pods/s is counted
  from its first bind to its last (the scheduler's own rate, its API writes included).

Gang latency: from a gang's last member created to all its members bound (stream mode). CPU: the
scheduler process's user+system seconds over the measured window, per 1,000 pods.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench.contenders import Contender
from ferry import binaries
from ferry.cluster.planes import COMPUTE, ControlPlanes, Shape
from ferry.cluster.process import Component
from ferry.kube.rest import Rest, api_client
from scheduler.bench.service import BoundWatch

Obj = dict[str, Any]
Say = Callable[[str], None]
GANG = 8
CREATE_CONCURRENCY = 32
DELETE_BATCH = 250  # pods per delete-collection call: one call for 5,000 pods timed out (504) here


@dataclass
class Result:
    contender: str
    workload: str  # "single" or "gang"
    mode: str  # "stream" or "backlog"
    pods: int
    seconds: float
    pods_per_s: float
    lag_s: float | None
    p50_ms: float | None
    p99_ms: float | None
    cpu_s_per_1000: float

    def as_dict(self) -> Obj:
        return asdict(self)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def until(check: Callable[[], Awaitable[bool]] | Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        if time.monotonic() > end:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        await asyncio.sleep(0.2)  # between polls


class Run:
    """One contender on its own control planes."""

    def __init__(self, contender: Contender, planes: ControlPlanes, api: client.ApiClient, say: Say) -> None:
        self.c = contender
        self.planes = planes
        self.api = api
        self.core = client.CoreV1Api(api)
        self.rest = Rest(api)
        self.say = say
        self.sem = asyncio.Semaphore(CREATE_CONCURRENCY)
        self.component: Component | None = None

    async def start_scheduler(self) -> None:
        if self.component is None:
            self.component = await asyncio.to_thread(self.c.start, self.planes)
        else:
            await asyncio.to_thread(self.component.start)
            await asyncio.to_thread(self.component.wait_ready)
        await self.c.ready(self.rest)

    async def stop_scheduler(self) -> None:
        assert self.component is not None
        await asyncio.to_thread(self.component.stop)

    @property
    def pid(self) -> int:
        assert self.component is not None and self.component.proc is not None
        return self.component.proc.pid

    async def namespace(self, name: str) -> None:
        await self.core.create_namespace({"metadata": {"name": name}})

        async def has_sa() -> bool:
            sas = await self.core.list_namespaced_service_account(name)
            return any(sa.metadata.name == "default" for sa in sas.items)

        await until(has_sa, 60, f"ServiceAccount default in {name}")

    async def _create(self, url: str, body: Obj) -> None:
        async with self.sem:
            await self.rest.create(url, body)

    async def groups(self, ns: str, names: list[str], members: int) -> None:
        """The PodGroups the pods will need, created before the clock starts (as operators do)."""
        jobs = []
        for name in names:
            g = self.c.group(name, members)
            if g is not None:
                gv_plural, body = g
                group, version, plural = gv_plural.split("/")
                jobs.append(self._create(f"/apis/{group}/{version}/namespaces/{ns}/{plural}", body))
        await asyncio.gather(*jobs)

    def pod(self, name: str, group: str | None, batch: int) -> Obj:
        body = self.c.pod(name, group)
        body["metadata"].setdefault("labels", {})["bench-batch"] = str(batch)
        return body

    async def create_pods(self, ns: str, bodies: list[Obj]) -> None:
        await asyncio.gather(*(self._create(f"/api/v1/namespaces/{ns}/pods", b) for b in bodies))

    async def cleanup(self, ns: str, batches: int) -> None:
        for b in range(batches):
            await self.core.delete_collection_namespaced_pod(ns, label_selector=f"bench-batch={b}",
                                                             grace_period_seconds=0)

        async def empty() -> bool:
            return not (await self.core.list_namespaced_pod(ns, limit=1)).items

        await until(empty, 600, f"namespace {ns} emptied")

    # ------------------------------------------------------------------ workloads
    def _single_bodies(self, n: int) -> tuple[list[str], list[Obj]]:
        names = [f"p{i:05d}" for i in range(n)]
        return names, [self.pod(name, None, i // DELETE_BATCH) for i, name in enumerate(names)]

    def _gang_bodies(self, gangs: int) -> tuple[list[str], list[list[Obj]]]:
        names = [f"g{g:04d}" for g in range(gangs)]
        per = max(1, DELETE_BATCH // GANG)
        return names, [[self.pod(f"{name}-{i}", name, g // per) for i in range(GANG)] for g, name in enumerate(names)]

    async def singles_stream(self, n: int) -> Result:
        ns = "single-stream"
        await self.namespace(ns)
        names, bodies = self._single_bodies(n)
        await self.groups(ns, names, 1)
        watch = BoundWatch(self.api, ns)
        task = asyncio.create_task(watch.run())
        cpu0, t0 = cpu_seconds(self.pid), time.monotonic()
        await self.create_pods(ns, bodies)
        created = time.monotonic()
        await until(lambda: len(watch.bound) >= n, 1200, f"{n} pods bound")
        done = max(watch.bound.values())
        cpu = cpu_seconds(self.pid) - cpu0
        task.cancel()
        await self.cleanup(ns, -(-n // DELETE_BATCH))
        return Result(self.c.name, "single", "stream", n, done - t0, n / (done - t0), done - created, None, None,
                      cpu * 1000 / n)

    async def singles_backlog(self, n: int) -> Result:
        ns = "single-backlog"
        await self.namespace(ns)
        names, bodies = self._single_bodies(n)
        await self.stop_scheduler()
        await self.groups(ns, names, 1)
        await self.create_pods(ns, bodies)
        watch = BoundWatch(self.api, ns)
        task = asyncio.create_task(watch.run())
        await self.start_scheduler()
        cpu0 = cpu_seconds(self.pid)
        await until(lambda: len(watch.bound) >= n, 1200, f"{n} backlogged pods bound")
        first, last = min(watch.bound.values()), max(watch.bound.values())
        cpu = cpu_seconds(self.pid) - cpu0
        task.cancel()
        await self.cleanup(ns, -(-n // DELETE_BATCH))
        return Result(self.c.name, "single", "backlog", n, last - first, n / max(last - first, 1e-3), None, None,
                      None, cpu * 1000 / n)

    async def gangs_stream(self, gangs: int) -> Result:
        ns = "gang-stream"
        await self.namespace(ns)
        names, bodies = self._gang_bodies(gangs)
        await self.groups(ns, names, GANG)
        watch = BoundWatch(self.api, ns)
        task = asyncio.create_task(watch.run())
        complete: dict[str, float] = {}

        async def gang(name: str, members: list[Obj]) -> None:
            await self.create_pods(ns, members)
            complete[name] = time.monotonic()

        cpu0, t0 = cpu_seconds(self.pid), time.monotonic()
        await asyncio.gather(*(gang(name, b) for name, b in zip(names, bodies, strict=True)))
        created = time.monotonic()
        n = gangs * GANG
        await until(lambda: len(watch.bound) >= n, 1200, f"{gangs} gangs bound")
        done = max(watch.bound.values())
        cpu = cpu_seconds(self.pid) - cpu0
        lat = [max(watch.bound[f"{g}-{i}"] for i in range(GANG)) - complete[g] for g in names]
        task.cancel()
        await self.cleanup(ns, -(-gangs // max(1, DELETE_BATCH // GANG)))
        return Result(self.c.name, "gang", "stream", n, done - t0, n / (done - t0), done - created,
                      statistics.median(lat) * 1000, percentile(lat, 0.99) * 1000, cpu * 1000 / n)

    async def gangs_backlog(self, gangs: int) -> Result:
        ns = "gang-backlog"
        await self.namespace(ns)
        names, bodies = self._gang_bodies(gangs)
        await self.stop_scheduler()
        await self.groups(ns, names, GANG)
        await self.create_pods(ns, [b for members in bodies for b in members])
        watch = BoundWatch(self.api, ns)
        task = asyncio.create_task(watch.run())
        await self.start_scheduler()
        cpu0 = cpu_seconds(self.pid)
        n = gangs * GANG
        await until(lambda: len(watch.bound) >= n, 1200, f"{gangs} backlogged gangs bound")
        first, last = min(watch.bound.values()), max(watch.bound.values())
        cpu = cpu_seconds(self.pid) - cpu0
        task.cancel()
        await self.cleanup(ns, -(-gangs // max(1, DELETE_BATCH // GANG)))
        return Result(self.c.name, "gang", "backlog", n, last - first, n / max(last - first, 1e-3), None, None, None,
                      cpu * 1000 / n)


async def measure(contender: Contender, workdir: Path, nodes: int, pods: int, gangs: int, say: Say) -> list[Result]:
    """Every workload of one contender, on control planes of its own (stopped at the end)."""
    planes = ControlPlanes(workdir, Shape(tenants=0, gpu_nodes=nodes, gpus_per_node=8), binaries.ensure())
    planes.prepare()
    t0 = time.monotonic()
    await asyncio.to_thread(planes.start)
    say(f"  [{contender.name}] control planes with {nodes} kwok nodes ready in {time.monotonic() - t0:.0f} s")
    api = await api_client(planes.kubeconfig(COMPUTE))
    results: list[Result] = []
    try:
        run = Run(contender, planes, api, say)
        await contender.prepare(planes, run.rest)
        await run.start_scheduler()
        steps: list[tuple[str, Callable[[], Awaitable[Result]]]] = [
            ("single pods, stream", lambda: run.singles_stream(pods)),
            ("single pods, backlog", lambda: run.singles_backlog(pods))]
        if contender.gangs:
            steps += [("gangs of 8, stream", lambda: run.gangs_stream(gangs)),
                      ("gangs of 8, backlog", lambda: run.gangs_backlog(gangs))]
        for label, step in steps:
            r = await step()
            extra = f", lag {r.lag_s:.1f} s" if r.lag_s is not None else ""
            extra += f", gang p50 {r.p50_ms:.0f} ms p99 {r.p99_ms:.0f} ms" if r.p50_ms is not None else ""
            say(f"  [{contender.name}] {label}: {r.pods} pods, {r.pods_per_s:.0f} pods/s{extra}, "
                f"CPU {r.cpu_s_per_1000:.2f} s per 1,000 pods")
            results.append(r)
    finally:
        await api.close()
        await asyncio.to_thread(planes.stop)
    return results
