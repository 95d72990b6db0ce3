"""The vnode bridge on real control planes: tenant pods run in the compute cluster and behave like
ordinary pods upstream (status, events, logs, deletion), tenants stay apart, unsafe pods are refused."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import uuid
from collections.abc import Awaitable
from functools import partial
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.cluster.gpunodes import DOMAIN_LABEL
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from ferry.kube.rest import Rest
from ferry.whypending import explain
from tests.helpers import (
    MERGE_PATCH,
    api_client,
    eventually,
    guarantee_claiming,
    kubectl,
    reserved_node,
    vnode_metrics,
)
from vnode import naming

pytestmark = pytest.mark.usefixtures("vnodes")
TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}


def tenant_pod(name: str, *, duration: str | None = None, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    annotations = {"kubeferry.io/sim-duration": duration} if duration else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"tolerations": [TOLERATION], "containers": [{
            "name": "main", "image": "trainer:1",
            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
        }], **spec},
    }


async def compute_pod_of(compute: client.ApiClient, tenant: str, uid: str) -> Any:
    pods = await client.CoreV1Api(compute).list_namespaced_pod(
        tenant, label_selector=f"{naming.UPSTREAM_UID_LABEL}={uid}")
    return pods.items[0] if pods.items else None


async def running_pair(core: client.CoreV1Api, compute: client.ApiClient, ns: str, name: str) -> tuple[str, Any]:
    """A plain tenant pod, once Running upstream: its UID and its compute-side copy."""
    uid = (await core.create_namespaced_pod(ns, tenant_pod(name, automountServiceAccountToken=False))).metadata.uid
    try:
        await eventually(lambda: _with_phase(core, ns, name, "Running"), what=f"{name} Running")
    except AssertionError as exc:  # say where it stuck: upstream, its copy, or the compute scheduler
        raise AssertionError(f"{exc}; {await _whereabouts(core, compute, ns, name, uid)}") from None
    return uid, await compute_pod_of(compute, "tenant-1", uid)


async def _whereabouts(core: client.CoreV1Api, compute: client.ApiClient, ns: str, name: str, uid: str) -> str:
    pod = await core.read_namespaced_pod(name, ns)
    cpod = await compute_pod_of(compute, "tenant-1", uid)
    said = [] if cpod is None else [f"{e.reason}: {e.message}" for e in (
        await client.CoreV1Api(compute).list_namespaced_event(
            "tenant-1", field_selector=f"involvedObject.name={cpod.metadata.name}")).items]
    return (f"tenant pod on {pod.spec.node_name!r}, {pod.status.phase}, conditions "
            f"{[(c.type, c.status, c.reason, c.message) for c in pod.status.conditions or []]}; compute copy "
            + ("none" if cpod is None else f"on {cpod.spec.node_name!r}, {cpod.status.phase}, events {said}"))


async def test_pod_with_configmap_secret_and_token_runs_and_succeeds(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    await core.create_namespaced_config_map(tenant_ns, {"metadata": {"name": "settings"}, "data": {"lr": "0.1"}})
    await core.create_namespaced_secret(tenant_ns, {"metadata": {"name": "creds"}, "stringData": {"key": "s3cr3t"}})
    body = tenant_pod("train", duration="6s")
    body["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "settings"}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/etc/cfg"}]
    body["spec"]["containers"][0]["env"] = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                                         "key": "key"}}},
                                            {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    created = await core.create_namespaced_pod(tenant_ns, body)
    uid = created.metadata.uid

    running = await eventually(lambda: _with_phase(core, tenant_ns, "train", "Running"), timeout=30,
                               what="tenant pod Running")
    cpod = await compute_pod_of(compute_api, "tenant-1", uid)
    assert cpod is not None and cpod.spec.scheduler_name == "kube-ferry"
    assert cpod.spec.automount_service_account_token is False
    assert cpod.spec.node_name and cpod.spec.node_name.startswith("gpu-node-"), "bound by the Kube-Ferry scheduler"
    assert running.status.pod_ip and running.status.pod_ip == cpod.status.pod_ip
    assert running.spec.node_name == "ferry-tenant-1"

    ccore = client.CoreV1Api(compute_api)
    cm_name = next(v.config_map.name for v in cpod.spec.volumes if v.config_map)
    assert (await ccore.read_namespaced_config_map(cm_name, "tenant-1")).data == {"lr": "0.1"}
    secret_ref = next(e for e in cpod.spec.containers[0].env if e.name == "KEY").value_from.secret_key_ref.name
    assert next(e for e in cpod.spec.containers[0].env if e.name == "ME").value == uid, "its tenant UID"
    copied = await ccore.read_namespaced_secret(secret_ref, "tenant-1")
    assert base64.b64decode(copied.data["key"]).decode() == "s3cr3t"
    # The service-account token is issued by the tenant cluster, for this pod's ServiceAccount.
    token_secret = next(s.secret.name for v in cpod.spec.volumes if v.projected
                        for s in v.projected.sources if s.secret and s.secret.name.endswith("-sa-token"))
    token = base64.b64decode((await ccore.read_namespaced_secret(token_secret, "tenant-1")).data["token"]).decode()
    review = await client.AuthenticationV1Api(tenant_api).create_token_review(
        {"spec": {"token": token}})
    assert review.status.authenticated
    assert review.status.user.username == f"system:serviceaccount:{tenant_ns}:default"

    done = await eventually(lambda: _with_phase(core, tenant_ns, "train", "Succeeded"), timeout=40,
                            what="tenant pod Succeeded")
    assert done.status.container_statuses[0].state.terminated.exit_code == 0
    assert (await compute_pod_of(compute_api, "tenant-1", uid)).status.phase == "Succeeded"


async def test_downward_api_files_show_the_tenant_pods_labels_and_annotations_and_follow_their_changes(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A podinfo volume (labels, annotations, name) reads the tenant pod's own metadata, written as a kubelet
    writes it, not the copy's (whose name differs and whose labels carry Kube-Ferry's keys); a label the
    tenant adds to the running pod reaches the file, as the kubelet rewrites it."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    body = tenant_pod("podinfo", automountServiceAccountToken=False)
    body["metadata"]["labels"] = {"app": "web", "tier": "front"}
    body["metadata"]["annotations"]["example.com/owner"] = 'ops "team"'
    body["spec"]["volumes"] = [{"name": "podinfo", "downwardAPI": {"items": [
        {"path": f, "fieldRef": {"fieldPath": f"metadata.{f}"}} for f in ("labels", "annotations", "name")]}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "podinfo", "mountPath": "/etc/podinfo"}]
    uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    await eventually(lambda: _with_phase(core, tenant_ns, "podinfo", "Running"), timeout=30, what="Running")
    cpod = await compute_pod_of(compute_api, "tenant-1", uid)
    assert cpod is not None
    (vol,) = [v for v in cpod.spec.volumes if v.name == "podinfo"]
    (source,) = vol.projected.sources
    assert {i.path: i.key for i in source.secret.items} == {f: f for f in ("labels", "annotations", "name")}

    async def files() -> dict[str, str]:
        data = (await ccore.read_namespaced_secret(source.secret.name, "tenant-1")).data
        return {k: base64.b64decode(data[k]).decode() for k in ("labels", "annotations", "name")}

    seen = await files()
    assert seen["labels"] == 'app="web"\ntier="front"', seen
    assert 'example.com/owner="ops \\"team\\""' in seen["annotations"].splitlines(), seen
    assert seen["name"] == "podinfo" and "kubeferry.io" not in seen["labels"] + seen["annotations"]
    await core.patch_namespaced_pod("podinfo", tenant_ns, {"metadata": {"labels": {"role": "leader"}}})

    async def followed() -> dict[str, str] | None:
        now = await files()
        return now if now["labels"] == 'app="web"\nrole="leader"\ntier="front"' else None

    await eventually(followed, timeout=30, what="the label in the pod's downward-API file")


async def test_a_pod_selecting_gpu_nodes_by_the_labels_they_share_fits_the_virtual_node(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A pod that picks GPU nodes as GPU charts and Kueue ResourceFlavors write it (``nvidia.com/gpu.present``,
    a GPU model) is bound by the tenant's own kube-scheduler to the virtual node, which carries the labels
    every compute GPU node shares; its copy keeps the selector, which those nodes meet. Before, the virtual
    node carried neither label and such a pod stayed Pending in the tenant cluster."""
    core = client.CoreV1Api(tenant_api)
    gpu_nodes = (await client.CoreV1Api(compute_api).list_node(label_selector="type=kwok")).items
    model = gpu_nodes[0].metadata.labels["kubeferry.io/gpu-model"]
    want = {"nvidia.com/gpu.present": "true", "kubeferry.io/gpu-model": model}

    async def carries() -> dict[str, str] | None:
        labels = (await core.read_node("ferry-tenant-1")).metadata.labels
        return labels if all(labels.get(k) == v for k, v in want.items()) else None

    labels = await eventually(carries, timeout=30, what="the virtual node carrying its GPU nodes' shared labels")
    assert "kubernetes.io/hostname" in labels and labels["kubernetes.io/hostname"] == "ferry-tenant-1"
    uid = (await core.create_namespaced_pod(tenant_ns, tenant_pod("picky", automountServiceAccountToken=False,
                                                                  nodeSelector=want))).metadata.uid
    running = await eventually(lambda: _with_phase(core, tenant_ns, "picky", "Running"), timeout=30,
                               what="the pod that selects GPU nodes Running")
    assert running.spec.node_name == "ferry-tenant-1"
    copy = await compute_pod_of(compute_api, "tenant-1", uid)
    assert copy is not None and copy.spec.node_selector == want, copy.spec.node_selector


async def _sa_exists(core: client.CoreV1Api, ns: str) -> bool:
    try:
        await core.read_namespaced_service_account("default", ns)
        return True
    except ApiException:
        return False


async def _with_phase(core: client.CoreV1Api, ns: str, name: str, want: str) -> Any:
    pod = await core.read_namespaced_pod(name, ns)
    return pod if pod.status.phase == want else None


