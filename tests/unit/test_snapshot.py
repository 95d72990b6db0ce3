"""The scheduler's snapshot: job shapes are reused only while the objects they came from are unchanged."""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

from scheduler.core.model import NodeRequirement, ReplicaPhase, SelectorOp
from scheduler.service.runs import evicted_status
from scheduler.service.service import namespace_condition
from scheduler.service.snapshot import (
    ShapeCache,
    build,
    build_queue,
    held_status,
    namespace_conflicts,
    namespace_queues,
)

NODES = {"n0": {"metadata": {"name": "n0", "labels": {}},
                "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}}


def pod(name: str, gpus: str = "1", node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "kube-ferry",
                            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if node:
        spec["nodeName"] = node
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"kubeferry.io/pod-group": "g"},
            "creationTimestamp": "2026-11-29T10:00:00Z"}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


GROUP = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 2}}


def test_shape_is_reused_until_a_pod_is_replaced_and_bad_specs_stay_reported() -> None:
    cache = ShapeCache()
    pods = {"ns/a": pod("a"), "ns/b": pod("b")}
    first = build(NODES, pods, {"ns/g": GROUP}, {}, 0.0, cache)
    shape = cache.entries["ns/g"][3]
    second = build(NODES, pods, {"ns/g": GROUP}, {}, 0.0, cache)
    assert cache.entries["ns/g"][3] is shape  # same objects: not derived again
    assert first.cluster.jobs["ns/g"] is not second.cluster.jobs["ns/g"]  # but each cycle gets its own Job

    # the informer replaces an updated object: the shape follows it
    pods["ns/a"] = bound = copy.deepcopy(pods["ns/a"])
    bound["spec"]["nodeName"] = "n0"
    third = build(NODES, pods, {"ns/g": GROUP}, {}, 0.0, cache)
    assert cache.entries["ns/g"][3] is not shape
    phases = sorted(r.phase for r in third.cluster.jobs["ns/g"].replicas)
    assert phases == [ReplicaPhase.BOUND, ReplicaPhase.PENDING]

    # a bad spec is explained on every cycle, cached or not
    pods["ns/b"] = pod("b", gpus="2")
    pods["ns/b"]["metadata"]["uid"] = "uid-b-recreated"
    for _ in range(2):
        snap = build(NODES, pods, {"ns/g": GROUP}, {}, 0.0, cache)
        assert "ask for different resources" in snap.problems["ns/g"]
        assert "ns/g" not in snap.cluster.jobs

    # a job that is gone leaves the cache
    build(NODES, {}, {}, {}, 0.0, cache)
    assert cache.entries == {}


def _ended(name: str, phase: str) -> dict[str, Any]:
    p = pod(name, node="n0")
    p["status"]["phase"] = phase
    return p


def test_members_that_ended_count_as_present_and_a_finished_gang_is_terminal() -> None:
    group = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 3}}
    # one member finished, one runs, one was re-created and waits: the gang is whole, not "waiting"
    pods = {"ns/a": _ended("a", "Succeeded"), "ns/b": pod("b", node="n0"), "ns/c": pod("c")}
    snap = build(NODES, pods, {"ns/g": group}, {}, 0.0)
    assert "ns/g" not in snap.waiting
    job = snap.cluster.jobs["ns/g"]
    assert job.gang_size == 2, "the ended member already satisfied its part of the minimum"
    counts = snap.counts["ns/g"]
    assert (counts.pending, counts.running, counts.succeeded, counts.failed) == (1, 1, 1, 0)
    assert counts.terminal_phase() is None

    # every member ended: no job for the core, a terminal phase with counts for the PodGroup
    pods = {"ns/a": _ended("a", "Succeeded"), "ns/b": _ended("b", "Succeeded"), "ns/c": _ended("c", "Failed")}
    snap = build(NODES, pods, {"ns/g": group}, {}, 0.0)
    assert "ns/g" not in snap.cluster.jobs and "ns/g" not in snap.waiting
    assert snap.counts["ns/g"].status() == {"running": 0, "succeeded": 2, "failed": 1}
    assert snap.counts["ns/g"].terminal_phase() == "Failed"
    assert snap.group_of["ns/g"] is group

    # still short of members that exist or existed: waiting, counted with the ended ones
    snap = build(NODES, {"ns/a": _ended("a", "Succeeded"), "ns/b": pod("b")}, {"ns/g": group}, {}, 0.0)
    assert snap.waiting["ns/g"] == "waiting for gang members: 2 of 3 pods exist"


