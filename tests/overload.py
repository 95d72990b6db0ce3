"""Overload (`make overload`): one tenant creates 5,000 GPU pods at once; another tenant's pods, submitted
at a steady pace meanwhile, must reach Running with a p99 create→Running within 2× of its unloaded value.

Run with ``python -m tests.overload [--flood 5000]``. Two tenants share 100 kwok nodes × 8 GPUs; the
flooding tenant's Queue may use at most half of them (its ``max``), so most of its flood waits in the
scheduler's queue and on its own vnode. The quiet tenant first submits its probe pods alone (the
unloaded figure), then again while the flood is being created and queued. Everything the tenants share
is measured: the compute apiserver, the scheduler's queues and cycles, the bridges.

The flooding tenant's own control plane (its etcd, apiserver, kube-scheduler and controller-manager), its
vnode (a Deployment in its own cluster, ``manifests/tenant/vnode.yaml``) and the client creating its flood
stand for machines of that tenant's own: its etcd is its own, and they run in the kernel's idle class
(SCHED_IDLE), so on this two-core machine they use the CPU the parts the tenants share -- the compute
control plane, the Kube-Ferry scheduler, kwok -- and the quiet tenant's own parts leave idle, and give it
up the moment one of those wakes. Every request of the flooding vnode still reaches the shared compute
apiserver, and every pod the Kube-Ferry scheduler. ``--flooder-cpu nice`` runs them at nice 19 instead: a
task at nice 19 that the kernel has picked keeps the CPU for its slice, so a shared part that wakes
meanwhile waits; ``--flooder-cpu shared``: one etcd for all and one priority, which measures the machine
more than the system.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.bridge import cpu_by_component, submit
from bench.throughput import percentile, until
from ferry.cluster.planes import COMPUTE, ControlPlanes
from ferry.keys import API_GROUP, API_VERSION
from ferry.kube.informer import Informer
from ferry.kube.rest import Rest, api_client, path
from tests.long_runs import metrics_text, parser, samples, say, two_tenants, write_results
from vnode import naming

Obj = dict[str, Any]

NS = "overload"
LOUD, QUIET = "tenant-1", "tenant-2"
MAX_RATIO = 2.0


STAGES = ("tenant bound", "compute created", "compute bound", "compute Running", "tenant Running")


@dataclass
class Probe:
    pods: int
    p50_ms: float
    p99_ms: float
    stage_p99_ms: dict[str, float]  # time from the stage before (the create call for the first), p99
    slowest: list[dict[str, float]]  # the slowest pods: when sent (s into the phase) and each stage's time


class StageWatch:
    """When each probe pod passed each stage, as this process's watches of both clusters saw it: which
    of the shared parts (the tenant's kube-scheduler, the vnode, the Kube-Ferry scheduler, kwok and the
    status mirror) a slow pod waited in."""

    def __init__(self, tenant: Rest, compute: Rest, tenant_name: str) -> None:
        self.seen: dict[str, dict[str, float]] = {}
        self.informers = [
            Informer("probe-tenant", tenant.lister(path("", "v1", "pods", NS)), self._tenant),
            Informer("probe-compute", compute.lister(path("", "v1", "pods"),
                                                     labelSelector=f"{naming.TENANT_LABEL}={tenant_name}"),
                     self._compute)]

    def _mark(self, name: str | None, stage: str) -> None:
        if name:
            self.seen.setdefault(name, {}).setdefault(stage, time.monotonic())

    def _tenant(self, _kind: str, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        if pod.get("spec", {}).get("nodeName"):
            self._mark(name, "tenant bound")
        if pod.get("status", {}).get("phase") == "Running":
            self._mark(name, "tenant Running")

    def _compute(self, _kind: str, pod: Obj) -> None:
        name = pod["metadata"].get("annotations", {}).get(naming.UPSTREAM_NAME_ANNOTATION)
        self._mark(name, "compute created")
        if pod.get("spec", {}).get("nodeName"):
            self._mark(name, "compute bound")
        if pod.get("status", {}).get("phase") == "Running":
            self._mark(name, "compute Running")

    def gaps_ms(self, name: str, sent_at: float) -> dict[str, float]:
        """Each stage's time from the one before (the create call for the first)."""
        times = [sent_at, *(self.seen[name][st] for st in STAGES)]
        return {st: round((times[i + 1] - times[i]) * 1000, 1) for i, st in enumerate(STAGES)}

    def stage_p99_ms(self, sent: dict[str, float]) -> dict[str, float]:
        gaps = [self.gaps_ms(k, t) for k, t in sent.items()]
        return {st: round(percentile([g[st] for g in gaps], 0.99), 1) for st in STAGES}

    def slowest(self, sent: dict[str, float], n: int = 5) -> list[dict[str, float]]:
        start = min(sent.values())
        worst = sorted(sent, key=lambda k: sent[k] - self.seen[k]["tenant Running"])[:n]
        return [{"sent_s": round(sent[k] - start, 1), **self.gaps_ms(k, sent[k])} for k in worst]


