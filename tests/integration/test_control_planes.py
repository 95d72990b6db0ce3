"""The local control planes are real Kubernetes: kubectl, kwok GPU nodes, pod lifecycle, RBAC."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.cluster.gpunodes import DOMAIN_LABEL, MODEL_LABEL, TOPOLOGY_ANNOTATION
from ferry.cluster.planes import ControlPlanes
from tests.conftest import SESSION_GPU_NODES
from tests.helpers import eventually, kubectl


def test_kubectl_reaches_every_cluster(planes: ControlPlanes) -> None:
    kc = planes.bin.path("kubectl")
    for name in ["compute", *planes.tenant_names]:
        version = json.loads(kubectl(kc, planes.kubeconfig(name), "version", "-o", "json").stdout)
        assert version["serverVersion"]["gitVersion"] == "v1.36.3"
        namespaces = kubectl(kc, planes.kubeconfig(name), "get", "namespaces", "-o", "name").stdout.split()
        assert "namespace/kube-system" in namespaces


async def test_kwok_gpu_nodes_are_ready_with_gpus(compute_api: client.ApiClient) -> None:
    nodes = (await client.CoreV1Api(compute_api).list_node(label_selector="type=kwok")).items
    assert len(nodes) == SESSION_GPU_NODES
    for node in nodes:
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", node.metadata.name
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        assert node.metadata.labels[MODEL_LABEL]
        assert node.metadata.labels[DOMAIN_LABEL].startswith("rack-")
        topo = json.loads(node.metadata.annotations[TOPOLOGY_ANNOTATION])
        assert topo["devices"] == 8
        assert sorted(d for g in topo["nvlinkGroups"] for d in g) == list(range(8))


def _pod(name: str, node: str, annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


async def test_bound_pod_runs_then_succeeds_after_its_duration(compute_api: client.ApiClient, compute_ns: str) -> None:
    core = client.CoreV1Api(compute_api)
    await core.create_namespaced_pod(compute_ns, _pod("sim", "gpu-node-0001", {"kubeferry.io/sim-duration": "3s"}))
    await eventually(lambda: _is(core, compute_ns, "sim", "Running"), timeout=20, what="pod Running")
    running_seen = time.monotonic()
    pod = await eventually(lambda: _is(core, compute_ns, "sim", "Succeeded"), timeout=30, what="pod Succeeded")
    assert time.monotonic() - running_seen >= 2.0  # not before its annotated duration (3 s, minus watch lag)
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == 0
    assert term.reason == "Completed"
    assert pod.status.pod_ip


async def _is(core: client.CoreV1Api, ns: str, name: str, phase: str) -> object:
    pod = await core.read_namespaced_pod(name, ns)
    return pod if pod.status.phase == phase else None


async def test_exit_code_annotation_fails_the_pod(compute_api: client.ApiClient, compute_ns: str) -> None:
    core = client.CoreV1Api(compute_api)
    await core.create_namespaced_pod(compute_ns, _pod("crash", "gpu-node-0002", {"kubeferry.io/sim-exit-code": "3"}))
    pod = await eventually(lambda: _is(core, compute_ns, "crash", "Failed"), timeout=30, what="pod Failed")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    assert pod.status.message == "simulated container exited with code 3"


async def test_tenant_controller_manager_creates_service_account_and_job_pods(
    tenant_api: client.ApiClient, tenant_ns: str
) -> None:
    core = client.CoreV1Api(tenant_api)
    await eventually(lambda: _sa(core, tenant_ns), timeout=30, what="default ServiceAccount")
    job = {
        "metadata": {"name": "hello"},
        "spec": {"parallelism": 2, "completions": 2, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
    }
    await client.BatchV1Api(tenant_api).create_namespaced_job(tenant_ns, job)

    async def pods() -> int:
        items = (await core.list_namespaced_pod(tenant_ns, label_selector="job-name=hello")).items
        return len(items) if len(items) == 2 else 0

    await eventually(pods, timeout=30, what="two Job pods")


async def _sa(core: client.CoreV1Api, ns: str) -> bool:
    try:
        await core.read_namespaced_service_account("default", ns)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def test_rbac_denies_a_credential_without_rights(planes: ControlPlanes, tenant_api: client.ApiClient,
                                                       tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    await core.create_namespaced_service_account(tenant_ns, {"metadata": {"name": "nobody"}})
    token = (await core.create_namespaced_service_account_token(
        "nobody", tenant_ns, {"spec": {"expirationSeconds": 600}})).status.token
    cfg = client.Configuration()
    cfg.host = planes.clusters["tenant-1"].server
    cfg.ssl_ca_cert = str(planes.clusters["tenant-1"].pki / "ca.crt")
    cfg.api_key = {"authorization": f"Bearer {token}"}
    async with client.ApiClient(cfg) as api:
        with pytest.raises(ApiException) as denied:
            await client.CoreV1Api(api).list_namespaced_pod(tenant_ns)
        assert denied.value.status == 403
        with pytest.raises(ApiException) as denied_nodes:
            await client.CoreV1Api(api).list_node()
        assert denied_nodes.value.status == 403
    # the admin credential of one tenant is not valid on another cluster (separate CAs)
    other = planes.clusters["tenant-2"]
    foreign = client.Configuration()
    await config.load_kube_config(config_file=str(planes.kubeconfig("tenant-1")), client_configuration=foreign)
    foreign.host = other.server
    foreign.ssl_ca_cert = str(other.pki / "ca.crt")
    async with client.ApiClient(foreign) as api:
        with pytest.raises(ApiException) as unauth:
            await client.CoreV1Api(api).list_namespace()
        assert unauth.value.status == 401


async def test_a_stopped_apiserver_comes_back(planes: ControlPlanes) -> None:
    """The fixture can stop and restart any single component (fault tests build on this)."""
    comp = planes.components["tenant-2-apiserver"]
    comp.stop()
    assert not comp.alive()
    kc = planes.bin.path("kubectl")
    res = kubectl(kc, planes.kubeconfig("tenant-2"), "get", "ns", "--request-timeout=2s", check=False)
    assert res.returncode != 0
    comp.start()
    comp.wait_ready()
    assert "namespace/default" in kubectl(kc, planes.kubeconfig("tenant-2"), "get", "ns", "-o", "name").stdout


async def test_informers_list_in_pages_through_the_real_servers_continue_tokens(
        compute_api: client.ApiClient, compute_ns: str) -> None:
    """Both kinds of lister an informer is given (the typed client's, ``Rest.lister``) page with
    ``limit``/``continue`` against a real apiserver, and the pages add up to the whole list."""
    from functools import partial
    from typing import Any

    from ferry.kube.informer import Informer
    from ferry.kube.rest import Rest, path

    core = client.CoreV1Api(compute_api)
    for i in range(7):
        await core.create_namespaced_config_map(compute_ns, {"metadata": {"name": f"cm-{i}"}})
    typed = partial(core.list_namespaced_config_map, compute_ns)
    for lister in (typed, Rest(compute_api).lister(path("", "v1", "configmaps", compute_ns))):
        tokens: list[str | None] = []

        async def paging(lister: Any = lister, tokens: list[str | None] = tokens, **kw: Any) -> Any:
            tokens.append(kw.get("_continue"))
            return await lister(**kw)

        inf = Informer("configmaps", paging, page_size=3)
        await inf._list()
        assert {k for k in inf.store if "/cm-" in k} == {f"{compute_ns}/cm-{i}" for i in range(7)}
        assert len(tokens) >= 3 and tokens[0] is None and all(tokens[1:]), tokens  # 7 + kube-root-ca.crt
