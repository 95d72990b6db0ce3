"""``make bench-core``: how fast the scheduling core decides (figures, not a test).

1. one cycle over 1,000 nodes x 8 GPUs with 5,000 pending pods in 500 gangs of 10;
2. time per gang decision (gangs of 8 one-GPU pods) on 5,000 nodes x 8 GPUs;
3. wall time of the ferry policy over the whole shared Philly trace (96 x 8 GPUs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scheduler.core.model import Cluster, Device, Job, Node, Queue, Request, Task
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
    if not args.skip_philly:
        philly_dir = args.traces / "philly"
        wall = bench_philly(philly_dir / "philly_2017-09_10.csv", philly_dir / "philly_vc_nodes.csv")
        print(f"simulator, whole shared Philly trace (52,849 jobs, 96 x 8 GPUs, policy ferry): {wall:.1f} s "
              "(target <= 120 s)")


if __name__ == "__main__":
    main()
