"""Bridge overhead: the same pods submitted through a tenant cluster and its virtual node, or created
directly in the compute cluster, on one set of control planes (one tenant, kwok nodes with a GPU for
every pod, the Kube-Ferry scheduler and the tenant's vnode).

First the rate the machine sustains for direct submission is measured (a burst of pods created as fast
as the apiserver takes them, counted to the last one Running); then, at that rate, the same number of
pods go (a) directly and (b) through the bridge: pods/s from the first create to the last Running and
p50/p99 from each create call to the pod seen Running by its submitter (the tenant pod for the bridge).

A bridged pod crosses two control planes, and on a small machine they share its cores, so the direct
rate can be more than the machine can bridge whatever the vnode costs. So the rate the bridge sustains
is measured too (a burst through the tenant), and both paths are offered half of it: what the bridge
adds to a pod's latency when the machine is not the limit (at 90 % of it the two cores are still nearly
all busy, since a pod costs more CPU when fewer arrive together).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.profile import Profile, Sampler
from bench.throughput import cpu_seconds, percentile, until
from ferry import binaries
from ferry.cluster.planes import COMPUTE, ControlPlanes, Shape
from ferry.kube.informer import Informer
from ferry.kube.rest import Rest, api_client, path

Obj = dict[str, Any]
Say = Callable[[str], None]
TOLERATIONS = [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"},
               {"key": "kubeferry.io/overflow", "operator": "Exists"}]


@dataclass
class Phase:
    path: str  # "direct" or "bridge"
    rate: float  # offered pods/s (0: as fast as possible)
    pods: int
    pods_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_pod: dict[str, float]  # by component: where the machine's time went
    profiles: list[Profile] = field(default_factory=list)  # our processes, sampled (bridged phase)

    def as_dict(self) -> Obj:
        return asdict(self)


def cpu_by_component(planes: ControlPlanes) -> dict[str, float]:
    """CPU seconds each running component has used so far."""
    out: dict[str, float] = {}
    for name, pid in planes.pids().items():
        try:
            out[name] = cpu_seconds(pid)
        except OSError:
            continue
    return out


def _pod(name: str, bridged: bool) -> Obj:
    spec: Obj = {"restartPolicy": "Never", "automountServiceAccountToken": False,
                 "containers": [{"name": "c", "image": "app:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    if bridged:
        spec["tolerations"] = TOLERATIONS
    else:
        spec["schedulerName"] = "kube-ferry"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


class RunningWatch:
    def __init__(self, rest: Rest, ns: str) -> None:
        self.running: dict[str, float] = {}
        self.informer = Informer(f"bench-{ns}", rest.lister(path("", "v1", "pods", ns)), self._seen)

    def _seen(self, _kind: str, obj: Obj) -> None:
        if obj.get("status", {}).get("phase") == "Running":
            self.running.setdefault(obj["metadata"]["name"], time.monotonic())


async def submit(rest: Rest, ns: str, n: int, rate: float, bridged: bool, prefix: str) -> dict[str, float]:
    """Create ``n`` pods at ``rate`` per second (0: as fast as 32 concurrent calls go); return each
    pod's create-call time."""
    sem = asyncio.Semaphore(32 if rate <= 0 else 256)
    sent: dict[str, float] = {}
    t0 = time.monotonic()

    async def one(i: int) -> None:
        if rate > 0:
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))  # pacing to the offered rate
        name = f"{prefix}{i:05d}"
        async with sem:
            sent[name] = time.monotonic()
            await rest.create(path("", "v1", "pods", ns), _pod(name, bridged))

    await asyncio.gather(*(one(i) for i in range(n)))
    return sent


