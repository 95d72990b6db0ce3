"""``make bench-bridge``: how fast one vnode forwards pods, its latency at a steady load, its memory.

On fresh local control planes (compute: 100 kwok nodes; one tenant; the Kube-Ferry scheduler):
  1. throughput — 2,000 pods already bound to the virtual node wait while the vnode is stopped; it
     starts and forwards them: pods/s from the first compute pod created to the last, and to all Running;
  2. latency — pods created at a steady 50/s for 40 s through the tenant's own kube-scheduler:
     p50/p99 from the create call to the tenant pod observed Running;
  3. memory — the vnode's resident set with 10,000 pods on its node, all Running.
Targets (issue 5): ≥ 200 pods/s, p99 ≤ 1 s, ≤ 300 MB.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ferry import binaries
from ferry.cluster.planes import ControlPlanes, Shape
from ferry.kube.informer import Informer
from ferry.kube.rest import Rest, path
from vnode import naming

TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}
NODE = "ferry-tenant-1"


def pod(name: str, bound: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"tolerations": [TOLERATION], "automountServiceAccountToken": False,
                            "containers": [{"name": "c", "image": "app:1", "resources": {"requests": {"cpu": "1m"}}}]}
    if bound:
        spec["nodeName"] = NODE
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def say(msg: str) -> None:
    print(msg, flush=True)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def create(rest: Rest, ns: str, names: list[str], bound: bool, parallel: int = 48) -> None:
    sem = asyncio.Semaphore(parallel)
    url = path("", "v1", "pods", ns)

    async def one(n: str) -> None:
        async with sem:
            await rest.create(url, pod(n, bound))

    await asyncio.gather(*(one(n) for n in names))


class Watcher:
    """Times at which tenant pods were first seen Running and compute pods first seen at all."""

    def __init__(self, tenant: Rest, compute: Rest, ns: str) -> None:
        self.running: dict[str, float] = {}
        self.forwarded: dict[str, float] = {}
        self.tenant = Informer("bench-tenant", tenant.lister(path("", "v1", "pods", ns)), self._tenant)
        self.compute = Informer("bench-compute", compute.lister(path("", "v1", "pods", "tenant-1"),
                                                                labelSelector=f"{naming.UPSTREAM_NS_LABEL}={ns}"),
                                self._compute)

    def _tenant(self, _kind: str, obj: dict[str, Any]) -> None:
        if obj.get("status", {}).get("phase") == "Running":
            self.running.setdefault(obj["metadata"]["name"], time.monotonic())

    def _compute(self, _kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"].get("annotations", {}).get(naming.UPSTREAM_NAME_ANNOTATION, "")
        self.forwarded.setdefault(name, time.monotonic())

    async def until(self, what: str, done: Any, timeout: float) -> None:
        end = time.monotonic() + timeout
        last = -1
        while not done():
            if time.monotonic() > end:
                raise TimeoutError(f"{what}: not reached within {timeout:.0f} s")
            n = len(self.running)
            if n // 1000 != last // 1000:
                say(f"  … {n} pods Running")
                last = n
            await asyncio.sleep(0.05)


async def run_bench(planes: ControlPlanes) -> None:
    from kubernetes_asyncio import config

    tenant_api = await config.new_client_from_config(config_file=str(planes.kubeconfig("tenant-1")))
    compute_api = await config.new_client_from_config(config_file=str(planes.kubeconfig("compute")))
    tenant_api.configuration.connection_pool_maxsize = 64
    tenant, compute = Rest(tenant_api), Rest(compute_api)
    ns = "bench"
    await tenant.create(path("", "v1", "namespaces"), {"metadata": {"name": ns}})
    w = Watcher(tenant, compute, ns)
    tasks = [asyncio.create_task(w.tenant.run()), asyncio.create_task(w.compute.run())]
    await asyncio.gather(w.tenant.synced.wait(), w.compute.synced.wait())
    vnode = planes.components["tenant-1-vnode"]

    # 1. throughput
    n1 = 2000
    vnode.stop()
    await create(tenant, ns, [f"thr-{i:05d}" for i in range(n1)], bound=True)
    say(f"throughput: {n1} pods bound to {NODE} while its vnode was stopped; starting it")
    t_start = time.monotonic()
    vnode.start()
    await w.until("throughput pods Running", lambda: sum(k.startswith("thr-") for k in w.running) >= n1, 600)
    fwd = sorted(t for k, t in w.forwarded.items() if k.startswith("thr-"))
    run_last = max(t for k, t in w.running.items() if k.startswith("thr-"))
    fwd_rate = n1 / max(fwd[-1] - fwd[0], 1e-9)
    run_rate = n1 / max(run_last - fwd[0], 1e-9)
    say(f"  vnode start → first compute pod {fwd[0] - t_start:.1f} s; forwarded {fwd_rate:.0f} pods/s; "
        f"all Running upstream at {run_rate:.0f} pods/s (round trip incl. the compute scheduler)")

    # 2. latency at a steady 50 pods/s through the tenant's kube-scheduler
    rate, seconds = 50, 40
    sent: dict[str, float] = {}
    say(f"latency: {rate} pods/s for {seconds} s through the tenant kube-scheduler")
    t0 = time.monotonic()
    pending: list[asyncio.Task[Any]] = []
    for i in range(rate * seconds):
        target = t0 + i / rate
        delay = target - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        name = f"lat-{i:05d}"
        sent[name] = time.monotonic()
        pending.append(asyncio.create_task(tenant.create(path("", "v1", "pods", ns), pod(name, bound=False))))
    await asyncio.gather(*pending)
    await w.until("latency pods Running", lambda: all(k in w.running for k in sent), 300)
    lat = sorted(w.running[k] - sent[k] for k in sent)
    p50, p99 = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
    say(f"  creation → Running: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms "
        f"({len(lat)} pods)")

    # 3. memory with 10,000 pods on the node
    total = 10000
    have = n1 + rate * seconds
    await create(tenant, ns, [f"mem-{i:05d}" for i in range(total - have)], bound=True)
    await w.until("10,000 pods Running", lambda: len(w.running) >= total, 900)
    rss = rss_mb(vnode.pid or 0)
    say(f"memory: vnode resident {rss:.0f} MB with {total} pods on its node, all Running")
    say("")
    say("SUMMARY (targets: ≥ 200 pods/s, p99 ≤ 1000 ms, ≤ 300 MB)")
    say(f"  forwarded pods/s per vnode : {fwd_rate:.0f}   (to Running upstream: {run_rate:.0f})")
    say(f"  latency p50 / p99 at 50/s  : {p50 * 1000:.0f} ms / {p99 * 1000:.0f} ms")
    say(f"  vnode RSS at 10,000 pods   : {rss:.0f} MB")
    for t in tasks:
        t.cancel()
    await tenant_api.close()
    await compute_api.close()


def main() -> int:
    bins = binaries.ensure()
    with tempfile.TemporaryDirectory(prefix="ferry-bench-bridge-") as d:
        planes = ControlPlanes(Path(d), Shape(tenants=1, gpu_nodes=100, gpus_per_node=8), bins)
        planes.prepare()
        planes.add_scheduler(extra=("--period=0.2",))
        planes.add_vnode("tenant-1", extra=("--workers=32",))
        t0 = time.monotonic()
        planes.start()
        say(f"control planes + scheduler + vnode ready in {time.monotonic() - t0:.1f} s")
        try:
            asyncio.run(run_bench(planes))
        finally:
            planes.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
