"""The service's model fed by deltas equals the model built at once from the same caches, step after step
(a pure test of the bookkeeping: the stores are dicts standing in for informer caches; the service tests
run the same code against real API servers)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from scheduler.core.decisions import Bind
from scheduler.core.lifecycle import NoHooks
from scheduler.core.model import ReplicaPhase, Tier
from scheduler.core.scheduler import Scheduler, SchedulerConfig
from scheduler.service.mirror import Mirror
from scheduler.service.snapshot import Snapshot, build

Obj = dict[str, Any]
CONFIG = SchedulerConfig.preset("ferry", min_runtime_s=0).without_actions("grow")


def node(name: str, gpus: int = 8, **labels: str) -> Obj:
    return {"metadata": {"name": name, "labels": dict(labels)},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110",
                                                   "nvidia.com/gpu": str(gpus)},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, ns: str = "a", gpus: int = 1, group: str | None = None, scheduler: str = "kube-ferry",
        on: str | None = None) -> Obj:
    labels = {"kubeferry.io/pod-group": group} if group else {}
    spec: Obj = {"schedulerName": scheduler,
                 "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if on:
        spec["nodeName"] = on
    return {"metadata": {"name": name, "namespace": ns, "uid": f"u-{ns}-{name}", "labels": labels,
                         "creationTimestamp": "2026-11-30T10:00:00Z", "annotations": {}},
            "spec": spec, "status": {"phase": "Pending"}}


def group(name: str, ns: str = "a", min_member: int = 2, **spec: Any) -> Obj:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"g-{ns}-{name}"},
            "spec": {"minMember": min_member, **spec}}


def queue(name: str, gpus: int, *namespaces: str) -> Obj:
    return {"metadata": {"name": name}, "spec": {"guaranteed": {"gpu": str(gpus)}, "namespaces": list(namespaces)}}


class World:
    """Informer stores and the deltas they would deliver."""

    def __init__(self) -> None:
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[str, Obj] = {}
        self.groups: dict[str, Obj] = {}
        self.queues: dict[str, Obj] = {}
        self.mirror = Mirror(CONFIG, lambda: self.pods, lambda: self.nodes, lambda: self.groups,
                             lambda: self.queues)

    def put_pod(self, p: Obj) -> None:
        key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        self.pods[key] = p
        self.mirror.pod_changed(key, p)

    def drop_pod(self, key: str) -> None:
        del self.pods[key]
        self.mirror.pod_changed(key, None)

    def put_node(self, n: Obj) -> None:
        self.nodes[n["metadata"]["name"]] = n
        self.mirror.node_changed(n["metadata"]["name"])

    def put_group(self, g: Obj) -> None:
        key = f"{g['metadata']['namespace']}/{g['metadata']['name']}"
        self.groups[key] = g
        self.mirror.group_changed(key)

    def put_queue(self, q: Obj) -> None:
        self.queues[q["metadata"]["name"]] = q
        self.mirror.queue_changed(q["metadata"]["name"])

    def cycle(self, now: float) -> list[Bind]:
        """A cycle on the delta-fed model, its bindings written to the pods (as the API server would)."""
        sched, snap = self.mirror.sync(now, {})
        check_same(sched, snap, self)
        binds = [d for d in sched.cycle(now).decisions if isinstance(d, Bind)]
        for d in binds:
            (p,) = [p for (task, i), p in snap.pods_of[d.job].items() if (task, i) == (d.task, d.index)]
            bound = copy.deepcopy(p)
            bound["spec"]["nodeName"] = d.node
            bound["metadata"]["annotations"]["kubeferry.io/gpu-devices"] = ",".join(map(str, d.devices))
            self.put_pod(bound)
        return binds


def state(sched: Scheduler, snap: Snapshot) -> dict[str, Any]:
    c = sched.cluster
    return {
        "nodes": {n.name: ([d.free for d in n.devices], n.used_cpu, n.pods, n.schedulable, n.labels)
                  for n in c.nodes.values()},
        "queues": {q.name: (q.allocated_gpu, q.guaranteed_gpu) for q in c.queues.values()},
        "jobs": {j.name: (j.queue, j.gang_size, sorted((r.task, r.index, r.node, r.devices) for r in j.replicas
                                                       if r.phase is ReplicaPhase.BOUND),
                          len(j.pending())) for j in c.jobs.values() if not j.phase.terminal},
        "pending": sorted(j.name for j in sched.pending_jobs()),
        "placer": sorted((n, sched.placer._where.get(n)) for n in c.nodes),
        "shown": (sorted(snap.pods_of), snap.problems, snap.waiting, {k: v.status() for k, v in snap.counts.items()}),
    }


def check_same(sched: Scheduler, snap: Snapshot, w: World) -> None:
    fresh_snap = build(dict(w.nodes), dict(w.pods), dict(w.groups), dict(w.queues), snap.cluster.now)
    fresh = Scheduler(fresh_snap.cluster, CONFIG, NoHooks())
    assert state(sched, snap) == state(fresh, fresh_snap)


def test_the_model_fed_by_deltas_equals_the_model_built_at_once() -> None:
    w = World()
    for i in range(3):
        w.put_node(node(f"n{i}", rack=f"r{i % 2}"))
    w.put_queue(queue("qa", 8, "a"))
    w.cycle(1)  # the first sync builds the whole model
    assert w.mirror.rebuilds == 1

    # a gang assembles member by member, its PodGroup arrives last; a single pod runs meanwhile
    w.put_pod(pod("g-0", group="g"))
    w.put_pod(pod("solo", gpus=2))
    assert {b.job for b in w.cycle(2)} == {"a/pod/solo"}
    w.put_pod(pod("g-1", group="g"))
    w.put_pod(pod("g-2", group="g"))
    w.cycle(3)
    w.put_group(group("g", min_member=3))
    assert len(w.cycle(4)) == 3

    # another scheduler's pod lands on a node; a node is cordoned and relabelled; a node joins
    w.put_pod(pod("foreign", ns="kube-system", gpus=4, scheduler="default-scheduler", on="n2"))
    cordoned = node("n1", rack="r9")
    cordoned["spec"]["unschedulable"] = True
    w.put_node(cordoned)
    w.put_node(node("n3", gpus=4))
    w.cycle(5)

    # a member ends, a pod asks for nonsense, a pod is deleted, a second queue claims a namespace
    ended = copy.deepcopy(w.pods["a/g-1"])
    ended["status"]["phase"] = "Succeeded"
    w.put_pod(ended)
    bad = pod("bad")
    bad["metadata"]["annotations"]["kubeferry.io/gpu-milli"] = "lots"
    w.put_pod(bad)
    w.drop_pod("a/pod/solo".replace("pod/", ""))
    w.put_queue(queue("qb", 8, "b"))
    w.put_pod(pod("b-0", ns="b", gpus=8))
    w.cycle(6)

    # the foreign pod leaves, a node is removed, the gang's PodGroup changes
    w.drop_pod("kube-system/foreign")
    del w.nodes["n3"]
    w.mirror.node_changed("n3")
    w.put_group(group("g", min_member=2, priority=5))
    w.cycle(7)
    w.cycle(8)
    assert w.mirror.rebuilds == 1  # all of it by deltas


def test_a_dependency_is_met_through_the_podgroup_status_once_its_pods_ended() -> None:
    w = World()
    w.put_queue(queue("q", 8, "a"))
    w.put_node(node("n1", 4))
    w.put_group(group("prep", min_member=1))
    w.put_group(group("train", min_member=1, dependsOn=[{"name": "prep", "phase": "Succeeded"}]))
    w.put_pod(pod("prep-0", group="prep"))
    w.put_pod(pod("train-0", group="train"))
    assert [b.job for b in w.cycle(1.0)] == ["a/prep"]
    sched, _ = w.mirror.sync(2.0, {})
    assert sched.cycle(2.0).pending_reasons["a/train"] == "waiting for a/prep to succeed (it is Running)"
    done = copy.deepcopy(w.pods["a/prep-0"])
    done["status"]["phase"] = "Succeeded"
    w.put_pod(done)  # the gang ended: the model forgets it, its PodGroup's status keeps the outcome
    finished = copy.deepcopy(w.groups["a/prep"])
    finished["status"] = {"phase": "Succeeded", "succeeded": 1}
    w.put_group(finished)
    assert [b.job for b in w.cycle(3.0)] == ["a/train"]


def test_a_parent_link_made_or_changed_later_recounts_the_departments_allocation() -> None:
    w = World()
    w.put_node(node("n1", 8))
    w.put_queue(queue("dept", 8))
    w.put_queue(queue("team", 4, "a"))
    w.put_pod(pod("p0", gpus=3))
    w.cycle(1.0)  # bound while team stands alone
    linked = queue("team", 4, "a")
    linked["spec"]["parent"] = "dept"
    w.put_queue(linked)
    sched, _ = w.mirror.sync(2.0, {})
    assert (sched.cluster.queues["dept"].allocated_gpu, sched.cluster.queues["team"].allocated_gpu) == (3000, 3000)
    w.put_queue(queue("team", 4, "a"))  # unlinked again
    sched, snap = w.mirror.sync(3.0, {})
    assert sched.cluster.queues["dept"].allocated_gpu == 0
    check_same(sched, snap, w)


def test_a_queue_that_turns_least_attained_service_on_refiles_its_waiting_jobs() -> None:
    w = World()
    w.mirror = Mirror(dataclasses.replace(CONFIG, plugins=(*CONFIG.plugins, "las")), lambda: w.pods,
                      lambda: w.nodes, lambda: w.groups, lambda: w.queues)
    w.put_node(node("n1", 8))
    w.put_queue(queue("q", 8, "a"))
    w.put_pod(pod("busy", gpus=8))
    w.cycle(1.0)
    w.put_pod(pod("served", gpus=8))  # first by name (same age), but had 20 GPU-hours (an earlier, evicted run)
    w.put_pod(pod("unserved", gpus=8))
    sched, _ = w.mirror.sync(2.0, {})
    sched.cluster.jobs["a/pod/served"].attained_gpu_s = 20 * 3600.0

    def first() -> str | None:
        head = sched.head(int(Tier.GUARANTEED), "q", set(), set())
        return head[1] if head else None

    sched.index(sched.cluster.jobs["a/pod/served"])
    assert first() == "a/pod/served"  # flag off: age, then name decide
    on = queue("q", 8, "a")
    on["spec"]["preemption"] = {"leastAttainedService": True}
    w.put_queue(on)
    sched, _ = w.mirror.sync(3.0, {})
    assert sched.cluster.queues["q"].least_attained_service and first() == "a/pod/unserved"


def test_a_queues_status_alone_re_derives_nothing_and_its_spec_does() -> None:
    """The service writes each Queue's status up to once a second; were that a queue change, every job
    would be re-derived each time (most of a second at 100,000 pods)."""
    w = World()
    w.put_node(node("n1", 8))
    w.put_queue(queue("q", 8, "a"))
    w.put_pod(pod("p0", gpus=3))
    w.cycle(1.0)
    syncs = w.mirror.queue_syncs
    reported = copy.deepcopy(w.queues["q"])
    reported["status"] = {"allocated": {"gpu": "3"}, "recentUsage": {"gpuSeconds": 3.0, "time": "2026-12-02T10:00:00Z"}}
    w.put_queue(reported)
    w.cycle(2.0)  # and the model still equals one built at once
    assert w.mirror.queue_syncs == syncs
    bigger = copy.deepcopy(reported)
    bigger["spec"]["guaranteed"] = {"gpu": "6"}
    w.put_queue(bigger)
    sched, _ = w.mirror.sync(3.0, {})
    assert w.mirror.queue_syncs == syncs + 1 and sched.cluster.queues["q"].guaranteed_gpu == 6000
    del w.queues["q"]
    w.mirror.queue_changed("q")
    w.mirror.sync(4.0, {})
    assert w.mirror.queue_syncs == syncs + 2


def test_a_job_whose_pods_labels_changed_is_derived_afresh() -> None:
    """Other pods' anti-affinity terms select pods by their labels: a relabelled pod's job is replaced in the
    model, as one whose request changed is."""
    from scheduler.core.model import Job, Request, Task
    from scheduler.service.mirror import same

    def job(labels: dict[str, str]) -> Job:
        return Job("ns/pod/p", "q", [Task("worker", 1, Request(gpus=1), labels=labels)], namespace="ns")

    assert same(job({"app": "web"}), job({"app": "web"}))
    assert not same(job({"app": "web"}), job({"app": "db"}))


def test_the_next_pod_of_an_evicted_bare_pods_controller_continues_its_job() -> None:
    """A pod without a PodGroup that the service evicts: its controller's next pod keeps the job's place
    (its arrival), the GPU-seconds it received and when it was evicted, as a gang's next run does from its
    PodGroup and as the trace replays assume. Once only, for the same controller only, and not by the
    evicted pod itself while it is still seen."""
    from ferry.keys import UPSTREAM_CONTROLLER_LABEL
    from scheduler.service.runs import EarlierRun

    def owned(name: str, controller: str, created: str, copy_of: bool = False) -> Obj:
        p = pod(name)
        p["metadata"]["creationTimestamp"] = created
        if copy_of:  # a vnode's copy names its tenant controller
            p["metadata"]["labels"][UPSTREAM_CONTROLLER_LABEL] = controller
        else:
            p["metadata"]["ownerReferences"] = [{"kind": "Job", "name": controller, "uid": controller,
                                                 "controller": True}]
        return p

    w = World()
    w.put_node(node("n0"))
    w.put_pod(owned("first", "job-1", "2026-11-30T10:00:00Z"))
    w.cycle(1.0)
    arrival = w.mirror.snap.cluster.jobs["a/pod/first"].submit_time  # type: ignore[union-attr]
    w.mirror.runs.evicted([w.pods["a/first"]], EarlierRun(arrival, 3600.0, 5000.0), now=5000.0)
    again = copy.deepcopy(w.pods["a/first"])
    again["metadata"]["annotations"]["kubeferry.io/will-evict-at"] = "2026-11-30T10:02:00Z"
    w.put_pod(again)  # re-derived before it is gone: it does not take its own note
    w.cycle(5001.0)
    assert w.mirror.runs.notes() == 1
    w.drop_pod("a/first")
    w.put_pod(owned("other", "job-2", "2026-11-30T10:30:00Z"))  # another controller's, arrived meanwhile
    w.put_pod(owned("first-next", "job-1", "2026-11-30T11:00:00Z", copy_of=True))
    w.cycle(5002.0)
    jobs = w.mirror.snap.cluster.jobs  # type: ignore[union-attr]
    nxt, other = jobs["a/pod/first-next"], jobs["a/pod/other"]
    assert (nxt.submit_time, nxt.attained_gpu_s, nxt.stopped_at) == (arrival, 3600.0, 5000.0)
    assert other.submit_time == arrival + 1800 and other.attained_gpu_s == 0.0 and other.stopped_at is None
    w.put_pod(owned("later", "job-1", "2026-11-30T11:05:00Z"))  # the note was taken once
    w.cycle(5003.0)
    assert jobs["a/pod/later"].submit_time == arrival + 3900
    changed = copy.deepcopy(w.pods["a/first-next"])
    changed["metadata"]["annotations"]["touched"] = "yes"
    w.put_pod(changed)  # derived again: the same answer
    w.mirror.invalidate()  # and after a rebuild (leadership taken back)
    w.cycle(5004.0)
    assert w.mirror.snap.cluster.jobs["a/pod/first-next"].submit_time == arrival  # type: ignore[union-attr]

    w.mirror.runs.evicted([w.pods["a/later"]], EarlierRun(arrival, 20.0, 5004.5), now=5004.5)
    remade = owned("later", "job-1", "2026-11-30T11:30:00Z")  # the same name, a new pod (a StatefulSet's)
    remade["metadata"]["uid"] = "u-a-later-2"
    w.put_pod(remade)
    w.cycle(5004.6)
    assert w.mirror.snap.cluster.jobs["a/pod/later"].attained_gpu_s == 20.0  # type: ignore[union-attr]

    stale = w.mirror.runs
    stale.evicted([w.pods["a/later"]], EarlierRun(arrival, 10.0, 5005.0), now=5005.0)
    w.put_pod(owned("late", "job-1", "2026-11-30T12:00:00Z"))
    w.mirror.sync(5005.0 + stale.keep_s + 1, {})  # the controller made its next pod too late: a new job
    assert w.mirror.snap.cluster.jobs["a/pod/late"].submit_time == arrival + 7200  # type: ignore[union-attr]
    assert stale.notes() == 0


def test_a_taken_note_is_kept_on_its_pod_and_a_new_scheduler_reads_it_back() -> None:
    """The pod that takes an evicted run's note is handed to the service once, to keep the run on itself; a
    scheduler that starts afresh (a restart, another leader: no notes in memory) reads it back from the
    pod, to the second (timestamps are whole seconds). A note that is not the scheduler's JSON is ignored."""
    from ferry.keys import EARLIER_RUN_ANNOTATION, UPSTREAM_CONTROLLER_LABEL
    from scheduler.service.runs import EarlierRun

    def bare(name: str, created: str) -> Obj:
        p = pod(name)
        p["metadata"]["creationTimestamp"] = created
        p["metadata"]["labels"][UPSTREAM_CONTROLLER_LABEL] = "job-1"
        return p

    w = World()
    w.put_node(node("n0"))
    w.put_pod(bare("first", "2026-11-30T10:00:00Z"))
    w.cycle(1.0)
    arrival = w.mirror.snap.cluster.jobs["a/pod/first"].submit_time  # type: ignore[union-attr]
    w.mirror.runs.evicted([w.pods["a/first"]], EarlierRun(arrival, 3600.4567, 5000.0, 4000.0), now=5000.0)
    w.drop_pod("a/first")
    w.put_pod(bare("next", "2026-11-30T11:00:00Z"))
    w.cycle(5001.0)
    (taken,) = w.mirror.runs.taken()
    assert taken[0]["metadata"]["uid"] == "u-a-next" and w.mirror.runs.taken() == []  # handed over once
    kept = taken[1].annotation()

    restarted = World()  # the same cluster, read by a scheduler that never saw the eviction
    restarted.put_node(node("n0"))
    annotated = copy.deepcopy(w.pods["a/next"])
    annotated["metadata"]["annotations"][EARLIER_RUN_ANNOTATION] = kept
    restarted.put_pod(annotated)
    restarted.put_pod(bare("newcomer", "2026-11-30T10:30:00Z"))
    restarted.put_pod(bare("forged", "2026-11-30T10:40:00Z"))
    restarted.pods["a/forged"]["metadata"]["annotations"][EARLIER_RUN_ANNOTATION] = '{"arrivalTime": 0}'
    restarted.cycle(5002.0)
    jobs = restarted.mirror.snap.cluster.jobs  # type: ignore[union-attr]
    nxt = jobs["a/pod/next"]
    assert (nxt.submit_time, nxt.attained_gpu_s, nxt.stopped_at, nxt.moved_at) == (arrival, 3600.456, 5000.0, 4000.0)
    assert jobs["a/pod/newcomer"].submit_time == arrival + 1800
    assert jobs["a/pod/forged"].submit_time == arrival + 2400 and jobs["a/pod/forged"].attained_gpu_s == 0.0
    assert restarted.mirror.runs.taken() == []  # read back, not taken again


