"""The scheduler service on the real compute cluster: gangs, reasons, fractional GPUs."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import eventually, queue_webhook_removed

GROUP, VERSION = "scheduling.kubeferry.io", "v1alpha1"


def pod(name: str, ns: str, *, gpus: int = 1, group: str | None = None, milli: int | None = None,
        duration: str | None = None, queue: str | None = None) -> dict[str, Any]:
    labels = {"kubeferry.io/pod-group": group} if group else {}
    annotations = {}
    if milli is not None:
        annotations["kubeferry.io/gpu-milli"] = str(milli)
    if duration:
        annotations["kubeferry.io/sim-duration"] = duration
    if queue:
        annotations["kubeferry.io/queue"] = queue
    limits = {"nvidia.com/gpu": str(gpus)} if milli is None else {}
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"schedulerName": "kube-ferry", "nodeSelector": {"ferry-test": ns}, "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "trainer", "resources": {"limits": limits}}]},
    }


async def _sa(core: client.CoreV1Api, ns: str) -> bool:
    return any(sa.metadata.name == "default" for sa in (await core.list_namespaced_service_account(ns)).items)


async def _gang_behind_a_blocker(core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str) -> None:
    """A 1-GPU pod bound on the test's 8-GPU node, then a gang of eight 1-GPU pods that cannot fit beside it."""
    await eventually(lambda: _sa(core, ns), timeout=30, what="default ServiceAccount")
    await core.create_namespaced_pod(ns, pod("blocker", ns))
    await eventually(lambda: _node_of(core, ns, "blocker"), timeout=30, what="blocker bound")
    await custom.create_namespaced_custom_object(GROUP, VERSION, ns, "podgroups", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "train"},
        "spec": {"minMember": 8}})
    for i in range(8):
        await core.create_namespaced_pod(ns, pod(f"train-{i}", ns, group="train"))


async def test_gang_waits_whole_then_binds_in_one_cycle(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    await _gang_behind_a_blocker(core, custom, compute_ns)

    async def pending_reason() -> str | None:
        pg = await custom.get_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", "train")
        conds = pg.get("status", {}).get("conditions", [])
        return next((c["message"] for c in conds if c["type"] == "Scheduled" and c["status"] == "False"
                     and c["reason"] == "Unschedulable"), None)

    message = await eventually(pending_reason, timeout=30, what="PodGroup Unschedulable condition")
    assert "gang of 8 replica(s) needs 8 GPUs all at once" in message

    async def told() -> bool:  # written beside the condition, not after it
        events = await core.list_namespaced_event(compute_ns, field_selector="involvedObject.name=train-0")
        return any(e.reason == "FailedScheduling" and "needs 8 GPUs" in e.message for e in events.items)

    await eventually(told, timeout=30, what="FailedScheduling Event on a gang member")
    pods = (await core.list_namespaced_pod(compute_ns, label_selector="kubeferry.io/pod-group=train")).items
    assert not any(p.spec.node_name for p in pods)  # nothing partially bound

    await core.delete_namespaced_pod("blocker", compute_ns, grace_period_seconds=0)

    async def all_bound() -> list[Any] | None:
        items = (await core.list_namespaced_pod(compute_ns, label_selector="kubeferry.io/pod-group=train")).items
        return items if all(p.spec.node_name for p in items) else None

    bound = await eventually(all_bound, timeout=30, what="all 8 bound")
    assert {p.spec.node_name for p in bound} == {private_node}
    devices = sorted(int(p.metadata.annotations["kubeferry.io/gpu-devices"]) for p in bound)
    assert devices == list(range(8))
    pg = await custom.get_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", "train")
    await eventually(lambda: _phase(custom, compute_ns), timeout=15, what="PodGroup Running")
    assert pg["metadata"]["name"] == "train"


async def test_a_waiting_pods_reason_said_again_counts_up_on_one_event(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    """kubectl describe shows a repeated reason as one Event with a count (as kube-scheduler's do), not a
    new Event each time the reason comes back."""
    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    await _gang_behind_a_blocker(core, custom, compute_ns)

    async def said(text: str, times: int) -> list[Any] | None:
        events = (await core.list_namespaced_event(compute_ns, field_selector="involvedObject.name=train-0")).items
        told = [e for e in events if e.reason == "FailedScheduling"]
        return told if any(text in e.message and (e.count or 1) >= times for e in told) else None

    await eventually(lambda: said("waiting for capacity", 1), timeout=30, what="train-0 told it waits for capacity")
    await core.patch_node(private_node, {"spec": {"unschedulable": True}})
    try:
        await eventually(lambda: said("cordoned", 1), timeout=30, what="train-0 told its node is cordoned")
    finally:
        await core.patch_node(private_node, {"spec": {"unschedulable": False}})
    told = await eventually(lambda: said("waiting for capacity", 2), timeout=30, what="capacity said again")
    assert sorted((e.message.split(":")[0], e.count) for e in told) == [
        ("waiting for a node", 1), ("waiting for capacity", 2)], [(e.message, e.count) for e in told]
    again = next(e for e in told if e.count == 2)
    assert again.last_timestamp >= again.first_timestamp


async def test_a_gang_starts_only_after_its_dependency_succeeded_and_a_failed_one_is_reported(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    groups = {"prep": [], "train": [{"name": "prep"}], "doomed": [], "after-doomed": [{"name": "doomed"}]}
    for name, deps in groups.items():
        await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"minMember": 1, **({"dependsOn": deps} if deps else {})}})
    await core.create_namespaced_pod(compute_ns, pod("prep-0", compute_ns, group="prep", duration="3s"))
    doomed = pod("doomed-0", compute_ns, group="doomed", duration="1s")
    doomed["metadata"]["annotations"]["kubeferry.io/sim-exit-code"] = "1"
    await core.create_namespaced_pod(compute_ns, doomed)
    for name in ("train", "after-doomed"):
        await core.create_namespaced_pod(compute_ns, pod(f"{name}-0", compute_ns, group=name))

    async def unschedulable(group: str, text: str) -> str | None:
        pg = await custom.get_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", group)
        conds = pg.get("status", {}).get("conditions", [])
        return next((c["message"] for c in conds if c["type"] == "Scheduled" and c["status"] == "False"
                     and text in c["message"]), None)

    await eventually(lambda: unschedulable("train", f"waiting for {compute_ns}/prep to succeed"), timeout=30,
                     what="train waiting for prep")
    assert await _node_of(core, compute_ns, "prep-0") == private_node  # capacity was there all along
    assert await _node_of(core, compute_ns, "train-0") is None
    assert await eventually(lambda: _node_of(core, compute_ns, "train-0"), timeout=60, what="train bound") == \
        private_node
    prep = await core.read_namespaced_pod("prep-0", compute_ns)
    assert prep.status.phase == "Succeeded"  # not before: train was bound after prep ended
    message = await eventually(lambda: unschedulable("after-doomed", "can never start"), timeout=60,
                               what="after-doomed reported as never startable")
    assert f"{compute_ns}/doomed failed" in message
    assert await _node_of(core, compute_ns, "after-doomed-0") is None