async def test_configmap_update_propagates(tenant_api: client.ApiClient, compute_api: client.ApiClient,
                                           tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    await core.create_namespaced_config_map(tenant_ns, {"metadata": {"name": "cfg"}, "data": {"v": "1"}})
    body = tenant_pod("p", automountServiceAccountToken=False)
    body["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "cfg"}}]
    await core.create_namespaced_pod(tenant_ns, body)
    copy_name = naming.compute_name("tenant-1", tenant_ns, "cfg")
    ccore = client.CoreV1Api(compute_api)

    async def copied(value: str) -> bool:
        try:
            return (await ccore.read_namespaced_config_map(copy_name, "tenant-1")).data == {"v": value}
        except ApiException:
            return False

    await eventually(lambda: copied("1"), what="ConfigMap copied")
    await core.patch_namespaced_config_map("cfg", tenant_ns, {"data": {"v": "2"}})
    await eventually(lambda: copied("2"), what="ConfigMap update propagated")


async def test_copies_no_pod_uses_are_collected_and_shared_ones_kept(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The session's vnodes sweep every 2 s and keep unused copies younger than 10 s."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    for name in ("shared", "own"):
        await core.create_namespaced_config_map(tenant_ns, {"metadata": {"name": name}, "data": {"k": name}})
    for pod, refs in (("keeper", ["shared"]), ("leaver", ["shared", "own"])):
        body = tenant_pod(pod, automountServiceAccountToken=False)
        body["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": r}} for r in refs]
        await core.create_namespaced_pod(tenant_ns, body)
    copies = {name: naming.compute_name("tenant-1", tenant_ns, name) for name in ("shared", "own")}

    async def present() -> set[str]:
        names = {cm.metadata.name for cm in (await ccore.list_namespaced_config_map("tenant-1")).items}
        return {k for k, v in copies.items() if v in names}

    await eventually(lambda: _with_phase(core, tenant_ns, "leaver", "Running"), what="leaver Running")
    await eventually(lambda: _with_phase(core, tenant_ns, "keeper", "Running"), what="keeper Running")
    assert await present() == {"shared", "own"}
    await core.delete_namespaced_pod("leaver", tenant_ns, grace_period_seconds=0)

    async def collected() -> bool:
        return await present() == {"shared"}

    await eventually(collected, timeout=40, what="the copy only the deleted pod used collected")
    assert (await core.read_namespaced_pod("keeper", tenant_ns)).status.phase == "Running"


async def test_identical_names_in_two_tenants_never_collide_and_credentials_are_scoped(
        planes: ControlPlanes, compute_api: client.ApiClient) -> None:
    ns = f"shared-{uuid.uuid4().hex[:6]}"
    uids: dict[str, str] = {}
    async with api_client(planes.kubeconfig("tenant-1")) as t1, api_client(planes.kubeconfig("tenant-2")) as t2:
        for tenant, api in (("tenant-1", t1), ("tenant-2", t2)):
            core = client.CoreV1Api(api)
            await core.create_namespace({"metadata": {"name": ns}})
            await eventually(lambda core=core: _sa_exists(core, ns), what="ServiceAccount")
            uids[tenant] = (await core.create_namespaced_pod(ns, tenant_pod("worker-0"))).metadata.uid
        try:
            for tenant, api in (("tenant-1", t1), ("tenant-2", t2)):
                core = client.CoreV1Api(api)
                pod = await eventually(lambda core=core: _with_phase(core, ns, "worker-0", "Running"),
                                       what=f"{tenant} pod Running")
                cpod = await compute_pod_of(compute_api, tenant, uids[tenant])
                assert cpod.metadata.namespace == tenant
                assert pod.status.pod_ip == cpod.status.pod_ip
            a = await compute_pod_of(compute_api, "tenant-1", uids["tenant-1"])
            b = await compute_pod_of(compute_api, "tenant-2", uids["tenant-2"])
            assert a.metadata.name != b.metadata.name and a.status.pod_ip != b.status.pod_ip
        finally:
            for api in (t1, t2):
                await client.CoreV1Api(api).delete_namespace(ns)

    vnode1 = planes.clusters["compute"].pki / "vnode-tenant-1.kubeconfig"
    async with api_client(vnode1) as as_vnode1:
        core = client.CoreV1Api(as_vnode1)
        await core.list_namespaced_pod("tenant-1")  # its own namespace: allowed
        for call in (core.list_namespaced_pod("tenant-2"), core.list_namespaced_secret("tenant-2"),
                     core.create_namespaced_pod("tenant-2", {"metadata": {"name": "x"}, "spec": {
                         "containers": [{"name": "c", "image": "i"}]}}),
                     core.list_pod_for_all_namespaces()):
            with pytest.raises(ApiException) as err:
                await call
            assert err.value.status == 403


async def test_host_path_pod_is_refused_and_nothing_reaches_compute(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    body = tenant_pod("sneaky", automountServiceAccountToken=False,
                      volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    failed = await eventually(lambda: _with_phase(core, tenant_ns, "sneaky", "Failed"), what="refused pod Failed")
    assert failed.status.reason == "Refused" and "hostPath" in failed.status.message
    events = await eventually(lambda: _events(core, tenant_ns, "sneaky", "Refused"), what="Refused event")
    assert "hostPath" in events[0].message
    assert await compute_pod_of(compute_api, "tenant-1", uid) is None


async def test_a_pod_beyond_the_baseline_level_is_refused_and_the_compute_namespace_enforces_it_too(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """An unconfined seccomp profile (one of the baseline Pod Security controls beyond the privileged flag):
    the vnode refuses the pod, saying which control; and the tenant's compute namespace enforces the same
    level on anything else that would create a pod there."""
    core = client.CoreV1Api(tenant_api)
    body = tenant_pod("unconfined", automountServiceAccountToken=False,
                      securityContext={"seccompProfile": {"type": "Unconfined"}})
    uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    failed = await eventually(lambda: _with_phase(core, tenant_ns, "unconfined", "Failed"), what="refused")
    assert failed.status.reason == "Refused" and "seccomp profile Unconfined" in failed.status.message
    assert await compute_pod_of(compute_api, "tenant-1", uid) is None
    with pytest.raises(ApiException) as err:
        await client.CoreV1Api(compute_api).create_namespaced_pod("tenant-1", {
            "metadata": {"name": "sidestep"}, "spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}},
                                                       "containers": [{"name": "c", "image": "i"}]}})
    assert err.value.status == 403 and "PodSecurity" in str(err.value.body), err.value.body


async def test_a_copy_the_compute_api_rejects_fails_the_pod_with_the_apis_reason(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Annotations just under the tenant API's 256 KiB limit: the copy's own marks push it over in the
    compute cluster. A rejection no retry can fix fails the pod with the API's words, once."""
    core = client.CoreV1Api(tenant_api)
    body = tenant_pod("heavy", automountServiceAccountToken=False)
    body["metadata"]["annotations"]["notes"] = "x" * (256 * 1024 - 20)  # "notes" + this: 15 bytes to spare
    uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    failed = await eventually(lambda: _with_phase(core, tenant_ns, "heavy", "Failed"), what="rejected copy Failed")
    assert failed.status.reason == "Refused"
    assert "compute cluster rejected its copy" in failed.status.message and "Too long" in failed.status.message
    events = await eventually(lambda: _events(core, tenant_ns, "heavy", "Refused"), what="Refused event")
    assert len(events) == 1 and "Too long" in events[0].message
    assert await compute_pod_of(compute_api, "tenant-1", uid) is None


async def _events(core: client.CoreV1Api, ns: str, pod: str, reason: str) -> list[Any]:
    evs = await core.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}")
    return [e for e in evs.items if e.reason == reason]


async def test_compute_events_reach_the_tenant_pod_in_compute_order_even_before_its_copy_exists(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """An Event can be watched before the pod it is about: it waits for the pod instead of being lost.
    The tenant copies keep the compute times, so the newest upstream is the newest the scheduler said
    (what `why-pending` reads), whatever order the two arrived in."""
    core = client.CoreV1Api(tenant_api)
    target = naming.compute_name("tenant-1", tenant_ns, "early")

    def said(text: str, at: str) -> dict[str, Any]:
        return {"metadata": {"generateName": f"{target}.", "namespace": "tenant-1"},
                "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": "tenant-1", "name": target},
                "type": "Warning", "reason": "FailedScheduling", "message": text, "source": {"component": "test"},
                "firstTimestamp": at, "lastTimestamp": at, "count": 1}

    compute_core = client.CoreV1Api(compute_api)
    await compute_core.create_namespaced_event("tenant-1", said("said second", "2026-01-01T00:00:02Z"))
    first = await compute_core.create_namespaced_event("tenant-1", said("said first", "2026-01-01T00:00:01Z"))
    await core.create_namespaced_pod(tenant_ns, tenant_pod("early", automountServiceAccountToken=False))

    async def both() -> list[Any] | None:
        evs = [e for e in await _events(core, tenant_ns, "early", "FailedScheduling") if e.message.startswith("said")]
        return evs if len(evs) == 2 else None

    evs = await eventually(both, timeout=30, what="both compute Events on the tenant pod")
    times = {e.message: e.last_timestamp.strftime("%Y-%m-%dT%H:%M:%SZ") for e in evs}
    assert times == {"said first": "2026-01-01T00:00:01Z", "said second": "2026-01-01T00:00:02Z"}
    # said again (the scheduler counts a repeated reason up on one Event): the tenant's copy counts up too
    await compute_core.patch_namespaced_event(first.metadata.name, "tenant-1", {
        "count": 3, "lastTimestamp": "2026-01-01T00:00:03Z", "message": "said first, and again"},
        _content_type="application/merge-patch+json")

    async def counted() -> list[Any] | None:
        evs = [e for e in await _events(core, tenant_ns, "early", "FailedScheduling") if e.message.startswith("said")]
        return evs if any(e.count == 3 for e in evs) else None

    evs = await eventually(counted, timeout=30, what="the repeat counted on the tenant pod")
    assert sorted((e.message, e.count) for e in evs) == [("said first, and again", 3), ("said second", 1)]


async def test_preempted_compute_pod_fails_upstream_and_is_not_recreated(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    uid, cpod = await running_pair(core, compute_api, tenant_ns, "victim")
    # What the scheduler does to a victim: the Eviction API (which adds DisruptionTarget, then deletes).
    await client.CoreV1Api(compute_api).create_namespaced_pod_eviction(
        cpod.metadata.name, "tenant-1", {"metadata": {"name": cpod.metadata.name, "namespace": "tenant-1"}})
    failed = await eventually(lambda: _with_phase(core, tenant_ns, "victim", "Failed"), what="victim Failed")
    assert failed.status.reason == "Preempted"
    assert any(c.type == "DisruptionTarget" and c.status == "True" for c in failed.status.conditions)
    # Touch the pod so the vnode reconciles it again: it must not come back in the compute cluster.
    await core.patch_namespaced_pod("victim", tenant_ns, {"metadata": {"labels": {"touched": "yes"}}})
    await eventually(lambda: _label_seen(core, tenant_ns), what="label applied")
    assert await compute_pod_of(compute_api, "tenant-1", uid) is None
    assert (await core.read_namespaced_pod("victim", tenant_ns)).status.phase == "Failed"


async def _label_seen(core: client.CoreV1Api, ns: str) -> bool:
    return (await core.read_namespaced_pod("victim", ns)).metadata.labels.get("touched") == "yes"


async def test_graceful_delete_flows_down_and_finishes_upstream(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    uid, _ = await running_pair(core, compute_api, tenant_ns, "gone")
    await core.delete_namespaced_pod("gone", tenant_ns, grace_period_seconds=5)

    async def both_gone() -> bool:
        try:
            await core.read_namespaced_pod("gone", tenant_ns)
            return False
        except ApiException as exc:
            return exc.status == 404 and await compute_pod_of(compute_api, "tenant-1", uid) is None

    await eventually(both_gone, timeout=30, what="tenant and compute pods deleted")


async def test_kubectl_logs_through_the_tenant_cluster(planes: ControlPlanes, tenant_api: client.ApiClient,
                                                       compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    _, cpod = await running_pair(core, compute_api, tenant_ns, "chatty")
    k = planes.bin.path("kubectl")
    direct = kubectl(k, planes.kubeconfig("compute"), "logs", "-n", "tenant-1", cpod.metadata.name).stdout
    assert direct.count("\n") >= 10
    through = kubectl(k, planes.kubeconfig("tenant-1"), "logs", "-n", tenant_ns, "chatty").stdout
    assert through == direct
    tail = kubectl(k, planes.kubeconfig("tenant-1"), "logs", "--tail=3", "-n", tenant_ns, "chatty").stdout
    assert tail.splitlines() == direct.splitlines()[-3:]
    proc = await asyncio.create_subprocess_exec(
        str(k), f"--kubeconfig={planes.kubeconfig('tenant-1')}", "logs", "-f", "-n", tenant_ns, "chatty",
        stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert first.decode() == direct.splitlines(keepends=True)[0]
        assert proc.returncode is None, "-f keeps streaming"
    finally:
        proc.kill()
        await proc.wait()


async def test_a_compute_side_actor_that_undoes_a_followed_label_is_not_fought_in_a_loop(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A label the tenant gives a running pod reaches its copy; a compute-side actor that undoes it at once
    (a webhook mutating every update) gets the patch again only after a back-off, not after each of its
    own undos: otherwise every patch's watch event would cause the next, a hot loop on the compute API."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    _, copy = await running_pair(core, compute_api, tenant_ns, "fought")
    await core.patch_namespaced_pod("fought", tenant_ns, {"metadata": {"labels": {"role": "leader"}}})
    undone = 0
    # the actor: watches the copy for a fixed window (the server ends the watch) and undoes the label on
    # every version that carries it
    async with watch.Watch() as w:
        async for event in w.stream(ccore.list_namespaced_pod, "tenant-1", timeout_seconds=12,
                                    field_selector=f"metadata.name={copy.metadata.name}"):
            if (event["object"].metadata.labels or {}).get("role") == "leader":
                await ccore.patch_namespaced_pod(copy.metadata.name, "tenant-1",
                                                 {"metadata": {"labels": {"role": None}}})
                undone += 1
    assert undone >= 1, "the label reached the copy"
    assert undone <= 2, f"the vnode re-sent its patch after each undo: {undone} times in 12 s"


async def test_virtual_node_registers_with_capacity_and_heartbeat(tenant_api: client.ApiClient,
                                                                  vnodes: dict[str, Component]) -> None:
    core = client.CoreV1Api(tenant_api)

    async def offering() -> Any:  # the compute cluster's kwok nodes may still be coming up in a fresh session
        node = await core.read_node("ferry-tenant-1")
        return node if int(node.status.allocatable["nvidia.com/gpu"]) > 0 else None

    node = await eventually(offering, timeout=60, what="the virtual node offering GPUs")
    assert any(t.key == "virtual-kubelet.io/provider" and t.effect == "NoSchedule" for t in node.spec.taints)
    assert node.metadata.labels["kubeferry.io/tenant"] == "tenant-1"
    assert next(c for c in node.status.conditions if c.type == "Ready").status == "True"
    assert next(c for c in node.status.conditions if c.type == "TenantClusterAccess").status == "True"
    lease = await client.CoordinationV1Api(tenant_api).read_namespaced_lease("ferry-tenant-1", "kube-node-lease")
    first = lease.spec.renew_time
    await eventually(lambda: _renewed(tenant_api, first), timeout=20, what="lease renewed")


async def _renewed(api: client.ApiClient, first: Any) -> bool:
    lease = await client.CoordinationV1Api(api).read_namespaced_lease("ferry-tenant-1", "kube-node-lease")
    return bool(lease.spec.renew_time != first)


# ------------------------------------------------------------------------------------------ gangs
def operator_pod(name: str, *, scheduler: str | None = None, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None, gates: list[str] | None = None) -> dict[str, Any]:
    """A pod as an unmodified operator writes it: no toleration for the virtual node, its own markers."""
    spec: dict[str, Any] = {"automountServiceAccountToken": False, "priorityClassName": "tenant-top", "containers": [{
        "name": "worker", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}, "spec": spec}


async def _group_phase(api: client.ApiClient, group: str, version: str, ns: str, name: str) -> str:
    obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(group, version, ns, "podgroups", name)
    return str((obj.get("status") or {}).get("phase", ""))


async def _gang_runs(core: client.CoreV1Api, compute: client.ApiClient, ns: str, names: list[str]) -> bool:
    pods = [await core.read_namespaced_pod(n, ns) for n in names]
    if not all(p.spec.node_name == "ferry-tenant-1" and p.status.phase == "Running" for p in pods):
        return False
    cpods = [await compute_pod_of(compute, "tenant-1", p.metadata.uid) for p in pods]
    return all(c is not None and c.spec.node_name for c in cpods)


async def _gang_held_back(core: client.CoreV1Api, compute: client.ApiClient, ns: str, names: list[str]) -> bool:
    """Members exist and are bound upstream, but the compute scheduler waits for the whole gang (and says
    so, once: on the members present when it started waiting)."""
    for n in names:
        pod = await core.read_namespaced_pod(n, ns)
        cpod = await compute_pod_of(compute, "tenant-1", pod.metadata.uid)
        if pod.spec.node_name != "ferry-tenant-1" or cpod is None or cpod.spec.node_name:
            return False
    return any([await _events(core, ns, n, "Waiting") for n in names])


@pytest.mark.parametrize("convention", ["volcano", "scheduler-plugins", "kueue"])
async def test_operator_gangs_bind_to_the_virtual_node_and_run_as_one(
        convention: str, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    await _top_priority_class(tenant_api)
    crd = {"volcano": ("scheduling.volcano.sh", "v1beta1"),
           "scheduler-plugins": ("scheduling.x-k8s.io", "v1alpha1")}.get(convention)
    if crd is not None:
        await client.CustomObjectsApi(tenant_api).create_namespaced_custom_object(
            *crd, tenant_ns, "podgroups",
            {"apiVersion": "/".join(crd), "kind": "PodGroup", "metadata": {"name": "job"},
             "spec": {"minMember": 4}})
    if convention == "volcano":  # Training-Operator waits for this before it creates pods
        assert crd is not None
        await eventually(lambda: _phase_is(tenant_api, crd, tenant_ns, "Inqueue"),
                         what="Volcano PodGroup admitted (Inqueue)")

    def member(i: int) -> dict[str, Any]:
        if convention == "volcano":
            return operator_pod(f"job-worker-{i}", scheduler="volcano",
                                annotations={"scheduling.k8s.io/group-name": "job", "volcano.sh/task-spec": "worker"})
        if convention == "scheduler-plugins":
            return operator_pod(f"job-worker-{i}", scheduler="scheduler-plugins",
                                labels={"scheduling.x-k8s.io/pod-group": "job"})
        return operator_pod(f"job-worker-{i}", labels={"kueue.x-k8s.io/queue-name": "team"},
                            annotations={"kueue.x-k8s.io/pod-group-name": "job",
                                         "kueue.x-k8s.io/pod-group-total-count": "4"},
                            gates=["kueue.x-k8s.io/admission"])

    names = [f"job-worker-{i}" for i in range(4)]
    for i in range(3):
        await core.create_namespaced_pod(tenant_ns, member(i))
    await eventually(lambda: _gang_held_back(core, compute_api, tenant_ns, names[:3]), timeout=30,
                     what="3 of 4 members held back with a Waiting event mirrored up")
    await core.create_namespaced_pod(tenant_ns, member(3))
    await eventually(lambda: _gang_runs(core, compute_api, tenant_ns, names), timeout=30, what="gang Running")
    groups = await client.CustomObjectsApi(compute_api).list_namespaced_custom_object(
        "scheduling.kubeferry.io", "v1alpha1", "tenant-1", "podgroups")
    mine = [g for g in groups["items"] if g["metadata"]["labels"].get(naming.UPSTREAM_NS_LABEL) == tenant_ns]
    assert len(mine) == 1 and mine[0]["spec"]["minMember"] == 4 and mine[0]["spec"]["queue"] == "tenant-1"
    assert (await core.read_namespaced_pod(names[0], tenant_ns)).spec.priority == 1000000
    assert mine[0]["spec"]["priority"] == 0, "the tenant's own priority is capped by the bridge, not trusted"
    if crd is not None:
        await eventually(lambda: _phase_is(tenant_api, crd, tenant_ns, "Running"), what="tenant PodGroup Running")


async def _top_priority_class(api: client.ApiClient) -> None:
    try:
        await client.SchedulingV1Api(api).create_priority_class(
            {"metadata": {"name": "tenant-top"}, "value": 1000000})
    except ApiException as exc:
        if exc.status != 409:
            raise


async def _phase_is(api: client.ApiClient, crd: tuple[str, str], ns: str, want: str) -> bool:
    return await _group_phase(api, *crd, ns, "job") == want


async def test_scheduler_preemption_shows_upstream_as_notice_then_failed_preempted(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, compute_ns: str) -> None:
    """An elastic tenant job on a full node is noticed, then evicted for a guaranteed job of another queue:
    the tenant pod shows the notice (condition + Event), then Failed/Preempted, and is not re-created."""
    ccore, core = client.CoreV1Api(compute_api), client.CoreV1Api(tenant_api)
    await client.CustomObjectsApi(tenant_api).create_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", tenant_ns, "podgroups",
        {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
         "metadata": {"name": "soak", "annotations": {"kubeferry.io/tier": "Elastic"}}, "spec": {"minMember": 1}})
    await _top_priority_class(tenant_api)
    victim = operator_pod("soak-0", scheduler="volcano", annotations={"scheduling.k8s.io/group-name": "soak"})
    victim["spec"]["nodeSelector"] = {"ferry-test": tenant_ns}
    victim["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
    async with reserved_node(compute_api, tenant_ns) as node:
        uid = (await core.create_namespaced_pod(tenant_ns, victim)).metadata.uid
        await eventually(lambda: _with_phase(core, tenant_ns, "soak-0", "Running"), what="elastic job Running")
        async with guarantee_claiming(compute_api, compute_ns, tenant_ns) as urgent:
            async def noticed() -> Any:
                pod = await core.read_namespaced_pod("soak-0", tenant_ns)
                conds = {c.type: c for c in pod.status.conditions or []}
                return pod if conds.get("kubeferry.io/WillEvict") and \
                    conds["kubeferry.io/WillEvict"].status == "True" else None

            await eventually(noticed, timeout=30, what="eviction notice on the tenant pod")
            await eventually(lambda: _events(core, tenant_ns, "soak-0", "WillEvict"), what="WillEvict event upstream")
            try:
                failed = await eventually(lambda: _with_phase(core, tenant_ns, "soak-0", "Failed"), timeout=45,
                                          what="tenant pod Failed after the grace")
            except AssertionError:
                cpod = await compute_pod_of(compute_api, "tenant-1", uid)
                preemptor = await ccore.read_namespaced_pod(urgent, compute_ns)
                on_node = (await ccore.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")).items
                seen = cpod and (cpod.metadata.annotations, cpod.status.conditions)
                there = [(p.metadata.namespace, p.metadata.name) for p in on_node]
                raise AssertionError(f"not Failed; compute victim: {seen}; urgent on {preemptor.spec.node_name}; "
                                     f"pods on {node}: {there}") from None
            assert failed.status.reason == "Preempted"
            assert any(c.type == "DisruptionTarget" and c.status == "True" for c in failed.status.conditions)
            await eventually(lambda: _running_on(ccore, compute_ns, urgent, node), what="preemptor runs")
            assert await compute_pod_of(compute_api, "tenant-1", uid) is None


async def test_node_and_pod_anti_affinity_hold_in_the_compute_cluster_and_a_pod_no_node_meets_is_told_so(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A gang scheduler's pods (the vnode binds them) state their nodes by affinity, as operators write a GPU
    model, and keep apart by pod anti-affinity, one worker per node: the requirements on compute labels
    hold in the compute cluster, the one on the virtual node is dropped, and the gang spreads where
    binpacking alone would stack it; a pod no compute node meets is told why on its tenant pod."""
    core = client.CoreV1Api(tenant_api)
    await _top_priority_class(tenant_api)

    def picky(name: str, group: str, pool: str) -> dict[str, Any]:
        body = operator_pod(name, scheduler="volcano", labels={"app": group},
                            annotations={"scheduling.k8s.io/group-name": group})
        body["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "ferry-test", "operator": "In", "values": [pool]},
                                      {"key": "kubernetes.io/hostname", "operator": "In",
                                       "values": ["ferry-tenant-1"]}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": group}}, "topologyKey": "kubernetes.io/hostname"}]}}
        return body

    for name, size in (("spread", 2), ("nowhere", 1)):
        await client.CustomObjectsApi(tenant_api).create_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", tenant_ns, "podgroups",
            {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
             "spec": {"minMember": size}})
    async with reserved_node(compute_api, tenant_ns) as first, reserved_node(compute_api, tenant_ns) as second:
        uids = [(await core.create_namespaced_pod(tenant_ns, picky(f"spread-{i}", "spread", tenant_ns))).metadata.uid
                for i in range(2)]
        await core.create_namespaced_pod(tenant_ns, picky("nowhere", "nowhere", f"{tenant_ns}-none"))

        async def spread_runs() -> bool:
            return all([await _with_phase(core, tenant_ns, f"spread-{i}", "Running") for i in range(2)])

        await eventually(spread_runs, what="the gang that keeps apart Running")
        copies = [await compute_pod_of(compute_api, "tenant-1", uid) for uid in uids]
        assert all(c is not None for c in copies)
        assert sorted(c.spec.node_name for c in copies if c) == sorted((first, second)), "one per node"
        copy = copies[0]
        assert copy is not None
        terms = copy.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert [[e.key for e in t.match_expressions] for t in terms.node_selector_terms] == [["ferry-test"]]

        async def told() -> list[Any]:
            return [e for e in await _events(core, tenant_ns, "nowhere", "FailedScheduling")
                    if "no node matches the node affinity ferry-test In" in e.message]

        await eventually(told, timeout=30, what="the tenant pod told no compute node meets its affinity")
        assert (await core.read_namespaced_pod("nowhere", tenant_ns)).status.phase == "Pending"


async def test_a_gangs_pod_affinity_keeps_it_in_one_zone_and_a_gang_no_node_holds_together_is_told_so(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Replicas that must share a topology domain (required pod affinity among the gang's pods, as users
    keep a training job in one rack or zone) start in the one zone that holds them all, where binpacking
    alone would take the two tightest nodes, one in each zone; a gang that no single node could hold
    together is told why on its tenant pods."""
    core = client.CoreV1Api(tenant_api)
    compute = client.CoreV1Api(compute_api)
    await _top_priority_class(tenant_api)

    def pod(name: str, gpus: int, select: dict[str, str], *, group: str = "", key: str = "") -> dict[str, Any]:
        body = operator_pod(name, scheduler="volcano" if group else "kube-ferry", labels={"app": group or name},
                            annotations={"scheduling.k8s.io/group-name": group} if group else {})
        body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
        body["spec"]["nodeSelector"] = select
        if key:
            body["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": group}}, "topologyKey": key}]}}
        return body

    for name in ("close", "apart"):
        await client.CustomObjectsApi(tenant_api).create_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", tenant_ns, "podgroups",
            {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
             "spec": {"minMember": 2}})
    mine = {"ferry-test": tenant_ns}
    async with (reserved_node(compute_api, tenant_ns) as a, reserved_node(compute_api, tenant_ns) as b,
                reserved_node(compute_api, tenant_ns) as c):
        zones = {a: "x", b: "y", c: "y"}
        for node, zone in zones.items():
            await compute.patch_node(node, {"metadata": {"labels": {"ferry-test-zone": zone, "ferry-test-fill": node}}})
        try:
            # fillers leave 4 GPUs free on a (zone x) and b (zone y): the tightest pair for two 4-GPU pods
            for node in (a, b):
                await core.create_namespaced_pod(tenant_ns, pod(f"fill-{zones[node]}", 4,
                                                                {**mine, "ferry-test-fill": node}))

            async def filled() -> bool:
                return all([await _with_phase(core, tenant_ns, f"fill-{z}", "Running") for z in ("x", "y")])

            await eventually(filled, what="the fillers Running")
            uids = [(await core.create_namespaced_pod(tenant_ns, pod(f"close-{i}", 4, mine, group="close",
                                                                     key="ferry-test-zone"))).metadata.uid
                    for i in range(2)]
            for i in range(2):
                await core.create_namespaced_pod(tenant_ns, pod(f"apart-{i}", 8, mine, group="apart",
                                                                key="kubernetes.io/hostname"))

            async def close_runs() -> bool:
                return all([await _with_phase(core, tenant_ns, f"close-{i}", "Running") for i in range(2)])

            await eventually(close_runs, what="the gang that keeps together Running")
            copies = [await compute_pod_of(compute_api, "tenant-1", uid) for uid in uids]
            placed = sorted(cp.spec.node_name for cp in copies if cp is not None)
            assert placed == sorted((b, c)), f"both in zone y ({b}, {c}), not {placed}"

            async def told() -> list[Any]:
                return [e for i in range(2) for e in await _events(core, tenant_ns, f"apart-{i}", "FailedScheduling")
                        if "keep together by kubernetes.io/hostname (required pod affinity), so they need 16 GPUs "
                           "on one node and the largest schedulable has 8" in e.message]

            await eventually(told, timeout=30, what="the gang no node holds together told so")
            assert (await core.read_namespaced_pod("apart-0", tenant_ns)).status.phase == "Pending"
        finally:
            for node in zones:
                await compute.patch_node(node, {"metadata": {"labels": {"ferry-test-zone": None,
                                                                        "ferry-test-fill": None}}})


async def test_a_gangs_topology_spread_holds_in_the_compute_cluster_and_one_by_a_missing_label_is_told_so(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A gang's topology spread constraint among its own pods (DoNotSchedule) is kept on its copies and
    holds: four replicas over two zones, two each, where binpacking alone stacks them on one node; a gang
    that spreads by a label no compute node has waits, told why on its tenant pods."""
    core = client.CoreV1Api(tenant_api)
    compute = client.CoreV1Api(compute_api)
    await _top_priority_class(tenant_api)

    def member(name: str, group: str, key: str) -> dict[str, Any]:
        body = operator_pod(name, scheduler="volcano", labels={"app": group},
                            annotations={"scheduling.k8s.io/group-name": group})
        body["spec"]["nodeSelector"] = {"ferry-test": tenant_ns}
        body["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": key,
                                                      "whenUnsatisfiable": "DoNotSchedule",
                                                      "labelSelector": {"matchLabels": {"app": group}}}]
        return body

    groups = {"even": (4, "ferry-test-zone"), "nowhere": (2, "example.com/no-such-label")}
    for name, (size, _) in groups.items():
        await client.CustomObjectsApi(tenant_api).create_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", tenant_ns, "podgroups",
            {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
             "spec": {"minMember": size}})
    async with reserved_node(compute_api, tenant_ns) as a, reserved_node(compute_api, tenant_ns) as b:
        zones = {a: "x", b: "y"}
        for node, zone in zones.items():
            await compute.patch_node(node, {"metadata": {"labels": {"ferry-test-zone": zone}}})
        try:
            uids = []
            for name, (size, key) in groups.items():
                for i in range(size):
                    uids.append((await core.create_namespaced_pod(tenant_ns, member(f"{name}-{i}", name, key)))
                                .metadata.uid)

            async def even_runs() -> bool:
                return all([await _with_phase(core, tenant_ns, f"even-{i}", "Running") for i in range(4)])

            await eventually(even_runs, what="the gang that spreads Running")
            copies = [await compute_pod_of(compute_api, "tenant-1", uid) for uid in uids[:4]]
            placed = sorted(zones[cp.spec.node_name] for cp in copies if cp is not None)
            assert placed == ["x", "x", "y", "y"], placed
            assert copies[0] is not None and copies[0].spec.topology_spread_constraints[0].max_skew == 1

            async def told() -> list[Any]:
                return [e for e in await _events(core, tenant_ns, "nowhere-0", "FailedScheduling")
                        if "spread by example.com/no-such-label (topology spread constraint)" in e.message]

            await eventually(told, timeout=30, what="the gang spreading by a missing label told so")
            assert (await core.read_namespaced_pod("nowhere-0", tenant_ns)).status.phase == "Pending"
        finally:
            for node in zones:
                await compute.patch_node(node, {"metadata": {"labels": {"ferry-test-zone": None}}})


async def test_a_preferred_node_affinity_is_met_where_a_preferred_node_has_room(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A pod that prefers compute nodes by a label (a GPU product it runs best on) goes to such a node while
    one has room, where binpacking alone takes the tighter node without it."""
    core = client.CoreV1Api(tenant_api)
    compute = client.CoreV1Api(compute_api)
    await _top_priority_class(tenant_api)
    mine = {"ferry-test": tenant_ns}

    def pod(name: str, gpus: int, select: dict[str, str], prefer: str = "") -> dict[str, Any]:
        body = operator_pod(name, scheduler="kube-ferry")
        body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
        body["spec"]["nodeSelector"] = select
        if prefer:
            body["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [
                    {"key": "ferry-test-pref", "operator": "In", "values": [prefer]}]}}]}}
        return body

    async with reserved_node(compute_api, tenant_ns) as tight, reserved_node(compute_api, tenant_ns) as liked:
        await compute.patch_node(tight, {"metadata": {"labels": {"ferry-test-fill": tight}}})
        await compute.patch_node(liked, {"metadata": {"labels": {"ferry-test-pref": "yes"}}})
        try:
            await core.create_namespaced_pod(tenant_ns, pod("fill", 4, {**mine, "ferry-test-fill": tight}))
            await eventually(lambda: _with_phase(core, tenant_ns, "fill", "Running"), what="the filler Running")
            uid = (await core.create_namespaced_pod(tenant_ns, pod("picky", 2, mine, prefer="yes"))).metadata.uid
            await eventually(lambda: _with_phase(core, tenant_ns, "picky", "Running"), what="the picky pod Running")
            copy = await compute_pod_of(compute_api, "tenant-1", uid)
            assert copy is not None and copy.spec.node_name == liked, f"on {copy and copy.spec.node_name}, not {liked}"
        finally:
            await compute.patch_node(tight, {"metadata": {"labels": {"ferry-test-fill": None}}})
            await compute.patch_node(liked, {"metadata": {"labels": {"ferry-test-pref": None}}})


async def _running_on(core: client.CoreV1Api, ns: str, name: str, node: str) -> bool:
    return bool((await core.read_namespaced_pod(name, ns)).spec.node_name == node)


async def test_subdomain_gets_a_headless_service_and_hostname_is_kept(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    await core.create_namespaced_service(tenant_ns, {"metadata": {"name": "job"}, "spec": {
        "clusterIP": "None", "selector": {"job": "x"}, "ports": [{"name": "ssh", "port": 22}]}})
    body = tenant_pod("job-worker-0", automountServiceAccountToken=False, subdomain="job", hostname="job-worker-0")
    uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    await eventually(lambda: _with_phase(core, tenant_ns, "job-worker-0", "Running"), what="Running")
    cpod = await compute_pod_of(compute_api, "tenant-1", uid)
    svc = await client.CoreV1Api(compute_api).read_namespaced_service(cpod.spec.subdomain, "tenant-1")
    assert svc.spec.cluster_ip == "None" and svc.spec.ports[0].port == 22
    assert svc.spec.selector == {naming.SUBDOMAIN_LABEL: cpod.spec.subdomain}
    assert cpod.metadata.labels[naming.SUBDOMAIN_LABEL] == cpod.spec.subdomain
    assert cpod.spec.hostname == "job-worker-0"


async def test_a_compute_pod_deleted_behind_the_bridge_fails_the_tenant_pod(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    uid, cpod = await running_pair(core, compute_api, tenant_ns, "lost")
    await client.CoreV1Api(compute_api).delete_namespaced_pod(cpod.metadata.name, "tenant-1", grace_period_seconds=0)
    failed = await eventually(lambda: _with_phase(core, tenant_ns, "lost", "Failed"), what="tenant pod Failed")
    assert failed.status.reason == "ComputePodLost"
    assert await compute_pod_of(compute_api, "tenant-1", uid) is None, "never silently re-created"


async def test_a_compute_pod_deleted_before_its_first_status_fails_the_tenant_pod(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """No node holds 64 GPUs: the compute pod waits unbound, and upstream nothing is written for the
    first seconds (one write, not Pending then Running). Deleted in that window, it is still lost."""
    core = client.CoreV1Api(tenant_api)
    created = await core.create_namespaced_pod(tenant_ns, tenant_pod("early", gpus=64,
                                                                     automountServiceAccountToken=False))
    uid = created.metadata.uid
    cpod = await eventually(lambda: compute_pod_of(compute_api, "tenant-1", uid), timeout=30, interval=0.05,
                            what="compute pod created")
    await client.CoreV1Api(compute_api).delete_namespaced_pod(cpod.metadata.name, "tenant-1", grace_period_seconds=0)
    failed = await eventually(lambda: _with_phase(core, tenant_ns, "early", "Failed"), what="tenant pod Failed")
    assert failed.status.reason == "ComputePodLost"
    assert await compute_pod_of(compute_api, "tenant-1", uid) is None, "never silently re-created"


async def test_kubelet_api_authenticates_and_authorises_callers(planes: ControlPlanes, tenant_api: client.ApiClient,
                                                                 tenant_ns: str) -> None:
    import ssl

    import aiohttp

    node = await client.CoreV1Api(tenant_api).read_node("ferry-tenant-1")
    port = node.status.daemon_endpoints.kubelet_endpoint.port
    url = f"https://127.0.0.1:{port}/containerLogs/{tenant_ns}/nothing/main"
    token = (await client.CoreV1Api(tenant_api).create_namespaced_service_account_token(
        "default", tenant_ns, {"spec": {"expirationSeconds": 600}})).status.token
    ctx = ssl.create_default_context(cafile=str(planes.clusters["tenant-1"].pki / "ca.crt"))
    async with aiohttp.ClientSession() as http:
        async with http.get(url, ssl=ctx) as anonymous:
            assert anonymous.status == 401
        async with http.get(url, ssl=ctx, headers={"Authorization": f"Bearer {token}"}) as sa:
            assert sa.status == 403, "a service account without nodes/proxy may not read logs"
    ctx = ssl.create_default_context(cafile=str(planes.clusters["tenant-1"].pki / "ca.crt"))
    ctx.load_cert_chain(str(planes.clusters["tenant-1"].pki / "apiserver-kubelet-client.crt"),
                        str(planes.clusters["tenant-1"].pki / "apiserver-kubelet-client.key"))
    async with aiohttp.ClientSession() as http, http.get(url, ssl=ctx) as apiserver:
        assert apiserver.status == 404, "the apiserver's client certificate is let through"


async def test_node_capacity_follows_the_queue_maximum(tenant_api: client.ApiClient,
                                                       compute_api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(compute_api)
    core = client.CoreV1Api(tenant_api)

    async def gpus(want: str) -> bool:
        node = await core.read_node("ferry-tenant-1")
        return bool(node.status.allocatable["nvidia.com/gpu"] == want)

    await custom.patch_cluster_custom_object("scheduling.kubeferry.io", "v1alpha1", "queues", "tenant-1",
                                             {"spec": {"max": {"gpu": "24"}}}, _content_type=MERGE_PATCH)
    try:
        await eventually(lambda: gpus("24"), timeout=20, what="allocatable capped at the queue maximum")
    finally:
        await custom.patch_cluster_custom_object("scheduling.kubeferry.io", "v1alpha1", "queues", "tenant-1",
                                                 {"spec": {"max": None}}, _content_type=MERGE_PATCH)
    nodes = (await client.CoreV1Api(compute_api).list_node()).items
    total = sum(int(n.status.allocatable.get("nvidia.com/gpu", 0)) for n in nodes)
    await eventually(lambda: gpus(str(total)), timeout=20, what="allocatable back to the cluster's GPUs")


async def test_service_account_token_is_renewed_before_it_expires(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str,
        vnodes: dict[str, Component]) -> None:
    """A projected token of 600 s (the apiserver's minimum) renewed at 2 % of its life: the compute
    pod's token Secret holds a new valid token, bound to the same pod, within seconds — long before
    the first one expires. Fails if renewal is never scheduled or writes a broken token."""
    vnode = vnodes["tenant-1"]
    vnode.stop()
    vnode.spec.argv.append("--token-refresh-at=0.02")
    try:
        vnode.start()
        vnode.wait_ready()
        core = client.CoreV1Api(tenant_api)
        body = tenant_pod("long-runner")
        body["spec"]["volumes"] = [{"name": "tok", "projected": {"sources": [{"serviceAccountToken": {
            "path": "token", "expirationSeconds": 600}}]}}]
        body["spec"]["containers"][0]["volumeMounts"] = [{"name": "tok", "mountPath": "/var/run/tok"}]
        uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
        await eventually(lambda: _with_phase(core, tenant_ns, "long-runner", "Running"), what="pod Running")
        cpod = await compute_pod_of(compute_api, "tenant-1", uid)
        secret = next(s.secret.name for v in cpod.spec.volumes if v.projected
                      for s in v.projected.sources if s.secret and s.secret.name.endswith("-sa-token"))
        ccore = client.CoreV1Api(compute_api)

        async def token() -> str:
            data = (await ccore.read_namespaced_secret(secret, "tenant-1")).data["token"]
            return base64.b64decode(data).decode()

        first = await token()
        started = asyncio.get_running_loop().time()

        async def renewed() -> str | None:
            t = await token()
            return t if t != first else None

        second = await eventually(renewed, timeout=40, interval=0.5, what="a renewed token in the compute Secret")
        took = asyncio.get_running_loop().time() - started
        auth = client.AuthenticationV1Api(tenant_api)
        for t in (first, second):  # the old one has not expired; the new one is for the same pod
            review = await auth.create_token_review({"spec": {"token": t}})
            assert review.status.authenticated, review.status.error
            assert review.status.user.username == f"system:serviceaccount:{tenant_ns}:default"
            assert review.status.user.extra["authentication.kubernetes.io/pod-uid"] == [uid]
        assert took < 600 * 0.5, f"renewed after {took:.0f} s"
    finally:
        vnode.stop()
        vnode.spec.argv.remove("--token-refresh-at=0.02")
        vnode.start()
        vnode.wait_ready()


async def test_a_compute_pods_in_cluster_client_reaches_the_tenant_api_as_its_own_service_account(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """What an in-cluster client in the compute pod would do, done from its spec: the API address in its
    environment (the vnode's --tenant-api; the compute kubelet would name the compute API), the CA and the
    token of its projected ServiceAccount volume (the copied kube-root-ca.crt and the tenant-issued token).
    The tenant API, verified by that CA, knows the caller as the pod's own ServiceAccount."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    uid = (await core.create_namespaced_pod(tenant_ns, tenant_pod("talks-to-its-api"))).metadata.uid
    await eventually(lambda: _with_phase(core, tenant_ns, "talks-to-its-api", "Running"), what="pod Running")
    cpod = await compute_pod_of(compute_api, "tenant-1", uid)
    env = {e.name: e.value for e in cpod.spec.containers[0].env or []}
    sources = [s for v in cpod.spec.volumes if v.projected for s in v.projected.sources]
    token_secret = next(s.secret.name for s in sources if s.secret and s.secret.name.endswith("-sa-token"))
    ca_map = next(s.config_map.name for s in sources if s.config_map)
    token = base64.b64decode((await ccore.read_namespaced_secret(token_secret, "tenant-1")).data["token"]).decode()
    ca = (await ccore.read_namespaced_config_map(ca_map, "tenant-1")).data["ca.crt"]
    url = f"https://{env['KUBERNETES_SERVICE_HOST']}:{env['KUBERNETES_SERVICE_PORT']}"
    async with aiohttp.ClientSession() as http, http.post(
            f"{url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            headers={"Authorization": f"Bearer {token}"}, ssl=ssl.create_default_context(cadata=ca)) as resp:
        review = await resp.json()
        assert resp.status == 201, review
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{tenant_ns}:default", user
    assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [uid], "the token is bound to the tenant pod"
    await core.delete_namespaced_pod("talks-to-its-api", tenant_ns)


async def test_kubectl_debug_adds_its_container_to_the_compute_pod_and_a_privileged_one_is_refused(
        planes: ControlPlanes, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """`kubectl debug` (the real client) adds an ephemeral container to a running tenant pod: it joins the
    compute copy, translated as the pod's containers are, and its status comes back. A privileged one
    (`--profile=sysadmin`) is beyond the vnode's baseline Pod Security level: it is not added, and the pod
    says why (an Event, and the container's status terminated with reason Refused)."""
    core = client.CoreV1Api(tenant_api)
    uid, _ = await running_pair(core, compute_api, tenant_ns, "debugged")
    k, cfg = planes.bin.path("kubectl"), planes.kubeconfig("tenant-1")
    kubectl(k, cfg, "debug", "-n", tenant_ns, "debugged", "--image=busybox:1", "-c", "debugger",
            "--profile=baseline")

    async def copied() -> Any:
        cpod = await compute_pod_of(compute_api, "tenant-1", uid)
        return next((c for c in cpod.spec.ephemeral_containers or [] if c.name == "debugger"), None)

    debugger = await eventually(copied, timeout=30, what="the debug container in the compute pod")
    assert debugger.image == "busybox:1"
    assert {e.name for e in debugger.env or []} >= {"KUBERNETES_SERVICE_HOST"}, "translated as the others"

    async def state(name: str) -> Any:
        pod = await core.read_namespaced_pod("debugged", tenant_ns)
        return next((s.state for s in pod.status.ephemeral_container_statuses or [] if s.name == name), None)

    running = await eventually(lambda: state("debugger"), timeout=30, what="its status in the tenant pod")
    assert running.running is not None, running
    kubectl(k, cfg, "debug", "-n", tenant_ns, "debugged", "--image=busybox:1", "-c", "second",
            "--profile=baseline")
    assert (await eventually(lambda: state("second"), timeout=30, what="a second one's status")).running

    kubectl(k, cfg, "debug", "-n", tenant_ns, "debugged", "--image=busybox:1", "-c", "root-shell",
            "--profile=sysadmin")
    refused = await eventually(lambda: state("root-shell"), timeout=30, what="the privileged one's status")
    assert refused.terminated.reason == "Refused" and "privileged" in refused.terminated.message, refused
    events = (await core.list_namespaced_event(tenant_ns, field_selector=(
        "involvedObject.name=debugged,reason=Refused"))).items
    assert any("'root-shell'" in e.message and "privileged" in e.message for e in events), events
    cpod = await compute_pod_of(compute_api, "tenant-1", uid)
    assert [c.name for c in cpod.spec.ephemeral_containers] == ["debugger", "second"], "never added to the copy"
    assert (await core.read_namespaced_pod("debugged", tenant_ns)).status.phase == "Running", "the pod runs on"
    await core.delete_namespaced_pod("debugged", tenant_ns)


async def test_a_readiness_gate_is_the_tenants_to_open_and_its_condition_is_never_overwritten(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A pod with a readiness gate (as a load balancer's controller adds one) runs, but is Ready only once
    the tenant-side controller sets the gate's condition, as on a kubelet of the tenant cluster; the vnode's
    later status writes keep that condition."""
    core = client.CoreV1Api(tenant_api)
    await core.create_namespaced_pod(tenant_ns, tenant_pod(
        "gated", automountServiceAccountToken=False, readinessGates=[{"conditionType": "example.com/lb-ready"}]))

    async def ready(want: str) -> Any:
        pod = await core.read_namespaced_pod("gated", tenant_ns)
        conds = {c.type: c for c in pod.status.conditions or []}
        return pod if pod.status.phase == "Running" and "Ready" in conds and conds["Ready"].status == want else None

    held = await eventually(lambda: ready("False"), timeout=30, what="Running, not Ready")
    cond = next(c for c in held.status.conditions if c.type == "Ready")
    assert cond.reason == "ReadinessGatesNotReady", cond
    assert next(c for c in held.status.conditions if c.type == "ContainersReady").status == "True"
    await core.patch_namespaced_pod_status("gated", tenant_ns, {"status": {"conditions": [
        {"type": "example.com/lb-ready", "status": "True"}]}})  # strategic merge, as a controller writes it
    opened = await eventually(lambda: ready("True"), timeout=30, what="Ready once the gate is open")
    assert any(c.type == "example.com/lb-ready" and c.status == "True" for c in opened.status.conditions)
    await core.delete_namespaced_pod("gated", tenant_ns)


async def test_a_pod_made_again_under_its_name_gets_its_own_token_and_identity_not_the_earlier_ones(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Operators make pods again under the same names (a restarted vcjob, an MPIJob's workers, a
    StatefulSet). The compute Secret of a pod's token and identity is named after the pod, and an earlier
    pod's lingers until collected: the new pod must get a token bound to itself (the earlier one is void
    once that pod is gone) and its own UID in its downward-API files."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    body = tenant_pod("again", automountServiceAccountToken=True)
    body["spec"]["volumes"] = [{"name": "info", "downwardAPI": {"items": [
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}}]}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "info", "mountPath": "/etc/podinfo"}]

    async def secret_of(uid: str) -> dict[str, str]:
        await eventually(lambda: _with_phase(core, tenant_ns, "again", "Running"), what="Running")
        cpod = await compute_pod_of(compute_api, "tenant-1", uid)
        info = next(v for v in cpod.spec.volumes if v.name == "info")
        name = info.projected.sources[0].secret.name
        assert {i.key for i in info.projected.sources[0].secret.items} == {"name", "uid"}
        data = (await ccore.read_namespaced_secret(name, "tenant-1")).data
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    first_uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    first = await secret_of(first_uid)
    assert (first["name"], first["uid"], first["namespace"]) == ("again", first_uid, tenant_ns)
    await core.delete_namespaced_pod("again", tenant_ns, grace_period_seconds=0)

    async def gone() -> bool:
        try:
            await core.read_namespaced_pod("again", tenant_ns)
            return False
        except ApiException as exc:
            return exc.status == 404

    await eventually(gone, timeout=30, what="the first pod gone")
    second_uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    second = await eventually(lambda: _for_pod(secret_of(second_uid), second_uid), timeout=30,
                              what="the second pod's own Secret")
    review = await client.AuthenticationV1Api(tenant_api).create_token_review({"spec": {"token": second["token"]}})
    assert review.status.authenticated, review.status.error
    assert review.status.user.extra["authentication.kubernetes.io/pod-uid"] == [second_uid]
    await core.delete_namespaced_pod("again", tenant_ns)


async def _for_pod(secret: Awaitable[dict[str, str]], uid: str) -> dict[str, str] | None:
    got = await secret
    return got if got["uid"] == uid else None


def _cached(vnode: Component) -> dict[str, float]:
    """The vnode's informer cache sizes (its /metrics)."""
    prefix = 'kube_ferry_vnode_cached_objects{cache="'
    return {series[len(prefix):-2]: value for series, value in vnode_metrics(vnode).items()
            if series.startswith(prefix)}


async def test_like_a_kubelet_the_vnode_caches_only_its_own_pods_and_those_not_yet_scheduled(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str,
        vnodes: dict[str, Component]) -> None:
    """A tenant cluster's pods on its other nodes are none of the vnode's business: its memory must not
    grow with them (a tenant may run tens of thousands of CPU pods beside a few bridged ones)."""
    core = client.CoreV1Api(tenant_api)
    container = {"name": "c", "image": "cpu:1"}
    node = f"cpu-{uuid.uuid4().hex[:6]}"  # a node of the tenant's own (a Node object: pod GC leaves its pods)
    await core.create_node({"metadata": {"name": node}})
    try:
        for i in range(20):  # bound at creation: no scheduler involved
            await core.create_namespaced_pod(tenant_ns, {"metadata": {"name": f"elsewhere-{i}"},
                                                         "spec": {"nodeName": node, "containers": [container]}})
        await core.create_namespaced_pod(tenant_ns, {"metadata": {"name": "unschedulable"}, "spec": {
            "nodeSelector": {"no-such": "node"}, "containers": [container]}})
        await running_pair(core, compute_api, tenant_ns, "mine")
        await eventually(lambda: _caches_hold_only_their_pods(core, vnodes["tenant-1"]), timeout=30,
                         what="the vnode's caches hold its pods and the unbound ones")
        elsewhere = await core.list_namespaced_pod(tenant_ns, field_selector=f"spec.nodeName={node}")
        assert len(elsewhere.items) == 20, "the pods elsewhere exist, uncached"
    finally:
        await core.delete_node(node)


async def _caches_hold_only_their_pods(core: client.CoreV1Api, vnode: Component) -> bool:
    cached = _cached(vnode)
    on_node = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=ferry-tenant-1")
    unbound = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=")
    return cached.get("tenant-pods") == len(on_node.items) and cached.get("tenant-unbound-pods") == len(unbound.items)


async def _claim(core: client.CoreV1Api, ns: str, name: str, phase: str) -> Any:
    claim = await core.read_namespaced_persistent_volume_claim(name, ns)
    return claim if claim.status.phase == phase else None


async def _claim_events(core: client.CoreV1Api, ns: str, name: str, reason: str) -> list[Any]:
    events = (await core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")).items
    return [e for e in events if e.reason == reason and e.involved_object.kind == "PersistentVolumeClaim"]


def _claim_body(name: str, storage_class: str, size: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
                                                 "resources": {"requests": {"storage": size}}}}


async def _gone(read: Any) -> bool:
    try:
        await read()
    except ApiException as exc:
        return exc.status == 404
    return False


async def test_a_claim_of_the_vnodes_storage_class_lives_in_the_compute_namespace_as_long_as_it_does(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Persistent volumes: a tenant claim of class kube-ferry is Bound at once to a volume pinned to the
    virtual node and made as a claim of the same size in the compute namespace; a pod mounting it runs
    with the compute claim mounted, and a new run of a pod finds the same claim; deleting the claim
    removes both. A claim of another class is refused with the reason, and nothing reaches compute."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    await core.create_namespaced_persistent_volume_claim(tenant_ns, _claim_body("ckpt", "kube-ferry", "5Gi"))
    bound = await eventually(lambda: _claim(core, tenant_ns, "ckpt", "Bound"), what="the claim Bound")
    volume = await core.read_persistent_volume(bound.spec.volume_name)
    [term] = volume.spec.node_affinity.required.node_selector_terms
    assert term.match_fields[0].values == ["ferry-tenant-1"]  # its pods go to the virtual node
    cname = naming.compute_name("tenant-1", tenant_ns, "ckpt")
    cclaim = await ccore.read_namespaced_persistent_volume_claim(cname, "tenant-1")
    assert cclaim.spec.resources.requests["storage"] == "5Gi" and cclaim.spec.access_modes == ["ReadWriteOnce"]
    said = await eventually(lambda: _claim_events(core, tenant_ns, "ckpt", "ProvisioningSucceeded"),
                            what="ProvisioningSucceeded on the claim")
    assert cname in said[0].message

    mount = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    for run in ("trainer-1", "trainer-2"):  # a job's runs, one after the other: the same data
        uid = (await core.create_namespaced_pod(tenant_ns, tenant_pod(
            run, automountServiceAccountToken=False, volumes=mount))).metadata.uid
        await eventually(partial(_with_phase, core, tenant_ns, run, "Running"), what=f"{run} Running")
        cp = await compute_pod_of(compute_api, "tenant-1", uid)
        assert [v.persistent_volume_claim.claim_name for v in cp.spec.volumes if v.persistent_volume_claim] == [cname]
        await core.delete_namespaced_pod(run, tenant_ns, grace_period_seconds=0)
        await eventually(partial(_gone, partial(core.read_namespaced_pod, run, tenant_ns)), what=f"{run} gone")

    await core.create_namespaced_persistent_volume_claim(tenant_ns, _claim_body("local", "standard", "1Gi"))
    body = operator_pod("elsewhere", scheduler="kube-ferry")  # bound by the vnode: no volume check upstream
    body["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "local"}}]
    body["spec"].pop("priorityClassName")
    uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    failed = await eventually(lambda: _with_phase(core, tenant_ns, "elsewhere", "Failed"), what="refused pod Failed")
    assert failed.status.reason == "Refused" and "storage class 'standard'" in failed.status.message
    assert await compute_pod_of(compute_api, "tenant-1", uid) is None

    await core.delete_namespaced_persistent_volume_claim("ckpt", tenant_ns)
    await eventually(lambda: _gone(lambda: ccore.read_namespaced_persistent_volume_claim(cname, "tenant-1")),
                     timeout=60, what="the compute claim deleted with the tenant claim")
    await eventually(lambda: _gone(lambda: core.read_persistent_volume(bound.spec.volume_name)), timeout=60,
                     what="the volume deleted")


async def test_a_claim_over_the_compute_namespaces_quota_stays_pending_and_says_why(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Bad input where the user looks: the compute namespace's ResourceQuota refuses the compute claim, so the
    tenant claim stays Pending with a ProvisioningFailed Event giving the compute API's words; once the
    quota allows it, the claim is provisioned (nothing else was disturbed meanwhile)."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    quota = f"storage-{tenant_ns}"
    await ccore.create_namespaced_resource_quota("tenant-1", {"metadata": {"name": quota},
                                                              "spec": {"hard": {"requests.storage": "1Gi"}}})
    try:
        async def quota_counted() -> bool:  # the quota controller fills status.hard before it is enforced
            q = await ccore.read_namespaced_resource_quota(quota, "tenant-1")
            return bool(q.status and q.status.hard)

        await eventually(quota_counted, what="the quota in force")
        await core.create_namespaced_persistent_volume_claim(tenant_ns, _claim_body("huge", "kube-ferry", "50Gi"))
        said = await eventually(lambda: _claim_events(core, tenant_ns, "huge", "ProvisioningFailed"),
                                what="ProvisioningFailed on the claim")
        assert "exceeded quota" in said[0].message and "requests.storage" in said[0].message
        assert (await core.read_namespaced_persistent_volume_claim("huge", tenant_ns)).status.phase == "Pending"
    finally:
        await ccore.delete_namespaced_resource_quota(quota, "tenant-1")
    await eventually(lambda: _claim(core, tenant_ns, "huge", "Bound"), timeout=60,
                     what="the claim Bound once the quota is gone")
    await core.delete_namespaced_persistent_volume_claim("huge", tenant_ns)


async def test_an_in_place_resize_is_refused_by_the_tenant_api_and_the_copy_keeps_its_resources(
        planes: ControlPlanes, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """`kubectl patch --subresource resize` (in-place resize, GA in Kubernetes 1.35) on a bridged pod: the copy
    runs in the shared cluster with what it was placed by, and the virtual node does not declare the feature
    (``status.declaredFeatures``), so the tenant's API server refuses the resize at once, saying why."""
    core = client.CoreV1Api(tenant_api)
    body = tenant_pod("sized", automountServiceAccountToken=False)
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m", "memory": "64Mi"}
    uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    await eventually(lambda: _with_phase(core, tenant_ns, "sized", "Running"), what="the pod Running")
    patch = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "200m"}}}]}}
    res = kubectl(planes.bin.path("kubectl"), planes.kubeconfig("tenant-1"), "-n", tenant_ns, "patch", "pod",
                  "sized", "--subresource=resize", "--type=strategic", "-p", json.dumps(patch), check=False)
    assert res.returncode != 0 and "Pod running on node without support for resize" in res.stderr, res.stderr
    pod = await core.read_namespaced_pod("sized", tenant_ns)
    assert pod.spec.containers[0].resources.requests["cpu"] == "100m"
    copy = await compute_pod_of(compute_api, "tenant-1", uid)
    assert copy.spec.containers[0].resources.requests["cpu"] == "100m"


async def test_pods_of_separate_jobs_that_keep_apart_by_pod_anti_affinity_run_on_separate_compute_nodes(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Three replicas of one app, each a job of its own (a Deployment's pods, here for a scheduler the vnode
    serves), with a required pod anti-affinity on the node selecting the app: in the compute cluster each runs
    on a node of its own, where binpacking alone stacked them on one; a fourth pod of the app that states
    nothing keeps off their nodes too (the other side of the rule)."""
    core = client.CoreV1Api(tenant_api)
    app = f"web-{tenant_ns}"
    apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}}

    def replica(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
        body = tenant_pod(name, automountServiceAccountToken=False, schedulerName="kube-ferry", **spec)
        body["metadata"]["labels"] = labels
        return body

    uids = {}
    for name in ("web-0", "web-1", "web-2"):
        uids[name] = (await core.create_namespaced_pod(tenant_ns, replica(name, {"app": app}, affinity=apart))
                      ).metadata.uid

    async def placed(names: list[str]) -> dict[str, str] | None:
        out = {}
        for name in names:
            copy = await compute_pod_of(compute_api, "tenant-1", uids[name])
            if copy is None or not copy.spec.node_name:
                return None
            out[name] = copy.spec.node_name
        return out

    first = await eventually(lambda: placed(["web-0", "web-1", "web-2"]), timeout=60, what="three replicas placed")
    assert len(set(first.values())) == 3, first
    uids["late"] = (await core.create_namespaced_pod(tenant_ns, replica("late", {"app": app}))).metadata.uid
    later = await eventually(lambda: placed(["late"]), timeout=60, what="the fourth pod placed")
    assert later["late"] not in first.values(), (first, later)


async def _deployment_running(tenant_api: client.ApiClient, compute_api: client.ApiClient, ns: str, app: str,
                              replicas: int = 3, **spec: Any) -> list[tuple[Any, Any]]:
    """The replicas of a Deployment whose pods state ``spec``, once all are Running: each with its copy."""
    template = tenant_pod("unused", automountServiceAccountToken=False, **spec)
    template["metadata"] = {"labels": {"app": app}}
    await client.AppsV1Api(tenant_api).create_namespaced_deployment(ns, {
        "metadata": {"name": app},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}}, "template": template}})
    core = client.CoreV1Api(tenant_api)

    async def running() -> list[Any] | None:
        pods = (await core.list_namespaced_pod(ns, label_selector=f"app={app}")).items
        return pods if len(pods) == replicas and all(p.status.phase == "Running" for p in pods) else None

    pods = await eventually(running, timeout=90, what=f"{replicas} replicas Running")
    return [(p, await compute_pod_of(compute_api, "tenant-1", p.metadata.uid)) for p in pods]


async def _bound_by_the_vnode(tenant_api: client.ApiClient, ns: str) -> set[str]:
    """The pods the vnode bound as ones the tenant's scheduler kept off the virtual node by a rule per node."""
    told = (await client.CoreV1Api(tenant_api).list_namespaced_event(ns, field_selector="reason=BoundByVirtualNode")
            ).items
    assert all("only by a rule per node" in e.message for e in told), [e.message for e in told]
    return {e.involved_object.name for e in told}


async def test_a_deployment_of_the_tenants_scheduler_that_keeps_replicas_apart_per_node_runs_every_replica(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """An unmodified Deployment for the tenant's own kube-scheduler, three replicas with a required pod
    anti-affinity over ``kubernetes.io/hostname``: that scheduler puts one on the virtual node and finds no node
    for the others (it sees one hostname); the vnode binds those, says so on each, and in the compute cluster
    the three run on three nodes."""
    app = f"api-{tenant_ns}"
    placed = await _deployment_running(tenant_api, compute_api, tenant_ns, app, affinity={"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}})
    assert {p.spec.node_name for p, _ in placed} == {"ferry-tenant-1"}
    assert len({c.spec.node_name for _, c in placed}) == 3, [c.spec.node_name for _, c in placed]
    assert len(await _bound_by_the_vnode(tenant_api, tenant_ns)) == 2


async def test_a_deployment_of_the_tenants_scheduler_that_spreads_over_nodes_runs_every_replica_apart(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The same with a topology spread constraint over ``kubernetes.io/hostname`` (``maxSkew: 1``, may not be
    broken) in a tenant cluster that has another node (no GPUs): the tenant's scheduler puts one replica on the
    virtual node, then counts the other node as a domain holding none; the vnode binds the rest, and the
    compute scheduler, counting each replica's peers, runs them on three nodes."""
    app = f"infer-{tenant_ns}"
    core = client.CoreV1Api(tenant_api)
    other = f"cpu-{tenant_ns}"[:63]
    await core.create_node({"metadata": {"name": other, "labels": {"kubernetes.io/hostname": other}}})
    try:
        placed = await _deployment_running(tenant_api, compute_api, tenant_ns, app, topologySpreadConstraints=[{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": app}}}])
    finally:
        await core.delete_node(other)
    assert {p.spec.node_name for p, _ in placed} == {"ferry-tenant-1"}
    assert len({c.spec.node_name for _, c in placed}) == 3, [c.spec.node_name for _, c in placed]
    assert len(await _bound_by_the_vnode(tenant_api, tenant_ns)) == 2


async def test_kubectl_drain_of_the_virtual_node_moves_a_deployment_off_and_its_new_pods_wait_for_uncordon(
        planes: ControlPlanes, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """``kubectl drain`` on the virtual node, as a tenant admin takes the bridge out of service: it cordons the
    Node and evicts the Deployment's pods (for a scheduler the vnode serves, as gangs' pods are), whose copies
    leave the compute cluster; the replicas the Deployment makes again are not bound while it is cordoned, as
    kube-scheduler would bind none, and are told why (also by why-pending); a pod drain did not select keeps
    running; once uncordoned the new replicas run."""
    core = client.CoreV1Api(tenant_api)
    node = "ferry-tenant-1"
    app = f"drain-{tenant_ns}"
    await running_pair(core, compute_api, tenant_ns, "bystander")
    first = await _deployment_running(tenant_api, compute_api, tenant_ns, app, replicas=2, schedulerName="kube-ferry")
    try:
        kubectl(planes.bin.path("kubectl"), planes.kubeconfig("tenant-1"), "drain", node, "--pod-selector",
                f"app={app}", "--timeout=90s", timeout=120)
        for p, _ in first:  # evicted, and their copies gone from the compute cluster
            assert await compute_pod_of(compute_api, "tenant-1", p.metadata.uid) is None
        gone = {p.metadata.name for p, _ in first}

        async def told() -> list[Any] | None:
            pods = [p for p in (await core.list_namespaced_pod(tenant_ns, label_selector=f"app={app}")).items
                    if p.metadata.name not in gone]
            evs = (await core.list_namespaced_event(tenant_ns, field_selector="reason=VirtualNodeUnschedulable")).items
            return pods if len(pods) == 2 and {e.involved_object.name for e in evs} == {
                p.metadata.name for p in pods} else None

        again = await eventually(told, timeout=30, what="the Deployment's new pods told why they wait")
        assert all(not p.spec.node_name and p.status.phase == "Pending" for p in again)
        for p in again:  # and as kube-scheduler says it, where `kubectl describe` and tools look
            said = await eventually(lambda n=p.metadata.name: _scheduled_condition(core, tenant_ns, n), timeout=10,
                                    what=f"{p.metadata.name}'s PodScheduled condition")
            assert (said.status, said.reason) == ("False", "Unschedulable"), said
            assert f"the virtual node {node} takes no new pods now: it is cordoned" in said.message, said
        # `kubectl ferry why-pending`, for this pod of scheduler kube-ferry and for one of another scheduler the
        # vnode plays (whose PodScheduled condition why-pending reads first)
        plain = operator_pod("plain", scheduler="scheduler-plugins-scheduler")
        plain["spec"].pop("priorityClassName")
        await core.create_namespaced_pod(tenant_ns, plain)
        for name in (again[0].metadata.name, "plain"):
            async def explained(n: str = name) -> Any | None:  # once the vnode's Event is there
                verdict = await explain(Rest(tenant_api), tenant_ns, n)
                return verdict if verdict.reason == "VirtualNodeUnschedulable" else None

            verdict = await eventually(explained, timeout=30, what=f"why-pending of {name}")
            assert verdict.message.startswith(f"the virtual node {node} takes no new pods now: it is cordoned"), verdict
            assert verdict.hint.startswith("an admin has cordoned or tainted the virtual node"), verdict
        await core.delete_namespaced_pod("plain", tenant_ns, grace_period_seconds=0)
        assert (await core.read_namespaced_pod("bystander", tenant_ns)).status.phase == "Running"
    finally:
        await core.patch_node(node, {"spec": {"unschedulable": False}})

    async def running_again() -> bool:
        pods = (await core.list_namespaced_pod(tenant_ns, label_selector=f"app={app}")).items
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    await eventually(running_again, timeout=60, what="the new replicas Running once the node is uncordoned")


async def _scheduled_condition(core: client.CoreV1Api, ns: str, name: str) -> Any | None:
    pod = await core.read_namespaced_pod(name, ns)
    return next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)


async def test_a_deployment_whose_replicas_spread_over_racks_runs_one_per_rack(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A Deployment for a scheduler the vnode serves, three replicas (each a job of its own) with a topology
    spread constraint over the compute nodes' rack label that may not be broken: each counts the others, so
    they run in three racks, where binpacking alone put them on one node."""
    app = f"serve-{tenant_ns}"
    placed = await _deployment_running(tenant_api, compute_api, tenant_ns, app, schedulerName="kube-ferry",
                                       topologySpreadConstraints=[{
                                           "maxSkew": 1, "topologyKey": DOMAIN_LABEL,
                                           "whenUnsatisfiable": "DoNotSchedule",
                                           "labelSelector": {"matchLabels": {"app": app}}}])
    compute = client.CoreV1Api(compute_api)
    racks = [(await compute.read_node(c.spec.node_name)).metadata.labels[DOMAIN_LABEL] for _, c in placed]
    assert len(set(racks)) == 3, racks


async def test_a_pod_that_keeps_beside_another_jobs_pod_by_pod_affinity_runs_on_its_compute_node(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, compute_ns: str,
        private_node: str) -> None:
    """A reader with a required pod affinity to a cache pod (another job) on the node: its copy runs on the
    cache's compute node, which binpacking alone would not pick (the cache sits alone on a node only this test
    selects, and a filler makes another node tighter); one whose affinity selects no running pod, nor
    itself, waits and is told why."""
    core = client.CoreV1Api(tenant_api)
    cache_app = f"cache-{tenant_ns}"

    def served(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
        body = tenant_pod(name, automountServiceAccountToken=False, schedulerName="kube-ferry", **spec)
        body["metadata"]["labels"] = labels
        return body

    def beside(app: str) -> dict[str, Any]:
        return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "kubernetes.io/hostname"}]}}

    async def on_node(uid: str) -> str | None:
        copy = await compute_pod_of(compute_api, "tenant-1", uid)
        return copy.spec.node_name if copy is not None and copy.spec.node_name else None

    # a tighter node than the cache's, where binpacking alone would put the reader
    filler = await core.create_namespaced_pod(tenant_ns, served("filler", {"app": "filler"}, gpus=6))
    assert await eventually(lambda: on_node(filler.metadata.uid), what="the filler placed") != private_node
    cache = (await core.create_namespaced_pod(tenant_ns, served("cache", {"app": cache_app},
                                                                nodeSelector={"ferry-test": compute_ns}))).metadata.uid
    await eventually(lambda: _with_phase(core, tenant_ns, "cache", "Running"), what="the cache Running")
    reader = (await core.create_namespaced_pod(tenant_ns, served("reader", {"app": "reader"},
                                                                 affinity=beside(cache_app)))).metadata.uid
    await core.create_namespaced_pod(tenant_ns, served("lonely", {"app": "reader"}, affinity=beside("nothing")))

    assert await eventually(lambda: on_node(cache), what="the cache placed") == private_node
    assert await eventually(lambda: on_node(reader), timeout=60, what="the reader placed") == private_node

    async def told() -> str | None:
        events = (await core.list_namespaced_event(tenant_ns, field_selector="involvedObject.name=lonely")).items
        return next((e.message for e in events if "its pod affinity and anti-affinity rule out" in (e.message or "")),
                    None)

    said = await eventually(told, timeout=60, what="the lonely reader told why it waits")
    assert "rule out" in said and (await core.read_namespaced_pod("lonely", tenant_ns)).status.phase == "Pending"
