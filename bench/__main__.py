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

from bench import bridge, report
from bench.contenders import Contender, KubeFerry, KubeScheduler, Volcano
from bench.throughput import Result, measure
from ferry import binaries
from ferry.binaries import peers


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def contenders(only: list[str] | None) -> list[Contender]:
    chosen = set(only or ["kube-ferry", "volcano", "kube-scheduler"])
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
    parser.add_argument("--only", action="append", choices=("kube-ferry", "volcano", "kube-scheduler", "bridge"),
                        help="run only these parts (repeatable; default: all)")
    parser.add_argument("--bridge-pods", type=int, default=1000, help="pods per bridge-overhead phase (0: skip)")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    started = datetime.now(UTC)
    binaries.ensure(say)
    chosen = contenders(args.only)
    results: list[Result] = []
    t0 = time.monotonic()
    out = args.out / f"bench-{started:%Y%m%dT%H%M%SZ}"
    header = {"started": started.isoformat(timespec="seconds"), "nodes": args.nodes, "pods": args.pods,
              "gangs": args.gangs,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
              "contenders": [{"name": c.name, "version": c.version, "settings": c.settings} for c in chosen]}
    phases: list[bridge.Phase] = []
    for i, c in enumerate(chosen, 1):
        say(f"[{i}/{len(chosen)}] {c.name} {c.version} ({time.monotonic() - t0:.0f} s so far)")
        with tempfile.TemporaryDirectory(prefix=f"ferry-bench-{c.name}-") as tmp:
            results += asyncio.run(measure(c, Path(tmp), args.nodes, args.pods, args.gangs, say))
        report.write(out, header, results, phases)  # what is measured so far survives a later failure
    if args.bridge_pods and (not args.only or "bridge" in args.only):
        say(f"[bridge] through a tenant cluster and its vnode vs directly ({time.monotonic() - t0:.0f} s so far)")
        with tempfile.TemporaryDirectory(prefix="ferry-bench-bridge-") as tmp:
            phases = asyncio.run(bridge.measure(Path(tmp), args.bridge_pods, say, profiles=out / "profiles"))
    headline = report.write(out, header, results, phases)
    print(headline)
    say(f"report: {out / 'report.md'} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
