"""Overload (`make overload`): one tenant creates 5,000 GPU pods at once; another tenant's pods, submitted
at a steady pace meanwhile, must reach Running with a p99 create→Running within 2× of its unloaded value.

Run with ``python -m tests.overload [--flood 5000]``. Two tenants share 100 kwok nodes × 8 GPUs; the
flooding tenant's Queue may use at most half of them (its ``max``), so most of its flood waits in the
scheduler's queue and on its own vnode. The quiet tenant first submits its probe pods alone (the
unloaded figure), then again while the flood is being created and queued. Everything the tenants share
is measured: the compute apiserver, the scheduler's queues and cycles, and the machine's two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from bench.bridge import RunningWatch, cpu_by_component, submit
from bench.throughput import percentile, until
from ferry.cluster.planes import COMPUTE, ControlPlanes
from ferry.keys import API_GROUP, API_VERSION
from ferry.kube.rest import Rest, api_client, path
from tests.long_runs import parser, say, two_tenants, write_results

NS = "overload"
LOUD, QUIET = "tenant-1", "tenant-2"
MAX_RATIO = 2.0


@dataclass
class Probe:
    pods: int
    p50_ms: float
    p99_ms: float


async def probe(rest: Rest, n: int, rate: float, prefix: str) -> Probe:
    """``n`` bridged one-GPU pods at ``rate``/s; create call → the tenant pod seen Running."""
    watch = RunningWatch(rest, NS)
    task = asyncio.create_task(watch.informer.run())
    try:
        await watch.informer.synced.wait()
        sent = await submit(rest, NS, n, rate, True, prefix)
        await until(lambda: all(k in watch.running for k in sent), 600, f"{n} {prefix} pods Running")
        lat = [watch.running[k] - sent[k] for k in sent]
        return Probe(n, statistics.median(lat) * 1000, percentile(lat, 0.99) * 1000)
    finally:
        task.cancel()


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
        alone = await probe(quiet, args.probe, args.rate, "alone-")
        say(f"  alone: p50 {alone.p50_ms:.0f} ms, p99 {alone.p99_ms:.0f} ms")
        say(f"{LOUD}: {args.flood} pods at once; {QUIET}: {args.probe} pods at {args.rate:g}/s meanwhile")
        t0, cpu0 = time.monotonic(), cpu_by_component(planes)
        flood = asyncio.create_task(submit(loud, NS, args.flood, 0, True, "flood-"))
        loaded = await probe(quiet, args.probe, args.rate, "loaded-")
        flood_done = flood.done()
        await flood
        created_s = time.monotonic() - t0
        cpu1 = cpu_by_component(planes)
        busiest = sorted(((cpu1[n] - cpu0[n], n) for n in cpu1 if n in cpu0), reverse=True)
        flooded = (await loud.get(path("", "v1", "pods", NS)))["items"]
        running = sum(p.get("status", {}).get("phase") == "Running" for p in flooded)
        ratio = loaded.p99_ms / alone.p99_ms
        out = {"flood": args.flood, "flood_created_s": round(created_s, 1), "flood_running_at_end": running,
               "flood_still_arriving_when_probe_done": not flood_done, "gpu_nodes": args.gpu_nodes,
               "alone": asdict(alone), "loaded": asdict(loaded), "p99_ratio": round(ratio, 2),
               "cpu_s_during_flood": {n: round(c, 1) for c, n in busiest}}
        written = write_results(args, "overload", out)
        print("\n=== overload ===")
        print(f"{LOUD} created {args.flood} pods in {created_s:.0f} s; {running} of them Running when the probe "
              f"ended (its Queue's max: {total // 2} GPUs)")
        print(f"{QUIET} create→Running: alone p50 {alone.p50_ms:.0f} ms p99 {alone.p99_ms:.0f} ms; during the flood "
              f"p50 {loaded.p50_ms:.0f} ms p99 {loaded.p99_ms:.0f} ms → p99 ×{ratio:.2f} (target ≤ ×{MAX_RATIO:g})")
        print(f"CPU seconds while the flood was created ({created_s:.0f} s, 2 cores): "
              + ", ".join(f"{n} {c:.0f}" for c, n in busiest[:8]))
        print(f"written to {written}")
        ok = ratio <= MAX_RATIO
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        for a in apis:
            await a.close()


def main(argv: list[str] | None = None) -> int:
    p = parser("tests.overload", __doc__, gpu_nodes=100, workdir="/tmp/kube-ferry-overload")
    p.add_argument("--flood", type=int, default=5000, help="pods the loud tenant creates at once")
    p.add_argument("--probe", type=int, default=200, help="pods the quiet tenant submits in each phase")
    p.add_argument("--rate", type=float, default=4.0, help="the quiet tenant's pods per second")
    args = p.parse_args(argv)
    planes = two_tenants(args)
    planes.add_scheduler()
    for tenant in planes.tenant_names:
        planes.add_vnode(tenant)
    say("starting the control planes, the scheduler and two vnodes")
    planes.start()
    try:
        return asyncio.run(run(args, planes))
    finally:
        planes.stop()


if __name__ == "__main__":
    sys.exit(main())
