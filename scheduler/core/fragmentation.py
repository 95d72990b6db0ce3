"""GPU fragmentation of nodes, measured against the pods the cluster typically sees (FGD, ATC'23).

A node's fragmentation is the GPU capacity that the typical pods could not use there: all its free
GPU milli for a pod that does not fit at all (CPU, GPU count/size, model), else the free milli on
GPUs too small for that pod. Weighted by how common each pod shape is, its decrease tells how
well a placement preserves room for future pods. Vectorised with numpy: one array row per node (the
simulator's FGD baseline) or per node state (the ``fragmentation`` plugin), one column per GPU device
(-1 where a node has fewer devices).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
Shape = tuple[int, int, int, tuple[str, ...]]  # cpu milli, gpu milli per GPU, GPU count, accepted models


@dataclass(frozen=True)
class TypicalPods:
    cpu: IntArray
    milli: IntArray
    count: IntArray
    freq: FloatArray
    model_ok: BoolArray  # [typical pod, node model id]

    @classmethod
    def from_shapes(cls, shapes: Mapping[Shape, int], model_ids: Mapping[str, int],
                    coverage: float = 0.95) -> TypicalPods:
        """The most common shapes until they cover ``coverage`` of all pods, frequencies renormalised."""
        total = sum(shapes.values())
        chosen: list[tuple[Shape, int]] = []
        covered = 0
        for shape, n in sorted(shapes.items(), key=lambda kv: -kv[1]):
            chosen.append((shape, n))
            covered += n
            if covered >= coverage * total:
                break
        weight = sum(n for _, n in chosen)
        ok = np.ones((len(chosen), max(len(model_ids), 1)), dtype=bool)
        for i, ((_, _, _, spec), _) in enumerate(chosen):
            if spec:
                ok[i] = False
                for m in spec:
                    if m in model_ids:
                        ok[i, model_ids[m]] = True
        return cls(
            cpu=np.array([s[0] for s, _ in chosen], dtype=np.int64),
            milli=np.array([s[1] for s, _ in chosen], dtype=np.int64),
            count=np.array([s[2] for s, _ in chosen], dtype=np.int64),
            freq=np.array([n / weight for _, n in chosen], dtype=np.float64),
            model_ok=ok,
        )


def node_frag(tp: TypicalPods, cpu: IntArray, free: IntArray, model: IntArray) -> FloatArray:
    """Expected fragmented GPU milli of each row (node state), all typical pods at once."""
    present = free >= 0
    f = np.where(present, free, 0)
    total = f.sum(axis=1)
    maxf = f.max(axis=1) if f.shape[1] else np.zeros(len(f), dtype=np.int64)
    full = (free == 1000).sum(axis=1)
    k = tp.count[:, None]
    milli = tp.milli[:, None]
    fits = (cpu[None, :] >= tp.cpu[:, None]) & tp.model_ok[:, model]
    fits &= np.where(k == 1, maxf[None, :] >= milli, full[None, :] >= k)
    fits &= k > 0
    small = np.where(present[None, :, :] & (free[None, :, :] < milli[:, :, None]), f[None, :, :], 0).sum(axis=2)
    frag = np.where(fits, small, total[None, :])
    result: FloatArray = tp.freq @ frag
    return result


def frag_after_whole(tp: TypicalPods, cpu_after: IntArray, free: IntArray, model: IntArray, k: int) -> FloatArray:
    """Fragmentation after taking the ``k`` lowest-indexed fully free GPUs of each row."""
    after = free.copy()
    if k:
        take = (after == 1000) & (np.cumsum(after == 1000, axis=1) <= k)
        after[take] = 0
    return node_frag(tp, cpu_after, after, model)


def frag_after_share(tp: TypicalPods, cpu_after: IntArray, free: IntArray, model: IntArray,
                     milli: int) -> tuple[FloatArray, IntArray]:
    """For a GPU share of ``milli``: the best device of each row and the fragmentation after using it
    (ties between devices to the lowest index, as FGD's simulator does)."""
    rows, gpus = free.shape
    # Every (device, row) candidate as one row of a stacked state: [gpus * rows, gpus].
    after = np.repeat(free[None, :, :], gpus, axis=0)
    idx = np.arange(gpus)
    after[idx, :, idx] -= milli
    fits = (free >= milli).T  # [gpus, rows]
    frag = node_frag(tp, np.tile(cpu_after, gpus), after.reshape(gpus * rows, gpus), np.tile(model, gpus))
    frag = np.where(fits, frag.reshape(gpus, rows), np.inf)
    cand = (frag <= frag.min(axis=0)[None, :] + 1e-6) & fits  # within rounding of the least: a tie
    key = np.where(cand, idx[:, None], 10**9)
    best_gpu = key.argmin(axis=0)
    best: FloatArray = frag[best_gpu, np.arange(rows)]
    return best, best_gpu.astype(np.int64)