async def _phase(custom: client.CustomObjectsApi, ns: str) -> bool:
    pg = await custom.get_namespaced_custom_object(GROUP, VERSION, ns, "podgroups", "train")
    return bool(pg.get("status", {}).get("phase") == "Running")


async def _node_of(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    p = await core.read_namespaced_pod(name, ns)
    return p.spec.node_name  # type: ignore[no-any-return]


async def test_a_gang_whose_pods_are_made_again_keeps_its_place_by_its_podgroup(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    """An operator makes a gang's pods again after an eviction; its PodGroup is older than a job that
    arrived meanwhile, and the gang goes first when the node frees, as the trace replays assume."""
    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    await core.create_namespaced_pod(compute_ns, pod("blocker", compute_ns, gpus=8))
    await eventually(lambda: _node_of(core, compute_ns, "blocker"), timeout=30, what="blocker bound")

    async def group(name: str) -> float:
        made = await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"minMember": 1}})
        return datetime.fromisoformat(made["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()

    async def second_after(t: float) -> bool:  # creation times have whole seconds: the next one must differ
        return time.time() >= t + 1.0

    old = await group("old")  # the gang that ran before
    await eventually(lambda: second_after(old), timeout=5, what="a second after the old PodGroup")
    newer = await group("newer")
    await core.create_namespaced_pod(compute_ns, pod("newer-0", compute_ns, gpus=8, group="newer"))
    await eventually(lambda: second_after(newer), timeout=5, what="a second after the newer job")
    await core.create_namespaced_pod(compute_ns, pod("old-0", compute_ns, gpus=8, group="old"))  # made again
    await eventually(lambda: _reason_of(custom, compute_ns, "old"), timeout=30, what="the old gang told why it waits")

    await core.delete_namespaced_pod("blocker", compute_ns, grace_period_seconds=0)
    await eventually(lambda: _node_of(core, compute_ns, "old-0"), timeout=30, what="the old gang bound first")
    assert await _node_of(core, compute_ns, "newer-0") is None


async def test_four_quarter_gpu_pods_share_one_device(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core = client.CoreV1Api(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    for i in range(4):
        await core.create_namespaced_pod(compute_ns, pod(f"share-{i}", compute_ns, milli=250))

    async def placed() -> list[Any] | None:
        items = (await core.list_namespaced_pod(compute_ns)).items
        return items if len(items) == 4 and all(p.spec.node_name for p in items) else None

    items = await eventually(placed, timeout=30, what="four shares bound")
    devices = {p.metadata.annotations["kubeferry.io/gpu-devices"] for p in items}
    assert len(devices) == 1  # one device, never over-committed: 4 x 250 = 1000
    await core.create_namespaced_pod(compute_ns, pod("share-4", compute_ns, milli=250))
    p4 = await eventually(lambda: _node_of(core, compute_ns, "share-4"), timeout=30, what="fifth share bound")
    assert p4 == private_node
    fifth = (await core.read_namespaced_pod("share-4", compute_ns)).metadata.annotations["kubeferry.io/gpu-devices"]
    assert fifth not in devices
    imbalance = scheduler_metric(ferry_scheduler, "kube_ferry_node_imbalance_percent")
    assert imbalance is not None and 0 <= imbalance < 1000  # exported at most once a second (defined in the README)


def scheduler_metric(comp: Component, name: str, queue: str | None = None, rule: str | None = None) -> float | None:
    """A sample of the scheduler's /metrics (a queue's, and a rule's, if given), or None when it does not
    export it."""
    import re
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{comp.spec.ports[0]}/metrics", timeout=5).read().decode()
    # the exposition writes a sample's labels sorted by name
    parts = [f'{key}="{value}"' for key, value in sorted({"queue": queue, "rule": rule}.items()) if value is not None]
    labels = re.escape("{" + ",".join(parts) + "}") if parts else ""
    m = re.search(rf"^{re.escape(name)}{labels} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


async def test_missing_queue_is_explained_and_others_still_schedule(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core = client.CoreV1Api(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    bad = pod("lost", compute_ns)
    bad["metadata"]["annotations"]["kubeferry.io/queue"] = f"nope-{uuid.uuid4().hex[:4]}"
    await core.create_namespaced_pod(compute_ns, bad)
    await core.create_namespaced_pod(compute_ns, pod("fine", compute_ns))
    await eventually(lambda: _node_of(core, compute_ns, "fine"), timeout=30, what="other pod bound")

    async def explained() -> bool:
        events = (await core.list_namespaced_event(compute_ns, field_selector="involvedObject.name=lost")).items
        return any("does not exist" in e.message for e in events)

    await eventually(explained, timeout=30, what="event about the missing queue")
    assert (await core.read_namespaced_pod("lost", compute_ns)).spec.node_name is None
    await core.create_namespaced_pod(compute_ns, pod("huge", compute_ns, gpus=16))

    async def impossible() -> bool:
        events = (await core.list_namespaced_event(compute_ns, field_selector="involvedObject.name=huge")).items
        return any("cannot be scheduled: no node has 16 GPUs (the largest has 8)" in e.message for e in events)

    await eventually(impossible, timeout=30, what="event about the impossible request")


async def test_guaranteed_gang_preempts_elastic_job_after_its_grace(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    queue = f"q-{compute_ns}"
    await custom.create_cluster_custom_object(GROUP, VERSION, "queues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": queue},
        "spec": {"namespaces": [compute_ns], "guaranteed": {"gpu": "8"},
                 "preemption": {"victimGraceSeconds": 6}}})
    try:
        for name, tier in (("el", "Elastic"), ("g", "Guaranteed")):
            await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
                "spec": {"minMember": 8, "tier": tier, "queue": queue}})
        for i in range(8):
            await core.create_namespaced_pod(compute_ns, pod(f"el-{i}", compute_ns, group="el"))

        async def group_bound(group: str) -> list[Any] | None:
            items = (await core.list_namespaced_pod(compute_ns, label_selector=f"kubeferry.io/pod-group={group}")).items
            return items if len(items) == 8 and all(p.spec.node_name for p in items) else None

        await eventually(lambda: group_bound("el"), timeout=30, what="elastic job running")
        for i in range(8):
            await core.create_namespaced_pod(compute_ns, pod(f"g-{i}", compute_ns, group="g"))

        async def noticed() -> str | None:
            p = await core.read_namespaced_pod("el-0", compute_ns)
            return (p.metadata.annotations or {}).get("kubeferry.io/will-evict-at")

        deadline = await eventually(noticed, timeout=30, what="eviction notice on the victim")
        # counted by the rule that chose it (its own queue's guaranteed job: tier preemption) and its queue
        counted = scheduler_metric(ferry_scheduler, "kube_ferry_preemption_notices_total", queue, rule="preempt")
        assert counted is not None and counted >= 1, counted

        async def told() -> Any:  # the condition is written beside the annotation, not before it
            p = await core.read_namespaced_pod("el-0", compute_ns)
            cond = next((c for c in p.status.conditions or [] if c.type == "kubeferry.io/WillEvict"), None)
            return p if cond is not None and cond.status == "True" else None

        victim = await eventually(told, timeout=5, what="WillEvict condition on the victim")
        assert victim.metadata.deletion_timestamp is None  # not yet: it has its grace to checkpoint
        import datetime as dt

        await eventually(lambda: group_bound("g"), timeout=40, what="guaranteed gang bound")
        now = dt.datetime.now(dt.UTC)
        assert now >= dt.datetime.fromisoformat(deadline.replace("Z", "+00:00"))  # only after the deadline
        left = (await core.list_namespaced_pod(compute_ns, label_selector="kubeferry.io/pod-group=el")).items
        assert all(p.metadata.deletion_timestamp or not p.spec.node_name for p in left), \
            [(p.metadata.name, p.spec.node_name, p.metadata.deletion_timestamp) for p in left]

        async def told_both() -> bool:  # Preempted is written once the evictions were accepted
            events = await core.list_namespaced_event(compute_ns, field_selector="involvedObject.name=el-0")
            return {"Preempting", "Preempted"} <= {e.reason for e in events.items}

        await eventually(told_both, timeout=30, what="Preempting and Preempted Events on the victim")

        async def kept() -> dict[str, Any] | None:  # for its next run, under this scheduler or a restarted one
            status = (await custom.get_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", "el")
                      ).get("status") or {}
            return status if status.get("lastEvictionTime") else None

        status = await eventually(kept, timeout=10, what="the evicted gang's PodGroup keeps what it received")
        assert status["attainedGpuSeconds"] >= 8 * 6  # 8 GPUs, running at least through its 6 s of grace
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


@pytest.mark.faults
async def test_standby_takes_over_when_the_leader_dies(
    planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
    private_node: str
) -> None:
    import time

    core = client.CoreV1Api(compute_api)
    coord = client.CoordinationV1Api(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    standby = planes.components.get("kube-ferry-scheduler-standby") or planes.add_scheduler(
        name="kube-ferry-scheduler-standby", extra=("--min-runtime=0", "--leader-elect", "--identity=standby"))
    standby.start()
    standby.wait_ready()

    async def holder() -> str:
        lease = await coord.read_namespaced_lease("kube-ferry-scheduler", "kube-system")
        return str(lease.spec.holder_identity)

    leader = await holder()
    victim = ferry_scheduler if leader == "primary" else standby
    victim.kill()
    killed = time.monotonic()
    for i in range(4):
        await core.create_namespaced_pod(compute_ns, pod(f"after-{i}", compute_ns))

    async def all_bound() -> list[Any] | None:
        items = (await core.list_namespaced_pod(compute_ns)).items
        return items if len(items) == 4 and all(p.spec.node_name for p in items) else None

    items = await eventually(all_bound, timeout=30, what="pods bound by the new leader")
    took = time.monotonic() - killed
    assert took <= 15, f"takeover took {took:.1f} s"
    assert await holder() != leader
    devices = sorted(p.metadata.annotations["kubeferry.io/gpu-devices"] for p in items)
    assert len(set(devices)) == 4  # four different GPUs: nothing placed twice
    victim.start()  # back as the standby
    victim.wait_ready()


async def test_invalid_specs_are_rejected_by_the_api_server(ferry_scheduler: Component, compute_api: client.ApiClient,
                                                            compute_ns: str) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    custom = client.CustomObjectsApi(compute_api)
    with pytest.raises(ApiException) as bad_group:
        await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "bad"},
            "spec": {"minMember": 0}})
    assert bad_group.value.status == 422
    assert "spec.minMember" in bad_group.value.body
    with pytest.raises(ApiException) as bad_queue:
        await custom.create_cluster_custom_object(GROUP, VERSION, "queues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": f"bad-{compute_ns}"},
            "spec": {"guaranteed": {"gpu": "8"}, "max": {"gpu": "4"}}})
    assert bad_queue.value.status == 422
    assert "spec.max.gpu must be at least spec.guaranteed.gpu" in bad_queue.value.body