async def _phase(planes: ControlPlanes, rest: Rest, ns: str, n: int, rate: float, bridged: bool,
                 prefix: str, profiles: Path) -> Phase:
    watch = RunningWatch(rest, ns)
    task = asyncio.create_task(watch.informer.run())
    ours = {k: v for k, v in planes.pids().items() if k.endswith("-vnode") or k == "kube-ferry-scheduler"}
    sampler = Sampler(ours if bridged else {}, profiles)  # py-spy's collapsed stacks stay with the report
    try:
        await watch.informer.synced.wait()
        cpu0 = cpu_by_component(planes)
        with sampler:
            sent = await submit(rest, ns, n, rate, bridged, prefix)
            await until(lambda: all(k in watch.running for k in sent), 900, f"{n} pods Running")
        cpu1 = cpu_by_component(planes)
        lat = [watch.running[k] - sent[k] for k in sent]
        span = max(watch.running[k] for k in sent) - min(sent.values())
        cpu = {name: round((cpu1[name] - cpu0[name]) * 1000 / n, 1) for name in cpu1 if name in cpu0}
        return Phase("bridge" if bridged else "direct", rate, n, n / span, statistics.median(lat) * 1000,
                     percentile(lat, 0.99) * 1000, cpu, sampler.profiles)
    finally:
        task.cancel()


async def _clean(rest: Rest, ns: str) -> None:
    await rest.call("DELETE", path("", "v1", "pods", ns), query={"gracePeriodSeconds": 0})

    async def empty() -> bool:
        return not (await rest.get(path("", "v1", "pods", ns), limit=1))["items"]

    await until(empty, 600, f"{ns} emptied")


async def measure(workdir: Path, pods: int, say: Say, profiles: Path | None = None) -> list[Phase]:
    nodes = max(100, pods // 8 + 25)  # room for every pod of a phase (one GPU each)
    planes = ControlPlanes(workdir, Shape(tenants=1, gpu_nodes=nodes, gpus_per_node=8), binaries.ensure())
    planes.prepare()
    planes.add_scheduler()
    planes.add_vnode("tenant-1")
    t0 = time.monotonic()
    await asyncio.to_thread(planes.start)
    say(f"  [bridge] control planes (one tenant, its vnode, {nodes} kwok nodes) ready in {time.monotonic() - t0:.0f} s")
    compute_api = await api_client(planes.kubeconfig(COMPUTE))
    tenant_api = await api_client(planes.kubeconfig("tenant-1"), pool=200)
    compute, tenant = Rest(compute_api), Rest(tenant_api)
    out: list[Phase] = []
    try:
        for rest in (compute, tenant):
            await rest.create(path("", "v1", "namespaces"), {"metadata": {"name": "bench"}})

            async def has_sa(rest: Rest = rest) -> bool:
                return await rest.get_or_none(path("", "v1", "serviceaccounts", "bench", "default")) is not None

            await until(has_sa, 60, "ServiceAccount default")
        folder = profiles or workdir / "profiles"
        burst = await _phase(planes, compute, "bench", pods, 0, False, "burst-", folder)
        say(f"  [bridge] direct burst: {burst.pods_per_s:.0f} pods/s sustained to Running")
        out.append(burst)
        await _clean(compute, "bench")
        rate = max(1.0, round(burst.pods_per_s * 0.9))
        await _paced(planes, compute, tenant, pods, rate, folder, say, out)
        bridged_burst = await _phase(planes, tenant, "bench", pods, 0, True, "bb-", folder)
        say(f"  [bridge] bridged burst: {bridged_burst.pods_per_s:.0f} pods/s sustained to Running")
        out.append(bridged_burst)
        await _clean(tenant, "bench")
        await _clean(compute, "tenant-1")
        bridge_rate = max(1.0, round(bridged_burst.pods_per_s * 0.5))
        if bridge_rate < rate:
            await _paced(planes, compute, tenant, pods, bridge_rate, folder, say, out, "q-")
    finally:
        await compute_api.close()
        await tenant_api.close()
        await asyncio.to_thread(planes.stop)
    return out


async def _paced(planes: ControlPlanes, compute: Rest, tenant: Rest, pods: int, rate: float, folder: Path,
                 say: Say, out: list[Phase], prefix: str = "p-") -> None:
    """The same pods offered at ``rate``, directly and through the bridge."""
    for bridged, rest in ((False, compute), (True, tenant)):
        ph = await _phase(planes, rest, "bench", pods, rate, bridged, prefix, folder)
        say(f"  [bridge] {ph.path} at {rate:.0f} pods/s offered: {ph.pods_per_s:.0f} pods/s, create→Running "
            f"p50 {ph.p50_ms:.0f} ms p99 {ph.p99_ms:.0f} ms")
        out.append(ph)
        await _clean(rest, "bench")
        if bridged:
            await _clean(compute, "tenant-1")
