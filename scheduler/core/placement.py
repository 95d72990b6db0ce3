"""Where replicas go: the best node by the configured node order, all-or-nothing for gangs.

Nodes are grouped by state (:mod:`scheduler.core.nodeclasses`); for each request shape the placer keeps
the states ranked by the node order (plugins at the ``node_order`` extension point: fragmentation,
binpack, ...), scoring a state once when it first appears. Finding a node walks that ranking from the
top and takes the first member that fits: a decision costs the number of distinct node states, not of
nodes. Placing a gang tentatively binds each replica and rolls every one back if any does not fit: no
partial gang ever leaves :meth:`Placer.place_gang`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.core.hierarchy import lineage
from scheduler.core.model import (
    GPU_MILLI,
    HOSTNAME_KEY,
    Cluster,
    Gather,
    Job,
    Node,
    PeerTerm,
    PodTerm,
    Replica,
    ReplicaPhase,
    Request,
    Spread,
    Together,
)
from scheduler.core.nodeclasses import ClassIndex, Filing, Members, NodeState


@dataclass(frozen=True, slots=True)
class Placement:
    replica: Replica
    node: str
    devices: tuple[int, ...]
    before: Filing | None = field(default=None, compare=False)  # the node's filing before this bind: its undo


MAX_RANKINGS = 4096  # request shapes whose rankings are kept; past that they are ranked anew when asked
TOGETHER_TRIALS = 16  # domains a gang that keeps together is tried in per attempt (each trial is a placement)


@dataclass(frozen=True, slots=True)
class Option:
    """One way to place a request on a node in state ``before``: the state it leaves, and for a GPU share
    the free milli of the device it takes (-1 for whole GPUs)."""

    before: NodeState
    after: NodeState
    device_free: int = -1


class NodeOrder(Protocol):
    """What ranks candidate nodes: keys compared highest first (node order), the device a share takes
    inside a node (device order), and a version that changes when earlier keys no longer hold."""

    @property
    def node_order_version(self) -> int: ...

    @property
    def settled_ties(self) -> bool:
        """Ties among equal nodes by packing (domain, then node settled longest), or by name alone."""
        ...

    def node_keys(self, req: Request, options: Sequence[Option]) -> list[tuple[float, ...]]: ...

    def device_keys(self, req: Request, options: Sequence[Option]) -> list[tuple[float, ...]]: ...


def tightest_fit(req: Request, options: Sequence[Option]) -> list[tuple[float, ...]]:
    """Binpack: a share on the fullest device that fits, then the node with the fewest free whole GPUs."""
    return [(-float(o.device_free) if req.is_share else 0.0, -float(o.before.full)) for o in options]


class TightestFit:
    """The node order when no plugin sets one."""

    node_order_version = 0
    settled_ties = True

    def node_keys(self, req: Request, options: Sequence[Option]) -> list[tuple[float, ...]]:
        return tightest_fit(req, options)

    def device_keys(self, req: Request, options: Sequence[Option]) -> list[tuple[float, ...]]:
        return [() for _ in options]


@dataclass(slots=True)
class _Ranking:
    """One request shape's candidate states, best first: (negated key, class, device free)."""

    version: int
    epoch: int
    seen: int = 0
    entries: list[tuple[tuple[float, ...], int, int]] = field(default_factory=list)