async def probe(rest: Rest, compute: Rest, n: int, rate: float, prefix: str) -> Probe:
    """``n`` bridged one-GPU pods at ``rate``/s; create call → the tenant pod seen Running."""
    watch = StageWatch(rest, compute, QUIET)
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(i.run()) for i in watch.informers]
        try:
            for i in watch.informers:
                await i.synced.wait()
            sent = await submit(rest, NS, n, rate, True, prefix)
            await until(lambda: all(len(watch.seen.get(k, ())) == len(STAGES) for k in sent), 600,
                        f"{n} {prefix} pods Running")
        finally:
            for t in tasks:
                t.cancel()
    lat = [watch.seen[k]["tenant Running"] - sent[k] for k in sent]
    return Probe(n, statistics.median(lat) * 1000, percentile(lat, 0.99) * 1000, watch.stage_p99_ms(sent),
                 watch.slowest(sent))


async def run(args: argparse.Namespace, planes: ControlPlanes) -> int:
    apis = [await api_client(planes.kubeconfig(c), pool=200) for c in (COMPUTE, LOUD, QUIET)]
    compute, loud, quiet = (Rest(a) for a in apis)
    try:
        total = args.gpu_nodes * 8
        for tenant, spec in ((LOUD, {"guaranteed": {"gpu": "0"}, "max": {"gpu": str(total // 2)}}),
                             (QUIET, {"guaranteed": {"gpu": str(total // 2)}, "max": {"gpu": str(total)}})):
            await compute.patch(path(API_GROUP, API_VERSION, "queues", name=tenant), {"spec": spec})
        for rest in (loud, quiet):
            await rest.create(path("", "v1", "namespaces"), {"metadata": {"name": NS}})

            async def has_sa(rest: Rest = rest) -> bool:
                return await rest.get_or_none(path("", "v1", "serviceaccounts", NS, "default")) is not None

            await until(has_sa, 60, "ServiceAccount default")
        say(f"{QUIET}: {args.probe} pods at {args.rate:g}/s, alone")
        before = await scheduler_timing(planes)
        alone = await probe(quiet, compute, args.probe, args.rate, "alone-")
        timing_alone = _minus(await scheduler_timing(planes), before)
        say(f"  alone: p50 {alone.p50_ms:.0f} ms, p99 {alone.p99_ms:.0f} ms; by stage {alone.stage_p99_ms}")
        say(f"{LOUD}: {args.flood} pods at once; {QUIET}: {args.probe} pods at {args.rate:g}/s meanwhile")
        t0, cpu0, text0 = time.monotonic(), cpu_by_component(planes), await apiserver_metrics(compute)
        timing0 = await scheduler_timing(planes)
        flood = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.overload", "--flood-only", str(planes.kubeconfig(LOUD)),
            "--flood", str(args.flood),
            preexec_fn=None if args.flooder_cpu == "shared" else partial(_flood_process_setup, args.flooder_cpu))
        loaded = await probe(quiet, compute, args.probe, args.rate, "loaded-")
        flood_done = flood.returncode is not None
        if await flood.wait():
            raise RuntimeError("the flood's client failed")
        created_s = time.monotonic() - t0
        cpu1, text1 = cpu_by_component(planes), await apiserver_metrics(compute)
        timing = _minus(await scheduler_timing(planes), timing0)
        requests = _minus(requests_served(text1), requests_served(text0))
        served = sorted(((n, k) for k, n in requests.items()), reverse=True)
        waits = queueing(_minus(seat_waits(text1), seat_waits(text0)))
        busiest = sorted(((cpu1[n] - cpu0[n], n) for n in cpu1 if n in cpu0), reverse=True)
        flooded = (await loud.get(path("", "v1", "pods", NS)))["items"]
        running = sum(p.get("status", {}).get("phase") == "Running" for p in flooded)
        ratio = loaded.p99_ms / alone.p99_ms
        out = {"flood": args.flood, "flooder_cpu": args.flooder_cpu,
               "flood_created_s": round(created_s, 1), "flood_running_at_end": running,
               "flood_still_arriving_when_probe_done": not flood_done, "gpu_nodes": args.gpu_nodes,
               "alone": asdict(alone), "loaded": asdict(loaded), "p99_ratio": round(ratio, 2),
               "cpu_s_during_flood": {n: round(c, 1) for c, n in busiest},
               "compute_requests_during_flood": {k: int(n) for n, k in served if n},
               "compute_apf_queueing_during_flood": waits}
        written = write_results(args, "overload", out)
        print("\n=== overload ===")
        print(f"{LOUD} created {args.flood} pods in {created_s:.0f} s; {running} of them Running when the probe "
              f"ended (its Queue's max: {total // 2} GPUs)")
        print(f"{QUIET} create→Running: alone p50 {alone.p50_ms:.0f} ms p99 {alone.p99_ms:.0f} ms; during the flood "
              f"p50 {loaded.p50_ms:.0f} ms p99 {loaded.p99_ms:.0f} ms → p99 ×{ratio:.2f} (target ≤ ×{MAX_RATIO:g})")
        print("p99 by stage (ms, from the stage before): " + "; ".join(
            f"{st} {alone.stage_p99_ms[st]:.0f} → {loaded.stage_p99_ms[st]:.0f}" for st in STAGES))
        print("slowest during the flood (s into it: ms per stage): " + "; ".join(
            f"{w['sent_s']:.0f} s: " + "/".join(f"{w[st]:.0f}" for st in STAGES) for w in loaded.slowest))
        print(f"CPU seconds while the flood was created ({created_s:.0f} s, 2 cores): "
              + ", ".join(f"{n} {c:.0f}" for c, n in busiest[:8]))
        print("compute apiserver requests meanwhile: " + ", ".join(f"{k} {n:.0f}" for n, k in served[:8]))
        print("waiting for a seat (API Priority and Fairness) meanwhile: " + waits)
        for name, t in (("alone", timing_alone), ("during the flood", timing)):
            print(f"Kube-Ferry scheduler {name}: {t['cycle_count']:.0f} cycles, mean "
                  f"{1000 * t['cycle_sum'] / max(1, t['cycle_count']):.0f} ms; cycle start → bindings written, "
                  f"mean {1000 * t['attempt_sum'] / max(1, t['attempt_count']):.0f} ms")
        print(f"written to {written}")
        ok = ratio <= MAX_RATIO
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        for a in apis:
            await a.close()


async def apiserver_metrics(rest: Rest) -> str:
    """The compute apiserver's own Prometheus metrics."""
    resp = await rest.raw("GET", "/metrics")
    try:
        return str(await resp.text())
    finally:
        resp.release()


def requests_served(text: str) -> dict[str, float]:
    """The apiserver's requests so far by verb and resource: what the shared server spent its time on."""
    out: dict[str, float] = {}
    for s in samples(text, "apiserver_request_total"):
        what = f"{s.labels.get('verb')} {s.labels.get('resource')}" + (
            f"/{s.labels['subresource']}" if s.labels.get("subresource") else "")
        out[what] = out.get(what, 0.0) + s.value
    return out


def seat_waits(text: str) -> dict[str, float]:
    """API Priority and Fairness so far: seconds requests queued for a seat (``<schema> sum``) and how many
    requests (``<schema> count``), by FlowSchema."""
    out: dict[str, float] = {}
    for s in samples(text, "apiserver_flowcontrol_request_wait_duration_seconds_sum",
                     "apiserver_flowcontrol_request_wait_duration_seconds_count"):
        key = f"{s.labels.get('flow_schema')} {'sum' if s.name.endswith('_sum') else 'count'}"
        out[key] = out.get(key, 0.0) + s.value
    return out


def queueing(waits: dict[str, float]) -> str:
    """Each FlowSchema's requests in a window and their mean wait for a seat (from :func:`seat_waits`)."""
    parts = []
    for fs in sorted({k.rsplit(" ", 1)[0] for k in waits}):
        n = waits.get(f"{fs} count", 0.0)
        if n:
            parts.append(f"{fs} {n:.0f} requests, mean wait {1000 * waits[f'{fs} sum'] / n:.1f} ms")
    return "; ".join(parts)


def _minus(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


async def scheduler_timing(planes: ControlPlanes) -> dict[str, float]:
    """The Kube-Ferry scheduler's cycles and binding attempts so far: counts and summed seconds."""
    text = await metrics_text(planes.components["kube-ferry-scheduler"].spec.ports[0]) or ""
    series = {f"kube_ferry_scheduling_{what}_duration_seconds{part}": what + part
              for what in ("cycle", "attempt") for part in ("_sum", "_count")}
    return {series[s.name]: s.value for s in samples(text, *series)}


def lower_priority(planes: ControlPlanes, tenant: str, how: str) -> list[str]:
    """The tenant's own control plane and vnode to the lowest CPU priority (see the module's docstring);
    returns what was lowered."""
    mine = [n for n in planes.pids() if n.startswith(f"{tenant}-") or n == f"etcd-{tenant}"]
    for name in mine:
        _lowest(planes.pids()[name], how)
    return mine


def _lowest(pid: int, how: str) -> None:
    """Nice 19 for every thread of ``pid`` (Linux sets it thread by thread; threads made later inherit
    it), and the idle class too unless ``how`` is ``nice``; nice 19 for its autogroup: each component
    leads a session of its own, and with autogroup scheduling (the kernel's default) sessions share the
    CPU as equals whatever their threads' nice."""
    for thread in Path(f"/proc/{pid}/task").iterdir():
        os.setpriority(os.PRIO_PROCESS, int(thread.name), 19)
        if how == "idle":
            os.sched_setscheduler(int(thread.name), os.SCHED_IDLE, os.sched_param(0))
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():
        autogroup.write_text("19")


def _flood_process_setup(how: str) -> None:
    """The flood's client: a session of its own at the priority of the tenant's control plane."""
    os.setsid()
    _lowest(os.getpid(), how)


async def flood_only(kubeconfig: str, n: int) -> None:
    api = await api_client(Path(kubeconfig), pool=200)
    try:
        await submit(Rest(api), NS, n, 0, True, "flood-")
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> int:
    p = parser("tests.overload", __doc__, gpu_nodes=100, workdir="/tmp/kube-ferry-overload")
    p.add_argument("--flood", type=int, default=5000, help="pods the loud tenant creates at once")
    p.add_argument("--probe", type=int, default=200, help="pods the quiet tenant submits in each phase")
    p.add_argument("--rate", type=float, default=4.0, help="the quiet tenant's pods per second")
    p.add_argument("--flooder-cpu", choices=("idle", "nice", "shared"), default="idle",
                   help="the flooding tenant's control plane, vnode and client: in the idle class (as if on "
                        "machines of its own), at nice 19, or sharing one etcd and the CPU at normal priority")
    p.add_argument("--vnode-arg", action="append", default=[], help="an extra flag for both vnodes (repeatable)")
    p.add_argument("--flood-only", metavar="KUBECONFIG", help=argparse.SUPPRESS)  # the flood's own process
    args = p.parse_args(argv)
    if args.flood_only:
        asyncio.run(flood_only(args.flood_only, args.flood))
        return 0
    planes = two_tenants(args, own_etcd=() if args.flooder_cpu == "shared" else (LOUD,))
    planes.add_scheduler()
    for tenant in planes.tenant_names:
        planes.add_vnode(tenant, extra=tuple(args.vnode_arg))
    say("starting the control planes, the scheduler and two vnodes")
    planes.start()
    try:
        if args.flooder_cpu != "shared":
            lowered = lower_priority(planes, LOUD, args.flooder_cpu)
            say(f"{'in the idle class' if args.flooder_cpu == 'idle' else 'at nice 19'}, as if on {LOUD}'s own "
                f"machines: " + ", ".join(lowered))
        return asyncio.run(run(args, planes))
    finally:
        planes.stop()


if __name__ == "__main__":
    sys.exit(main())
