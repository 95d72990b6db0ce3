"""Where replicas go: GPU binpacking with topology, all-or-nothing for gangs.

Nodes are indexed by how many whole GPUs they have free, per topology domain, so finding the
tightest node that fits is a few dictionary look-ups rather than a scan of the cluster. Placing a
gang tentatively binds each replica and rolls every one back if any does not fit: no partial gang
ever leaves :meth:`Placer.place_gang`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from scheduler.core.model import GPU_MILLI, Cluster, Job, Node, Replica, ReplicaPhase, Request


@dataclass(frozen=True, slots=True)
class Placement:
    replica: Replica
    node: str
    devices: tuple[int, ...]


class Placer:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.max_gpus = max((len(n.devices) for n in cluster.nodes.values()), default=0)
        # free whole GPUs -> domain -> nodes (dicts as ordered sets)
        self._buckets: list[dict[str, dict[str, None]]] = [{} for _ in range(self.max_gpus + 1)]
        self._where: dict[str, int] = {}
        self._partial: dict[str, None] = {}  # nodes with a partly used device (for GPU shares)
        self.domain_free: dict[str, int] = defaultdict(int)  # free whole GPUs per domain
        self._capacity: dict[str, int] = {}
        self.capacity = 0  # GPU milli of schedulable nodes
        # node -> the replicas bound there (dicts as ordered sets), to recount a node's use from scratch
        self.on_node: dict[str, dict[tuple[str, str, int], tuple[Job, Replica]]] = defaultdict(dict)
        for node in cluster.nodes.values():
            self._index(node)
        for job in cluster.jobs.values():  # a placer made anew for a model that has bindings
            for r in job.replicas:
                if r.phase is ReplicaPhase.BOUND and r.node is not None:
                    self.on_node[r.node][(job.name, r.task, r.index)] = (job, r)

    # ------------------------------------------------------------------ index
    def _index(self, node: Node) -> None:
        old = self._where.pop(node.name, None)
        if old is not None:
            bucket = self._buckets[old]
            names = bucket[node.domain]
            del names[node.name]
            if not names:
                del bucket[node.domain]
            self.domain_free[node.domain] -= old
        self._partial.pop(node.name, None)
        self.capacity -= self._capacity.pop(node.name, 0)
        if not node.schedulable:
            return
        self._capacity[node.name] = node.gpu_capacity
        self.capacity += node.gpu_capacity
        free = node.free_whole
        self._buckets[free].setdefault(node.domain, {})[node.name] = None
        self._where[node.name] = free
        self.domain_free[node.domain] += free
        if any(0 < d.free < GPU_MILLI for d in node.devices):
            self._partial[node.name] = None

    def refresh(self, names: Iterable[str]) -> None:
        for name in names:
            self._index(self.cluster.nodes[name])

    def recount(self, node: Node, charges: Iterable[Callable[[Node], None]] = ()) -> None:
        """A node's use from scratch: what ``charges`` hold there (pods the core does not place), then the
        replicas bound to it. For a node whose object or foreign pods changed."""
        node.used_cpu = node.used_mem = node.pods = 0
        for d in node.devices:
            d.free = GPU_MILLI
        for take in charges:
            take(node)
        for job, replica in self.on_node.get(node.name, {}).values():
            req = job.task_by_name[replica.task].request
            node.used_cpu += req.cpu_milli
            node.used_mem += req.mem_mib
            node.pods += 1
            for i in replica.devices:
                if i < len(node.devices):
                    node.devices[i].free -= req.gpu_milli
        self._index(node)

    def forget(self, name: str) -> None:
        """A node that is gone: out of the index (its replicas stay bound to the name, holding nothing)."""
        node = self.cluster.nodes.get(name)
        if node is not None:
            node.schedulable = False
            self._index(node)

    def max_free_whole(self) -> int:
        for free in range(self.max_gpus, -1, -1):
            if self._buckets[free]:
                return free
        return 0

    # ----------------------------------------------------------- accounting
    def bind(self, job: Job, replica: Replica, node_name: str, devices: tuple[int, ...], strict: bool = True) -> None:
        """Account a replica on a node. ``strict``: a decision, which must fit; otherwise a fact found in the
        cluster, recorded even where it over-commits a device (e.g. a preemptor bound while its victim's
        pods are still leaving): such a device simply has no room until one of them goes."""
        req = job.task_by_name[replica.task].request
        node = self.cluster.nodes[node_name]
        node.used_cpu += req.cpu_milli
        node.used_mem += req.mem_mib
        node.pods += 1
        for d in devices:
            node.devices[d].free -= req.gpu_milli
            if strict and node.devices[d].free < 0:
                raise AssertionError(f"GPU {d} of {node_name} over-committed by {job.name}")
        replica.phase, replica.node, replica.devices = ReplicaPhase.BOUND, node_name, devices
        self.on_node[node_name][(job.name, replica.task, replica.index)] = (job, replica)
        self.cluster.queues[job.queue].allocated_gpu += req.gpu_total
        job.allocated += req.gpu_total
        self._index(node)

    def release(self, job: Job, replica: Replica, phase: ReplicaPhase) -> None:
        if replica.phase is not ReplicaPhase.BOUND or replica.node is None:
            replica.phase = phase
            return
        req = job.task_by_name[replica.task].request
        self.on_node[replica.node].pop((job.name, replica.task, replica.index), None)
        node = self.cluster.nodes.get(replica.node)
        if node is not None:
            node.used_cpu -= req.cpu_milli
            node.used_mem -= req.mem_mib
            node.pods -= 1
            for d in replica.devices:
                node.devices[d].free += req.gpu_milli
            self._index(node)
        self.cluster.queues[job.queue].allocated_gpu -= req.gpu_total
        job.allocated -= req.gpu_total
        replica.phase, replica.node, replica.devices = phase, None, ()

    # ------------------------------------------------------------- searching
    def _fits_host(self, node: Node, req: Request, excluded: frozenset[str]) -> bool:
        return (
            node.schedulable
            and node.name not in excluded
            and node.free_cpu >= req.cpu_milli
            and node.free_mem >= req.mem_mib
            and node.pods < node.max_pods
            and (not req.models or node.model in req.models)
            and all(node.labels.get(k) == v for k, v in req.selector)
        )

    def _candidates(self, need: int, domain: str | None) -> Iterator[str]:
        """Nodes with at least ``need`` whole GPUs free, tightest first, ``domain`` first."""
        for free in range(need, self.max_gpus + 1):
            bucket = self._buckets[free]
            if not bucket:
                continue
            if domain is not None and domain in bucket:
                yield from bucket[domain]
            for dom, names in bucket.items():
                if dom != domain:
                    yield from names

    @staticmethod
    def pick_devices(node: Node, count: int) -> tuple[int, ...] | None:
        """``count`` whole free GPUs, inside one linked group when possible (the tightest such group)."""
        groups: dict[int, list[int]] = defaultdict(list)
        for d in node.devices:
            if d.free == GPU_MILLI:
                groups[d.group].append(d.index)
        fitting = [g for g in groups.values() if len(g) >= count]
        if fitting:
            return tuple(min(fitting, key=len)[:count])
        chosen: list[int] = []
        for g in sorted(groups.values(), key=len, reverse=True):  # fewest groups
            chosen.extend(g[: count - len(chosen)])
            if len(chosen) == count:
                return tuple(sorted(chosen))
        return None

    def find(self, req: Request, excluded: frozenset[str] = frozenset(),
             domain: str | None = None) -> tuple[str, tuple[int, ...]] | None:
        nodes = self.cluster.nodes
        if req.is_share:
            best: tuple[int, str, int] | None = None
            for name in self._partial:
                node = nodes[name]
                if not self._fits_host(node, req, excluded):
                    continue
                for d in node.devices:
                    if req.gpu_milli <= d.free < GPU_MILLI and (best is None or d.free < best[0]):
                        best = (d.free, name, d.index)
            if best is not None:
                return best[1], (best[2],)
            for name in self._candidates(1, domain):
                node = nodes[name]
                if self._fits_host(node, req, excluded):
                    tight = self.pick_devices(node, 1)
                    if tight is not None:
                        return name, tight
            return None
        fallback: tuple[str, tuple[int, ...]] | None = None
        for name in self._candidates(req.gpus, domain):
            node = nodes[name]
            if not self._fits_host(node, req, excluded):
                continue
            devices = self.pick_devices(node, req.gpus) if req.gpus else ()
            if devices is None:
                continue
            if req.gpus <= 1 or len({node.devices[d].group for d in devices}) == 1:
                return name, devices
            if fallback is None:
                fallback = (name, devices)
        return fallback

    def best_domain(self, gpus_needed: int) -> str | None:
        """The topology domain that fits the whole gang most tightly, else the one with the most room."""
        fits = [(free, dom) for dom, free in self.domain_free.items() if free >= gpus_needed]
        if fits:
            return min(fits)[1]
        return max(((free, dom) for dom, free in self.domain_free.items()), default=(0, None))[1]

    def place_gang(self, job: Job, replicas: list[Replica],
                   excluded: frozenset[str] = frozenset()) -> list[Placement] | None:
        """Bind all of ``replicas`` or none of them."""
        tasks = job.task_by_name
        order = sorted(replicas, key=lambda r: -tasks[r.task].request.gpu_total)
        whole = sum(tasks[r.task].request.gpus for r in replicas if not tasks[r.task].request.is_share)
        domain = self.best_domain(whole) if len(replicas) > 1 else None
        done: list[Placement] = []
        for replica in order:
            found = self.find(tasks[replica.task].request, excluded, domain)
            if found is None:
                for p in done:
                    self.release(job, p.replica, ReplicaPhase.PENDING)
                return None
            node, devices = found
            self.bind(job, replica, node, devices)
            if domain is None and len(replicas) > 1:
                domain = self.cluster.nodes[node].domain
            done.append(Placement(replica, node, devices))
        return done