def test_a_running_job_knows_when_it_started_so_young_jobs_are_protected() -> None:
    """Victim protection needs a start time: the later of the PodGroup's scheduledTime and its pods'
    first start (a PodGroup's time may be an earlier incarnation's), else the time it is first seen bound."""
    a, b = pod("a", node="n0"), pod("b", node="n0")
    b["status"]["startTime"] = "2026-11-29T10:05:00Z"
    group = {**GROUP, "status": {"scheduledTime": "2026-11-29T10:04:00Z"}}
    job = build(NODES, {"ns/a": a, "ns/b": b}, {"ns/g": group}, {}, 1e10).cluster.jobs["ns/g"]
    assert job.start_time == 1795946700.0  # 2026-11-29T10:05:00Z: the pod started after the group's time
    stale = {**GROUP, "status": {"scheduledTime": "2026-11-29T11:00:00Z"}}
    assert build(NODES, {"ns/a": a, "ns/b": b}, {"ns/g": stale}, {}, 1e10).cluster.jobs["ns/g"].start_time == \
        1795950000.0
    unseen = build(NODES, {"ns/a": pod("a", node="n0"), "ns/b": pod("b", node="n0")}, {"ns/g": GROUP}, {}, 123.0)
    assert unseen.cluster.jobs["ns/g"].start_time == 123.0
    waiting = build(NODES, {"ns/a": pod("a"), "ns/b": pod("b")}, {"ns/g": GROUP}, {}, 123.0)
    assert waiting.cluster.jobs["ns/g"].start_time is None


def test_a_gang_made_again_after_an_eviction_keeps_its_place_by_its_podgroups_creation() -> None:
    """Its operator makes new pods after the eviction; a job of the same queue that arrived while the gang
    ran waits behind it all the same, as in the trace replays. A pod without a PodGroup is a new job."""
    from scheduler.core.model import JobPhase
    from scheduler.core.scheduler import Scheduler

    def member(name: str, group: str, created: str) -> dict[str, Any]:
        p = pod(name, gpus="8")
        p["metadata"].update(labels={"kubeferry.io/pod-group": group}, creationTimestamp=created)
        return p

    def group(name: str, created: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
                "spec": {"minMember": 1, "queue": "team"}}

    pods = {"ns/back": member("back", "g", "2026-11-29T10:01:40Z"),  # the operator's new pod, after the eviction
            "ns/later": member("later", "h", "2026-11-29T10:00:30Z")}  # arrived while g ran
    groups = {"ns/g": group("g", "2026-11-29T09:00:00Z"), "ns/h": group("h", "2026-11-29T10:00:20Z")}
    queues = {"team": {"metadata": {"name": "team"}, "spec": {"guaranteed": {"gpu": "8"}}}}
    snap = build(NODES, pods, groups, queues, 1795946700.0)
    assert snap.cluster.jobs["ns/g"].submit_time == 1795942800.0  # 09:00:00Z, its PodGroup's creation
    assert snap.cluster.jobs["ns/h"].submit_time == 1795946420.0  # 10:00:20Z: the earlier of the two
    Scheduler(snap.cluster).cycle(1795946700.0)
    assert snap.cluster.jobs["ns/g"].phase is JobPhase.RUNNING and snap.cluster.jobs["ns/h"].phase is JobPhase.PENDING

    bare = pod("bare", gpus="8")
    del bare["metadata"]["labels"]
    alone = build(NODES, {"ns/bare": bare}, {}, queues, 1795946700.0)
    assert alone.cluster.jobs["ns/pod/bare"].submit_time == 1795946400.0  # its own creation, 10:00:00Z