async def test_multi_gpu_pod_gets_linked_gpus(ferry_scheduler: Component, compute_api: client.ApiClient,
                                              compute_ns: str, private_node: str) -> None:
    core = client.CoreV1Api(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    await core.create_namespaced_pod(compute_ns, pod("one", compute_ns, gpus=1))
    await eventually(lambda: _node_of(core, compute_ns, "one"), timeout=30, what="one bound")
    await core.create_namespaced_pod(compute_ns, pod("four", compute_ns, gpus=4))
    await eventually(lambda: _node_of(core, compute_ns, "four"), timeout=30, what="four bound")
    four = await core.read_namespaced_pod("four", compute_ns)
    devices = sorted(int(d) for d in four.metadata.annotations["kubeferry.io/gpu-devices"].split(","))
    assert devices in ([0, 1, 2, 3], [4, 5, 6, 7])  # one NVLink group of the node's topology
    one = await core.read_namespaced_pod("one", compute_ns)
    assert one.metadata.annotations["kubeferry.io/gpu-devices"] not in map(str, devices)


async def test_partly_bound_gang_is_completed(ferry_scheduler: Component, compute_api: client.ApiClient,
                                              compute_ns: str, private_node: str) -> None:
    """As after a restart in the middle of binding a gang: the members left unbound follow at once."""
    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    for i in range(2):  # bound by hand, as a crashed scheduler would have left them
        body = pod(f"m-{i}", compute_ns, group="m")
        body["spec"]["nodeName"] = private_node
        body["metadata"]["annotations"]["kubeferry.io/gpu-devices"] = str(i)
        await core.create_namespaced_pod(compute_ns, body)
    for i in range(2, 4):
        await core.create_namespaced_pod(compute_ns, pod(f"m-{i}", compute_ns, group="m"))
    await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "m"}, "spec": {"minMember": 4}})

    async def all_bound() -> list[Any] | None:
        items = (await core.list_namespaced_pod(compute_ns)).items
        return items if len(items) == 4 and all(p.spec.node_name for p in items) else None

    items = await eventually(all_bound, timeout=15, what="rest of the gang bound")
    devices = [p.metadata.annotations["kubeferry.io/gpu-devices"] for p in items]
    assert sorted(devices) == ["0", "1", "2", "3"]  # the hand-bound devices were respected


