"""fragmentation (FGD, USENIX ATC'23): prefer the node a replica fragments least for the pods to come.

A node state's fragmentation is the GPU capacity the typical pods of the workload could not use
there (:mod:`scheduler.core.fragmentation`); a placement is scored by how much it lowers that,
in FGD's coarse buckets (a sigmoid of the decrease, in whole points). The typical pods are the
replicas of the jobs the scheduler holds (running and pending), re-read when a good part of them
changed, or the distribution a simulator sets (:meth:`Scheduler.expect`, FGD's method). Ties go,
for a replica restricted to some GPU models, to the best CPU-and-GPU fit (scarce models are packed);
for a replica without GPUs, to the node with the fewest free GPU milli (its CPU is taken where it
strands no GPU); then the next plugin, then the node's name (FGD's fixed node priority). A share
takes the device that fragments least.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scheduler.core.fragmentation import Shape, TypicalPods, node_frag
from scheduler.core.framework import Framework, Plugin, Session
from scheduler.core.model import GPU_MILLI, Request
from scheduler.core.nodeclasses import NodeState
from scheduler.core.placement import Option

REFRESH_SHARE = 0.125  # the typical pods are re-read once this share of the workload changed


def shape_of(req: Request) -> Shape:
    return (req.cpu_milli, req.gpu_milli if req.gpus else 0, req.gpus, tuple(sorted(req.models)))


class Fragmentation(Plugin):
    name = "fragmentation"

    def register(self, fw: Framework) -> None:
        self.fw = fw
        self._typical: TypicalPods | None = None
        self._models: dict[str, int] = {}
        self._frag: dict[NodeState, float] = {}
        self._built_at = -1  # the scheduler's workload change count when the typical pods were read
        self._built_size = 0
        self._replaced = 0  # the scheduler's workload_replaced when the typical pods were read
        self._cpu_norm = self._gpu_norm = 1.0
        fw.session_open.append((self.name, self.open))
        fw.ties_by_name = True
        fw.node_order.append((self.name, self.node_order))
        fw.device_order.append((self.name, self.device_order))

    # the expected workload -------------------------------------------------------
    def open(self, ssn: Session) -> None:
        changed = self.sched.workload_changes - self._built_at
        if (self._typical is None or self.sched.workload_replaced != self._replaced
                or changed > REFRESH_SHARE * max(self._built_size, 1)):
            self._build()

    def _build(self) -> None:
        sched = self.sched
        shapes: dict[Shape, int] = {}
        for req, n in sched.workload().items():
            if n > 0:
                shape = shape_of(req)
                shapes[shape] = shapes.get(shape, 0) + n
        nodes = [n for n in sched.cluster.nodes.values() if n.schedulable]
        for node in nodes:
            self._models.setdefault(node.model, len(self._models))
        self._cpu_norm = float(max((n.cpu_milli for n in nodes), default=1) or 1)
        self._gpu_norm = float(max((len(n.devices) for n in nodes), default=1) * GPU_MILLI or 1)
        self._typical = TypicalPods.from_shapes(shapes or {(0, GPU_MILLI, 1, ()): 1}, self._models)
        self._frag.clear()
        self._built_at, self._built_size = sched.workload_changes, sum(shapes.values())
        self._replaced = sched.workload_replaced
        self.fw.node_order_changed()

    def _fragmentation(self, states: Sequence[NodeState]) -> list[float]:
        """Each state's expected fragmented GPU milli, computed once per state (vectorised over new ones)."""
        if self._typical is None or any(s.model not in self._models for s in states):
            self._build()
        assert self._typical is not None
        todo = list({s for s in states if s not in self._frag})
        if todo and len(self._frag) > 1 << 16:  # states come and go; the typical pods may not change
            self._frag.clear()
            todo = list(set(states))
        if todo:
            width = max((len(s.frees) for s in todo), default=0)
            free = np.full((len(todo), width), -1, dtype=np.int64)
            for i, s in enumerate(todo):
                frees = s.frees
                free[i, : len(frees)] = frees
            cpu = np.array([s.cpu_free for s in todo], dtype=np.int64)
            model = np.array([self._models[s.model] for s in todo], dtype=np.int64)
            for s, f in zip(todo, node_frag(self._typical, cpu, free, model).tolist(), strict=True):
                self._frag[s] = f
        return [self._frag[s] for s in states]

    def _decrease(self, options: Sequence[Option]) -> list[float]:
        before = self._fragmentation([o.before for o in options])
        after = self._fragmentation([o.after for o in options])
        return [b - a for b, a in zip(before, after, strict=True)]

    # extension points -----------------------------------------------------------
    def device_order(self, req: Request, options: Sequence[Option]) -> list[tuple[float, ...]]:
        return [(d,) for d in self._decrease(options)]

    def node_order(self, req: Request, options: Sequence[Option]) -> list[tuple[float, ...]]:
        keys: list[tuple[float, ...]] = []
        for o, d in zip(options, self._decrease(options), strict=True):
            score = float(math.trunc(100.0 / (1.0 + math.exp(-d / 1000.0))))
            if req.models:
                fit = 1 - (o.after.cpu_free / self._cpu_norm * 0.5 + o.after.free_milli / self._gpu_norm * 0.5)
                keys.append((score, float(math.trunc(fit * 100))))
            elif not req.gpus:
                keys.append((score, -float(o.before.free_milli)))
            else:
                keys.append((score,))
        return keys
