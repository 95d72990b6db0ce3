"""``make bench``: Kube-Ferry beside Volcano and kube-scheduler, one run, one report.

Builds what it needs (control planes, vc-scheduler), measures each contender on fresh control planes
with the same nodes and pods, writes ``results/bench-<time>/report.md`` with tables and PNG plots, and
prints the headline table. Long: about 40 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import bridge, replay, report
from bench.contenders import Contender, KubeFerry, KubeScheduler, Volcano
from bench.throughput import Result, measure
from ferry import binaries
from ferry.binaries import peers


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def contenders(only: list[str] | None) -> list[Contender]:
    chosen = set(only if only is not None else ["kube-ferry", "volcano", "kube-scheduler"])
    out: list[Contender] = []
    if "kube-ferry" in chosen:
        out.append(KubeFerry())
    if "volcano" in chosen:
        vc = peers.ensure_volcano(say)
        out.append(Volcano(vc.scheduler, vc.crds, peers.VOLCANO_VERSION))
    if "kube-scheduler" in chosen:
        out.append(KubeScheduler(binaries.KUBERNETES_VERSION))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--gangs", type=int, default=500)
    parser.add_argument("--only", action="append",
                        choices=("kube-ferry", "volcano", "kube-scheduler", "bridge", "replay"),
                        help="run only these parts (repeatable; default: all). 'replay' alone replays the trace "
                             "through Kube-Ferry and Volcano without the throughput runs")
    parser.add_argument("--replay-jobs", type=int, default=2000, help="trace replay: consecutive Philly jobs (0: skip)")
    parser.add_argument("--replay-start", type=replay.start_date, default=replay.start_date("2017-10-16"),
                        help="trace replay: the first job's day (UTC)")
    parser.add_argument("--replay-factor", type=float, default=240.0,
                        help="trace replay: arrival gaps and run times divided by this")
    parser.add_argument("--replay-nodes", type=int, default=40,
                        help="trace replay: kwok nodes × 8 GPUs (the default window never queues on 96)")
    parser.add_argument("--bridge-pods", type=int, default=1000, help="pods per bridge-overhead phase (0: skip)")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    started = datetime.now(UTC)
    binaries.ensure(say)
    names = ("kube-ferry", "volcano", "kube-scheduler")
    parts = set(args.only or (*names, "bridge", "replay"))
    measured = contenders([n for n in names if n in parts])
    replayed = contenders(["kube-ferry", "volcano"]) if "replay" in parts and args.replay_jobs else []
    results: list[Result] = []
    t0 = time.monotonic()
    out = args.out / f"bench-{started:%Y%m%dT%H%M%SZ}"
    header = {"started": started.isoformat(timespec="seconds"), "nodes": args.nodes, "pods": args.pods,
              "gangs": args.gangs, "replay_start": f"{args.replay_start:%Y-%m-%d}",
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
              "contenders": [{"name": c.name, "version": c.version, "settings": c.settings}
                             for c in {c.name: c for c in measured + replayed}.values()]}
    phases: list[bridge.Phase] = []
    for i, c in enumerate(measured, 1):
        say(f"[{i}/{len(measured)}] {c.name} {c.version} ({time.monotonic() - t0:.0f} s so far)")
        with tempfile.TemporaryDirectory(prefix=f"ferry-bench-{c.name}-") as tmp:
            results += asyncio.run(measure(c, Path(tmp), args.nodes, args.pods, args.gangs, say))
        report.write(out, header, results, phases)  # what is measured so far survives a later failure
    if args.bridge_pods and "bridge" in parts:
        say(f"[bridge] through a tenant cluster and its vnode vs directly ({time.monotonic() - t0:.0f} s so far)")
        with tempfile.TemporaryDirectory(prefix="ferry-bench-bridge-") as tmp:
            phases = asyncio.run(bridge.measure(Path(tmp), args.bridge_pods, say, profiles=out / "profiles"))
    replays: list[replay.ReplayResult] = []
    simulated: dict[str, Any] = {}
    if replayed:  # kube-scheduler has no queues or gangs to replay a multi-tenant trace with
        trace, vc_nodes = replay.trace_window(args.replay_start, args.replay_jobs)
        for c in replayed:
            say(f"[replay] {c.name}: {len(trace)} Philly jobs ({time.monotonic() - t0:.0f} s so far)")
            with tempfile.TemporaryDirectory(prefix=f"ferry-bench-replay-{c.name}-") as tmp:
                replays.append(asyncio.run(replay.replay(c, Path(tmp), trace, vc_nodes, args.replay_factor,
                                                         args.replay_nodes, say)))
            say(f"  [{c.name}] {replays[-1].metrics}")
            report.write(out, header, results, phases, replays)
        simulated = replay.simulated(trace, vc_nodes, args.replay_nodes)
    headline = report.write(out, header, results, phases, replays, simulated)
    print(headline)
    say(f"report: {out / 'report.md'} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
