"""Gangs through the bridge from first member to last: judged on every member whatever its phase,
terminal with counts on both sides when the job ends, one identity per incarnation of a tenant group."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.cluster.process import Component
from ferry.demo import objects
from ferry.keys import EARLIER_RUN_ANNOTATION, UPSTREAM_CONTROLLER_LABEL
from tests.helpers import (
    compute_copies,
    eventually,
    guarantee_claiming,
    replacements,
    reserved_node,
    running_pods,
    vnode_metrics,
)
from vnode import naming
from vnode.pods import SETTLE_BOUND_S

pytestmark = pytest.mark.usefixtures("vnodes")
FERRY = ("scheduling.kubeferry.io", "v1alpha1")
VOLCANO = ("scheduling.volcano.sh", "v1beta1")
PLUGINS = ("scheduling.x-k8s.io", "v1alpha1")


def member(name: str, convention: str, group: str, duration: str = "3s") -> dict[str, Any]:
    """A gang member as an unmodified operator writes it (no toleration; the vnode binds it)."""
    annotations = {"kubeferry.io/sim-duration": duration}
    labels: dict[str, str] = {}
    if convention == "volcano":
        annotations["scheduling.k8s.io/group-name"] = group
        scheduler = "volcano"
    else:
        labels["scheduling.x-k8s.io/pod-group"] = group
        scheduler = "scheduler-plugins"
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"schedulerName": scheduler, "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "containers": [{"name": "w", "image": "trainer:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def tenant_group(api: client.ApiClient, crd: tuple[str, str], ns: str, name: str, min_member: int) -> Any:
    return await client.CustomObjectsApi(api).create_namespaced_custom_object(
        *crd, ns, "podgroups", {"apiVersion": "/".join(crd), "kind": "PodGroup", "metadata": {"name": name},
                                "spec": {"minMember": min_member}})


async def _compute_pod_of(compute: client.ApiClient, tenant_uid: str) -> Any:
    pods = (await client.CoreV1Api(compute).list_namespaced_pod(
        "tenant-1", label_selector=f"{naming.UPSTREAM_UID_LABEL}={tenant_uid}")).items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


async def compute_groups(compute: client.ApiClient, tenant_ns: str) -> list[Any]:
    groups = await client.CustomObjectsApi(compute).list_namespaced_custom_object(*FERRY, "tenant-1", "podgroups")
    return [g for g in groups["items"] if g["metadata"]["labels"].get(naming.UPSTREAM_NS_LABEL) == tenant_ns]


async def status_of(api: client.ApiClient, crd: tuple[str, str], ns: str, name: str) -> dict[str, Any]:
    obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(*crd, ns, "podgroups", name)
    return dict(obj.get("status") or {})


def _ts(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else 0.0


async def _first_start(compute: client.ApiClient, tenant_ns: str) -> float | None:
    pods = (await client.CoreV1Api(compute).list_namespaced_pod(
        "tenant-1", label_selector=f"{naming.UPSTREAM_NS_LABEL}={tenant_ns}")).items
    starts = [_ts(p.status.start_time) for p in pods if p.status.start_time]
    return min(starts) if starts else None


async def _waiting_events(compute: client.ApiClient, tenant_ns: str) -> list[Any]:
    pods = (await client.CoreV1Api(compute).list_namespaced_pod(
        "tenant-1", label_selector=f"{naming.UPSTREAM_NS_LABEL}={tenant_ns}")).items
    names = {p.metadata.name for p in pods}
    events = (await client.CoreV1Api(compute).list_namespaced_event("tenant-1")).items
    return [e for e in events if e.involved_object.name in names and e.reason == "Waiting"]


@pytest.mark.parametrize(("convention", "crd", "done"), [("volcano", VOLCANO, "Completed"),
                                                           ("scheduler-plugins", PLUGINS, "Finished")])
async def test_a_finished_gang_is_terminal_on_both_sides_with_counts(
        convention: str, crd: tuple[str, str], done: str, tenant_api: client.ApiClient,
        compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    await tenant_group(tenant_api, crd, tenant_ns, "job", 4)
    for i in range(4):
        await core.create_namespaced_pod(tenant_ns, member(f"job-w-{i}", convention, "job"))

    async def finished() -> dict[str, Any] | None:
        st = await status_of(tenant_api, crd, tenant_ns, "job")
        return st if st.get("phase") == done else None

    st = await eventually(finished, timeout=60, what=f"tenant PodGroup {done}")
    assert st.get("succeeded") == 4 and not st.get("running") and not st.get("failed"), st
    (group,) = await compute_groups(compute_api, tenant_ns)
    cst = group["status"]
    assert cst["phase"] == "Succeeded" and cst["succeeded"] == 4 and cst["running"] == 0 and cst["failed"] == 0
    assert not any(c["reason"] == "Waiting" for c in cst.get("conditions", [])), cst
    started = await _first_start(compute_api, tenant_ns)
    assert started is not None
    late = [e for e in await _waiting_events(compute_api, tenant_ns) if _ts(e.last_timestamp) > started + 1]
    assert not late, f"Waiting events after the first member started: {[e.message for e in late]}"


async def test_launcher_and_workers_gang_completes(tenant_api: client.ApiClient, compute_api: client.ApiClient,
                                                   tenant_ns: str) -> None:
    """A training operator's usual shape: a launcher made by a batch Job plus workers made by the
    operator, all with the Volcano group marker, minMember 5."""
    core = client.CoreV1Api(tenant_api)
    await tenant_group(tenant_api, VOLCANO, tenant_ns, "mpi", 5)
    for i in range(4):
        await core.create_namespaced_pod(tenant_ns, member(f"mpi-worker-{i}", "volcano", "mpi", duration="4s"))
    launcher = member("unused", "volcano", "mpi", duration="2s")
    await client.BatchV1Api(tenant_api).create_namespaced_job(tenant_ns, {
        "metadata": {"name": "mpi-launcher"},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"annotations": launcher["metadata"]["annotations"]},
                                                 "spec": launcher["spec"]}}})

    async def completed() -> dict[str, Any] | None:
        st = await status_of(tenant_api, VOLCANO, tenant_ns, "mpi")
        return st if st.get("phase") == "Completed" else None

    st = await eventually(completed, timeout=90, what="launcher + workers gang Completed")
    assert st.get("succeeded") == 5 and not st.get("failed"), st
    (group,) = await compute_groups(compute_api, tenant_ns)
    assert group["status"]["phase"] == "Succeeded" and group["status"]["succeeded"] == 5
    job = await client.BatchV1Api(tenant_api).read_namespaced_job("mpi-launcher", tenant_ns)
    assert job.status.succeeded == 1


async def test_a_preempted_batch_job_is_made_again_by_the_job_controller_and_completes(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, compute_ns: str,
        vnodes: dict[str, Component]) -> None:
    """A plain batch Job written as preemptible Jobs are (its ``podFailurePolicy`` ignores
    ``DisruptionTarget``), two pods in one Volcano gang, borrows a node that another queue's guarantee
    claims: both pods are told ``Preempted`` and handed back, the tenant's Job controller makes two new ones
    without counting a failure, they wait as one gang while the node is taken, run once it is free, and the
    Job completes. The vnode counts the pods it handed back and tells the Job why they went."""
    handed_back = "kube_ferry_vnode_preempted_pods_handed_back_total"
    before = vnode_metrics(vnodes["tenant-1"])[handed_back]
    tcore, ccore, batch = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api), client.BatchV1Api(tenant_api)
    await tenant_group(tenant_api, VOLCANO, tenant_ns, "train", 2)
    job = objects.batch_job("train", 2, 4, duration="25s")  # outlasts the 4 s grace
    job["metadata"]["namespace"] = tenant_ns
    job["spec"]["template"]["spec"]["nodeSelector"] = {"ferry-test": tenant_ns}
    async with reserved_node(compute_api, tenant_ns):
        await batch.create_namespaced_job(tenant_ns, job)
        first = await eventually(lambda: running_pods(tcore, tenant_ns, 2), timeout=60, what="both pods Running")

        async with guarantee_claiming(compute_api, compute_ns, tenant_ns) as urgent:
            new = await eventually(lambda: replacements(tcore, tenant_ns, first, 2), timeout=60,
                                   what="two new pods from the Job controller")
            told = (await tcore.list_namespaced_event(tenant_ns, field_selector="reason=Preempted")).items
            assert {e.involved_object.name for e in told} >= {p.metadata.name for p in first}
            assert not (await batch.read_namespaced_job("train", tenant_ns)).status.failed
            await eventually(lambda: vnode_metrics(vnodes["tenant-1"])[handed_back] == before + 2, timeout=30,
                             what="both preempted pods handed back")
            left = {p.metadata.uid for p in (await tcore.list_namespaced_pod(tenant_ns)).items
                    if p.metadata.deletion_timestamp is None}
            assert not left & {p.metadata.uid for p in first}

            async def on_job() -> list[Any] | None:  # `kubectl describe job` says why; written after the hand-back
                told = (await tcore.list_namespaced_event(
                    tenant_ns, field_selector="involvedObject.kind=Job,involvedObject.name=train,reason=Preempted")
                        ).items
                return told or None

            said = await eventually(on_job, timeout=30, what="the Preempted Event on the Job")
            assert "makes it again" in said[0].message, said
            new_uids = {p.metadata.uid for p in new}

            async def copies_of_new() -> list[Any] | None:  # the vnode copies the new pods on its own time
                made = [c for c in await compute_copies(compute_api, tenant_ns)
                        if c.metadata.labels.get(naming.UPSTREAM_UID_LABEL) in new_uids]
                return made if len(made) == 2 else None

            copies = await eventually(copies_of_new, timeout=30, what="both new pods copied")
            assert not any(c.spec.node_name for c in copies), \
                [(c.metadata.name, c.spec.node_name) for c in copies]  # the gang waits whole
            job_uid = (await batch.read_namespaced_job("train", tenant_ns)).metadata.uid
            assert {c.metadata.labels.get(UPSTREAM_CONTROLLER_LABEL) for c in copies} == {job_uid}  # runs.py

            await ccore.delete_namespaced_pod(urgent, compute_ns, grace_period_seconds=0)

            async def complete() -> Any:
                status = (await batch.read_namespaced_job("train", tenant_ns)).status
                done = any(c.type == "Complete" and c.status == "True" for c in status.conditions or [])
                return status if done else None

            status = await eventually(complete, timeout=120, what="the Job Complete after its second run")
        assert status.succeeded == 2 and not status.failed, status


async def test_a_preempted_bare_jobs_next_pod_goes_before_a_pod_that_arrived_while_it_ran(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, compute_ns: str) -> None:
    """A batch Job of one pod and no gang, written as preemptible Jobs are, is reclaimed; its Job makes the
    next pod. That pod continues the job in the compute cluster (the copy names the tenant Job; the scheduler
    gives it the job's arrival: scheduler/service/runs.py), so when the node frees it starts before a pod of
    the same tenant that arrived while the first ran, as in the trace replays."""
    tcore, ccore, batch = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api), client.BatchV1Api(tenant_api)

    def bare(duration: str) -> dict[str, Any]:  # a pod the vnode binds (Volcano's scheduler), of no gang
        made = member("x", "volcano", "-", duration=duration)
        del made["metadata"]["annotations"]["scheduling.k8s.io/group-name"], made["metadata"]["name"]
        made["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
        made["spec"]["nodeSelector"] = {"ferry-test": tenant_ns}
        return made

    async with reserved_node(compute_api, tenant_ns):
        template = bare("600s")
        job = await batch.create_namespaced_job(tenant_ns, {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
            "spec": {"backoffLimit": 0, "template": template, "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}}})
        (first,) = await eventually(lambda: running_pods(tcore, tenant_ns, 1), timeout=60, what="the Job's pod Running")
        # the scheduler dates a job by its compute copy's creation (whole seconds; the copy may come a moment after
        # the tenant pod under load): "later" must be made in a later second than the copy, or the two tie
        (first_copy,) = await compute_copies(compute_api, tenant_ns)
        started = max(first.metadata.creation_timestamp.timestamp(), first_copy.metadata.creation_timestamp.timestamp())

        async def a_second_later() -> bool:  # creation times have whole seconds
            return datetime.now(UTC).timestamp() >= started + 1.0

        await eventually(a_second_later, timeout=5, what="a second after the Job's pod")
        later = {**bare("600s"), "metadata": {**bare("600s")["metadata"], "name": "later"}}
        await tcore.create_namespaced_pod(tenant_ns, later)

        async with guarantee_claiming(compute_api, compute_ns, tenant_ns) as urgent:
            async def next_pod() -> Any:
                pods = (await tcore.list_namespaced_pod(
                    tenant_ns, label_selector=f"batch.kubernetes.io/controller-uid={job.metadata.uid}")).items
                return next((p for p in pods if p.metadata.uid != first.metadata.uid
                             and p.metadata.deletion_timestamp is None), None)

            nxt = await eventually(next_pod, timeout=60, what="the Job's next pod")

            async def copied() -> Any:
                return next((c for c in await compute_copies(compute_api, tenant_ns)
                             if c.metadata.labels.get(naming.UPSTREAM_UID_LABEL) == nxt.metadata.uid), None)

            copy = await eventually(copied, timeout=30, what="the next pod's compute copy")
            assert copy.metadata.labels.get(UPSTREAM_CONTROLLER_LABEL) == job.metadata.uid
            assert not copy.spec.node_name  # the node is taken

            async def kept() -> str | None:  # the run it continues, kept on it for a scheduler that restarts
                got = await ccore.read_namespaced_pod(copy.metadata.name, copy.metadata.namespace)
                return (got.metadata.annotations or {}).get(EARLIER_RUN_ANNOTATION)

            earlier = json.loads(await eventually(kept, timeout=20, what="the next pod's copy keeping the run"))
            assert earlier["arrivalTime"] == first_copy.metadata.creation_timestamp.strftime("%Y-%m-%dT%H:%M:%SZ")
            await ccore.delete_namespaced_pod(urgent, compute_ns, grace_period_seconds=0)

            async def one_running() -> Any:
                pods = [p for p in (await tcore.list_namespaced_pod(tenant_ns)).items
                        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
                return pods or None

            (running,) = await eventually(one_running, timeout=60, what="a pod Running once the node is free")
            assert running.metadata.uid == nxt.metadata.uid, running.metadata.name
        await batch.delete_namespaced_job("train", tenant_ns, propagation_policy="Background")
        await tcore.delete_namespaced_pod("later", tenant_ns, grace_period_seconds=0)


async def test_a_tenant_gang_declared_after_another_starts_once_that_one_succeeded(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The tenant says it on its own PodGroup (an annotation naming its PodGroups); the vnode writes the
    compute PodGroup's dependsOn in compute names."""
    custom = client.CustomObjectsApi(tenant_api)
    for name, deps in (("prep", None), ("train", "prep")):
        await custom.create_namespaced_custom_object(*VOLCANO, tenant_ns, "podgroups", {
            "apiVersion": "/".join(VOLCANO), "kind": "PodGroup",
            "metadata": {"name": name, "annotations": {"kubeferry.io/depends-on": deps} if deps else {}},
            "spec": {"minMember": 1}})
    core = client.CoreV1Api(tenant_api)
    await core.create_namespaced_pod(tenant_ns, member("train-0", "volcano", "train", duration="1s"))
    await core.create_namespaced_pod(tenant_ns, member("prep-0", "volcano", "prep", duration="3s"))

    async def completed() -> dict[str, Any] | None:
        st = await status_of(tenant_api, VOLCANO, tenant_ns, "train")
        return st if st.get("phase") == "Completed" else None

    await eventually(completed, timeout=90, what="train Completed")
    by_upstream = {g["metadata"]["annotations"][naming.UPSTREAM_NAME_ANNOTATION]: g
                   for g in await compute_groups(compute_api, tenant_ns)}
    assert by_upstream["train"]["spec"]["dependsOn"] == [
        {"name": by_upstream["prep"]["metadata"]["name"], "phase": "Succeeded"}]
    pods = {p.metadata.annotations[naming.UPSTREAM_NAME_ANNOTATION]: p for p in (
        await client.CoreV1Api(compute_api).list_namespaced_pod(
            "tenant-1", label_selector=f"{naming.UPSTREAM_NS_LABEL}={tenant_ns}")).items}
    prep_end = max(_ts(c.state.terminated.finished_at) for c in pods["prep-0"].status.container_statuses)
    assert _ts(pods["train-0"].status.start_time) >= prep_end - 1  # timestamps have whole seconds


async def _compute_event(compute: client.ApiClient, pod: Any, reason: str) -> None:
    """An Event about a compute pod, as a kubelet or the scheduler would write it."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await client.CoreV1Api(compute).create_namespaced_event("tenant-1", {
        "metadata": {"generateName": f"{pod.metadata.name}."},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "namespace": "tenant-1",
                           "uid": pod.metadata.uid},
        "type": "Normal", "reason": reason, "message": f"about compute pod {pod.metadata.uid}",
        "source": {"component": "test"}, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1})


async def _reasons_on(tenant: client.ApiClient, ns: str, uid: str) -> set[str]:
    events = (await client.CoreV1Api(tenant).list_namespaced_event(
        ns, field_selector=f"involvedObject.uid={uid}")).items
    return {e.reason for e in events}


async def _no_pods(core: client.CoreV1Api, ns: str) -> bool:
    return not (await core.list_namespaced_pod(ns)).items


async def _running_on_a_new_group(compute: client.ApiClient, tenant_ns: str, old_uid: str,
                                  tenant_uid: str) -> list[Any] | None:
    """The compute PodGroup made for tenant group ``tenant_uid``, once Running with the earlier incarnation's
    (``old_uid``) gone."""
    groups = await compute_groups(compute, tenant_ns)
    if any(g["metadata"]["uid"] == old_uid for g in groups):
        return None
    mine = [g for g in groups if g["metadata"]["labels"].get(naming.UPSTREAM_UID_LABEL) == tenant_uid]
    return mine if mine and (mine[0].get("status") or {}).get("phase") == "Running" else None


async def _phase_is(api: client.ApiClient, crd: tuple[str, str], ns: str, name: str, phase: str) -> bool:
    return (await status_of(api, crd, ns, name)).get("phase") == phase


async def _runs_anew(tenant_api: client.ApiClient, compute_api: client.ApiClient, crd: tuple[str, str], ns: str,
                     group: Any, old_uid: str, timeout: float) -> list[Any]:
    """Wait until tenant PodGroup ``group`` (made again) runs on a compute PodGroup of its own, the earlier
    incarnation's (``old_uid``) gone, and is Running itself; its compute PodGroup."""
    name = group["metadata"]["name"]
    found: list[Any] = await eventually(
        partial(_running_on_a_new_group, compute_api, ns, old_uid, group["metadata"]["uid"]), timeout=timeout,
        what=f"gang {name} Running on a new compute PodGroup")
    await eventually(partial(_phase_is, tenant_api, crd, ns, name, "Running"), timeout=30,
                     what=f"the new tenant group {name} Running")
    return found


async def test_a_recreated_gang_gets_a_fresh_compute_group(vnodes: dict[str, Component], tenant_api: client.ApiClient,
                                                          compute_api: client.ApiClient, tenant_ns: str) -> None:
    import time

    core = client.CoreV1Api(tenant_api)
    custom = client.CustomObjectsApi(tenant_api)
    names = [f"pt-{i}" for i in range(4)]
    first = await tenant_group(tenant_api, VOLCANO, tenant_ns, "pt", 4)
    for n in names:
        await core.create_namespaced_pod(tenant_ns, member(n, "volcano", "pt", duration="2s"))

    async def completed(uid: str) -> bool:
        st = await status_of(tenant_api, VOLCANO, tenant_ns, "pt")
        groups = await compute_groups(compute_api, tenant_ns)
        return (st.get("phase") == "Completed" and len(groups) == 1
                and groups[0]["metadata"]["labels"].get(naming.UPSTREAM_UID_LABEL) == uid)

    await eventually(lambda: completed(first["metadata"]["uid"]), timeout=60, what="first incarnation Completed")
    (old,) = await compute_groups(compute_api, tenant_ns)
    old_pod = await core.read_namespaced_pod(names[0], tenant_ns)
    old_cpod = await _compute_pod_of(compute_api, old_pod.metadata.uid)
    await _compute_event(compute_api, old_cpod, "OldGangEvent")
    # The operator deletes the job (group and pods) and it is submitted again under the same names.
    await custom.delete_namespaced_custom_object(*VOLCANO, tenant_ns, "podgroups", "pt")
    for n in names:
        await core.delete_namespaced_pod(n, tenant_ns, grace_period_seconds=0)

    await eventually(partial(_no_pods, core, tenant_ns), timeout=30, what="old pods deleted")
    t0 = time.monotonic()
    second = await tenant_group(tenant_api, VOLCANO, tenant_ns, "pt", 4)
    for n in names:
        await core.create_namespaced_pod(tenant_ns, member(n, "volcano", "pt", duration="30s"))
    assert time.monotonic() - t0 < 3

    (new,) = await _runs_anew(tenant_api, compute_api, VOLCANO, tenant_ns, second, old["metadata"]["uid"], 30)
    assert new["status"].get("succeeded", 0) == 0, "no count of the first incarnation leaks into the second"

    # A restarted vnode reads every compute Event again; the old pod's Event names the compute pod name
    # the new pod has now, but not its UID: it must not appear on the new tenant pod. An Event about the
    # new pod, written while the vnode is down, is replayed in the same list and must appear; one more
    # written after that one is mirrored comes behind both in the vnode's (FIFO) queue.
    new_pod = await core.read_namespaced_pod(names[0], tenant_ns)
    new_cpod = await _compute_pod_of(compute_api, new_pod.metadata.uid)
    vnode = vnodes["tenant-1"]
    vnode.stop()
    await _compute_event(compute_api, new_cpod, "NewGangEvent")
    vnode.start()
    vnode.wait_ready()

    def mirrored(reason: str) -> Any:
        async def check() -> set[str] | None:
            reasons = await _reasons_on(tenant_api, tenant_ns, new_pod.metadata.uid)
            return reasons if reason in reasons else None
        return check

    await eventually(mirrored("NewGangEvent"), timeout=30, what="the replayed Event about the new pod mirrored")
    await _compute_event(compute_api, new_cpod, "AfterReplay")
    reasons = await eventually(mirrored("AfterReplay"), timeout=30, what="a later Event mirrored")
    assert "OldGangEvent" not in reasons, reasons
    assert "OldGangEvent" in await _reasons_on(tenant_api, tenant_ns, old_pod.metadata.uid), "it was mirrored once"


async def test_a_gang_made_again_pods_first_waits_for_its_new_group_and_never_joins_the_old_one(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A job made again under the same names whose pods reach the vnode before its PodGroup (written in that
    order, or the group's watch lagging the pods' under load: a flake of the test above) waits, saying why,
    instead of joining the earlier incarnation's compute group, which nothing would have replaced."""
    core = client.CoreV1Api(tenant_api)
    custom = client.CustomObjectsApi(tenant_api)
    names = ["pf-0", "pf-1"]
    first = await tenant_group(tenant_api, PLUGINS, tenant_ns, "pf", 2)
    for n in names:
        await core.create_namespaced_pod(tenant_ns, member(n, "scheduler-plugins", "pf", duration="2s"))

    async def done_on(uid: str) -> bool:
        groups = await compute_groups(compute_api, tenant_ns)
        return ([g["metadata"]["labels"].get(naming.UPSTREAM_UID_LABEL) for g in groups] == [uid]
                and (await status_of(tenant_api, PLUGINS, tenant_ns, "pf")).get("phase") == "Finished")

    await eventually(lambda: done_on(first["metadata"]["uid"]), timeout=60, what="first incarnation Finished")
    (old,) = await compute_groups(compute_api, tenant_ns)
    await custom.delete_namespaced_custom_object(*PLUGINS, tenant_ns, "podgroups", "pf")
    for n in names:
        await core.delete_namespaced_pod(n, tenant_ns, grace_period_seconds=0)

    await eventually(partial(_no_pods, core, tenant_ns), timeout=30, what="old pods deleted")
    for n in names:
        await core.create_namespaced_pod(tenant_ns, member(n, "scheduler-plugins", "pf", duration="30s"))
    pod = await core.read_namespaced_pod(names[0], tenant_ns)

    async def told() -> bool:
        return "GangNotReady" in await _reasons_on(tenant_api, tenant_ns, pod.metadata.uid)

    await eventually(told, timeout=30, what="the pod told it waits for its PodGroup")
    assert not (await client.CoreV1Api(compute_api).list_namespaced_pod(
        "tenant-1", label_selector=f"{naming.UPSTREAM_NS_LABEL}={tenant_ns}")).items, "no member made before its group"
    second = await tenant_group(tenant_api, PLUGINS, tenant_ns, "pf", 2)

    await _runs_anew(tenant_api, compute_api, PLUGINS, tenant_ns, second, old["metadata"]["uid"], 60)


async def test_members_that_joined_an_earlier_incarnations_group_get_their_own_once_it_is_seen(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The vnode may see a job's new pods while it still sees the old PodGroup (its watch lagging; here a
    finalizer keeps the old group in sight): they join the old compute group. Once the new group is seen,
    that compute group is replaced by one of the new incarnation, whatever the members' phase."""
    core = client.CoreV1Api(tenant_api)
    custom = client.CustomObjectsApi(tenant_api)
    names = ["pl-0", "pl-1"]
    first = await custom.create_namespaced_custom_object(*PLUGINS, tenant_ns, "podgroups", {
        "apiVersion": "/".join(PLUGINS), "kind": "PodGroup",
        "metadata": {"name": "pl", "finalizers": ["kubeferry.io/test-hold"]}, "spec": {"minMember": 2}})
    for n in names:
        await core.create_namespaced_pod(tenant_ns, member(n, "scheduler-plugins", "pl", duration="2s"))

    async def finished() -> bool:
        groups = await compute_groups(compute_api, tenant_ns)
        return ([g["metadata"]["labels"].get(naming.UPSTREAM_UID_LABEL) for g in groups] == [first["metadata"]["uid"]]
                and (await status_of(tenant_api, PLUGINS, tenant_ns, "pl")).get("phase") == "Finished")

    await eventually(finished, timeout=60, what="first incarnation Finished")
    (old,) = await compute_groups(compute_api, tenant_ns)
    await custom.delete_namespaced_custom_object(*PLUGINS, tenant_ns, "podgroups", "pl")
    for n in names:
        await core.delete_namespaced_pod(n, tenant_ns, grace_period_seconds=0)

    await eventually(partial(_no_pods, core, tenant_ns), timeout=30, what="old pods deleted")
    uids = {(await core.create_namespaced_pod(tenant_ns, member(n, "scheduler-plugins", "pl", duration="60s")))
            .metadata.uid for n in names}

    async def bridged() -> bool:
        pods = (await client.CoreV1Api(compute_api).list_namespaced_pod(
            "tenant-1", label_selector=f"{naming.UPSTREAM_NS_LABEL}={tenant_ns}")).items
        return {p.metadata.labels.get(naming.UPSTREAM_UID_LABEL) for p in pods} == uids

    await eventually(bridged, timeout=30, what="the new members made beside the old group")
    assert [g["metadata"]["uid"] for g in await compute_groups(compute_api, tenant_ns)] == [old["metadata"]["uid"]]
    await custom.patch_namespaced_custom_object(*PLUGINS, tenant_ns, "podgroups", "pl",
                                                [{"op": "remove", "path": "/metadata/finalizers"}])

    async def old_group_gone() -> bool:
        found = await custom.list_namespaced_custom_object(*PLUGINS, tenant_ns, "podgroups")
        return not found["items"]

    await eventually(old_group_gone, timeout=30, what="the old tenant PodGroup gone")
    second = await tenant_group(tenant_api, PLUGINS, tenant_ns, "pl", 2)

    await _runs_anew(tenant_api, compute_api, PLUGINS, tenant_ns, second, old["metadata"]["uid"], 60)


async def test_running_members_whose_groups_both_went_get_a_compute_group_as_soon_as_their_tenant_group_is_back(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A running gang whose tenant PodGroup is deleted (a user re-applying it) and whose compute PodGroup goes
    meanwhile (collected, or deleted by hand): the members run on and are told why their group has no status.
    Once the tenant group is made again they get a compute group of its incarnation at once, not at the
    vnode's resync two minutes later, and the new tenant group shows them Running."""
    core = client.CoreV1Api(tenant_api)
    custom = client.CustomObjectsApi(tenant_api)
    names = ["pr-0", "pr-1"]
    await tenant_group(tenant_api, VOLCANO, tenant_ns, "pr", 2)
    for n in names:
        await core.create_namespaced_pod(tenant_ns, member(n, "volcano", "pr", duration="600s"))
    await eventually(partial(_phase_is, tenant_api, VOLCANO, tenant_ns, "pr", "Running"), timeout=60,
                     what="the gang Running")
    started = max([_ts((await core.read_namespaced_pod(n, tenant_ns)).status.start_time) for n in names])

    async def settled() -> bool:  # the vnode's own timers for a new pod (the first status write) have fired
        return datetime.now(UTC).timestamp() > started + SETTLE_BOUND_S + 1

    await eventually(settled, timeout=SETTLE_BOUND_S + 30, what="the members past their first status write")
    (old,) = await compute_groups(compute_api, tenant_ns)
    await custom.delete_namespaced_custom_object(*VOLCANO, tenant_ns, "podgroups", "pr")
    await client.CustomObjectsApi(compute_api).delete_namespaced_custom_object(
        *FERRY, "tenant-1", "podgroups", old["metadata"]["name"])
    uids = [(await core.read_namespaced_pod(n, tenant_ns)).metadata.uid for n in names]

    async def told() -> bool:
        return all(["PodGroupMissing" in await _reasons_on(tenant_api, tenant_ns, uid) for uid in uids])

    await eventually(told, timeout=30, what="the running members told their PodGroup is missing")
    assert not await compute_groups(compute_api, tenant_ns), "no compute group without its tenant group"
    second = await tenant_group(tenant_api, VOLCANO, tenant_ns, "pr", 2)

    await _runs_anew(tenant_api, compute_api, VOLCANO, tenant_ns, second, old["metadata"]["uid"], 20)
    assert all(p.status.phase == "Running" for p in (await core.list_namespaced_pod(tenant_ns)).items)


async def test_a_waiting_gang_whose_compute_group_vanished_gets_it_back_and_runs(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Found by the chaos soak: a compute PodGroup collected between its creation and its members' (a
    compute outage held them back) left the gang waiting forever. Whatever removes it, members still
    waiting bring it back."""
    core = client.CoreV1Api(tenant_api)
    await tenant_group(tenant_api, VOLCANO, tenant_ns, "phoenix", min_member=3)
    for i in range(2):  # 2 of 3: the gang waits in the compute cluster
        await core.create_namespaced_pod(tenant_ns, member(f"phoenix-{i}", "volcano", "phoenix", duration="60s"))
    (group,) = await eventually(lambda: compute_groups(compute_api, tenant_ns), what="the compute PodGroup")
    first_uid = group["metadata"]["uid"]
    await client.CustomObjectsApi(compute_api).delete_namespaced_custom_object(
        *FERRY, "tenant-1", "podgroups", group["metadata"]["name"])

    async def back() -> Any:
        groups = await compute_groups(compute_api, tenant_ns)
        return groups if groups and groups[0]["metadata"]["uid"] != first_uid else None

    await eventually(back, timeout=20, what="the compute PodGroup made again")
    await core.create_namespaced_pod(tenant_ns, member("phoenix-2", "volcano", "phoenix", duration="60s"))

    async def all_running() -> bool:
        pods = (await core.list_namespaced_pod(tenant_ns)).items
        return len(pods) == 3 and all(p.status.phase == "Running" for p in pods)

    await eventually(all_running, timeout=60, what="the whole gang Running")


async def test_a_tenant_groups_changed_minimum_reaches_the_waiting_gang(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Found with KubeRay, which sets its PodGroup's minMember to the cluster's size whenever a worker group
    is scaled: the compute PodGroup kept the size it was made with, so a gang asked for fewer members than
    it first had waited forever. A user who corrects a PodGroup's minimum is served the same way."""
    core = client.CoreV1Api(tenant_api)
    await tenant_group(tenant_api, VOLCANO, tenant_ns, "shrunk", min_member=3)
    for i in range(2):  # 2 of 3: the gang waits
        await core.create_namespaced_pod(tenant_ns, member(f"shrunk-{i}", "volcano", "shrunk", duration="60s"))

    async def compute_minimum() -> int | None:
        groups = await compute_groups(compute_api, tenant_ns)
        return int(groups[0]["spec"]["minMember"]) if groups else None

    assert await eventually(compute_minimum, what="the compute PodGroup") == 3
    await eventually(lambda: _waiting_events(compute_api, tenant_ns), timeout=30, what="the gang told it waits")
    await client.CustomObjectsApi(tenant_api).patch_namespaced_custom_object(
        *VOLCANO, tenant_ns, "podgroups", "shrunk", [{"op": "replace", "path": "/spec/minMember", "value": 2}])

    async def all_running() -> bool:
        pods = (await core.list_namespaced_pod(tenant_ns)).items
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    await eventually(all_running, timeout=60, what="the 2 members Running once the minimum is 2")
    assert await compute_minimum() == 2

    # A change no retry can serve is told on the tenant's group; the running gang keeps what it has.
    await client.CustomObjectsApi(tenant_api).patch_namespaced_custom_object(
        *VOLCANO, tenant_ns, "podgroups", "shrunk", [{"op": "add", "path": "/spec/minTaskMember", "value": {"w": -1}}])

    async def told() -> list[Any]:
        events = (await core.list_namespaced_event(tenant_ns, field_selector="involvedObject.kind=PodGroup")).items
        return [e for e in events if e.reason == "InvalidPodGroup" and e.involved_object.name == "shrunk"]

    (event,) = await eventually(told, timeout=30, what="an InvalidPodGroup Event on the tenant's PodGroup")
    assert event.type == "Warning" and "minTaskMember[w]" in event.message, event.message
    groups = await compute_groups(compute_api, tenant_ns)
    assert groups[0]["spec"]["minMember"] == 2 and "minTaskMember" not in groups[0]["spec"]
    assert await all_running()
