"""A synthetic fragmented cluster, with and without consolidation (`make bench-consolidation`).

Many single-GPU jobs that run for hours and are movable (checkpointable), and 8-GPU gangs that need a
whole node: as the small jobs end at random, free GPUs are scattered over partly used nodes, and a gang
waits although the cluster has room in total. The same jobs (seeded) run through the ferry preset, through
the ferry preset with the ``consolidate`` action and with ``drain-holds`` (moves only for a gang that
holds nodes, off those nodes); printed per cluster size: the share of 8-GPU
gangs that waited more than an hour, their mean wait, how many jobs were moved and the GPU-seconds the
moves lost (work since the notice, redone after the move)."""

from __future__ import annotations

import argparse
import dataclasses
import random

from scheduler.core.scheduler import SchedulerConfig
from scheduler.sim import philly

HOUR = 3600.0


def workload(nodes: int, days: float, seed: int, load: float = 0.9) -> list[philly.TraceJob]:
    """Poisson arrivals at ``load`` of the cluster's GPUs: 1-GPU jobs (mean 10 h) carry 70 % of the GPU
    time, 8-GPU gangs (mean 2 h) the rest; run times exponential."""
    rng = random.Random(seed)
    gpus = nodes * 8
    small_mean, big_mean, small_share = 10 * HOUR, 2 * HOUR, 0.7
    small_rate = load * gpus * small_share / small_mean  # arrivals per second
    big_rate = load * gpus * (1 - small_share) / (8 * big_mean)
    jobs: list[philly.TraceJob] = []
    for rate, size, mean in ((small_rate, 1, small_mean), (big_rate, 8, big_mean)):
        t = 0.0
        while t < days * 86400:
            t += rng.expovariate(rate)
            jobs.append(philly.TraceJob(round(t), max(60.0, round(rng.expovariate(1 / mean))), size, "t"))
    return sorted(jobs, key=lambda j: j.submit)


def run(nodes: int, days: float, seed: int) -> dict[str, dict[str, float]]:
    jobs = workload(nodes, days, seed)
    out = {}
    base = SchedulerConfig.preset("ferry")
    for label, config in (("ferry", base),
                          *((f"ferry + {a}", dataclasses.replace(base, actions=(*base.actions, a)))
                            for a in ("consolidate", "drain-holds"))):
        res = philly.simulate(jobs, {"t": nodes}, "ferry", nodes=nodes, config=config,
                              movable=lambda j: j.gpus < 8)
        big = [w for w, j in zip(res.job_waits, jobs, strict=True) if j.gpus == 8]
        m = res.metrics
        out[label] = {"gangs": len(big), "over_1h_pct": round(100 * sum(w > HOUR for w in big) / len(big), 1),
                      "gang_avg_wait_s": round(sum(big) / len(big)), "moves": m["preemptions"],
                      "lost_gpu_s": m["wasted_gpu_s"], "avg_wait_s": m["avg_wait_s"],
                      "utilisation": m["gpu_utilization"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", default="24,32,48")
    parser.add_argument("--days", type=float, default=14)
    parser.add_argument("--seeds", default="1,2")
    args = parser.parse_args()
    print(f"{'nodes':>5} {'seed':>4} {'policy':<20} {'gangs':>6} {'>1h %':>6} {'gang avg s':>10} {'moves':>6} "
          f"{'lost GPU-s':>11} {'avg wait s':>10} {'util %':>7}")
    for n in (int(x) for x in args.nodes.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            for label, r in run(n, args.days, seed).items():
                print(f"{n:>5} {seed:>4} {label:<20} {r['gangs']:>6} {r['over_1h_pct']:>6} {r['gang_avg_wait_s']:>10} "
                      f"{r['moves']:>6} {r['lost_gpu_s']:>11} {r['avg_wait_s']:>10} {r['utilisation']!s:>7}",
                      flush=True)


if __name__ == "__main__":
    main()