def _queue(name: str, created: str, *namespaces: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": {"namespaces": list(namespaces)}}


def test_a_namespace_two_queues_list_belongs_to_the_older_whatever_the_listing_order() -> None:
    old, new = _queue("team-a", "2026-01-01T00:00:00Z", "a", "shared"), _queue("b", "2026-06-01T00:00:00Z", "shared")
    for order in ({"b": new, "team-a": old}, {"team-a": old, "b": new}):
        assert namespace_queues(order) == {"a": "team-a", "shared": "team-a"}
        assert namespace_conflicts(order) == {"b": {"shared": "team-a"}}
    [condition] = namespace_condition({"shared": "team-a"})
    assert condition["status"] == "False" and "shared (Queue team-a)" in condition["message"]
    assert namespace_condition({})[0]["status"] == "True"


def test_a_queue_asks_for_least_attained_service_under_preemption() -> None:
    spec = {"guaranteed": {"gpu": "8"}, "preemption": {"leastAttainedService": True}}
    assert build_queue({"metadata": {"name": "team"}, "spec": spec}).least_attained_service
    assert not build_queue({"metadata": {"name": "team"}, "spec": {}}).least_attained_service


def test_a_model_built_after_a_restart_knows_what_an_evicted_gang_received_from_its_podgroup() -> None:
    """Least attained service across a restart: the service writes :func:`evicted_status` (from the
    eviction decision) into the PodGroup, and a model built from the objects later orders the gang's next
    run by it. Without it the returning long runner would count as fresh and, being older, go first."""
    from scheduler.core.decisions import Evict
    from scheduler.core.model import JobPhase
    from scheduler.core.scheduler import PRESETS, Scheduler, SchedulerConfig

    t0 = 1795946400.0  # 2026-11-29T10:00:00Z
    evict = Evict("ns/g", "least-attained-service by ns/x", (("worker", 0, "n0"),), 8 * 7200.5, moved_at=t0 + 20)
    kept = evicted_status(evict.attained_gpu_s, t0 + 50.7, evict.moved_at)
    assert kept == {"attainedGpuSeconds": 57604.0, "lastEvictionTime": "2026-11-29T10:00:50Z",
                    "lastMoveTime": "2026-11-29T10:00:20Z"}  # an earlier move: consolidation's cooldown

    def member(name: str, group: str, created: str) -> dict[str, Any]:
        p = pod(name, gpus="8")
        p["metadata"].update(labels={"kubeferry.io/pod-group": group}, creationTimestamp=created)
        return p

    pods = {"ns/back": member("back", "g", "2026-11-29T10:01:40Z"),  # the operator's new pod, after the eviction
            "ns/fresh": member("fresh", "h", "2026-11-29T10:03:20Z")}  # a newcomer of the same queue
    queues = {"team": {"metadata": {"name": "team"},
                       "spec": {"guaranteed": {"gpu": "8"}, "preemption": {"leastAttainedService": True}}}}
    config = SchedulerConfig(plugins=(*PRESETS["ferry"]["plugins"], "las"), las_thresholds_gpu_s=(3600.0, 36000.0))

    def first_to_run(status: dict[str, Any]) -> tuple[str, Scheduler]:
        spec = {"minMember": 1, "queue": "team"}
        groups = {"ns/g": {"metadata": {"name": "g", "namespace": "ns"}, "spec": spec, "status": status},
                  "ns/h": {"metadata": {"name": "h", "namespace": "ns"}, "spec": spec}}
        snap = build(NODES, pods, groups, queues, t0 + 300)
        sched = Scheduler(snap.cluster, config)
        sched.cycle(t0 + 300)
        [running] = [n for n, j in snap.cluster.jobs.items() if j.phase is JobPhase.RUNNING]
        return running, sched

    running, sched = first_to_run({"phase": "Evicted", **kept})
    returned = sched.cluster.jobs["ns/g"]
    assert running == "ns/h" and returned.attained_gpu_s == 57604.0 and returned.stopped_at == t0 + 50
    assert returned.moved_at == t0 + 20
    assert returned.waiting_since == t0 + 100  # its wait: from its return (after the eviction), not from now
    assert first_to_run({"phase": "Evicted"})[0] == "ns/g"  # nothing kept: it counts as fresh, and is older


def test_a_model_built_after_a_restart_keeps_a_hold_and_recalls_the_job_on_loan_there() -> None:
    """reserve and lend-holds across a restart: the service keeps :func:`held_status` in the PodGroups, and a
    model built from them later keeps the waiting gang's hold (a newcomer goes there only on loan) and
    recalls the jobs on loan once the gang could start. Forgotten, the newcomer takes the node outright and
    the loan becomes an occupant the gang waits for, however long it runs."""
    from scheduler.core.decisions import NotifyWillEvict
    from scheduler.core.model import JobPhase
    from scheduler.core.scheduler import Scheduler, SchedulerConfig

    t0 = 1795946400.0  # 2026-11-29T10:00:00Z; the gang has waited an hour, past reservationAfterSeconds

    def member(name: str, gpus: str, node: str | None = None) -> dict[str, Any]:
        p = pod(name, gpus=gpus, node=node)
        p["metadata"].update(labels={"kubeferry.io/pod-group": name}, creationTimestamp="2026-11-29T09:00:00Z")
        return p

    def model(kept: bool) -> Scheduler:
        pods = {"ns/occupant": member("occupant", "4", "n0"), "ns/loan": member("loan", "2", "n0"),
                "ns/big": member("big", "8"), "ns/late": member("late", "2")}  # late: a 2-GPU newcomer
        status = {"big": {"heldNodes": ["n0"]}, "loan": {"onLoanFrom": ["ns/big"]}} if kept else {}
        phase = {"occupant": "Running", "loan": "Running", "big": "Pending", "late": "Pending"}
        groups = {f"ns/{n}": {"metadata": {"name": n, "namespace": "ns"}, "spec": {"minMember": 1},
                              "status": {"phase": p, **status.get(n, {})}} for n, p in phase.items()}
        snap = build(NODES, pods, groups, {}, t0)
        sched = Scheduler(snap.cluster, SchedulerConfig.preset("ferry"))
        sched.cycle(t0)
        return sched

    sched = model(kept=True)
    jobs = sched.cluster.jobs
    assert held_status(jobs["ns/big"]) == {"heldNodes": ["n0"], "onLoanFrom": None}
    assert held_status(jobs["ns/loan"]) == {"heldNodes": None, "onLoanFrom": ["ns/big"]}
    assert jobs["ns/late"].on_loan_from == ("ns/big",)  # the hold stands: the newcomer is only lent the node
    sched.finish("ns/occupant")
    notices = sched.cycle(t0 + 10).of(NotifyWillEvict)
    assert sorted((n.job, n.preemptor) for n in notices if isinstance(n, NotifyWillEvict)) == [
        ("ns/late", "ns/big"), ("ns/loan", "ns/big")]
    assert jobs["ns/big"].phase is JobPhase.PRIVILEGED

    forgot = model(kept=False)
    late = forgot.cluster.jobs["ns/late"]
    assert late.on_loan_from == () and late.phase is JobPhase.RUNNING  # on the node outright
    forgot.finish("ns/occupant")
    assert not forgot.cycle(t0 + 10).of(NotifyWillEvict)
    assert forgot.cluster.jobs["ns/big"].phase is JobPhase.PENDING


def test_a_queue_built_from_its_object_continues_the_usage_its_status_recorded() -> None:
    status = {"recentUsage": {"gpuSeconds": 5.5, "time": "2026-11-29T10:00:00Z"}}
    queue = build_queue({"metadata": {"name": "team"}, "spec": {}, "status": status})
    assert queue.recent_usage == 5500.0 and queue.usage_at == 1795946400.0
    fresh = build_queue({"metadata": {"name": "team"}, "spec": {}})
    assert fresh.recent_usage == 0.0 and fresh.usage_at is None


def test_a_pods_node_affinity_is_read_and_a_bad_operator_is_reported() -> None:
    a, b = pod("a"), pod("b")
    affinity = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100", "h100"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]}}
    for p in (a, b):
        p["spec"]["affinity"] = affinity
        p["metadata"]["uid"] += "-affinity"  # requests are memoised by pod uid and generation
    snap = build(NODES, {"ns/a": a, "ns/b": b}, {"ns/g": GROUP}, {}, 0.0, ShapeCache())
    request = snap.cluster.jobs["ns/g"].tasks[0].request
    assert request.affinity == ((NodeRequirement("gpu", SelectorOp.IN, ("a100", "h100")),),
                                (NodeRequirement("metadata.name", SelectorOp.NOT_IN, ("n9",), field=True),))
    assert request.preferred == ((1, (NodeRequirement("zone", SelectorOp.EXISTS),)),)

    bad = copy.deepcopy(affinity)
    bad["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]["operator"] = "Like"
    for p in (a, b):
        p["spec"]["affinity"] = bad
        p["metadata"]["uid"] += "-bad"
    snap = build(NODES, {"ns/a": a, "ns/b": b}, {"ns/g": GROUP}, {}, 0.0, ShapeCache())
    assert "operator 'Like' of 'gpu' is not one of In, NotIn" in snap.problems["ns/g"], snap.problems


def _member(name: str, role: str, terms: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """A pod of a job in role ``role`` with required pod (anti-)affinity ``terms`` (``kind``)."""
    p = pod(name)
    p["metadata"]["uid"] += f"-{kind}"
    p["metadata"]["labels"].update({"kubeferry.io/task": role, "app": "train", "role": role})
    if terms:
        p["spec"]["affinity"] = {kind: {"requiredDuringSchedulingIgnoredDuringExecution": terms}}
    return p


def test_a_jobs_pod_anti_affinity_among_its_own_pods_is_kept_apart_and_other_terms_are_not() -> None:
    member = partial(_member, kind="podAntiAffinity")

    workers = {"labelSelector": {"matchLabels": {"app": "train"},
                                 "matchExpressions": [{"key": "role", "operator": "In", "values": ["worker"]}]},
               "topologyKey": "kubernetes.io/hostname"}
    training = {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "zone"}
    database = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
    elsewhere = {**training, "namespaces": ["other"]}
    pods = {"ns/m": member("m", "master", [training]),
            "ns/w0": member("w0", "worker", [workers, database, elsewhere]),
            "ns/w1": member("w1", "worker", [workers, database, elsewhere])}
    group = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 3}}
    snap = build(NODES, pods, {"ns/g": group}, {}, 0.0, ShapeCache())
    tasks = snap.cluster.jobs["ns/g"].task_by_name
    master, worker = tasks["master"].request, tasks["worker"].request
    # the db term is about other pods, and the last term looks at another namespace
    assert {a.key for a in worker.apart} == {"kubernetes.io/hostname"}
    assert {a.key for a in master.apart} == {"zone"}
    (by_host,), (by_zone,) = worker.apart, master.apart
    assert worker.marks == {by_host.term, by_zone.term} and master.marks == {by_zone.term}
    assert not worker.together and not master.together


def test_a_jobs_pod_affinity_among_its_own_pods_keeps_them_together_and_other_terms_are_not_kept() -> None:
    member = partial(_member, kind="podAffinity")

    to_master = {"labelSelector": {"matchLabels": {"role": "master"}}, "topologyKey": "zone"}
    to_cache = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}
    pods = {"ns/m": member("m", "master", []),
            "ns/w0": member("w0", "worker", [to_master, to_cache]),
            "ns/w1": member("w1", "worker", [to_master, to_cache])}
    group = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 3}}
    snap = build(NODES, pods, {"ns/g": group}, {}, 0.0, ShapeCache())
    tasks = snap.cluster.jobs["ns/g"].task_by_name
    master, worker = tasks["master"].request, tasks["worker"].request
    (zone,) = worker.together  # the cache term is about other pods
    assert zone.key == "zone" and master.marks == {zone.term} and not worker.marks
    assert not master.together and not worker.apart


