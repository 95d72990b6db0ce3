"""``make bench-philly``: ferry, strict gang FIFO and Volcano's default policy side by side on the
shared Philly trace (96 nodes x 8 GPUs), with a PNG per policy under ``--plots``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from scheduler.sim import philly
from scheduler.sim.traces import TRACES, Problems

KEYS = ("avg_wait_s", "p50_wait_s", "p99_wait_s", "max_wait_s", "avg_jct_s", "gpu_utilization", "jain_fairness",
        "preemptions", "wasted_gpu_s", "big_jobs_p99_wait_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path,
                        default=TRACES / "philly")
    parser.add_argument("--policies", default="fifo,volcano,ferry")
    parser.add_argument("--plots", type=Path, default=Path("build/plots"))
    args = parser.parse_args()
    problems = Problems([])
    jobs = philly.load_jobs(args.traces / "philly_2017-09_10.csv", problems)
    vc = philly.load_vc_nodes(args.traces / "philly_vc_nodes.csv", problems)
    args.plots.mkdir(parents=True, exist_ok=True)
    rows = []
    for policy in args.policies.split(","):
        t0 = time.monotonic()
        res = philly.simulate(jobs, vc, policy, progress=lambda s: print(f"  {s}", flush=True))
        wall = time.monotonic() - t0
        from scheduler.sim.plot import plot_philly

        plot_philly(res, args.plots / f"philly-{policy}.png")
        rows.append((policy, res.metrics, wall))
        print(f"{policy}: " + " ".join(f"{k}={res.metrics[k]}" for k in KEYS) + f" ({wall:.0f} s)", flush=True)
    print()
    print(f"{'metric':<20}" + "".join(f"{p:>12}" for p, _, _ in rows))
    for k in KEYS:
        print(f"{k:<20}" + "".join(f"{m[k]!s:>12}" for _, m, _ in rows))
    print(f"{'simulator wall s':<20}" + "".join(f"{w:>12.0f}" for _, _, w in rows))


if __name__ == "__main__":
    main()
