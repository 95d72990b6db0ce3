"""``make bench-bridge``: how fast one vnode forwards pods, its latency at a steady load, its memory.

On fresh local control planes (compute: 100 kwok nodes; one tenant; the Kube-Ferry scheduler):
  1. throughput — 2,000 pods already bound to the virtual node wait while the vnode is stopped; it
     starts and forwards them: pods/s from the first compute pod created to the last, (a) with the
     compute scheduler paused (the vnode's own rate: on a real installation the compute cluster's
     scheduler and nodes do not share its machine), then (b) with everything running, and to all Running;
  2. latency — pods created at a steady 50/s for 40 s through the tenant's own kube-scheduler:
     p50/p99 from the create call to the tenant pod observed Running;
  3. memory — the vnode's resident set with 10,000 pods on its node, all Running.
Targets (issue 5): ≥ 200 pods/s, p99 ≤ 1 s, ≤ 300 MB.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ferry import binaries
from ferry.cluster.planes import ControlPlanes, Shape
from ferry.kube.informer import Informer
from ferry.kube.rest import Rest, api_client, path
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


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def cpu_snapshot(planes: ControlPlanes) -> dict[str, float]:
    out = {name: cpu_s(pid) for name, pid in planes.pids().items()}
    out["bench (this process)"] = cpu_s(os.getpid())
    return out


async def writes(rest: Rest) -> dict[str, float]:
    """Mutating requests an apiserver has served, by verb/resource/subresource (from its /metrics)."""
    import re

    resp = await rest.raw("GET", "/metrics")
    async with resp:
        text = (await resp.read()).decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("verb") in ("POST", "PATCH", "PUT", "DELETE", "CREATE", "UPDATE", "APPLY"):
            sub = "/" + labels["subresource"] if labels.get("subresource") else ""
            key = f"{labels['verb']} {labels.get('resource', '')}{sub}"
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


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
        self.scheduled: dict[str, float] = {}  # tenant pod bound to the virtual node
        self.bound: dict[str, float] = {}  # compute pod bound by the Kube-Ferry scheduler
        self.started: dict[str, float] = {}  # compute pod Running
        self.tenant = Informer("bench-tenant", tenant.lister(path("", "v1", "pods", ns)), self._tenant)
        self.compute = Informer("bench-compute", compute.lister(path("", "v1", "pods", "tenant-1"),
                                                                labelSelector=f"{naming.UPSTREAM_NS_LABEL}={ns}"),
                                self._compute)

    def _tenant(self, _kind: str, obj: dict[str, Any]) -> None:
        if obj.get("spec", {}).get("nodeName"):
            self.scheduled.setdefault(obj["metadata"]["name"], time.monotonic())
        if obj.get("status", {}).get("phase") == "Running":
            self.running.setdefault(obj["metadata"]["name"], time.monotonic())

    def _compute(self, _kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"].get("annotations", {}).get(naming.UPSTREAM_NAME_ANNOTATION, "")
        now = time.monotonic()
        self.forwarded.setdefault(name, now)
        if obj.get("spec", {}).get("nodeName"):
            self.bound.setdefault(name, now)
        if obj.get("status", {}).get("phase") == "Running":
            self.started.setdefault(name, now)

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


async def run_bench(planes: ControlPlanes, n1: int, rate: int, seconds: int, total: int) -> None:
    tenant_api = await api_client(planes.kubeconfig("tenant-1"), pool=200)
    compute_api = await api_client(planes.kubeconfig("compute"))
    tenant, compute = Rest(tenant_api), Rest(compute_api)
    ns = "bench"
    await tenant.create(path("", "v1", "namespaces"), {"metadata": {"name": ns}})
    w = Watcher(tenant, compute, ns)
    tasks = [asyncio.create_task(w.tenant.run()), asyncio.create_task(w.compute.run())]
    await asyncio.gather(w.tenant.synced.wait(), w.compute.synced.wait())
    vnode = planes.components["tenant-1-vnode"]

    async def backlog(prefix: str) -> float:
        """``n1`` pods bound to the virtual node while its vnode is stopped, then the vnode starts."""
        vnode.stop()
        await create(tenant, ns, [f"{prefix}-{i:05d}" for i in range(n1)], bound=True)
        vnode.start()
        return time.monotonic()

    def forwarded(prefix: str) -> tuple[float, float]:
        """When the first of them reached the compute cluster, and pods/s from the first to the last."""
        fwd = sorted(t for k, t in w.forwarded.items() if k.startswith(prefix))
        return fwd[0], n1 / max(fwd[-1] - fwd[0], 1e-9)

    # 1a. forwarding alone: the compute scheduler paused, so the vnode shares the machine only with the
    # apiservers (on a real installation the compute cluster's scheduler and nodes run elsewhere)
    scheduler = planes.components["kube-ferry-scheduler"]
    scheduler.stop()
    say(f"forwarding: {n1} pods bound to {NODE} while its vnode is stopped; it starts, compute scheduler paused")
    t_start = await backlog("fwd")
    await w.until("pods forwarded", lambda: sum(k.startswith("fwd-") for k in w.forwarded) >= n1, 600)
    first, alone_rate = forwarded("fwd-")
    say(f"  vnode start → first compute pod {first - t_start:.1f} s; forwarded {alone_rate:.0f} pods/s")
    t_resume = time.monotonic()
    scheduler.start()
    await w.until("forwarded pods Running", lambda: sum(k.startswith("fwd-") for k in w.running) >= n1, 600)
    last = max(t for k, t in w.running.items() if k.startswith("fwd-"))
    say(f"  scheduler resumed: all bound, Running and mirrored upstream at {n1 / (last - t_resume):.0f} pods/s")

    # 1b. the same with everything running at once
    say(f"throughput: {n1} more pods while the vnode is stopped; it starts, everything running")
    t_start = await backlog("thr")
    await w.until("throughput pods Running", lambda: sum(k.startswith("thr-") for k in w.running) >= n1, 600)
    first, fwd_rate = forwarded("thr-")
    run_rate = n1 / max(max(t for k, t in w.running.items() if k.startswith("thr-")) - first, 1e-9)
    say(f"  vnode start → first compute pod {first - t_start:.1f} s; forwarded {fwd_rate:.0f} pods/s; "
        f"all Running upstream at {run_rate:.0f} pods/s (round trip incl. the compute scheduler)")

    # 2. latency at a steady 50 pods/s through the tenant's kube-scheduler
    sent: dict[str, float] = {}
    say(f"latency: {rate} pods/s for {seconds} s through the tenant kube-scheduler")
    cpu0 = cpu_snapshot(planes)
    w0 = {"tenant": await writes(tenant), "compute": await writes(compute)}
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
    cpu1 = cpu_snapshot(planes)
    wall = time.monotonic() - t0
    say(f"  CPU per pod by component over the latency phase ({wall:.0f} s wall, {len(sent)} pods):")
    ours = 0.0
    for name in sorted(cpu1, key=lambda n: cpu0.get(n, 0) - cpu1[n]):
        used = cpu1[name] - cpu0.get(name, cpu1[name])
        if name.endswith("-vnode") or name == "kube-ferry-scheduler":
            ours += used
        if used > 0.05:
            say(f"    {name:32s} {used * 1000 / len(sent):6.1f} ms/pod  ({100 * used / wall:5.1f} % of a core)")
    spent = sum(cpu1[n] - cpu0.get(n, cpu1[n]) for n in cpu1)
    cores = os.cpu_count() or 1
    rest_ms = (spent - ours) * 1000 / len(sent)
    ceiling = cores * 1000 / rest_ms if rest_ms > 0 else float("inf")
    say(f"  everything but the vnode and the scheduler (apiservers, etcd, kwok, kube-scheduler, controller "
        f"managers, this bench) costs {rest_ms:.1f} ms of CPU per pod: on this machine's {cores} cores it "
        f"alone caps the round trip at {ceiling:.0f} pods/s")
    for side, rest in (("tenant", tenant), ("compute", compute)):
        w1 = await writes(rest)
        per = {k: (v - w0[side].get(k, 0.0)) / len(sent) for k, v in w1.items()}
        say(f"  {side} apiserver writes per pod: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                            sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.05))
    lat = sorted(w.running[k] - sent[k] for k in sent)
    p50, p99 = statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]
    stages = (("bound to the virtual node", w.scheduled), ("forwarded", w.forwarded),
              ("bound in compute", w.bound), ("Running in compute", w.started))
    for what, stage in stages:
        d = sorted(stage[k] - sent[k] for k in sent if k in stage)
        say(f"  creation → {what}: p50 {statistics.median(d) * 1000:.0f} ms, "
            f"p99 {d[int(0.99 * (len(d) - 1))] * 1000:.0f} ms")
    say(f"  creation → Running: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms "
        f"({len(lat)} pods)")

    # 3. memory with 10,000 pods on the node
    have = 2 * n1 + rate * seconds
    await create(tenant, ns, [f"mem-{i:05d}" for i in range(total - have)], bound=True)
    await w.until("10,000 pods Running", lambda: len(w.running) >= total, 900)
    rss = rss_mb(vnode.pid or 0)
    say(f"memory: vnode resident {rss:.0f} MB with {total} pods on its node, all Running")
    say("")
    say(f"SUMMARY (targets: ≥ 200 pods/s, p99 ≤ 1000 ms at 50 pods/s, ≤ 300 MB; this run: {rate} pods/s)")
    say(f"  forwarded pods/s per vnode : {alone_rate:.0f}   (with the scheduler and kwok sharing the machine: "
        f"{fwd_rate:.0f}; to Running upstream: {run_rate:.0f})")
    say(f"  latency p50 / p99 at {rate}/s  : {p50 * 1000:.0f} ms / {p99 * 1000:.0f} ms")
    say(f"  vnode RSS at 10,000 pods   : {rss:.0f} MB")
    for t in tasks:
        t.cancel()
    await tenant_api.close()
    await compute_api.close()


def main() -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--throughput-pods", type=int, default=2000)
    p.add_argument("--latency-seconds", type=int, default=40)
    p.add_argument("--rate", type=int, default=50, help="pods/s of the latency phase")
    p.add_argument("--memory-pods", type=int, default=10000)
    args = p.parse_args()
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
            asyncio.run(run_bench(planes, args.throughput_pods, args.rate, args.latency_seconds,
                                  args.memory_pods))
        finally:
            planes.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