async def test_reclaim_returns_a_guarantee_whole_jobs_elastic_first(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    qa, qb = f"a-{compute_ns}", f"b-{compute_ns}"
    for q in (qa, qb):
        await custom.create_cluster_custom_object(GROUP, VERSION, "queues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": q},
            "spec": {"guaranteed": {"gpu": "4"}, "preemption": {"victimGraceSeconds": 3}}})
    try:
        # tenant a fills the idle node: a guaranteed 2-GPU job, then two elastic 3-GPU jobs borrow b's share
        specs = [("a-g", qa, "Guaranteed", 2), ("a-e1", qa, "Elastic", 3), ("a-e2", qa, "Elastic", 3)]
        for name, q, tier, n in specs:
            await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
                "spec": {"minMember": n, "tier": tier, "queue": q}})
            for i in range(n):
                await core.create_namespaced_pod(compute_ns, pod(f"{name}-{i}", compute_ns, group=name))

        async def bound(group: str, n: int) -> bool:
            items = (await core.list_namespaced_pod(compute_ns, label_selector=f"kubeferry.io/pod-group={group}")).items
            live = [p for p in items if p.spec.node_name and not p.metadata.deletion_timestamp]
            return len(live) == n

        for name, _, _, n in specs:
            await eventually(lambda name=name, n=n: bound(name, n), timeout=30, what=f"{name} running")
        await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "b-g"},
            "spec": {"minMember": 3, "queue": qb}})
        for i in range(3):
            await core.create_namespaced_pod(compute_ns, pod(f"b-g-{i}", compute_ns, group="b-g"))
        await eventually(lambda: bound("b-g", 3), timeout=40, what="b's job running after reclaim")

        async def queue_status() -> dict[str, Any] | None:
            q = await custom.get_cluster_custom_object(GROUP, VERSION, "queues", qb)
            st: dict[str, Any] = q.get("status", {})
            return st if st.get("allocated", {}).get("gpu") == "3" else None

        st = await eventually(queue_status, timeout=15, what="queue status shows b's allocation")
        assert st["runningJobs"] == 1
        assert st["borrowed"]["gpu"] == "0"
        # whole elastic jobs went (one was enough for 3 GPUs); a's guaranteed job was never touched
        assert await bound("a-g", 2)
        survivors = [await bound("a-e1", 3), await bound("a-e2", 3)]
        assert survivors.count(True) == 1
    finally:
        for q in (qa, qb):
            await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", q)