class Placer:
    def __init__(self, cluster: Cluster, order: NodeOrder | None = None) -> None:
        self.cluster = cluster
        self.order: NodeOrder = order or TightestFit()
        self.classes = ClassIndex(self.order.settled_ties)
        self._rankings: dict[Request, _Ranking] = {}
        self._where: dict[str, tuple[int, str]] = {}  # node -> its free whole GPUs, its domain
        self._whole: list[int] = [0]  # schedulable nodes by how many whole GPUs they have free
        self.domain_free: dict[str, int] = defaultdict(int)  # free whole GPUs per domain
        self._capacity: dict[str, int] = {}
        self.capacity = 0  # GPU milli of schedulable nodes
        # node -> the replicas bound there (dicts as ordered sets), to recount a node's use from scratch
        self.on_node: dict[str, dict[tuple[str, str, int], tuple[Job, Replica]]] = defaultdict(dict)
        # the bound replicas whose pod anti-affinity reaches other jobs' pods: every placement looks at them
        self._avoiders: dict[tuple[str, str, int], tuple[Job, Replica]] = {}
        # binds and releases, all and per job that spreads: other jobs' pods a spread counts are recounted only
        # after one of theirs
        self._moves = 0
        self._moves_of: defaultdict[str, int] = defaultdict(int)
        self._peer_counts: dict[tuple[str, str], tuple[int, dict[str, int]]] = {}
        for node in cluster.nodes.values():
            self._index(node)
        for job in cluster.jobs.values():  # a placer made anew for a model that has bindings
            for r in job.replicas:
                if r.phase is ReplicaPhase.BOUND and r.node is not None:
                    self.on_node[r.node][(job.name, r.task, r.index)] = (job, r)
                    if job.task_by_name[r.task].request.avoid:
                        self._avoiders[(job.name, r.task, r.index)] = (job, r)

    # ------------------------------------------------------------------ index
    def _index(self, node: Node) -> None:
        old = self._where.pop(node.name, None)
        if old is not None:
            self._whole[old[0]] -= 1
            self.domain_free[old[1]] -= old[0]
        self.capacity -= self._capacity.pop(node.name, 0)
        cls = self.classes.place(node)
        if cls is None:
            return
        capacity = len(node.devices) * GPU_MILLI
        self._capacity[node.name] = capacity
        self.capacity += capacity
        free = cls.full
        self._where[node.name] = (free, node.domain)
        while len(self._whole) <= free:
            self._whole.append(0)
        self._whole[free] += 1
        self.domain_free[node.domain] += free

    def reorder(self, order: NodeOrder) -> None:
        """A new node order (a reloaded configuration); the index is rebuilt if its tie order changed."""
        self.order = order
        if self.classes.settled != order.settled_ties:
            self.classes = ClassIndex(order.settled_ties)
            self._rankings.clear()
            for node in sorted(self.cluster.nodes.values(), key=lambda n: n.name):
                self.classes.place(node)

    def refresh(self, names: Iterable[str]) -> None:
        for name in names:
            self._index(self.cluster.nodes[name])

    def recount(self, node: Node, charges: Iterable[Callable[[Node], None]] = ()) -> None:
        """A node's use from scratch: what ``charges`` hold there (pods the core does not place), then the
        replicas bound to it. For a node whose object or foreign pods changed."""
        self._moves += 1  # its labels may have changed: a spread's counts by domain too
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
        self._moves += 1
        if node is not None:
            node.schedulable = False
            self._index(node)

    def max_free_whole(self) -> int:
        for free in range(len(self._whole) - 1, -1, -1):
            if self._whole[free]:
                return free
        return 0

    def max_free_whole_for(self, req: Request) -> int:
        """The most free whole GPUs on one schedulable node that ``req`` may use (its node selector, node
        affinity and GPU models): what a request bound to a few nodes waits for, not the whole cluster's
        largest block. A walk over the nodes, so only for such a request; any other gets
        :meth:`max_free_whole`."""
        if not req.selects and not req.models:
            return self.max_free_whole()
        return max((n.free_whole for n in self.cluster.nodes.values()
                    if n.schedulable and (not req.models or n.model in req.models) and req.admits(n)), default=0)

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
        if req.avoid:
            self._avoiders[(job.name, replica.task, replica.index)] = (job, replica)
        self._moves += 1
        if req.spread:  # only a job that spreads asks how many of the moves were its own
            self._moves_of[job.name] += 1
        self._charge(job.queue, req.gpu_total)
        job.allocated += req.gpu_total
        self._index(node)

    def filing(self, name: str) -> Filing | None:
        """Where the node is filed in the state index now: what :meth:`refile` puts back."""
        return self.classes.filing(name)

    def refile(self, name: str, filing: Filing | None) -> None:
        """Undo a bind or release of a trial to the end: the node, in its earlier state again, also gets
        back its place among equal nodes (a discarded trial must not change later tie-breaks)."""
        self.classes.restore(name, filing)

    def unwind(self, job: Job, placed: list[Placement]) -> None:
        """Release ``placed`` (binds of :meth:`place_gang`), newest first, leaving no trace."""
        for p in reversed(placed):
            self.release(job, p.replica, ReplicaPhase.PENDING)
            self.refile(p.node, p.before)

    def _charge(self, queue: str, milli: int) -> None:
        """A queue's jobs hold ``milli`` more: it and its ancestors count them."""
        queues = self.cluster.queues
        q = queues[queue]
        q.own_gpu += milli
        if q.parent is None:
            q.allocated_gpu += milli
            return
        for a in lineage(queues, queue):
            a.allocated_gpu += milli

    def release(self, job: Job, replica: Replica, phase: ReplicaPhase) -> None:
        if replica.phase is not ReplicaPhase.BOUND or replica.node is None:
            replica.phase = phase
            return
        req = job.task_by_name[replica.task].request
        self.on_node[replica.node].pop((job.name, replica.task, replica.index), None)
        if req.avoid:
            self._avoiders.pop((job.name, replica.task, replica.index), None)
        self._moves += 1
        if req.spread:  # only a job that spreads asks how many of the moves were its own
            self._moves_of[job.name] += 1
        node = self.cluster.nodes.get(replica.node)
        if node is not None:
            node.used_cpu -= req.cpu_milli
            node.used_mem -= req.mem_mib
            node.pods -= 1
            for d in replica.devices:
                node.devices[d].free += req.gpu_milli
            self._index(node)
        self._charge(job.queue, -req.gpu_total)
        job.allocated -= req.gpu_total
        replica.phase, replica.node, replica.devices = phase, None, ()

    # ------------------------------------------------------------- searching
    def _fits_host(self, node: Node, req: Request, excluded: frozenset[str]) -> bool:
        """What the node's state does not say: memory, pod slots, labels, and the caller's exclusions."""
        return (
            node.name not in excluded
            and node.free_mem >= req.mem_mib
            and node.pods < node.max_pods
            and (not req.selects or req.admits(node))
        )

    @staticmethod
    def _options(state: NodeState, req: Request) -> list[Option]:
        """Every way ``req`` fits a node in ``state`` (model and CPU included), or none."""
        if state.cpu_free < req.cpu_milli or (req.models and state.model not in req.models):
            return []
        if req.is_share:
            return [Option(state, state.after_share(v, req.gpu_milli, req.cpu_milli), v)
                    for v in sorted({f for f in state.frees if f >= req.gpu_milli})]
        after = state.after_whole(req.gpus, req.cpu_milli)
        return [] if after is None else [Option(state, after)]

    def _ranking(self, req: Request) -> _Ranking:
        """``req``'s candidate states best first, extended by the states that appeared since last asked."""
        version, epoch = self.order.node_order_version, self.classes.epoch
        ranking = self._rankings.get(req)
        if ranking is None or ranking.version != version or ranking.epoch != epoch:
            if len(self._rankings) >= MAX_RANKINGS:  # request shapes come and go over a long life
                self._rankings.clear()
            ranking = self._rankings[req] = _Ranking(version, epoch)
        if ranking.seen == len(self.classes):
            return ranking
        chosen: list[tuple[int, Option]] = []
        for cls in self.classes.new_since(ranking.seen):
            options = self._options(cls.state, req)
            if len(options) > 1:  # a share: the device the node order prefers, else the fullest that fits
                keys = self.order.device_keys(req, options)
                best = min(range(len(options)), key=lambda i: (tuple(-k for k in keys[i]), options[i].device_free))
                options = [options[best]]
            if options:
                chosen.append((cls.ident, options[0]))
        ranking.seen = len(self.classes)
        if chosen:
            keys = self.order.node_keys(req, [o for _, o in chosen])
            topology = req.gpus > 1 and not req.is_share
            for (ident, option), key in zip(chosen, keys, strict=True):
                if topology:  # a multi-GPU replica inside one linked group first
                    key = (1.0 if option.before.one_group_fits(req.gpus) else 0.0, *key)
                bisect.insort(ranking.entries, (tuple(-k for k in key), ident, option.device_free))
        return ranking

    def _first_fit(self, names: Members, req: Request, excluded: frozenset[str]) -> str | None:
        nodes = self.cluster.nodes
        first = names.first()
        if first is None:
            return None
        if self._fits_host(nodes[first], req, excluded):
            return first
        for name in names:
            if self._fits_host(nodes[name], req, excluded):
                return str(name)
        return None

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

    def _devices(self, node: Node, req: Request, device_free: int) -> tuple[int, ...] | None:
        if req.is_share:
            return next(((d.index,) for d in node.devices if d.free == device_free), None)
        return self.pick_devices(node, req.gpus) if req.gpus else ()

    def find(self, req: Request, excluded: frozenset[str] = frozenset(),
             domain: str | None = None) -> tuple[str, tuple[int, ...]] | None:
        """The best node for ``req`` and the devices it takes there: a fitting member of the best-ranked
        states; among equals, a node of ``domain`` first, then of the domain that has held such nodes
        longest, then the node settled longest in its state."""
        classes = self.classes.classes
        settled = self.classes.settled
        best: tuple[int, int, int, str, int] | None = None  # (outside domain, domain since, node since, node, device)
        current: tuple[float, ...] | None = None
        ranking = self._rankings.get(req)
        if (ranking is None or ranking.seen != len(classes) or ranking.epoch != self.classes.epoch
                or ranking.version != self.order.node_order_version):
            ranking = self._ranking(req)
        for key, ident, device_free in ranking.entries:
            if key != current:  # a new group of equally ranked states: the last one's best stands
                if best is not None:
                    break
                current = key
            cls = classes[ident]
            if not cls.count:
                continue
            if domain is not None and domain in cls.by_domain:
                members = cls.by_domain[domain]
                name = self._first_fit(members, req, excluded)
                if name is not None:
                    found = (0, 0, members.since[name], name, device_free)
                    if best is None or found < best:
                        best = found
                    continue
            if not settled:  # by name across domains
                name = self._first_fit(cls.members, req, excluded)
                if name is not None and (best is None or (1, 0, 0, name) < best[:4]):
                    best = (1, 0, 0, name, device_free)
                continue
            for dom, members in cls.by_domain.items():  # domains in the order they began to hold such nodes
                if dom == domain:
                    continue
                name = self._first_fit(members, req, excluded)
                if name is not None:
                    found = (1, members.created, members.since[name], name, device_free)
                    if best is None or found < best:
                        best = found
                    break
        if best is None:
            return None
        node = self.cluster.nodes[best[3]]
        devices = self._devices(node, req, best[4])
        return None if devices is None else (node.name, devices)

    def find_for(self, job: Job, req: Request, excluded: frozenset[str],
                 domain: str | None = None) -> tuple[str, tuple[int, ...]] | None:
        """``find`` for a replica of ``job``, within what its pod terms leave it (``confined``), and among the
        nodes its preferred node affinity weighs most that have room (binpacking and topology decide among
        those): a preference is met whenever it can be, not traded against a tighter fit."""
        if not req.states_placement and not self._avoiders:
            return self.find(req, excluded, domain)
        barred = self.confined(job, req, excluded)
        if not req.preferred:
            return self.find(req, barred, domain)
        nodes = self.cluster.nodes
        by_weight: dict[int, set[str]] = defaultdict(set)
        for n in nodes.values():
            if n.name not in barred:
                by_weight[req.preference(n)].add(n.name)
        if len(by_weight) <= 1:
            return self.find(req, barred, domain)
        for weight in sorted(by_weight, reverse=True):
            found = self.find(req, frozenset(nodes.keys() - by_weight[weight]), domain)
            if found is not None:
                return found
        return None

    def off_limits(self, job: Job, req: Request, excluded: frozenset[str]) -> frozenset[str]:
        """``excluded`` and the nodes a replica of ``req`` may not use by its job's pod anti-affinities: those
        in a domain of a bound replica of the job that it keeps away, or that keeps it away. A walk over the
        job's replicas (and, for a domain other than the node, over the nodes): only for jobs that state one."""
        if not req.apart and not req.marks and not req.avoid and not self._avoiders:
            return excluded
        tasks, nodes = job.task_by_name, self.cluster.nodes
        banned: dict[str, set[str]] = defaultdict(set)  # label key -> its domains taken
        if req.avoid or self._avoiders:
            self._peers_barred(job, req, banned)
        for r in job.replicas:
            node = nodes.get(r.node) if r.phase is ReplicaPhase.BOUND and r.node else None
            if node is None:
                continue
            other = tasks[r.task].request
            for a in [a for a in req.apart if a.term in other.marks] + [a for a in other.apart if a.term in req.marks]:
                if (domain := a.domain(node)) is not None:
                    banned[a.key].add(domain)
        out: set[str] = set()
        for key, domains in banned.items():
            if key == HOSTNAME_KEY:
                out |= domains
            else:
                out |= {n.name for n in nodes.values() if n.labels.get(key) in domains}
        return excluded | out if out else excluded

    def _peers_barred(self, job: Job, req: Request, banned: dict[str, set[str]]) -> None:
        """Add to ``banned`` the domains a replica of ``req`` may not go to by pod anti-affinity with pods of any
        job (kube-scheduler's InterPodAffinity filter, both sides): those holding a bound pod one of its terms
        selects, and those of a bound pod whose term selects it. The first is a walk over the bound replicas,
        for replicas that state such a term; the second over the few bound replicas that do."""
        for a in req.avoid:
            banned[a.key] |= self._peer_domains(a)
        if not self._avoiders:
            return
        nodes, mine = self.cluster.nodes, self._labels_of(job, req)
        for other, r in self._avoiders.values():
            node = nodes.get(r.node or "")
            if node is None:
                continue
            for a in other.task_by_name[r.task].request.avoid:
                if a.selects(job.namespace, mine) and (d := a.domain(node)) is not None:
                    banned[a.key].add(d)

    @staticmethod
    def _labels_of(job: Job, req: Request) -> Mapping[str, str]:
        """The pod labels of the job's task that asks ``req``."""
        return next((t.labels for t in job.tasks if t.request is req), {})

    def _peer_domains(self, term: PeerTerm) -> set[str]:
        """The domains of ``term`` holding a bound pod, of any job, the term selects."""
        nodes, out = self.cluster.nodes, set()
        for name, occupants in self.on_node.items():
            node = nodes.get(name)
            if node is None or (domain := term.domain(node)) is None or domain in out:
                continue
            if any(term.selects(other.namespace, other.task_by_name[r.task].labels) for other, r in occupants.values()):
                out.add(domain)
        return out

    def confined(self, job: Job, req: Request, excluded: frozenset[str]) -> frozenset[str]:
        """``off_limits`` and, for a replica with a pod affinity (with other jobs' pods, ``near``, or among its
        job's replicas), the nodes outside the domains of the bound pods that term selects (while none is bound
        and the term selects the replica itself, only the nodes without the term's label: it may start a
        domain; with other jobs' pods and not itself, every node); for one with a topology spread constraint,
        the nodes of domains it would skew too far (``_skewed``)."""
        out = self.off_limits(job, req, excluded)
        if not req.together and not req.spread and not req.near:
            return out
        nodes = self.cluster.nodes
        barred: set[str] = set()
        for near in req.near:
            held = self._peer_domains(near)
            if not held and near.selects(job.namespace, self._labels_of(job, req)):
                barred |= {n.name for n in nodes.values() if near.domain(n) is None}
            elif near.key == HOSTNAME_KEY:
                barred |= nodes.keys() - held
            else:
                barred |= {n.name for n in nodes.values() if near.domain(n) not in held}
        for sp in req.spread:
            barred |= self._skewed(job, req, sp)
        for t in req.together:
            held = self._held_domains(job, t)
            if not held and t.term in req.marks:
                barred |= {n.name for n in nodes.values() if t.domain(n) is None}
            elif t.key == HOSTNAME_KEY:
                barred |= nodes.keys() - held
            else:
                barred |= {n.name for n in nodes.values() if t.domain(n) not in held}
        return out | barred if barred else out

    def _skewed(self, job: Job, req: Request, sp: Spread) -> set[str]:
        """The nodes a replica with spread constraint ``sp`` may not use, as kube-scheduler's PodTopologySpread
        filter reads it: those without the label, and those of a domain whose count of the bound pods the
        term selects (the job's replicas, and other jobs' pods of its namespace; with this one, if it selects
        it) would exceed the count of the emptiest domain the replica's selector and affinity admit by more
        than ``max_skew``."""
        nodes = self.cluster.nodes
        counts = self._marked_domains(job, sp)
        if sp.namespace is not None:
            self._count_peers(job, sp, counts)
        # every node the replica's selector and affinity admit counts, cordoned or not (as nodeTaintsPolicy Ignore)
        eligible = {d for n in nodes.values() if (d := sp.domain(n)) is not None and req.admits(n)}
        least = min((counts[d] for d in eligible), default=0) if len(eligible) >= sp.min_domains else 0
        mine = 1 if sp.term in req.marks else 0
        return {n.name for n in nodes.values()
                if (d := sp.domain(n)) is None or counts[d] + mine - least > sp.max_skew}

    def _count_peers(self, job: Job, sp: Spread, counts: defaultdict[str, int]) -> None:
        """Add to ``counts`` the bound pods of other jobs that ``sp`` selects, per domain: a walk over the bound
        pods, for a replica that states such a spread, done again only once another job's pod came or went
        (a gang's replicas placed one after another share it)."""
        key, stamp = (job.name, sp.term), self._moves - self._moves_of[job.name]
        cached = self._peer_counts.get(key)
        if cached is None or cached[0] != stamp:
            nodes, found = self.cluster.nodes, defaultdict[str, int](int)
            for name, occupants in self.on_node.items():
                node = nodes.get(name)
                if node is None or (domain := sp.domain(node)) is None:
                    continue
                found[domain] += sum(1 for other, r in occupants.values() if other.name != job.name
                                     and sp.selects(other.namespace, other.task_by_name[r.task].labels))
            if len(self._peer_counts) > 1024:  # pending jobs that spread come and go
                self._peer_counts.clear()
            cached = self._peer_counts[key] = (stamp, dict(found))
        for domain, n in cached[1].items():
            counts[domain] += n

    def _held_domains(self, job: Job, term: PodTerm) -> set[str]:
        """The domains of ``term`` that hold a bound replica of ``job`` the term selects."""
        return set(self._marked_domains(job, term))

    def _marked_domains(self, job: Job, term: PodTerm) -> defaultdict[str, int]:
        """How many bound replicas of ``job`` that ``term`` selects each of its domains holds."""
        tasks, nodes = job.task_by_name, self.cluster.nodes
        out: defaultdict[str, int] = defaultdict(int)
        for r in job.replicas:
            node = nodes.get(r.node) if r.phase is ReplicaPhase.BOUND and r.node else None
            if node is not None and term.term in tasks[r.task].request.marks and (d := term.domain(node)) is not None:
                out[d] += 1
        return out

    def best_domain(self, gpus_needed: int) -> str | None:
        """The topology domain that fits the whole gang most tightly, else the one with the most room."""
        fits = [(free, dom) for dom, free in self.domain_free.items() if free >= gpus_needed]
        if fits:
            return min(fits)[1]
        return max(((free, dom) for dom, free in self.domain_free.items()), default=(0, None))[1]

    def place_gang(self, job: Job, replicas: list[Replica], excluded: frozenset[str] = frozenset(),
                   probe: bool = False) -> list[Placement] | None:
        """Bind all of ``replicas`` or none of them; with ``probe``, only say where they would go (nothing
        stays bound). A gang that does not fit, or a probe, leaves the index as it found it. A gang whose
        replicas keep together (a required pod affinity among them) is tried in one domain after another,
        the tightest with room first (at most ``TOGETHER_TRIALS``), unless a replica it follows is bound. One
        whose replicas prefer to (a preferred pod affinity, ``Gather``) is tried so too, in the domains its
        bound replicas hold if any, and then placed wherever it fits."""
        tasks = job.task_by_name
        by_size = sorted(replicas, key=lambda r: -tasks[r.task].request.gpu_total)
        if not any(t.request.together or t.request.gather for t in job.tasks):
            return self._place(job, by_size, excluded, probe)
        terms: list[Together | Gather] = [t for r in replicas for t in tasks[r.task].request.together]
        preferred = not terms
        if preferred:
            terms = [t for r in replicas for t in tasks[r.task].request.gather]
        if not terms:
            return self._place(job, by_size, excluded, probe)
        # replicas that follow others (a term that does not select them) after those they may follow
        order = sorted(replicas, key=lambda r: (_follows(tasks[r.task].request), -tasks[r.task].request.gpu_total))
        if not preferred and len(set(terms)) > 1 and _apart_groups(job, replicas, {t.term for t in terms}):
            return self._place_groups(job, order, sorted(set(terms), key=lambda t: (t.key, t.term)), excluded, probe)
        term = min(terms, key=lambda t: (t.key, t.term))
        group = {r.task for r in replicas if term in tasks[r.task].request.together
                 or term in tasks[r.task].request.gather or term.term in tasks[r.task].request.marks}
        held = self._held_domains(job, term)
        if held and not preferred:
            return self._place(job, order, excluded, probe)  # ``confined`` keeps them to the held domains
        pins = ([self._outside(term, held)] if held
                else self._domains_to_try(term, sum(tasks[r.task].request.gpu_total for r in replicas
                                                    if r.task in group), excluded))
        for pin in pins:
            done = self._place(job, order, excluded, probe, pin, group)
            if done is not None:
                return done
        return self._place(job, by_size, excluded, probe) if preferred else None

    def _place_groups(self, job: Job, order: list[Replica], terms: list[Together | Gather], excluded: frozenset[str],
                      probe: bool) -> list[Placement] | None:
        """A gang of groups that each keep together by a term of their own (``_apart_groups``; say, Kueue podsets
        that must each stay in one rack, or a podset's slices that must each stay on one host inside its rack):
        group after group, each tried in one domain after another (tightest with room first, as a gang of one
        group is) with the groups before it bound, a group's inner groups inside the domain it is tried in, then
        the replicas in no group. Binpacking a group instead could start it in a domain too small for it, and
        the gang would wait though it fits. A group whose term already has a domain (a replica bound there)
        stays there (``confined``). Each group keeps the first domain it fits in: at most ``TOGETHER_TRIALS``
        placements a group, not their product."""
        done = self._nested(job, order, terms, excluded)
        if done is not None and probe:
            self.unwind(job, done)
        return done

    def _nested(self, job: Job, order: list[Replica], terms: list[Together | Gather],
                excluded: frozenset[str]) -> list[Placement] | None:
        """``_place_groups`` for ``order``'s replicas, off ``excluded``: the outermost groups in turn, each tried in
        its domains with the groups it holds placed inside (recursively); nothing stays bound if one finds none."""
        tasks = job.task_by_name
        groups = {term: frozenset(r.task for r in order if term in tasks[r.task].request.together
                                  or term.term in tasks[r.task].request.marks) for term in terms}
        done: list[Placement] = []
        left = list(order)
        for term in terms:
            group = groups[term]
            members = [r for r in left if r.task in group]
            if not members or any(group < other for other in groups.values()):
                continue  # placed with an equal group before, or inside the group that holds it
            inner = [t for t in terms if groups[t] and groups[t] < group]
            pins: Iterable[frozenset[str]] = (
                [frozenset()] if self._held_domains(job, term)
                else self._domains_to_try(term, sum(tasks[r.task].request.gpu_total for r in members), excluded))
            tries = (self._nested(job, members, inner, excluded | pin) if inner
                     else self._place(job, members, excluded, False, pin, set(group)) for pin in pins)
            placed = next((p for p in tries if p is not None), None)
            if placed is None:
                self.unwind(job, done)
                return None
            done += placed
            left = [r for r in left if r.task not in group]
        rest = self._place(job, left, excluded, False) if left else []
        if rest is None:
            self.unwind(job, done)
            return None
        return done + rest

    def _domains_to_try(self, term: PodTerm, milli: int, excluded: frozenset[str]) -> Iterator[frozenset[str]]:
        """For each domain of ``term`` whose schedulable nodes have ``milli`` of GPU free, tightest first: the
        nodes outside it."""
        free: dict[str, int] = defaultdict(int)
        for n in self.cluster.nodes.values():
            if n.schedulable and n.name not in excluded and (d := term.domain(n)) is not None:
                free[d] += n.free_gpu_milli
        for d in sorted((d for d, f in free.items() if f >= milli), key=lambda d: (free[d], d))[:TOGETHER_TRIALS]:
            yield self._outside(term, {d})

    def _outside(self, term: PodTerm, domains: set[str]) -> frozenset[str]:
        """The nodes outside ``domains`` of ``term``."""
        nodes = self.cluster.nodes
        if term.key == HOSTNAME_KEY:
            return frozenset(nodes.keys() - domains)
        return frozenset(n.name for n in nodes.values() if term.domain(n) not in domains)

    def _place(self, job: Job, order: list[Replica], excluded: frozenset[str], probe: bool,
               pin: frozenset[str] = frozenset(), group: set[str] | None = None) -> list[Placement] | None:
        """Bind ``order``'s replicas one after another or none; those of a task in ``group`` also off ``pin``."""
        tasks = job.task_by_name
        whole = sum(tasks[r.task].request.gpus for r in order if not tasks[r.task].request.is_share)
        domain = self.best_domain(whole) if len(order) > 1 else None
        done: list[Placement] = []
        for replica in order:
            req = tasks[replica.task].request
            off = excluded | pin if group and replica.task in group else excluded
            found = (self.find_for(job, req, off, domain) if req.states_placement or self._avoiders
                     else self.find(req, off, domain))  # the hot path: no call more
            if found is None:
                self.unwind(job, done)
                return None
            node, devices = found
            before = self.classes.filing(node)
            self.bind(job, replica, node, devices)
            if domain is None and len(order) > 1:
                domain = self.cluster.nodes[node].domain
            done.append(Placement(replica, node, devices, before))
        if probe:
            self.unwind(job, done)
        return done


def _apart_groups(job: Job, replicas: list[Replica], names: set[str]) -> bool:
    """Whether the replicas form groups that each keep together by a term of their own, so that each group can be
    placed on its own: each replica states exactly the terms that select it, and any two groups are apart or one
    holds the other (Kueue's podsets, and a podset's slices inside it). A replica that follows another group's
    (a term that does not select it) can start only once that group runs."""
    tasks = job.task_by_name
    requests = {tasks[r.task].request for r in replicas}
    if not all({t.term for t in req.together} == req.marks & names for req in requests):
        return False
    present = {r.task for r in replicas}
    groups = [frozenset(t for t in present if name in tasks[t].request.marks) for name in names]
    return all(a <= b or b <= a or not a & b for a in groups for b in groups)


def _follows(req: Request) -> bool:
    """Whether a replica keeps to others by a pod affinity that does not select it (it goes after them)."""
    return any(t.term not in req.marks for t in req.together)