def test_a_jobs_preferred_pod_affinity_among_its_own_pods_is_a_preference_to_gather_them() -> None:
    team = {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "zone"}
    to_cache = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}
    pods = {}
    for name, role in (("m", "master"), ("w0", "worker"), ("w1", "worker")):
        p = _member(name, role, [], "gather")
        p["spec"]["affinity"] = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": team}, {"weight": 10, "podAffinityTerm": to_cache}],
            "requiredDuringSchedulingIgnoredDuringExecution": [team]}}
        pods[f"ns/{name}"] = p
    group = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 3}}
    snap = build(NODES, pods, {"ns/g": group}, {}, 0.0, ShapeCache())
    for task in snap.cluster.jobs["ns/g"].tasks:
        (gather,), (together,) = task.request.gather, task.request.together  # the cache term is about other pods
        assert gather.key == "zone" and gather.term != together.term  # the same term preferred and required
        assert task.request.marks == {gather.term, together.term}


def test_a_jobs_spread_constraints_among_its_own_pods_are_kept_and_soft_ones_are_not() -> None:
    hard = {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "train"}}, "matchLabelKeys": ["role"], "minDomains": 3}
    soft = {**hard, "whenUnsatisfiable": "ScheduleAnyway", "topologyKey": "rack"}
    pods = {}
    for name, role in (("m", "master"), ("w0", "worker"), ("w1", "worker")):
        p = _member(name, role, [], "spread")
        p["spec"]["topologySpreadConstraints"] = [hard, soft]
        pods[f"ns/{name}"] = p
    group = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 3}}
    snap = build(NODES, pods, {"ns/g": group}, {}, 0.0, ShapeCache())
    tasks = snap.cluster.jobs["ns/g"].task_by_name
    master, worker = tasks["master"].request, tasks["worker"].request
    (spread,), (by_master,) = worker.spread, master.spread
    assert (spread.key, spread.max_skew, spread.min_domains) == ("zone", 2, 3)
    # matchLabelKeys: each role's constraint counts the pods of its own role
    assert worker.marks == {spread.term} and master.marks == {by_master.term} and spread != by_master
    # other jobs' pods of the namespace count too (a Deployment's replicas): by the same selector
    assert spread.namespace == "ns" and spread.selects("ns", {"app": "train", "role": "worker"})
    assert not spread.selects("ns", {"app": "train", "role": "master"}) and not spread.selects("other", {
        "app": "train", "role": "worker"})