async def test_a_team_borrows_its_departments_idle_guarantee_before_other_queues(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    dept, team, idle, other, orphan = (f"{x}-{compute_ns}" for x in ("dept", "team", "idle", "other", "orphan"))
    specs: list[tuple[str, dict[str, Any]]] = [
        (dept, {"guaranteed": {"gpu": "8"}}), (team, {"parent": dept, "guaranteed": {"gpu": "4"}}),
        (idle, {"parent": dept, "guaranteed": {"gpu": "4"}}), (other, {"weight": 10}),
        (orphan, {"parent": f"gone-{compute_ns}"})]
    with pytest.raises(client.ApiException) as refused:  # the API server refuses the one loop it can see
        await custom.create_cluster_custom_object(GROUP, VERSION, "queues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": f"self-{compute_ns}"},
            "spec": {"parent": f"self-{compute_ns}"}})
    assert refused.value.status == 422 and "a queue cannot be its own parent" in refused.value.body
    for name, spec in specs[:-1]:
        await custom.create_cluster_custom_object(GROUP, VERSION, "queues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": name}, "spec": spec})
    async with queue_webhook_removed(compute_api):  # which refuses the orphan (test_queue_webhook.py)
        async def orphan_written() -> bool:  # once the API server no longer calls the webhook
            try:
                await custom.create_cluster_custom_object(GROUP, VERSION, "queues", {
                    "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": orphan},
                    "spec": specs[-1][1]})
            except client.ApiException as exc:
                if "denied the request" not in str(exc.body):
                    raise
                return False
            return True

        await eventually(orphan_written, timeout=30, what="the orphan written past the webhook")
    try:
        async def parent_condition(name: str) -> dict[str, Any] | None:
            q = await custom.get_cluster_custom_object(GROUP, VERSION, "queues", name)
            conds = (q.get("status") or {}).get("conditions") or []
            return next((c for c in conds if c["type"] == "ParentAccepted"), None)

        cond = await eventually(lambda: parent_condition(orphan), timeout=30, what="orphan's ParentAccepted")
        assert cond["status"] == "False" and f"parent queue 'gone-{compute_ns}' does not exist" in cond["message"]
        assert (await eventually(lambda: parent_condition(team), timeout=30, what="team's"))["status"] == "True"
        for name, q, n in (("team-run", team, 4), ("other-run", other, 2)):
            await _make_group(core, custom, compute_ns, name, n, "Guaranteed", q)
            await eventually(lambda name=name, n=n: _running(core, compute_ns, name, n), timeout=30,
                             what=f"{name} running")
        # two contenders for the last 2 GPUs, seen in one cycle: the node is cordoned while they arrive
        await core.patch_node(private_node, {"spec": {"unschedulable": True}})
        try:
            # Node and pod events come by separate watches: the contenders arrive once a probe of the node is
            # told that it is cordoned, so the scheduler has seen the cordon (else it may place the first).
            await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "probe"},
                "spec": {"minMember": 1, "queue": team}})
            await core.create_namespaced_pod(compute_ns, pod("probe-0", compute_ns, gpus=2, group="probe"))
            await eventually(lambda: _told(custom, compute_ns, "probe", "is cordoned"), timeout=30,
                             what="a probe told the node is cordoned")
            await core.delete_namespaced_pod("probe-0", compute_ns, grace_period_seconds=0)
            await custom.delete_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", "probe")
            for name, q in (("other-more", other), ("team-more", team), ("other-later", other)):
                await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
                    "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
                    "spec": {"minMember": 1, "queue": q}})
                await core.create_namespaced_pod(compute_ns, pod(f"{name}-0", compute_ns, gpus=2, group=name))
            told = [await eventually(lambda name=name: _reason_of(custom, compute_ns, name), timeout=30,
                                     what=f"{name} considered") for name in ("other-more", "team-more")]
            # the one passed over behind the first like it is told too; none is called impossible for a cordon
            told.append(await eventually(lambda: _reason_of(custom, compute_ns, "other-later"), timeout=30,
                                         what="other-later told why"))
            assert all(t.startswith("waiting for a node: no node matches the node selector")
                       and "1 node that could is cordoned" in t for t in told), "\n".join(told)
        finally:
            await core.patch_node(private_node, {"spec": {"unschedulable": False}})
        await eventually(lambda: _running(core, compute_ns, "team-more", 1), timeout=30, what="team-more running")
        # by weight alone the other queue (2 GPUs at weight 10) would have come first; the department's
        # idle guarantee is lent inside the department first
        assert not await _running(core, compute_ns, "other-more", 1)
    finally:
        for name, _ in reversed(specs):  # children first: the webhook refuses a parent before them
            await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", name)


