"""Nodes grouped by state, so a placement decision costs the number of distinct states, not of nodes.

Two nodes whose GPU model, free CPU and free GPU milli per linked group of devices are equal are
interchangeable for scoring: any node-order rule (fragmentation, binpack, topology inside a node) gives
them the same score for the same request. A 10,000-node cluster has a few dozen such states at a
time; a placement scores each state once per request shape and remembers it (a state never changes:
a node that changes moves to another state). Members of a state are kept sorted by name, per
topology domain too, so the tie-break among equally good nodes is deterministic and the same whether
the model was built at once or by deltas.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from scheduler.core.model import GPU_MILLI, Node

_GROUP = 1 << 24  # packs a device's group and free milli into one int of a node's raw key


def _canonical(groups: Iterable[Iterable[int]]) -> tuple[tuple[int, ...], ...]:
    """Free milli per device sorted within each group, groups sorted: equal for interchangeable nodes."""
    return tuple(sorted(tuple(sorted(g, reverse=True)) for g in groups))


@dataclass(frozen=True, slots=True)
class NodeState:
    """What a node offers, canonically: devices' free milli sorted within each linked group, groups sorted."""

    model: str
    cpu_free: int
    groups: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, node: Node) -> NodeState:
        by_group: dict[int, list[int]] = {}
        for d in node.devices:
            by_group.setdefault(d.group, []).append(d.free)
        return cls(node.model, node.free_cpu, _canonical(by_group.values()))

    @property
    def frees(self) -> tuple[int, ...]:
        return tuple(f for g in self.groups for f in g)

    @property
    def full(self) -> int:
        return sum(1 for g in self.groups for f in g if f == GPU_MILLI)

    @property
    def free_milli(self) -> int:
        return sum(max(f, 0) for g in self.groups for f in g)

    def one_group_fits(self, whole: int) -> bool:
        """Whether ``whole`` fully free GPUs exist inside one linked group."""
        return any(sum(1 for f in g if f == GPU_MILLI) >= whole for g in self.groups)

    def after_whole(self, whole: int, cpu: int) -> NodeState | None:
        """The state after taking ``whole`` full GPUs and ``cpu`` milli, devices chosen as
        :meth:`scheduler.core.placement.Placer.pick_devices` does (the tightest group that holds them all,
        else the fullest groups first); None if they are not there."""
        if self.full < whole:
            return None
        groups = [list(g) for g in self.groups]
        counts = [sum(1 for f in g if f == GPU_MILLI) for g in groups]
        fitting = [i for i, n in enumerate(counts) if n >= whole]
        order = [min(fitting, key=lambda i: counts[i])] if fitting else sorted(
            range(len(groups)), key=lambda i: -counts[i])
        left = whole
        for i in order:
            g = groups[i]
            for j, f in enumerate(g):
                if left and f == GPU_MILLI:
                    g[j] = 0
                    left -= 1
        return NodeState(self.model, self.cpu_free - cpu, _canonical(groups))

    def after_share(self, free: int, milli: int, cpu: int) -> NodeState:
        """The state after taking ``milli`` of a device that has ``free`` milli (one that exists)."""
        groups = [list(g) for g in self.groups]
        for g in groups:
            if free in g:
                g[g.index(free)] = free - milli
                break
        return NodeState(self.model, self.cpu_free - cpu, _canonical(groups))


class Members:
    """The nodes of one state, walked longest-settled first: by when each entered the state, then by
    name. A heap with lazy deletion: a bind moves a node between states, so adding and removing must be
    cheap, and a walk usually stops at the first node."""

    __slots__ = ("_heap", "created", "since")

    def __init__(self, created: int = 0) -> None:
        self.since: dict[str, int] = {}  # node -> when it entered (the index's sequence number)
        self._heap: list[tuple[int, str]] = []
        self.created = created  # for a domain's members: when the domain began to hold nodes in this state

    def __len__(self) -> int:
        return len(self.since)

    def __contains__(self, name: str) -> bool:
        return name in self.since

    def add(self, name: str, seq: int) -> None:
        self.since[name] = seq
        heapq.heappush(self._heap, (seq, name))

    def discard(self, name: str) -> None:
        self.since.pop(name, None)
        self._tidy()

    def resettle(self, name: str, seq: int) -> None:
        """A member's entry moved back to ``seq`` (an undone trial)."""
        self.add(name, seq)
        self._tidy()

    def _tidy(self) -> None:
        if len(self._heap) > 2 * len(self.since) + 16:  # mostly stale entries: rebuild
            self._heap = sorted((seq, n) for n, seq in self.since.items())

    def first(self) -> str | None:
        """The first name in order (what most walks need), stale heap entries dropped on the way."""
        heap, since = self._heap, self.since
        while heap and since.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def __iter__(self) -> Iterator[str]:
        first = self.first()
        if first is None:
            return
        yield first
        heap, since = self._heap, self.since
        # the rest in order without disturbing the heap: a frontier of heap positions
        frontier: list[tuple[tuple[int, str], int]] = []
        for child in (1, 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child], child))
        while frontier:
            entry, i = heapq.heappop(frontier)
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
            if since.get(entry[1]) == entry[0]:
                yield entry[1]


