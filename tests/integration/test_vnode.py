"""The vnode bridge on real control planes: tenant pods run in the compute cluster and behave like
ordinary pods upstream (status, events, logs, deletion), tenants stay apart, unsafe pods are refused."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import api_client, eventually, kubectl
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


async def phase(core: client.CoreV1Api, ns: str, name: str) -> str:
    return (await core.read_namespaced_pod(name, ns)).status.phase or ""


async def test_pod_with_configmap_secret_and_token_runs_and_succeeds(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    await core.create_namespaced_config_map(tenant_ns, {"metadata": {"name": "settings"}, "data": {"lr": "0.1"}})
    await core.create_namespaced_secret(tenant_ns, {"metadata": {"name": "creds"}, "stringData": {"key": "s3cr3t"}})
    body = tenant_pod("train", duration="6s")
    body["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "settings"}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/etc/cfg"}]
    body["spec"]["containers"][0]["env"] = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                                         "key": "key"}}}]
    await eventually(lambda: _sa_exists(core, tenant_ns), what="default ServiceAccount")
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
    secret_ref = cpod.spec.containers[0].env[0].value_from.secret_key_ref.name
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


async def _events(core: client.CoreV1Api, ns: str, pod: str, reason: str) -> list[Any]:
    evs = await core.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}")
    return [e for e in evs.items if e.reason == reason]


async def test_preempted_compute_pod_fails_upstream_and_is_not_recreated(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    uid = (await core.create_namespaced_pod(tenant_ns, tenant_pod("victim", automountServiceAccountToken=False))
           ).metadata.uid
    await eventually(lambda: _with_phase(core, tenant_ns, "victim", "Running"), what="victim Running")
    cpod = await compute_pod_of(compute_api, "tenant-1", uid)
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
    uid = (await core.create_namespaced_pod(tenant_ns, tenant_pod("gone", automountServiceAccountToken=False))
           ).metadata.uid
    await eventually(lambda: _with_phase(core, tenant_ns, "gone", "Running"), what="Running")
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
    uid = (await core.create_namespaced_pod(tenant_ns, tenant_pod("chatty", automountServiceAccountToken=False))
           ).metadata.uid
    await eventually(lambda: _with_phase(core, tenant_ns, "chatty", "Running"), what="Running")
    cpod = await compute_pod_of(compute_api, "tenant-1", uid)
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


@pytest.fixture
async def tenant2_api(planes: ControlPlanes) -> AsyncIterator[client.ApiClient]:
    async with api_client(planes.kubeconfig("tenant-2")) as api:
        yield api


async def test_virtual_node_registers_with_capacity_and_heartbeat(tenant_api: client.ApiClient,
                                                                  vnodes: dict[str, Component]) -> None:
    core = client.CoreV1Api(tenant_api)
    node = await core.read_node("ferry-tenant-1")
    assert any(t.key == "virtual-kubelet.io/provider" and t.effect == "NoSchedule" for t in node.spec.taints)
    assert node.metadata.labels["kubeferry.io/tenant"] == "tenant-1"
    assert int(node.status.allocatable["nvidia.com/gpu"]) > 0
    assert next(c for c in node.status.conditions if c.type == "Ready").status == "True"
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
    spec: dict[str, Any] = {"automountServiceAccountToken": False, "containers": [{
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
    """Members exist and are bound upstream, but the compute scheduler waits for the whole gang (and says so)."""
    for n in names:
        pod = await core.read_namespaced_pod(n, ns)
        cpod = await compute_pod_of(compute, "tenant-1", pod.metadata.uid)
        if pod.spec.node_name != "ferry-tenant-1" or cpod is None or cpod.spec.node_name:
            return False
    return bool(await _events(core, ns, names[0], "Waiting"))


@pytest.mark.parametrize("convention", ["volcano", "scheduler-plugins", "kueue"])
async def test_operator_gangs_bind_to_the_virtual_node_and_run_as_one(
        convention: str, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
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
    if crd is not None:
        await eventually(lambda: _phase_is(tenant_api, crd, tenant_ns, "Running"), what="tenant PodGroup Running")


async def _phase_is(api: client.ApiClient, crd: tuple[str, str], ns: str, want: str) -> bool:
    return await _group_phase(api, *crd, ns, "job") == want