async def _told(custom: client.CustomObjectsApi, ns: str, group: str, words: str) -> str | None:
    reason = await _reason_of(custom, ns, group)
    return reason if reason is not None and words in reason else None


async def _reason_of(custom: client.CustomObjectsApi, ns: str, group: str) -> str | None:
    pg = await custom.get_namespaced_custom_object(GROUP, VERSION, ns, "podgroups", group)
    conds = (pg.get("status") or {}).get("conditions") or []
    return next((c["message"] for c in conds if c["type"] == "Scheduled" and c["status"] == "False"), None)


async def _make_queue(custom: client.CustomObjectsApi, name: str, ns: str, **preemption: Any) -> None:
    await custom.create_cluster_custom_object(GROUP, VERSION, "queues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": name},
        "spec": {"namespaces": [ns], "guaranteed": {"gpu": "8"}, "preemption": preemption}})


async def _make_group(core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str, name: str, n: int,
                      tier: str, queue: str) -> None:
    await custom.create_namespaced_custom_object(GROUP, VERSION, ns, "podgroups", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
        "spec": {"minMember": n, "tier": tier, "queue": queue}})
    for i in range(n):
        await core.create_namespaced_pod(ns, pod(f"{name}-{i}", ns, group=name))


async def fill_then_preempt(core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str, queue: str) -> None:
    """The private node full (an elastic and a guaranteed job of 4), then a guaranteed job of 4 more:
    it can only run by preempting the elastic one."""
    await _make_group(core, custom, ns, "el", 4, "Elastic", queue)
    await _make_group(core, custom, ns, "f", 4, "Guaranteed", queue)
    for g in ("el", "f"):
        await eventually(lambda g=g: _running(core, ns, g, 4), timeout=30, what=f"{g} running")
    await _make_group(core, custom, ns, "g", 4, "Guaranteed", queue)


async def _running(core: client.CoreV1Api, ns: str, group: str, n: int) -> bool:
    items = (await core.list_namespaced_pod(ns, label_selector=f"kubeferry.io/pod-group={group}")).items
    return len([p for p in items if p.spec.node_name and not p.metadata.deletion_timestamp]) == n


