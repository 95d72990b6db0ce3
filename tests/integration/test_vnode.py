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