def test_pod_anti_affinity_with_any_job_is_read_with_the_namespaces_it_looks_at_and_the_pods_labels() -> None:
    member = partial(_member, kind="podAntiAffinity")
    database = {"labelSelector": {"matchLabels": {"app": "db"},
                                  "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["test"]}]},
                "topologyKey": "kubernetes.io/hostname"}
    listed = {**database, "namespaces": ["other", "ns"]}
    everywhere = {**database, "namespaceSelector": {}}
    by_label = {**database, "namespaceSelector": {"matchLabels": {"team": "x"}}}  # namespaces' labels: unknown
    selects_nothing = {"topologyKey": "kubernetes.io/hostname"}
    pods = {"ns/w0": member("w0", "worker", [database, listed, everywhere, by_label, selects_nothing])}
    snap = build(NODES, pods, {"ns/g": {**GROUP, "spec": {"minMember": 1}}}, {}, 0.0, ShapeCache())
    job = snap.cluster.jobs["ns/g"]
    assert job.namespace == "ns" and job.tasks[0].labels["app"] == "train"
    terms = {a.namespaces: a for a in job.tasks[0].request.avoid}
    assert set(terms) == {frozenset({"ns"}), frozenset({"other", "ns"}), None}
    own = terms[frozenset({"ns"})]
    assert own.selector == (NodeRequirement("app", SelectorOp.IN, ("db",)),
                            NodeRequirement("tier", SelectorOp.NOT_IN, ("test",)))
    assert own.selects("ns", {"app": "db"}) and not own.selects("ns", {"app": "db", "tier": "test"})
    assert not own.selects("other", {"app": "db"}) and terms[None].selects("other", {"app": "db"})


def test_a_pod_affinity_with_other_jobs_pods_is_read_as_near_and_one_its_own_job_meets_stays_the_gangs() -> None:
    member = partial(_member, kind="podAffinity")
    to_cache = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}
    together = {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "zone"}
    pods = {f"ns/w{i}": member(f"w{i}", "worker", [to_cache, together]) for i in range(2)}
    snap = build(NODES, pods, {"ns/g": GROUP}, {}, 0.0, ShapeCache())
    request = snap.cluster.jobs["ns/g"].tasks[0].request
    assert {t.key for t in request.together} == {"zone"}
    (near,) = request.near
    assert near.key == "kubernetes.io/hostname" and near.namespaces == frozenset({"ns"})
    assert near.selects("ns", {"app": "cache"}) and not near.selects("ns", {"app": "train"})


def test_a_task_whose_leader_states_more_terms_than_its_followers_keeps_them_whichever_pod_sorts_first() -> None:
    """JobSet's exclusive placement: only a Job's leader states the anti-affinity with other Jobs (its
    followers follow it into its rack); the gang's task keeps it, whatever the copies' names."""
    member = partial(_member, kind="podAntiAffinity")
    others = {"labelSelector": {"matchExpressions": [{"key": "job", "operator": "Exists"},
                                                     {"key": "job", "operator": "NotIn", "values": ["a"]}]},
              "topologyKey": "rack"}
    for leader, follower in (("a-0", "a-1"), ("b-1", "a-0")):  # the leader's name sorts first, then last
        pods = {f"ns/{leader}": member(leader, "worker", [others]), f"ns/{follower}": member(follower, "worker", [])}
        snap = build(NODES, pods, {"ns/g": {**GROUP, "spec": {"minMember": 2}}}, {}, 0.0, ShapeCache())
        (avoid,) = snap.cluster.jobs["ns/g"].tasks[0].request.avoid
        assert avoid.key == "rack" and avoid.selects("ns", {"job": "b"}) and not avoid.selects("ns", {"job": "a"})
