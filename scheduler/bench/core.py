"""``make bench-core``: how fast the scheduling core decides (figures, not a test).

1. one cycle over 1,000 nodes x 8 GPUs with 5,000 pending pods in 500 gangs of 10;
2. time per gang decision (gangs of 8 one-GPU pods) on 5,000 nodes x 8 GPUs;
3. 10,000 nodes x 8 GPUs holding 100,000 pods: the full cycle, a cycle with nothing new, one pod's delta
   applied to the long-lived model and the cycle after it, peak memory; then the same through the
   service's model (API objects in, :mod:`scheduler.bench.mirror`);
4. wall time of the ferry policy over the whole shared Philly trace (96 x 8 GPUs).
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from scheduler.core.decisions import Bind
from scheduler.core.model import Cluster, Device, Job, JobPhase, Node, Queue, ReplicaPhase, Request, Task
from scheduler.core.scheduler import Scheduler
from scheduler.sim.traces import TRACES


def _cluster(nodes: int, gpus: int = 8, queues: int = 4) -> Cluster:
    return Cluster(
        {f"n{i:05d}": Node(f"n{i:05d}", 128000, 1 << 20, [Device(d, group=d // 4) for d in range(gpus)],
                           domain=f"rack-{i // 16}") for i in range(nodes)},
        {f"q{i}": Queue(f"q{i}", guaranteed_gpu=nodes * gpus * 1000 // queues) for i in range(queues)},
    )


def _gang(name: str, queue: str, pods: int, t: float) -> Job:
    return Job(name, queue, [Task("worker", pods, Request(cpu_milli=4000, mem_mib=16384, gpus=1))], submit_time=t)


def bench_cycle(repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        c = _cluster(1000)
        s = Scheduler(c)
        for g in range(500):
            s.submit(_gang(f"g{g}", f"q{g % 4}", 10, float(g)))
        t0 = time.perf_counter()
        res = s.cycle(1000.0)
        times.append(time.perf_counter() - t0)
        assert res.placed_jobs == 500, res.placed_jobs
    return times


def bench_gang_decision(nodes: int, gangs: int) -> list[float]:
    c = _cluster(nodes)
    s = Scheduler(c)
    out = []
    for g in range(gangs):
        s.submit(_gang(f"g{g}", f"q{g % 4}", 8, float(g)))
        t0 = time.perf_counter()
        res = s.cycle(float(g))
        out.append(time.perf_counter() - t0)
        assert res.placed_jobs == 1
    return out


@dataclass
class LargeFigures:
    build_s: float
    first_cycle_s: float
    placed_pods: int
    steady_cycle_s: float  # a cycle after nothing changed
    delta_s: list[float]  # one pod's change applied to the model
    delta_cycle_s: list[float]  # the cycle that follows it
    rss_mib: float


def _large_gang(rng: random.Random, name: str, queue: str, t: float, share: bool) -> Job:
    size = min(64, max(1, int(rng.paretovariate(1.2))))
    req = Request(cpu_milli=2000, mem_mib=8192, gpus=1, gpu_milli=500 if share else 1000)
    return Job(name, queue, [Task("worker", size, req)], submit_time=t, min_member=size)


def bench_large(nodes: int = 10_000, running: int = 80_000, pending: int = 20_000, seed: int = 7) -> LargeFigures:
    """``nodes`` x 8 GPUs with ``running`` pods placed (gangs of 1-64; a quarter of them half-GPU shares, so
    about an eighth of the GPUs stay free) and ``pending`` more pods in gangs of 1-64: about half of them
    fit, the rest keep waiting (each later cycle considers them again)."""
    rng = random.Random(seed)
    c = _cluster(nodes)
    t0 = time.perf_counter()
    s = Scheduler(c)
    n, g = 0, 0
    while n < running:
        job = _large_gang(rng, f"r{g}", f"q{g % 4}", float(g), share=g % 4 == 3)
        s.submit(job)
        n += len(job.replicas)
        g += 1
    s.cycle(0.0)  # the running pods' placement (as a service finds them bound after a restart)
    n = 0
    while n < pending:
        job = _large_gang(rng, f"p{g}", f"q{g % 4}", 1.0 + g, share=False)
        s.submit(job)
        n += len(job.replicas)
        g += 1
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = s.cycle(100.0)
    first = time.perf_counter() - t0
    placed = len(res.of(Bind))
    t0 = time.perf_counter()
    s.cycle(101.0)
    steady = time.perf_counter() - t0
    deltas, cycles = [], []
    bound_jobs = [j for j in c.jobs.values() if j.phase is JobPhase.RUNNING]
    for i in range(50):  # a pod ends (its gang fails or finishes), a new one arrives
        job = bound_jobs[rng.randrange(len(bound_jobs))]
        replica = next((r for r in job.replicas if r.phase is ReplicaPhase.BOUND), None)
        t0 = time.perf_counter()
        if replica is not None:
            s.replica_done(job.name, replica.task, replica.index, ReplicaPhase.SUCCEEDED)
        s.submit(Job(f"d{i}", "q0", [Task("worker", 1, Request(cpu_milli=1000, mem_mib=1024, gpus=1))],
                     submit_time=200.0 + i))
        t1 = time.perf_counter()
        s.cycle(200.0 + i)
        deltas.append(t1 - t0)
        cycles.append(time.perf_counter() - t1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return LargeFigures(build, first, placed, steady, deltas, cycles, rss)


def bench_philly(path: Path, vc: Path) -> float:
    from scheduler.sim import philly
    from scheduler.sim.traces import Problems

    problems = Problems([])
    jobs = philly.load_jobs(path, problems)
    vcs = philly.load_vc_nodes(vc, problems)
    t0 = time.perf_counter()
    philly.simulate(jobs, vcs, "ferry", progress=lambda s: print(f"  {s}", flush=True))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--skip-philly", action="store_true")
    args = parser.parse_args()
    cyc = bench_cycle(3)
    print("cycle, 1,000 nodes x 8 GPUs, 5,000 pending pods in 500 gangs: "
          f"median {statistics.median(cyc) * 1000:.1f} ms "
          f"(min {min(cyc) * 1000:.1f}, max {max(cyc) * 1000:.1f}; target <= 200 ms)")
    gang = bench_gang_decision(5000, 300)
    gang.sort()
    print(f"gang decision (8 x 1 GPU) at 5,000 nodes x 8 GPUs: median {statistics.median(gang) * 1000:.2f} ms, "
          f"p99 {gang[int(len(gang) * 0.99) - 1] * 1000:.2f} ms (target <= 5 ms)")
    large = bench_large()
    print(f"10,000 nodes x 8 GPUs, 80,000 pods running, 20,000 pending in gangs of 1-64: model built in "
          f"{large.build_s:.1f} s; full cycle {large.first_cycle_s * 1000:.0f} ms ({large.placed_pods} pods placed; "
          f"target <= 1,000 ms); a cycle with nothing new {large.steady_cycle_s * 1000:.0f} ms; one pod's delta "
          f"applied to the model: median {statistics.median(large.delta_s) * 1000:.2f} ms, max "
          f"{max(large.delta_s) * 1000:.2f} ms (target <= 10 ms), the cycle after it median "
          f"{statistics.median(large.delta_cycle_s) * 1000:.0f} ms; peak RSS {large.rss_mib:.0f} MiB "
          "(target <= 2,048 MiB)", flush=True)
    from scheduler.bench.mirror import bench_mirror, report

    print(report(bench_mirror()), flush=True)
    if not args.skip_philly:
        philly_dir = args.traces / "philly"
        wall = bench_philly(philly_dir / "philly_2017-09_10.csv", philly_dir / "philly_vc_nodes.csv")
        print(f"simulator, whole shared Philly trace (52,849 jobs, 96 x 8 GPUs, policy ferry): {wall:.1f} s "
              "(target <= 120 s)")


if __name__ == "__main__":
    main()