async def test_pending_eviction_is_cancelled_when_capacity_frees_up(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    queue = f"c-{compute_ns}"
    await _make_queue(custom, queue, compute_ns, victimGraceSeconds=60)
    try:
        await fill_then_preempt(core, custom, compute_ns, queue)

        async def notice() -> str | None:
            p = await core.read_namespaced_pod("el-0", compute_ns)
            return (p.metadata.annotations or {}).get("kubeferry.io/will-evict-at")

        await eventually(notice, timeout=30, what="eviction notice")
        for i in range(4):  # capacity frees up before the deadline
            await core.delete_namespaced_pod(f"f-{i}", compute_ns, grace_period_seconds=0)
        await eventually(lambda: _running(core, compute_ns, "g", 4), timeout=30, what="preemptor running")

        async def cancelled() -> bool:
            p = await core.read_namespaced_pod("el-0", compute_ns)
            conds = {c.type: c for c in p.status.conditions or []}
            c = conds.get("kubeferry.io/WillEvict")
            return bool(c and c.status == "False" and c.reason == "EvictionCancelled"
                        and "kubeferry.io/will-evict-at" not in (p.metadata.annotations or {}))

        await eventually(cancelled, timeout=30, what="eviction cancelled")
        assert await _running(core, compute_ns, "el", 4)
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def test_a_queue_without_the_right_does_not_preempt(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    queue = f"n-{compute_ns}"
    await _make_queue(custom, queue, compute_ns, preemptOwnElastic=False, victimGraceSeconds=1)
    try:
        await _make_group(core, custom, compute_ns, "el", 8, "Elastic", queue)
        await eventually(lambda: _running(core, compute_ns, "el", 8), timeout=30, what="elastic running")
        await _make_group(core, custom, compute_ns, "g", 4, "Guaranteed", queue)

        async def explained() -> bool:
            pg = await custom.get_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", "g")
            conds = pg.get("status", {}).get("conditions", [])
            return any(c.get("reason") == "Unschedulable" for c in conds)

        await eventually(explained, timeout=30, what="preemptor explained as unschedulable")
        p = await core.read_namespaced_pod("el-0", compute_ns)
        assert "kubeferry.io/will-evict-at" not in (p.metadata.annotations or {})
        assert await _running(core, compute_ns, "el", 8)
        assert not await _running(core, compute_ns, "g", 4)
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def test_elastic_job_is_shrunk_before_anyone_is_killed(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    queue = f"s-{compute_ns}"
    await _make_queue(custom, queue, compute_ns, victimGraceSeconds=60)
    try:
        await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "el"},
            "spec": {"minMember": 2, "tier": "Elastic", "queue": queue, "elastic": {"min": 2, "max": 6}}})
        for i in range(6):
            await core.create_namespaced_pod(compute_ns, pod(f"el-{i}", compute_ns, group="el"))
        await eventually(lambda: _running(core, compute_ns, "el", 6), timeout=30, what="elastic job at 6")
        await _make_group(core, custom, compute_ns, "g", 4, "Guaranteed", queue)
        await eventually(lambda: _running(core, compute_ns, "g", 4), timeout=30, what="guaranteed job running")
        # shrunk by two, still above its minimum (the evictions and the bindings are written concurrently)
        await eventually(lambda: _running(core, compute_ns, "el", 4), timeout=30, what="elastic job shrunk to 4")
        left = (await core.list_namespaced_pod(compute_ns, label_selector="kubeferry.io/pod-group=el")).items
        alive = sorted(p.metadata.name for p in left if not p.metadata.deletion_timestamp)
        assert alive == ["el-0", "el-1", "el-2", "el-3"]  # the newest replicas went
        for p in left:
            assert "kubeferry.io/will-evict-at" not in (p.metadata.annotations or {})  # no whole job was told to go
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def test_a_gang_lands_in_one_topology_domain(ferry_scheduler: Component, compute_api: client.ApiClient,
                                                   compute_ns: str) -> None:
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "wide"},
        "spec": {"minMember": 3}})
    for i in range(3):
        body = pod(f"wide-{i}", compute_ns, gpus=8, group="wide", duration="20s")
        del body["spec"]["nodeSelector"]
        await core.create_namespaced_pod(compute_ns, body)

    async def placed() -> list[Any] | None:
        items = (await core.list_namespaced_pod(compute_ns)).items
        return items if len(items) == 3 and all(p.spec.node_name for p in items) else None

    items = await eventually(placed, timeout=30, what="gang of three 8-GPU pods bound")
    nodes = [await core.read_node(p.spec.node_name) for p in items]
    assert len({n.metadata.name for n in nodes}) == 3
    assert len({n.metadata.labels["kubeferry.io/topology-domain"] for n in nodes}) == 1


@pytest.mark.faults
async def test_killing_the_only_replica_mid_gang_binding_leaves_no_partial_gang(
        ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str) -> None:
    """SIGKILL the scheduler the moment the first member of a 64-pod gang is bound; after the restart the
    gang is completed in its first cycles (the bound members are adopted, never bound twice). (32 pods
    were all bound before the kill landed once the scheduler got faster.)"""
    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    size = 64
    nodes = sorted(n.metadata.name for n in (await core.list_node(label_selector="type=kwok,!ferry-test")).items)[:8]
    for n in nodes:  # the gang's own 8 nodes × 8 GPUs (pods select label ferry-test=<namespace>)
        await core.patch_node(n, {"metadata": {"labels": {"ferry-test": compute_ns}}})
    try:
        await _kill_mid_binding(ferry_scheduler, core, custom, compute_api, compute_ns, size)
    finally:
        for n in nodes:
            await core.patch_node(n, {"metadata": {"labels": {"ferry-test": None}}})


