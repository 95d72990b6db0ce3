"""The FGD (USENIX ATC'23) GPU-sharing allocation experiment on the Alibaba ``openb`` traces.

Reproduces the published method step by step (``shared/traces/openb/METHOD.md``): Go's math/rand
for pod order, 130 % inflation by cloning and node tie-break ranks; one pod at a time, never
leaving; the GPU allocation ratio logged after every pod and discretised to columns 0..130.

Policies: ``random``, ``bestfit``, ``gpupacking``, ``fgd`` (the published baselines, kept here to
validate the method against the published curves) and ``ferry``: the shipped scheduler's own
:class:`~scheduler.core.placement.Placer`, configured as a GPU-sharing cluster would configure the
service (the ``ferry`` preset with the ``fragmentation`` node order in place of ``binpack``), each pod
found and bound through it exactly as the service places a replica.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from scheduler.core.fragmentation import TypicalPods, frag_after_share, frag_after_whole, node_frag
from scheduler.core.model import Cluster, Device, Job, Node, Queue, Request, Task
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.sim.gorand import GoRand
from scheduler.sim.traces import Problems, load, parse_int

MAX_PODS_PER_NODE = 1001
INFLATION = 1.3
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class OpenbNode:
    sn: str
    cpu: int
    mem: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpu: int
    mem: int
    num_gpu: int
    gpu_milli: int
    spec: tuple[str, ...]

    @property
    def demand(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def shape(self) -> tuple[int, int, int, tuple[str, ...]]:
        return (self.cpu, self.gpu_milli, self.num_gpu, self.spec)


def _node(row: dict[str, str]) -> OpenbNode:
    sn = (row.get("sn") or "").strip()
    if not sn:
        raise ValueError("sn is missing")
    return OpenbNode(sn, parse_int(row, "cpu_milli", minimum=1), parse_int(row, "memory_mib", minimum=1),
                     parse_int(row, "gpu", maximum=64), (row.get("model") or "").strip())


def _pod(row: dict[str, str]) -> OpenbPod:
    name = (row.get("name") or "").strip()
    if not name:
        raise ValueError("name is missing")
    cpu = parse_int(row, "cpu_milli")
    mem = parse_int(row, "memory_mib")
    num_gpu = parse_int(row, "num_gpu", maximum=64)
    milli = min(parse_int(row, "gpu_milli"), 1000)
    if num_gpu == 0 or milli == 0:
        num_gpu, milli = 0, 0
    elif num_gpu > 1:
        milli = 1000
    spec = tuple(s for s in (row.get("gpu_spec") or "").split("|") if s)
    return OpenbPod(name, cpu, mem, num_gpu, milli, spec)


def load_nodes(path: Path, problems: Problems, strict: bool = False) -> list[OpenbNode]:
    nodes = load(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"), _node, problems, strict)
    return sorted((n for n in nodes if n.gpus > 0), key=lambda n: n.sn)


def load_pods(path: Path, problems: Problems, strict: bool = False) -> list[OpenbPod]:
    pods = load(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"), _pod, problems, strict)
    return sorted(pods, key=lambda p: p.name)


@dataclass
class Workload:
    pods: list[OpenbPod]
    ranks: list[int]
    rng: GoRand


def make_workload(pods: list[OpenbPod], nodes: list[OpenbNode], seed: int) -> Workload:
    """Seeded shuffle, inflation to 130 % of GPU capacity by cloning, node tie-break ranks."""
    rng = GoRand(seed)
    rng.int_()
    order = list(pods)
    rng.shuffle(order)
    capacity = sum(n.gpus for n in nodes) * 1000
    target = INFLATION * capacity
    total = sum(p.demand for p in order)
    if total < target:
        while total < target:
            clone = pods[rng.intn(len(pods))]
            if total + clone.gpu_milli > target:
                break
            order.append(clone)
            total += clone.demand
    else:
        while total > target:
            total -= order.pop(rng.intn(len(order))).demand
    for _ in range(10):
        rng.int63()
    ranks = rng.perm(len(nodes))
    return Workload(order, ranks, rng)


class ClusterArrays:
    """Free resources of every node as arrays, so policies can score all nodes at once."""

    def __init__(self, nodes: list[OpenbNode]) -> None:
        self.n = len(nodes)
        self.g = max((n.gpus for n in nodes), default=0)
        self.cpu = np.array([n.cpu for n in nodes], dtype=np.int64)
        self.mem = np.array([n.mem for n in nodes], dtype=np.int64)
        self.pods = np.zeros(self.n, dtype=np.int64)
        self.ngpu = np.array([n.gpus for n in nodes], dtype=np.int64)
        self.free: IntArray = np.full((self.n, self.g), -1, dtype=np.int64)  # -1: no such GPU
        for i, node in enumerate(nodes):
            self.free[i, : node.gpus] = 1000
        models = sorted({n.model for n in nodes})
        self.model_ids = {m: i for i, m in enumerate(models)}
        self.model = np.array([self.model_ids[n.model] for n in nodes], dtype=np.int64)
        self.maxfree = self.free.max(axis=1)
        self.full = (self.free == 1000).sum(axis=1)

    def model_mask(self, spec: tuple[str, ...]) -> npt.NDArray[np.bool_] | None:
        if not spec:
            return None
        ids = [self.model_ids[m] for m in spec if m in self.model_ids]
        return np.isin(self.model, ids)

    def feasible(self, pod: OpenbPod) -> IntArray:
        ok = (self.cpu >= pod.cpu) & (self.mem >= pod.mem) & (self.pods < MAX_PODS_PER_NODE)
        if pod.num_gpu:
            ok &= self.ngpu > 0
            mm = self.model_mask(pod.spec)
            if mm is not None:
                ok &= mm
            ok &= (self.maxfree >= pod.gpu_milli) if pod.num_gpu == 1 else (self.full >= pod.num_gpu)
        return np.flatnonzero(ok)

    def place(self, i: int, pod: OpenbPod, gpus: list[int]) -> None:
        self.cpu[i] -= pod.cpu
        self.mem[i] -= pod.mem
        self.pods[i] += 1
        for g in gpus:
            self.free[i, g] -= pod.gpu_milli
        self.maxfree[i] = self.free[i].max()
        self.full[i] = int((self.free[i] == 1000).sum())

    def lowest_free(self, i: int, k: int) -> list[int]:
        return [int(g) for g in np.flatnonzero(self.free[i] == 1000)[:k]]

    def tightest_fit(self, i: int, milli: int) -> int:
        row = self.free[i]
        fits = np.where(row >= milli, row, 10**9)
        return int(np.argmin(fits))  # lowest index among equals


Choice = tuple[int, list[int]]


class Policy(Protocol):
    name: str

    def choose(self, pod: OpenbPod, feasible: IntArray) -> Choice: ...

    def placed(self, node: int) -> None: ...


def _best(scores: npt.NDArray[np.float64] | IntArray, feasible: IntArray, ranks: IntArray) -> int:
    """Highest score; ties to the smallest rank (the simulator's fixed per-seed node priority)."""
    top = scores.max()
    tied = feasible[scores == top]
    return int(tied[np.argmin(ranks[tied])])


@dataclass
class _Base:
    c: ClusterArrays
    ranks: IntArray

    def device(self, i: int, pod: OpenbPod) -> list[int]:
        if pod.num_gpu == 0:
            return []
        if pod.num_gpu == 1 and pod.gpu_milli < 1000:
            return [self.c.tightest_fit(i, pod.gpu_milli)]
        return self.c.lowest_free(i, pod.num_gpu)

    def placed(self, node: int) -> None:
        return None


@dataclass
class BestFit(_Base):
    name: str = "bestfit"

    def choose(self, pod: OpenbPod, feasible: IntArray) -> Choice:
        c = self.c
        gfree = np.where(c.free[feasible] > 0, c.free[feasible], 0).sum(axis=1)
        raw = 1 - ((c.cpu[feasible] - pod.cpu) / 128000 * 0.5 + (gfree - pod.demand) / 8000 * 0.5)
        scores = np.trunc(raw * 100)
        i = _best(scores, feasible, self.ranks)
        return i, self.device(i, pod)


@dataclass
class GpuPacking(_Base):
    name: str = "gpupacking"

    def choose(self, pod: OpenbPod, feasible: IntArray) -> Choice:
        c = self.c
        if pod.num_gpu == 0:
            i = int(feasible[np.argmin(self.ranks[feasible])])
            return i, []
        ngpu = c.ngpu[feasible]
        all_free = c.full[feasible] == ngpu
        if pod.num_gpu > 1:
            part = np.full(len(feasible), max(50 - pod.num_gpu, 33))
        else:
            free = c.free[feasible]
            chosen = np.where(free >= pod.gpu_milli, free, 10**9).min(axis=1)
            part = np.where(chosen == 1000, 49, np.maximum(100 - (chosen * 100 // 1000) // 10, 50))
        scores = np.where(all_free, np.maximum(33 - ngpu, ngpu), part)
        i = _best(scores, feasible, self.ranks)
        return i, self.device(i, pod)


@dataclass
class RandomFit(_Base):
    rng: GoRand = field(default_factory=lambda: GoRand(1))
    name: str = "random"

    def choose(self, pod: OpenbPod, feasible: IntArray) -> Choice:
        i = int(feasible[self.rng.intn(len(feasible))])
        if pod.num_gpu == 1 and pod.gpu_milli < 1000:
            fits = np.flatnonzero(self.c.free[i] >= pod.gpu_milli)
            return i, [int(fits[self.rng.intn(len(fits))])]
        return i, self.device(i, pod)


class _Fragmentation(_Base):
    """FGD's scoring over node arrays (the published baseline): per-shape score caches invalidated per
    changed node."""

    def __init__(self, c: ClusterArrays, ranks: IntArray, typical: TypicalPods) -> None:
        super().__init__(c, ranks)
        self.typical = typical
        self.before = node_frag(typical, c.cpu, c.free, c.model)
        self._cache: dict[tuple[int, int, int, tuple[str, ...]], tuple[npt.NDArray[np.float64], IntArray,
                                                                      npt.NDArray[np.bool_]]] = {}

    def placed(self, node: int) -> None:
        c = self.c
        sl = slice(node, node + 1)
        self.before[node] = node_frag(self.typical, c.cpu[sl], c.free[sl], c.model[sl])[0]
        for _, _, valid in self._cache.values():
            valid[node] = False

    def _scores(self, pod: OpenbPod, feasible: IntArray) -> tuple[npt.NDArray[np.float64], IntArray]:
        """(fragmentation decrease, chosen GPU for a share) for the feasible nodes."""
        c = self.c
        entry = self._cache.get(pod.shape)
        if entry is None:
            entry = (np.zeros(c.n), np.zeros(c.n, dtype=np.int64), np.zeros(c.n, dtype=bool))
            self._cache[pod.shape] = entry
        delta, gpu, valid = entry
        todo = feasible[~valid[feasible]]
        if len(todo):
            cpu_after = c.cpu[todo] - pod.cpu
            if pod.num_gpu == 1 and pod.gpu_milli < 1000:
                after, best_gpu = frag_after_share(self.typical, cpu_after, c.free[todo], c.model[todo],
                                                   pod.gpu_milli)
                gpu[todo] = best_gpu
            else:
                after = frag_after_whole(self.typical, cpu_after, c.free[todo], c.model[todo], pod.num_gpu)
            delta[todo] = self.before[todo] - after
            valid[todo] = True
        return delta[feasible], gpu[feasible]

    def device(self, i: int, pod: OpenbPod) -> list[int]:
        if pod.num_gpu == 1 and pod.gpu_milli < 1000:
            return [int(self._cache[pod.shape][1][i])]
        return super().device(i, pod)


class Fgd(_Fragmentation):
    name = "fgd"

    def choose(self, pod: OpenbPod, feasible: IntArray) -> Choice:
        delta, _ = self._scores(pod, feasible)
        scores = np.trunc(100.0 / (1.0 + np.exp(-delta / 1000.0)))
        i = _best(scores, feasible, self.ranks)
        return i, self.device(i, pod)


def _core_cluster(nodes: list[OpenbNode], ranks: list[int]) -> Cluster:
    """The openb nodes as the core's model; named by their tie-break rank, so the Placer's name order is
    the simulator's fixed per-seed node priority."""
    width = len(str(len(nodes)))
    by_rank = sorted(range(len(nodes)), key=lambda i: ranks[i])
    return Cluster(
        {f"{ranks[i]:0{width}d}": Node(f"{ranks[i]:0{width}d}", nodes[i].cpu, nodes[i].mem,
                                        [Device(d) for d in range(nodes[i].gpus)], max_pods=MAX_PODS_PER_NODE,
                                        model=nodes[i].model)
         for i in by_rank},
        {"openb": Queue("openb")},
    )


_FERRY = SchedulerConfig.preset("ferry")
SHARING = SchedulerConfig.preset("ferry", plugins=tuple(
    "fragmentation" if p == "binpack" else p for p in _FERRY.plugins))  # the service configured for GPU sharing


def request_of(pod: OpenbPod) -> Request:
    return Request(cpu_milli=pod.cpu, mem_mib=pod.mem, gpus=pod.num_gpu,
                   gpu_milli=pod.gpu_milli if pod.num_gpu else 1000, models=frozenset(pod.spec))


def _run_core(nodes: list[OpenbNode], pods: list[OpenbPod], work: Workload) -> tuple[list[tuple[int, int]], int]:
    """Every pod of the workload through the shipped Placer, as the service places one replica."""
    sched = Scheduler(_core_cluster(nodes, work.ranks), SHARING)
    sched.expect(Counter(request_of(p) for p in pods))
    placer = sched.placer
    arrived = used = failed = 0
    log: list[tuple[int, int]] = []
    for i, pod in enumerate(work.pods):
        arrived += pod.demand
        req = request_of(pod)
        found = placer.find(req)
        if found is None:
            failed += 1
        else:
            job = Job(f"pod-{i}", "openb", [Task("pod", 1, req)])
            placer.bind(job, job.replicas[0], found[0], found[1])
            used += pod.demand
        log.append((arrived, used))
    return log, failed


POLICIES = ("random", "bestfit", "gpupacking", "fgd", "ferry")


@dataclass
class Result:
    policy: str
    seed: int
    pods: int
    failed: int
    arrived_milli: int
    used_milli: int
    capacity_milli: int
    curve: list[float | None]

    @property
    def gpu_allocation_ratio(self) -> float | None:
        return self.curve[-1]


def run(nodes: list[OpenbNode], pods: list[OpenbPod], policy: str, seed: int) -> Result:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if not nodes:
        raise ValueError("no GPU nodes")
    if not pods:
        raise ValueError("no pods")
    work = make_workload(pods, nodes, seed)
    capacity = sum(n.gpus for n in nodes) * 1000
    if policy == "ferry":
        core_log, core_failed = _run_core(nodes, pods, work)
        last = core_log[-1] if core_log else (0, 0)
        return Result(policy, seed, len(work.pods), core_failed, last[0], last[1], capacity,
                      discretise(core_log, capacity))
    c = ClusterArrays(nodes)
    ranks = np.array(work.ranks, dtype=np.int64)
    chooser: Policy
    if policy == "bestfit":
        chooser = BestFit(c, ranks)
    elif policy == "gpupacking":
        chooser = GpuPacking(c, ranks)
    elif policy == "random":
        chooser = RandomFit(c, ranks, rng=work.rng)
    else:
        chooser = Fgd(c, ranks, TypicalPods.from_shapes(Counter(p.shape for p in pods), c.model_ids))
    arrived = used = failed = 0
    log: list[tuple[int, int]] = []
    for pod in work.pods:
        arrived += pod.demand
        feasible = c.feasible(pod)
        if len(feasible):
            i, gpus = chooser.choose(pod, feasible)
            c.place(i, pod, gpus)
            chooser.placed(i)
            used += pod.demand
        else:
            failed += 1
        log.append((arrived, used))
    return Result(policy, seed, len(work.pods), failed, arrived, used, capacity, discretise(log, capacity))


def discretise(log: list[tuple[int, int]], capacity: int, columns: int = 131) -> list[float | None]:
    """Mean allocation % per arrived-% column, as the FGD analysis script does."""
    xs = [round(a / (capacity / 1000) / 10) for a, _ in log]
    ys = [round(u / (capacity / 1000) / 10, 2) for _, u in log]
    by_x: dict[int, list[float]] = {}
    for x, y in zip(xs, ys, strict=True):
        by_x.setdefault(x, []).append(y)
    out: list[float | None] = []
    for col in range(columns):
        vals = by_x.get(col)
        if not vals:
            vals = [y for k in (col - 1, col, col + 1) for y in by_x.get(k, [])]
        out.append(round(math.fsum(vals) / len(vals), 2) if vals else None)
    return out
