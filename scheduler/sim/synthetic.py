"""Synthetic multi-tenant GPU workloads: traces no rule was shaped on.

The Philly trace is one cluster's two months. A policy shaped on it can win there and lose on a workload
of other tenants, sizes and burstiness, which is what a cluster we do not have will bring. This module
draws such workloads from a seed: how many tenants, their guarantees, how much each submits, the sizes and
run times of their jobs and how bursty their arrivals are all vary from seed to seed, over ranges fixed
once (below) and documented, never chosen by how a policy fared on them. The offered load is the one
parameter the caller picks: GPU-seconds asked over GPU-seconds the cluster has in the submission span.

A workload is a list of :class:`~scheduler.sim.philly.TraceJob` and a VC table (tenant -> guaranteed
nodes), so :func:`scheduler.sim.philly.simulate` replays it as it replays Philly.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from scheduler.sim.philly import TraceJob

# The ranges every workload is drawn from (fixed before any replay; see docs/results.md).
TENANTS = (3, 10)  # how many tenants
SIZES = (1, 2, 4, 8, 16, 32)  # GPUs a job may ask for
SIZE_DECAY = (0.1, 1.1)  # a tenant's P(size 2^(k+1)) / P(size 2^k): small = mostly 1-GPU jobs
MEDIAN_RUN_S = (60.0, 4 * 3600.0)  # a tenant's median run time (log-uniform)
RUN_SIGMA = (1.0, 2.2)  # spread of its run times (log-normal sigma): a heavy tail
MAX_RUN_S = 7 * 86400.0
BURST_JOBS = (1.0, 60.0)  # a tenant's mean jobs per burst (log-uniform): 1 = steady arrivals
BURST_GAP_S = 20.0  # mean gap between the jobs of one burst
NO_GUARANTEE = 0.3  # chance that one tenant has no guarantee and only borrows
PARETO_SHAPE = 1.2  # skew of guarantees and of demand across tenants


@dataclass(frozen=True)
class Workload:
    """One drawn workload: what it is, for the report, and what the replay needs."""

    seed: int
    load: float
    nodes: int
    jobs: list[TraceJob]
    vc_nodes: dict[str, int]  # tenant -> guaranteed nodes (tenants without one are absent)
    span_s: float  # submission span
    gpus_per_node: int = 8

    def describe(self) -> str:
        tenants = sorted({j.tenant for j in self.jobs})
        big = sum(1 for j in self.jobs if j.gpus > 8)
        one = sum(1 for j in self.jobs if j.gpus == 1)
        return (f"seed {self.seed}: {len(tenants)} tenants ({len(tenants) - len(self.vc_nodes)} without a guarantee), "
                f"{len(self.jobs)} jobs ({one} of 1 GPU, {big} above 8), {self.span_s / 86400:.1f} days, "
                f"offered load {self.load:.2f} of {self.nodes} x {self.gpus_per_node} GPUs")


def generate(seed: int, jobs: int, nodes: int, load: float, gpus_per_node: int = 8) -> Workload:
    """``jobs`` jobs of a workload drawn from ``seed``, submitted over the span that makes their GPU-seconds
    ``load`` times the capacity of ``nodes`` x ``gpus_per_node`` GPUs. The same arguments give the same
    workload; ``load`` only spreads the bursts over a longer or shorter span, so one seed's workloads at
    several loads hold the same jobs."""
    if jobs < 1 or nodes < 1 or load <= 0:
        raise ValueError(f"a workload needs jobs, nodes and a positive load, got {jobs}, {nodes}, {load:g}")
    rng = random.Random(seed)
    count = rng.randint(*TENANTS)
    names = [f"t{seed}-{i}" for i in range(count)]
    guarantee = {t: rng.paretovariate(PARETO_SHAPE) for t in names}
    if count > 1 and rng.random() < NO_GUARANTEE:
        del guarantee[names[-1]]
    total = sum(guarantee.values())
    vc_nodes = {t: max(1, round(nodes * g / total)) for t, g in guarantee.items()}
    demand = [rng.paretovariate(PARETO_SHAPE) for _ in names]  # independent of guarantees: some borrow
    largest = max(s for s in SIZES if s <= nodes * gpus_per_node // 2 or s == 1)
    sizes = [s for s in SIZES if s <= largest]
    profiles = []
    for _ in names:
        decay = rng.uniform(*SIZE_DECAY)
        weights = [decay ** k for k in range(len(sizes))]
        median = math.exp(rng.uniform(math.log(MEDIAN_RUN_S[0]), math.log(MEDIAN_RUN_S[1])))
        sigma = rng.uniform(*RUN_SIGMA)
        burst = math.exp(rng.uniform(math.log(BURST_JOBS[0]), math.log(BURST_JOBS[1])))
        profiles.append((sizes, weights, median, sigma, burst))
    drawn: list[tuple[int, int, float]] = []  # (tenant index, gpus, duration)
    for _ in range(jobs):
        i = rng.choices(range(count), weights=demand)[0]
        sizes, weights, median, sigma, _ = profiles[i]
        run = min(MAX_RUN_S, max(1.0, rng.lognormvariate(math.log(median), sigma)))
        drawn.append((i, rng.choices(sizes, weights=weights)[0], run))
    work = sum(g * d for _, g, d in drawn)
    span = work / (load * nodes * gpus_per_node)
    out: list[TraceJob] = []
    for i, name in enumerate(names):
        mine = [(g, d) for t, g, d in drawn if t == i]
        burst = profiles[i][4]
        k = 0
        while k < len(mine):  # bursts at uniform times over the span, their jobs close together
            size = max(1, min(len(mine) - k, round(rng.expovariate(1 / burst)) or 1))
            t = rng.uniform(0, span)
            for g, d in mine[k:k + size]:
                out.append(TraceJob(submit=round(t, 1), duration=round(d, 1), gpus=g, tenant=name))
                t += rng.expovariate(1 / BURST_GAP_S)
            k += size
    out.sort(key=lambda j: (j.submit, j.tenant))
    return Workload(seed, load, nodes, out, vc_nodes, span, gpus_per_node)
