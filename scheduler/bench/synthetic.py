"""``make bench-synthetic``: the ferry preset beside the volcano preset on synthetic workloads
(:mod:`scheduler.sim.synthetic`), each judged by the checks of the Philly matrix (issue 11): avg and p99
wait at most the volcano preset's, utilisation at least its minus 0.5 point, Jain at least 0.95.

The workloads are drawn from seeds over ranges fixed before any replay; they are checks, not data to tune
on. The report gives every workload's figures and verdict, then per offered load how many pass each check
and the median ratio of ferry's waits to the volcano preset's. Each workload's waits are also split by
who waits: jobs of tenants that ask for no more than their guarantee, and of those that ask for more (the
borrowers), for a guarantee moves waiting from the first to the second."""

from __future__ import annotations

import argparse
import os
import statistics
import time

from scheduler.bench.philly import Replay, cell_misses, metric_text, policy_row, replays
from scheduler.sim import synthetic
from scheduler.sim.philly import PhillyResult

LOADS = (0.7, 0.9, 1.1)
CHECKS = ("avg", "p99", "util", "jain")


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def borrowers(w: synthetic.Workload) -> set[str]:
    """The tenants that ask for more than their guarantee: a larger share of the workload's GPU-seconds
    than of the guaranteed nodes (every tenant without a guarantee)."""
    work: dict[str, float] = {}
    for j in w.jobs:
        work[j.tenant] = work.get(j.tenant, 0.0) + j.gpus * j.duration
    total_work, total_vc = sum(work.values()) or 1.0, sum(w.vc_nodes.values()) or 1
    return {t for t, gs in work.items() if gs / total_work > w.vc_nodes.get(t, 0) / total_vc}


def split_waits(res: PhillyResult, beyond: set[str]) -> tuple[float | None, float | None]:
    """Average wait of the jobs of tenants within their guarantee, and of the borrowers' (None: no such job)."""
    within: list[float] = []
    borrowing: list[float] = []
    for tenant, waits in res.tenant_waits.items():
        (borrowing if tenant in beyond else within).extend(waits)
    return _mean(within), _mean(borrowing)


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 1) if values else None


def report(seeds: range, loads: tuple[float, ...], jobs: int, nodes: int, workers: int) -> list[str]:
    """Replay every (seed, load) workload under both presets and print each verdict, then the summary."""
    works = [synthetic.generate(seed, jobs, nodes, load) for seed in seeds for load in loads]
    calls = [Replay(w.jobs, w.vc_nodes, policy, nodes) for w in works for policy in ("ferry", "volcano")]
    done = replays(calls, workers)
    lines = [f"synthetic workloads: {len(seeds)} seeds x loads {', '.join(f'{x:g}' for x in loads)}, "
             f"{jobs} jobs on {nodes} x 8 GPUs; each: ferry | volcano avg/p99 wait s, util %, Jain"]
    print(lines[0], flush=True)
    # per load, per workload: the misses, then ferry/volcano ratios of avg, p99, within-guarantee and
    # borrowers' avg wait
    by_load: dict[float, list[tuple[list[str], list[float | None]]]] = {x: [] for x in loads}
    for w in works:
        (f, _), (v, _) = next(done), next(done)
        fm, vm = f.metrics, v.metrics
        misses = cell_misses(fm, vm)
        beyond = borrowers(w)
        (f_in, f_out), (v_in, v_out) = split_waits(f, beyond), split_waits(v, beyond)
        by_load[w.load].append((misses, [_ratio(fm["avg_wait_s"], vm["avg_wait_s"]),
                                         _ratio(fm["p99_wait_s"], vm["p99_wait_s"]),
                                         _ratio(f_in, v_in), _ratio(f_out, v_out)]))
        lines.append(f"  {w.describe()}\n    {policy_row({'ferry': fm, 'volcano': vm})}  "
                     + ("ok" if not misses else "MISS " + ",".join(misses))
                     + f"\n    avg wait within their guarantee {metric_text(f_in)} | {metric_text(v_in)} s; "
                     f"borrowers ({', '.join(sorted(beyond)) or 'none'}) {metric_text(f_out)} | {metric_text(v_out)} s")
        print(lines[-1], flush=True)
    lines.append("summary by offered load: workloads passing every check; passing each; median ferry/volcano "
                 "avg and p99 wait, and avg wait of the tenants within their guarantee and of the borrowers")
    for load, rows in by_load.items():
        each = ", ".join(f"{c} {sum(c not in m for m, _ in rows)}" for c in CHECKS)
        med = [_median([x for _, r in rows if (x := r[k]) is not None]) for k in range(4)]
        lines.append(f"  load {load:g}: {sum(not m for m, _ in rows)} of {len(rows)} ({each}); "
                     f"avg {med[0]}, p99 {med[1]}; within {med[2]}, borrowers {med[3]}")
    for line in lines[-len(by_load) - 1:]:
        print(line, flush=True)
    return lines


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