@dataclass(frozen=True, slots=True)
class Filing:
    """Where a node is filed and since when: what undoing a trial puts back, so a trial that is discarded
    leaves no trace in later tie-breaks (a node it touched does not become the node settled last)."""

    state: NodeState
    domain: str
    since: int  # when the node entered its state
    domain_since: int  # when its domain began to hold nodes in that state


@dataclass(slots=True)
class NodeClass:
    """The schedulable nodes in one state."""

    ident: int
    state: NodeState
    full: int  # whole GPUs free
    count: int = 0  # nodes in this state, read on every walk of a ranking
    members: Members = field(default_factory=Members)  # all of them, kept only for ties by name
    by_domain: dict[str, Members] = field(default_factory=dict)  # in the order domains began to hold members


class ClassIndex:
    """Schedulable nodes by state. Class identities are never reused, so a cache keyed by them stays
    valid until :attr:`epoch` changes (the index dropped its empty classes)."""

    def __init__(self, settled: bool = True) -> None:
        self.settled = settled  # ties by domain and node settled longest; False: by name alone
        self.classes: list[NodeClass] = []
        self._by_state: dict[NodeState, NodeClass] = {}
        self._of: dict[str, tuple[NodeClass, str]] = {}  # node -> its class, its domain
        self.epoch = 0
        self._live = 0
        self._seq = 0
        self._raw: dict[tuple[object, ...], NodeClass] = {}  # a node's raw devices -> the class of its state

    def __len__(self) -> int:
        return len(self.classes)

    def class_of(self, node: Node) -> NodeClass:
        """The class of the node's state, created if new; remembered by the raw device tuple, since a bind
        re-files its node and the canonical state is costlier to build and hash."""
        raw = (node.model, node.cpu_milli - node.used_cpu, tuple([d.group * _GROUP + d.free for d in node.devices]))
        cls = self._raw.get(raw)
        if cls is None:
            state = NodeState.of(node)
            cls = self._by_state.get(state)
            if cls is None:
                cls = NodeClass(len(self.classes), state, state.full)
                self.classes.append(cls)
                self._by_state[state] = cls
            if len(self._raw) > 1 << 16:
                self._raw.clear()
            self._raw[raw] = cls
        return cls

    def place(self, node: Node) -> NodeClass | None:
        """File ``node`` under its current state (or take it out if it is not schedulable); its class."""
        name = node.name
        if not node.schedulable:
            self.remove(name)
            return None
        cls = self.class_of(node)
        filed = self._of.get(name)
        if filed is not None:
            if filed[0] is cls and filed[1] == node.domain:
                return cls  # unchanged: it keeps its place (how long it has been settled)
            self._leave(filed[0], filed[1], name)
        if not cls.count:
            self._live += 1
        cls.count += 1
        if self.settled:
            self._seq += 1
        else:  # walked by name across domains
            cls.members.add(name, 0)
        members = cls.by_domain.get(node.domain)
        if members is None:
            members = cls.by_domain[node.domain] = Members(self._seq)
        members.add(name, self._seq)
        self._of[name] = (cls, node.domain)
        if len(self.classes) > 16 + 2 * self._live:  # walks skip empty classes: keep them few
            self._compact()
        return cls

    def filing(self, name: str) -> Filing | None:
        """Where ``name`` is filed now (None: not schedulable)."""
        found = self._of.get(name)
        if found is None:
            return None
        cls, domain = found
        members = cls.by_domain[domain]
        return Filing(cls.state, domain, members.since[name], members.created)

    def restore(self, name: str, filing: Filing | None) -> None:
        """Give ``name`` back the place ``filing`` recorded, if it is in that state again (a trial undone)."""
        found = self._of.get(name)
        if found is None or filing is None or found[1] != filing.domain or found[0].state != filing.state:
            return
        cls = found[0]
        members = cls.by_domain[filing.domain]
        if members.since[name] != filing.since:
            members.resettle(name, filing.since)
        if filing.domain_since < members.created:  # the trial emptied the domain's members, then refilled them
            members.created = filing.domain_since
            cls.by_domain = dict(sorted(cls.by_domain.items(), key=lambda item: item[1].created))

    def remove(self, name: str) -> None:
        found = self._of.pop(name, None)
        if found is not None:
            self._leave(found[0], found[1], name)

    def _leave(self, cls: NodeClass, domain: str, name: str) -> None:
        cls.count -= 1
        if not self.settled:
            cls.members.discard(name)
        members = cls.by_domain[domain]
        members.discard(name)
        if not members:
            del cls.by_domain[domain]
        if not cls.count:
            self._live -= 1

    def _compact(self) -> None:
        """Drop empty classes (a long life sees many states come and go); caches keyed by identity go."""
        live = [c for c in self.classes if c.count]
        self.classes = []
        self._by_state = {}
        self._raw = {}
        for c in live:
            c.ident = len(self.classes)
            self.classes.append(c)
            self._by_state[c.state] = c
        self.epoch += 1

    def new_since(self, count: int) -> Iterator[NodeClass]:
        """Classes created after the first ``count``."""
        for i in range(count, len(self.classes)):
            yield self.classes[i]
