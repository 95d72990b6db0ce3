"""``make bench-synthetic``: the ferry preset beside the volcano preset on synthetic workloads
(:mod:`scheduler.sim.synthetic`), each judged by the checks of the Philly matrix (issue 11): avg and p99
wait at most the volcano preset's, utilisation at least its minus 0.5 point, Jain at least 0.95.

The workloads are drawn from seeds over ranges fixed before any replay; they are checks, not data to tune
on. The report gives every workload's figures and verdict, then per offered load how many pass each check
and the median ratio of ferry's waits to the volcano preset's."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from scheduler.bench.philly import Replay, cell_misses, replays
from scheduler.sim import synthetic

LOADS = (0.7, 0.9, 1.1)
CHECKS = ("avg", "p99", "util", "jain")


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def report(seeds: range, loads: tuple[float, ...], jobs: int, nodes: int, workers: int) -> list[str]:
    """Replay every (seed, load) workload under both presets and print each verdict, then the summary."""
    works = [synthetic.generate(seed, jobs, nodes, load) for seed in seeds for load in loads]
    calls = [Replay(w.jobs, w.vc_nodes, policy, nodes) for w in works for policy in ("ferry", "volcano")]
    done = replays(calls, workers)
    lines = [f"synthetic workloads: {len(seeds)} seeds x loads {', '.join(f'{x:g}' for x in loads)}, "
             f"{jobs} jobs on {nodes} x 8 GPUs; each: ferry | volcano avg/p99 wait s, util %, Jain"]
    print(lines[0], flush=True)
    by_load: dict[float, list[tuple[list[str], float | None, float | None]]] = {x: [] for x in loads}
    for w in works:
        (f, _), (v, _) = next(done), next(done)
        fm, vm = f.metrics, v.metrics
        misses = cell_misses(fm, vm)
        by_load[w.load].append((misses, _ratio(fm["avg_wait_s"], vm["avg_wait_s"]),
                                _ratio(fm["p99_wait_s"], vm["p99_wait_s"])))
        lines.append(f"  {w.describe()}\n    ferry {_cell(fm)} | volcano {_cell(vm)}  "
                     + ("ok" if not misses else "MISS " + ",".join(misses)))
        print(lines[-1], flush=True)
    lines.append("summary by offered load: workloads passing every check; passing each; median ferry/volcano "
                 "avg and p99 wait")
    for load, rows in by_load.items():
        each = ", ".join(f"{c} {sum(c not in m for m, _, _ in rows)}" for c in CHECKS)
        avg = [r for _, r, _ in rows if r is not None]
        p99 = [r for _, _, r in rows if r is not None]
        lines.append(f"  load {load:g}: {sum(not m for m, _, _ in rows)} of {len(rows)} ({each}); "
                     f"avg {_median(avg)}, p99 {_median(p99)}")
    for line in lines[-len(by_load) - 1:]:
        print(line, flush=True)
    return lines


def _cell(m: dict[str, Any]) -> str:
    return f"{m['avg_wait_s']} / {m['p99_wait_s']} / {m['gpu_utilization']} / {m['jain_fairness']}"


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x" if values else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=12, help="workloads per load (seeds 1..N)")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--loads", type=float, nargs="+", default=list(LOADS))
    ap.add_argument("--jobs", type=int, default=1500)
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    report(range(args.first_seed, args.first_seed + args.seeds), tuple(args.loads), args.jobs, args.nodes,
           args.workers)
    print(f"done in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
