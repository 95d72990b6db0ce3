"""Builders for scheduling-core tests."""

from __future__ import annotations

from scheduler.core.model import Cluster, Device, Job, Node, Queue, QueueRights, Request, Task, Tier
from scheduler.core.scheduler import PRESETS, Scheduler, SchedulerConfig

# the ferry preset's plugins without lend-holds: for tests of holds as such (drained held nodes stay empty)
NO_LOANS = tuple(p for p in PRESETS["ferry"]["plugins"] if p != "lend-holds")


def node(name: str, gpus: int = 8, domain: str = "rack-0", cpu: int = 64000, mem: int = 512 * 1024) -> Node:
    half = max(gpus // 2, 1)
    return Node(name, cpu, mem, [Device(i, group=i // half) for i in range(gpus)], domain=domain)


def cluster(nodes: list[Node], queues: list[Queue] | None = None) -> Cluster:
    qs = queues or [Queue("default")]
    return Cluster({n.name: n for n in nodes}, {q.name: q for q in qs})


def queue(name: str, guaranteed_gpus: float = 0, *, reclaim: bool = True, privileged: bool = False,
          preempt_own_elastic: bool = True, grace: float = 30.0, delay: float = 0.0,
          max_gpus: float | None = None) -> Queue:
    return Queue(name, guaranteed_gpu=int(guaranteed_gpus * 1000),
                 max_gpu=None if max_gpus is None else int(max_gpus * 1000),
                 rights=QueueRights(preempt_own_elastic=preempt_own_elastic, reclaim=reclaim, privileged=privileged),
                 victim_grace_s=grace, preemptor_delay_s=delay)


def gang(name: str, queue_name: str, pods: int, gpus: int = 1, *, tier: Tier = Tier.GUARANTEED, submit: float = 0.0,
         milli: int = 1000, elastic_max: int | None = None, min_member: int | None = None,
         priority: int = 0) -> Job:
    return Job(name, queue_name, [Task("worker", pods, Request(cpu_milli=1000, mem_mib=1024, gpus=gpus,
                                                                  gpu_milli=milli))],
               submit_time=submit, tier=tier, elastic_max=elastic_max, min_member=min_member, priority=priority)


def scheduler(c: Cluster, **cfg: object) -> Scheduler:
    """A scheduler without victim protection unless asked (the scenarios run seconds apart)."""
    cfg.setdefault("min_runtime_s", 0.0)
    return Scheduler(c, SchedulerConfig(**cfg))  # type: ignore[arg-type]


def passed_big_gang(plugins: tuple[str, ...]) -> tuple[Cluster, Scheduler]:
    """Three 8-GPU nodes, five 4-GPU jobs; at t=2 a gang of two 8-GPU pods waits and a 2-GPU job passes it
    (backfill), so from t=100 on it starves: holds come after reservation_after_s=100."""
    c = cluster([node("n1", 8), node("n2", 8), node("n3", 8)])
    s = scheduler(c, reservation_after_s=100.0, plugins=plugins)
    for i in range(5):
        s.submit(gang(f"small{i}", "default", 1, 4, submit=i))
    s.cycle(0)
    s.submit(gang("big", "default", 2, 8, submit=1))
    s.submit(gang("filler", "default", 1, 2, submit=2))
    s.cycle(2)
    return c, s