def test_notes_not_yet_taken_are_saved_and_a_new_leader_restores_them_less_the_expired_and_the_taken() -> None:
    """What a leader hands its successor (service.py saves it in a ConfigMap): the notes no next pod has taken.
    The successor restores them (to the second), drops the expired ones and those a pod already keeps (taken,
    its annotation written, the save not yet), and its next pod takes the note. Within a byte bound the newest
    notes are saved first; a text that is not the scheduler's is refused. A note whose eviction was refused is
    withdrawn, not another."""
    import json

    import pytest

    from ferry.keys import EARLIER_RUN_ANNOTATION, UPSTREAM_CONTROLLER_LABEL
    from scheduler.service.runs import EarlierRun, EarlierRuns

    def bare(name: str, controller: str) -> Obj:
        p = pod(name)
        p["metadata"]["labels"][UPSTREAM_CONTROLLER_LABEL] = controller
        return p

    old = EarlierRuns(keep_s=100.0)
    runs = {c: EarlierRun(1000.0 + i, 10.5 + i, 2000.0 + i) for i, c in enumerate(("job-1", "job-2", "job-3"))}
    old.evicted([bare("j1", "job-1")], runs["job-1"], now=2000.0)  # kept until 2,100
    old.evicted([bare("j2", "job-2")], runs["job-2"], now=2050.0)  # until 2,150
    old.evicted([bare("j3", "job-3")], runs["job-3"], now=2060.0)  # until 2,160: taken, its annotation written
    before = old.generation
    text = old.saved(now=2060.0)
    assert old.generation == before  # saving changes nothing
    assert set(json.loads(text)) == {"a/job-1", "a/job-2", "a/job-3"}

    taker = bare("j3-next", "job-3")
    taker["metadata"]["annotations"][EARLIER_RUN_ANNOTATION] = runs["job-3"].annotation()
    new = EarlierRuns(keep_s=100.0)
    assert new.restore(text, [taker], now=2120.0) == 1  # job-1's expired at 2,100; job-3's is kept by its pod
    assert new.of("a/pod/j2-next", bare("j2-next", "job-2"), now=2120.0) == runs["job-2"]
    assert new.of("a/pod/j1-next", bare("j1-next", "job-1"), now=2120.0) is None and new.notes() == 0

    small = json.loads(old.saved(now=2060.0, most_bytes=300))  # room for one: the newest
    assert list(small) == ["a/job-3"], small
    refused = EarlierRun(1500.0, 1.0, 2070.0)  # an eviction a disruption budget refused: the job runs on
    new.evicted([bare("j4", "job-4")], runs["job-2"], now=2070.0)  # an earlier eviction's note, not taken
    new.evicted([bare("j4", "job-4")], refused, now=2070.0)
    before = new.generation
    assert new.withdraw([bare("j4", "job-4")], refused) == 1
    assert new.generation > before and new.notes() == 1
    assert new.of("a/pod/j4-next", bare("j4-next", "job-4"), now=2070.0) == runs["job-2"]  # the refused one is gone
    assert new.withdraw([bare("j4", "job-4")], refused) == 0  # nothing left to withdraw
    assert new.notes() == 0
    with pytest.raises(ValueError, match="not a map of notes"):
        new.restore("[1, 2]", [], now=0.0)
    with pytest.raises(json.JSONDecodeError):
        new.restore("not json", [], now=0.0)