async def _kill_mid_binding(ferry_scheduler: Component, core: client.CoreV1Api, custom: client.CustomObjectsApi,
                            compute_api: client.ApiClient, compute_ns: str, size: int) -> None:
    import time

    from ferry.kube.informer import Informer
    from ferry.kube.rest import Rest, path

    partial_seen: list[int] = []
    for attempt in range(5):
        group = f"big-{attempt}"
        await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": group},
            "spec": {"minMember": size}})
        killed = asyncio.Event()

        def on_pod(_kind: str, obj: dict[str, Any], group: str = group, killed: asyncio.Event = killed) -> None:
            if not killed.is_set() and obj["metadata"].get("labels", {}).get("kubeferry.io/pod-group") == group \
                    and obj.get("spec", {}).get("nodeName"):
                ferry_scheduler.kill()  # SIGKILL: bindings still in flight are cut off
                killed.set()

        watcher = Informer("test-pods", Rest(compute_api).lister(path("", "v1", "pods", compute_ns)), on_pod)
        watch = asyncio.create_task(watcher.run())
        await watcher.synced.wait()
        for i in range(size):
            await core.create_namespaced_pod(compute_ns, pod(f"{group}-{i}", compute_ns, group=group))
        await asyncio.wait_for(killed.wait(), 60)
        watch.cancel()

        async def bound(group: str = group) -> int:
            items = (await core.list_namespaced_pod(compute_ns, label_selector=f"kubeferry.io/pod-group={group}")).items
            return sum(1 for p in items if p.spec.node_name)

        at_kill = await bound()
        ferry_scheduler.start()
        ferry_scheduler.wait_ready()
        t0 = time.monotonic()
        await eventually(lambda: _all_bound(bound, size), timeout=10, what="gang completed after the restart")
        print(f"\nattempt {attempt}: {at_kill}/{size} bound at the kill, all {size} bound "
              f"{time.monotonic() - t0:.1f} s after the restarted scheduler was ready")
        await core.delete_collection_namespaced_pod(compute_ns, label_selector=f"kubeferry.io/pod-group={group}",
                                                    grace_period_seconds=0)
        if 0 < at_kill < size:
            partial_seen.append(at_kill)
            break
    assert partial_seen, "the kill never landed between the first and the last binding of a gang"


async def _all_bound(bound: Any, size: int) -> bool:
    return bool(await bound() == size)


async def test_a_queues_status_is_written_at_most_once_a_second_however_fast_it_changes(
        ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str) -> None:
    """Pods arriving faster than cycles move a Queue's pending numbers every cycle; its status is still
    written at most once per QUEUE_STATUS_EVERY_S, and ends with the latest numbers."""
    from ferry.kube.informer import Informer
    from ferry.kube.rest import Rest, path
    from scheduler.service.service import QUEUE_STATUS_EVERY_S

    core = client.CoreV1Api(compute_api)
    custom = client.CustomObjectsApi(compute_api)
    queue = f"q-{compute_ns}"
    await custom.create_cluster_custom_object(GROUP, VERSION, "queues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": queue},
        "spec": {"namespaces": [compute_ns]}})
    writes: list[float] = []

    def seen(kind: str, obj: dict[str, Any]) -> None:
        if kind == "MODIFIED" and obj.get("status"):
            writes.append(time.monotonic())

    watch = Informer("test-queue", Rest(compute_api).lister(
        path(GROUP, VERSION, "queues"), fieldSelector=f"metadata.name={queue}"), seen)
    task = asyncio.create_task(watch.run())
    try:
        await watch.synced.wait()
        await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
        t0 = time.monotonic()
        n = 40
        for i in range(n):  # no node carries the pods' selector: each stays pending, one more per create
            await core.create_namespaced_pod(compute_ns, pod(f"p-{i}", compute_ns))

        async def all_pending() -> bool:
            q = await custom.get_cluster_custom_object(GROUP, VERSION, "queues", queue)
            return bool((q.get("status") or {}).get("pendingJobs") == n)

        await eventually(all_pending, timeout=30, what=f"the Queue's status counting {n} pending jobs")
        elapsed = time.monotonic() - t0
        during = [t for t in writes if t >= t0]
        assert len(during) <= elapsed / QUEUE_STATUS_EVERY_S + 2, (len(during), round(elapsed, 1))
    finally:
        task.cancel()
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def test_a_wait_for_first_consumer_claim_is_told_the_node_its_pod_is_bound_to(
    ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str, private_node: str
) -> None:
    """What kube-scheduler's volume binding does and a scheduler must: the provisioner of a WaitForFirstConsumer
    class waits for the claim to name the node of its first pod. A claim of an Immediate class is left alone."""
    core, storage = client.CoreV1Api(compute_api), client.StorageV1Api(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    classes = {f"first-{compute_ns}": "WaitForFirstConsumer", f"now-{compute_ns}": "Immediate"}
    for name, mode in classes.items():
        await storage.create_storage_class({"metadata": {"name": name}, "provisioner": "example.com/none",
                                            "volumeBindingMode": mode})
    try:
        body = pod("trainer", compute_ns)
        body["spec"]["volumes"] = []
        for claim, cls in zip(("ckpt", "data"), classes, strict=True):
            await core.create_namespaced_persistent_volume_claim(compute_ns, {"metadata": {"name": claim}, "spec": {
                "storageClassName": cls, "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}})
            body["spec"]["volumes"].append({"name": claim, "persistentVolumeClaim": {"claimName": claim}})
        await core.create_namespaced_pod(compute_ns, body)
        node = await eventually(lambda: _node_of(core, compute_ns, "trainer"), timeout=30, what="trainer bound")
        ckpt = await core.read_namespaced_persistent_volume_claim("ckpt", compute_ns)
        assert ckpt.metadata.annotations["volume.kubernetes.io/selected-node"] == node == private_node
        data = await core.read_namespaced_persistent_volume_claim("data", compute_ns)
        assert "volume.kubernetes.io/selected-node" not in (data.metadata.annotations or {})
    finally:
        for name in classes:
            await storage.delete_storage_class(name)
