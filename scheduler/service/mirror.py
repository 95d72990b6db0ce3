"""The service's one cluster model, kept in step with the informer caches by their deltas.

Informer handlers file each changed object (O(1): which job a pod belongs to, which node a foreign pod
charges) and mark what it touches dirty; before a cycle, :meth:`Mirror.sync` re-derives only the dirty
jobs and nodes and applies them to the long-lived :class:`Scheduler` — a job whose members or PodGroup
changed replaces its old self keeping its scheduling history, a node whose object or foreign pods
changed is recounted. A cycle therefore costs what changed, and the decisions in flight (notices,
preemptors, holds, cooldowns) simply stay in the model. The whole model is built once at start and
whenever leadership is taken (another replica may have decided meanwhile) or a cycle failed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ferry.keys import DEVICES_ANNOTATION
from ferry.kube.informer import key_of
from scheduler.core.hierarchy import recount
from scheduler.core.lifecycle import NoHooks
from scheduler.core.model import Job, JobPhase, ReplicaPhase
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.service.runs import EarlierRuns
from scheduler.service.snapshot import (
    Obj,
    ShapeCache,
    Snapshot,
    assemble,
    build,
    build_node,
    build_queues,
    charge,
    file_pod,
    group_phase,
    namespace_queues,
    record,
)

Assumed = Mapping[str, tuple[str, tuple[int, ...], float]]  # pod -> (node, devices, since)
Store = Callable[[], Mapping[str, Obj]]  # an informer's store (a relist replaces the dict: always ask)


def _spec_of(queue: Obj | None) -> tuple[Any, Any]:
    """What the model derives from a Queue: its spec, and its identity (a namespace goes to the oldest
    queue claiming it). Not its status."""
    if queue is None:
        return (None, None)
    return (queue["metadata"].get("uid"), queue.get("spec"))


def with_assumed(pod: Obj, assumed: Assumed) -> Obj:
    """The pod as the scheduler sees it: bound where this replica bound it until the cache shows that."""
    hit = assumed.get(key_of(pod))
    if hit is None or pod.get("spec", {}).get("nodeName"):
        return pod
    node, devices, _ = hit
    meta = pod["metadata"]
    return {**pod, "spec": {**pod["spec"], "nodeName": node},
            "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                 DEVICES_ANNOTATION: ",".join(map(str, devices))}}}


class Mirror:
    def __init__(self, config: SchedulerConfig, pods: Store, nodes: Store, groups: Store, queues: Store) -> None:
        self.config = config
        self._stores = (pods, nodes, groups, queues)
        self._shapes = ShapeCache()
        self.runs = EarlierRuns()  # what the next pods of evicted bare jobs continue (kept across rebuilds)
        self.sched: Scheduler | None = None
        self.snap: Snapshot | None = None
        self.rebuilds = 0
        self.queue_syncs = 0  # times every job was re-derived after a Queue changed
        # what each pod counts as (kept from the stores by the deltas)
        self._filed: dict[str, tuple[str, str]] = {}
        self._members: dict[str, dict[str, None]] = defaultdict(dict)  # job -> its live member pods
        self._ended: dict[str, dict[str, None]] = defaultdict(dict)  # gang -> members that ended
        self._charges: dict[str, dict[str, None]] = defaultdict(dict)  # node -> pods the core does not place
        self._dirty_jobs: dict[str, None] = {}
        self._dirty_nodes: dict[str, None] = {}
        self._queues_dirty = False
        self._queue_specs: dict[str, tuple[Any, Any]] = {}  # queue -> (uid, spec) the model was derived from

    @property
    def _pods(self) -> Mapping[str, Obj]:
        return self._stores[0]()

    @property
    def _nodes(self) -> Mapping[str, Obj]:
        return self._stores[1]()

    @property
    def _groups(self) -> Mapping[str, Obj]:
        return self._stores[2]()

    @property
    def _queues(self) -> Mapping[str, Obj]:
        return self._stores[3]()

    # ---------------------------------------------------------------- deltas
    def invalidate(self) -> None:
        """Build the whole model again before the next cycle."""
        self.sched = None

    def pod_changed(self, key: str, obj: Obj | None) -> None:
        old = self._filed.pop(key, None)
        if old is not None:
            self._unfile(key, *old)
        if obj is None:
            return
        kind, where = file_pod(obj)
        if kind == "none":
            return
        self._filed[key] = (kind, where)
        if kind == "member":
            self._members[where][key] = None
            self._dirty_jobs[where] = None
        elif kind == "ended":
            self._ended[where][key] = None
            self._dirty_jobs[where] = None
        else:
            self._charges[where][key] = None
            self._dirty_nodes[where] = None

    def _unfile(self, key: str, kind: str, where: str) -> None:
        index = {"member": self._members, "ended": self._ended, "charge": self._charges}[kind]
        index[where].pop(key, None)
        if not index[where]:
            del index[where]
        (self._dirty_nodes if kind == "charge" else self._dirty_jobs)[where] = None

    def job_changed(self, pod_key: str) -> None:
        """Something the store does not show changed for this pod's job (an assumed binding dropped)."""
        filed = self._filed.get(pod_key)
        if filed is not None and filed[0] == "member":
            self._dirty_jobs[filed[1]] = None

    def node_changed(self, name: str) -> None:
        self._dirty_nodes[name] = None

    def group_changed(self, key: str) -> None:
        self._dirty_jobs[key] = None

    def queue_changed(self, name: str) -> None:
        """A Queue added, changed or removed. A change of its status alone (the service's own report of it,
        up to once a second) changes nothing the model derives from a Queue, so it re-derives nothing: at
        10,000 nodes and 100,000 pods re-deriving every job costs most of a second."""
        obj = self._queues.get(name)
        if self._queue_specs.get(name) != _spec_of(obj):
            self._queues_dirty = True

    def _note_queue_specs(self) -> None:
        self._queue_specs = {name: _spec_of(obj) for name, obj in self._queues.items()}

    # ------------------------------------------------------------------ sync
    def sync(self, now: float, assumed: Assumed) -> tuple[Scheduler, Snapshot]:
        """The model with every delta since the last sync applied."""
        if self.sched is None or self.snap is None:
            return self._rebuild(now, assumed)
        sched, snap = self.sched, self.snap
        sched.configure(self.config)
        snap.cluster.now = now
        if self._queues_dirty:
            self._sync_queues(sched)
        nodes, self._dirty_nodes = self._dirty_nodes, {}
        for name in nodes:
            self._sync_node(sched, name)
        jobs, self._dirty_jobs = self._dirty_jobs, {}
        ns_queue = namespace_queues(self._queues)
        for name in jobs:
            self._sync_job(sched, snap, name, ns_queue, now, assumed)
        if self._queues_dirty:
            self._queues_dirty = False
            wanted = build_queues(self._queues)
            for gone in [q for q in snap.cluster.queues if q not in wanted]:
                if not any(j.queue == gone for j in snap.cluster.jobs.values()):
                    del snap.cluster.queues[gone]
        return sched, snap

    def _rebuild(self, now: float, assumed: Assumed) -> tuple[Scheduler, Snapshot]:
        store = self._pods
        pods = {k: with_assumed(p, assumed) for k, p in store.items()}
        self.snap = build(dict(self._nodes), pods, dict(self._groups), dict(self._queues), now, self._shapes,
                          self.runs)
        self.sched = Scheduler(self.snap.cluster, self.config, NoHooks())
        # a dependency the model does not hold (all its pods ended or are gone): its PodGroup's status says
        self.sched.phase_elsewhere = lambda name: group_phase(self._groups.get(name))
        self._filed.clear()
        self._members.clear()
        self._ended.clear()
        self._charges.clear()
        for key, pod in store.items():
            self.pod_changed(key, pod)
        self._dirty_jobs.clear()
        self._dirty_nodes.clear()
        self._queues_dirty = False
        self._note_queue_specs()
        self.rebuilds += 1
        return self.sched, self.snap

    def _sync_queues(self, sched: Scheduler) -> None:
        """Queues change rarely and a change can move any job (namespace queues): every job is re-derived."""
        self._note_queue_specs()
        self.queue_syncs += 1
        queues = sched.cluster.queues
        reordered: set[str] = set()
        for name, q in build_queues(self._queues).items():
            have = queues.get(name)
            if have is None:
                queues[name] = q
                continue
            if have.least_attained_service != q.least_attained_service:
                reordered.add(name)
            for field in ("guaranteed_gpu", "max_gpu", "weight", "rights", "preemptor_delay_s", "victim_grace_s",
                          "parent", "least_attained_service"):
                setattr(have, field, getattr(q, field))
        for job in [j for j in sched.pending_jobs() if j.queue in reordered]:
            sched.index(job)  # the queue's job order changed
        recount(queues)  # links may have changed; what each queue's own jobs hold is kept by the placer
        self._dirty_jobs.update(dict.fromkeys([*self._members, *self._ended, *sched.cluster.jobs]))

    def _sync_node(self, sched: Scheduler, name: str) -> None:
        obj = self._nodes.get(name)
        nodes = sched.cluster.nodes
        if obj is None:
            if name in nodes:
                on_node = sched.placer.on_node.get(name, {}).values()
                self._dirty_jobs.update(dict.fromkeys(job.name for job, _ in on_node))
                sched.forget_node(name)
            return
        fresh = build_node(obj)
        node = nodes.get(name)
        if node is None:
            sched.add_node(fresh)
            node = fresh
        elif [d.group for d in node.devices] != [d.group for d in fresh.devices]:
            node.devices = fresh.devices  # GPUs added, removed or regrouped: recounted below
        for field in ("cpu_milli", "mem_mib", "max_pods", "model", "domain", "schedulable", "labels"):
            setattr(node, field, getattr(fresh, field))
        store = self._pods
        pods = [store[k] for k in self._charges.get(name, {}) if k in store]
        sched.placer.recount(node, [partial(charge, pod=p) for p in pods])
        sched.node_changed(name)

    def _sync_job(self, sched: Scheduler, snap: Snapshot, name: str, ns_queue: dict[str, str], now: float,
                  assumed: Assumed) -> None:
        store = self._pods
        live = [with_assumed(store[k], assumed) for k in self._members.get(name, {}) if k in store]
        ended = [store[k] for k in self._ended.get(name, {}) if k in store]
        old = snap.cluster.jobs.get(name)
        if not live and not ended:
            for table in (snap.pods_of, snap.group_of, snap.counts, snap.problems, snap.waiting):
                table.pop(name, None)
            self._shapes.entries.pop(name, None)
            self.runs.forget(name)
            if old is not None:
                sched.remove(name)
            return
        view = assemble(name, live, ended, self._groups, ns_queue, snap.cluster.queues, self._shapes, now,
                        self.runs)
        record(snap, name, view)
        new = view.job
        if new is None:
            if old is not None:
                sched.remove(name)
        elif old is None:
            sched.submit(new)
        elif not same(old, new):
            sched.replace(new)


def same(old: Job, new: Job) -> bool:
    """Nothing the scheduler decides on differs between the model's job and one derived afresh."""
    if (old.queue, old.tier, old.priority, old.min_member, old.elastic_max, old.main_task, old.submit_time,
            old.depends_on, old.movable) != (new.queue, new.tier, new.priority, new.min_member, new.elastic_max,
                                             new.main_task, new.submit_time, new.depends_on, new.movable):
        return False
    if old.phase.terminal or len(old.replicas) != len(new.replicas):
        return False
    if [(t.name, t.replicas, t.request, t.min_available, t.labels) for t in old.tasks] != [
            (t.name, t.replicas, t.request, t.min_available, t.labels) for t in new.tasks]:  # labels: pod terms
        return False
    for a, b in zip(old.replicas, new.replicas, strict=True):
        if (a.task, a.index) != (b.task, b.index):
            return False
        if b.phase is ReplicaPhase.BOUND:
            if a.phase is not ReplicaPhase.BOUND or a.node != b.node or (b.devices and a.devices != b.devices):
                return False
        elif a.phase is not ReplicaPhase.PENDING:
            return False
    return old.phase is not JobPhase.PRIVILEGED or not new.bound()

