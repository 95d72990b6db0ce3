"""An unmodified KubeRay operator (v1.5.0, built from its Go module) in a tenant cluster, with Volcano as its
batch scheduler: a RayCluster's head and GPU workers start in the compute cluster as one gang through the
virtual node and the cluster becomes ready; scaling its worker group up places the new worker, scaling it
down removes workers there, and the gang keeps the size the operator gives its PodGroup, so a cluster that
lost every pod starts again; deleting it leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.binaries import Binaries
from ferry.binaries.clients import KUBERAY, ensure_operator
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import (
    compute_copies,
    eventually,
    guarantee_claiming,
    logged_process,
    reserved_node,
    resolve,
    running_pods,
    wait_sync,
)
from vnode.dnsserver import PeerDNS
from vnode.naming import UPSTREAM_NAME_ANNOTATION, UPSTREAM_NS_LABEL, compute_name

TENANT = "tenant-1"
IMAGE = "rayproject/ray:2.46.0"  # what KubeRay's samples run (kwok runs no image)


@pytest.fixture(scope="module")
def kuberay(planes: ControlPlanes, binaries: Binaries, vnodes: dict[str, Component],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """The operator watching every namespace of tenant-1, batch scheduler ``volcano`` (PodGroups per cluster)."""
    op = ensure_operator(KUBERAY)
    kubeconfig = planes.kubeconfig(TENANT)
    kubectl = [str(binaries.path("kubectl")), f"--kubeconfig={kubeconfig}"]
    # all three, as its release installs them: the operator starts no controller until every kind is served
    subprocess.run([*kubectl, "apply", "--server-side", "-f", str(op.crds)], check=True, capture_output=True)
    log_path = tmp_path_factory.mktemp("kuberay") / "operator.log"
    with logged_process([str(op.binary), "--batch-scheduler=volcano", "--enable-leader-election=false",
                         "--metrics-addr=0", "--health-probe-bind-address=0", f"--kubeconfig={kubeconfig}"],
                        {**os.environ, "KUBECONFIG": str(kubeconfig)}, log_path) as proc:
        wait_sync(lambda: b'"logger":"controllers.RayCluster","msg":"Starting workers"' in log_path.read_bytes(), 60,
                  f"the RayCluster controller to start (log: {log_path})")
        assert proc.poll() is None, log_path.read_text()[-2000:]
        yield proc


def raycluster(name: str, workers: int, gpus: int = 1, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A RayCluster as KubeRay's samples write one: a head without GPUs and one group of ``gpus``-GPU workers."""
    def template(container: str, limits: dict[str, str]) -> dict[str, Any]:
        spec = {"containers": [{"name": container, "image": IMAGE, "resources": {"limits": limits}}]}
        return {"spec": {**spec, "nodeSelector": node_selector} if node_selector else spec}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
            "spec": {"rayVersion": "2.46.0",
                     "headGroupSpec": {"rayStartParams": {},
                                       "template": template("ray-head", {"cpu": "1", "memory": "2Gi"})},
                     "workerGroupSpecs": [{
                         "groupName": "gpu", "replicas": workers, "minReplicas": 0, "maxReplicas": 8,
                         "rayStartParams": {},
                         "template": template("ray-worker", {"cpu": "1", "memory": "2Gi",
                                                             "nvidia.com/gpu": str(gpus)})}]}}


def _running(pods: list[Any], count: int) -> list[Any] | None:
    live = [p for p in pods if p.metadata.deletion_timestamp is None]
    return live if len(live) == count and all(p.status.phase == "Running" and p.spec.node_name for p in live) \
        else None


@pytest.mark.usefixtures("kuberay")
async def test_a_raycluster_starts_as_one_gang_scales_and_leaves_nothing_when_deleted(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, peer_dns: PeerDNS) -> None:
    rays = client.CustomObjectsApi(tenant_api)
    groups = client.CustomObjectsApi(tenant_api)
    await rays.create_namespaced_custom_object("ray.io", "v1", tenant_ns, "rayclusters", raycluster("rc", workers=2))

    async def compute_running(count: int) -> list[Any] | None:
        return _running(await compute_copies(compute_api, tenant_ns), count)

    pods = await eventually(lambda: compute_running(3), timeout=90,
                            what="the head and 2 workers Running in the compute cluster")
    gpu_pods = [p for p in pods if "nvidia.com/gpu" in (p.spec.containers[0].resources.limits or {})]
    assert len(gpu_pods) == 2 and all(p.spec.node_name.startswith("gpu-node-") for p in gpu_pods)
    # A worker reaches the head at the address KubeRay gives it (FQ_RAY_IP: its head Service's full name),
    # which resolves (`ferry dns`) to the vnode's copy of that Service, which routes to the head's compute pod.
    head_pod = next(p for p in pods if p not in gpu_pods)
    address = next(e.value for c in [*gpu_pods[0].spec.containers, *(gpu_pods[0].spec.init_containers or [])]
                   for e in c.env or [] if e.name == "FQ_RAY_IP")

    async def head_found() -> bool:
        svc = await _copy_of(compute_api, tenant_ns, address.split(".")[0])
        want = None if svc is None else ([head_pod.status.pod_ip] if svc.spec.cluster_ip in (None, "None")
                                         else [svc.spec.cluster_ip])
        return want is not None and await resolve(peer_dns, gpu_pods[0], address) == want

    await eventually(head_found, timeout=30, what=f"the head's address {address} resolved from a worker")
    group = await groups.get_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", tenant_ns, "podgroups",
                                                      "ray-rc-pg")
    assert group["spec"]["minMember"] == 3

    async def state() -> str | None:
        rc = await rays.get_namespaced_custom_object("ray.io", "v1", tenant_ns, "rayclusters", "rc")
        return str((rc.get("status") or {}).get("state") or "") or None

    assert await eventually(lambda: _is(state, "ready"), timeout=60, what="the RayCluster ready") == "ready"

    await rays.patch_namespaced_custom_object("ray.io", "v1", tenant_ns, "rayclusters", "rc",
                                              [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas",
                                                "value": 3}])
    await eventually(lambda: compute_running(4), timeout=90, what="the third worker Running in the compute cluster")
    group = await groups.get_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", tenant_ns, "podgroups",
                                                      "ray-rc-pg")
    assert group["spec"]["minMember"] == 4  # the operator grew the gang it had started

    await rays.patch_namespaced_custom_object("ray.io", "v1", tenant_ns, "rayclusters", "rc",
                                              [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas",
                                                "value": 1}])
    left = await eventually(lambda: compute_running(2), timeout=90, what="two workers gone from the compute cluster")

    async def tenant_pods() -> list[Any] | None:
        pods = (await client.CoreV1Api(tenant_api).list_namespaced_pod(tenant_ns)).items
        return pods if len(pods) == 2 else None

    kept = await eventually(tenant_pods, timeout=60, what="the operator's 2 pods left in the tenant cluster")
    assert {p.metadata.annotations[UPSTREAM_NAME_ANNOTATION] for p in left} == {p.metadata.name for p in kept}
    assert {p.spec.node_name for p in kept} == {f"ferry-{TENANT}"}

    # The operator resized its gang with the group (minMember 2 now), and the compute PodGroup follows it:
    # a cluster whose pods are all lost comes back as a gang of 2, not one waiting for the 4 it once had.
    async def compute_minimum() -> int | None:
        groups = await client.CustomObjectsApi(compute_api).list_namespaced_custom_object(
            "scheduling.kubeferry.io", "v1alpha1", TENANT, "podgroups",
            label_selector=f"{UPSTREAM_NS_LABEL}={tenant_ns}")
        sizes = [int(g["spec"]["minMember"]) for g in groups["items"]]
        return sizes[0] if sizes == [2] else None

    await eventually(compute_minimum, timeout=30, what="the compute PodGroup's minMember following to 2")
    await client.CoreV1Api(tenant_api).delete_collection_namespaced_pod(tenant_ns)

    async def replaced() -> list[Any] | None:
        pods = _running(await compute_copies(compute_api, tenant_ns), 2)
        names = {p.metadata.annotations[UPSTREAM_NAME_ANNOTATION] for p in pods or []}
        return pods if pods and not names & {p.metadata.name for p in kept} else None

    await eventually(replaced, timeout=90, what="the operator's new head and worker Running in the compute cluster")

    await rays.delete_namespaced_custom_object("ray.io", "v1", tenant_ns, "rayclusters", "rc")

    async def gone() -> bool:
        return not await compute_copies(compute_api, tenant_ns)

    await eventually(gone, timeout=90, what="the deleted RayCluster's compute pods to be gone")


async def _copy_of(compute_api: client.ApiClient, tenant_ns: str, service: str) -> Any:
    name = compute_name(TENANT, tenant_ns, service)
    found = [s for s in (await client.CoreV1Api(compute_api).list_namespaced_service(TENANT)).items
             if s.metadata.name == name]
    return found[0] if found else None


async def _is(read: Any, want: str) -> str | None:
    got = await read()
    return got if got == want else None


@pytest.mark.usefixtures("kuberay")
async def test_a_preempted_raycluster_is_recreated_by_its_operator_and_runs_again_as_one_gang(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, compute_ns: str) -> None:
    """An elastic RayCluster soaking up a node is preempted whole for another queue's guarantee: its pods
    end Failed/Preempted in the tenant cluster, the operator replaces them, and the replacements wait as
    one gang (none runs alone, no duplicate) until the node is free again, then run."""
    ccore, ccustom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    tcore, tcustom = client.CoreV1Api(tenant_api), client.CustomObjectsApi(tenant_api)
    async with reserved_node(compute_api, tenant_ns) as node:
        await tcustom.create_namespaced_custom_object(
            "ray.io", "v1", tenant_ns, "rayclusters",
            raycluster("soak", workers=1, gpus=8, node_selector={"ferry-test": tenant_ns}))
        # The operator makes the PodGroup; its user marks it elastic afterwards, as with kubectl annotate.
        group = await eventually(lambda: _podgroup(tcustom, tenant_ns, "ray-soak-pg"), what="the operator's PodGroup")
        await tcustom.patch_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", tenant_ns, "podgroups", "ray-soak-pg",
            [{"op": "add", "path": "/metadata/annotations", "value": {
                **(group["metadata"].get("annotations") or {}), "kubeferry.io/tier": "Elastic"}}])
        first = await eventually(lambda: running_pods(tcore, tenant_ns, 2), timeout=90,
                                 what="the elastic RayCluster's head and worker Running")

        async def compute_tier() -> str | None:
            groups = await ccustom.list_namespaced_custom_object(
                "scheduling.kubeferry.io", "v1alpha1", TENANT, "podgroups",
                label_selector=f"{UPSTREAM_NS_LABEL}={tenant_ns}")
            tiers = [g["spec"]["tier"] for g in groups["items"]]
            return tiers[0] if tiers == ["Elastic"] else None

        await eventually(compute_tier, timeout=30, what="the compute PodGroup elastic, as its tenant group now says")

        async with guarantee_claiming(compute_api, compute_ns, tenant_ns) as urgent:
            async def preempted() -> list[Any] | None:
                events = (await tcore.list_namespaced_event(tenant_ns, field_selector="reason=Preempted")).items
                names = {e.involved_object.name for e in events}
                return events if names >= {p.metadata.name for p in first} else None

            await eventually(preempted, timeout=60, what="both members told Preempted in the tenant cluster")

            async def urgent_runs() -> bool:
                pod = await ccore.read_namespaced_pod(urgent, compute_ns)
                return bool(pod.spec.node_name == node and pod.status.phase == "Running")

            await eventually(urgent_runs, timeout=60, what="the guaranteed pod Running on the node")

            async def replaced_and_waiting() -> list[Any] | None:
                pods = [p for p in (await tcore.list_namespaced_pod(tenant_ns)).items
                        if p.metadata.deletion_timestamp is None]
                fresh = [p for p in pods if p.metadata.name not in {q.metadata.name for q in first}]
                return pods if len(pods) == 2 and len(fresh) == 2 else None

            await eventually(replaced_and_waiting, timeout=60, what="the operator's replacements of both members")
            copies = [p for p in await compute_copies(compute_api, tenant_ns) if p.metadata.deletion_timestamp is None]
            assert len(copies) <= 2 and not any(p.spec.node_name for p in copies), \
                [(p.metadata.name, p.spec.node_name, p.status.phase) for p in copies]  # the gang waits whole

            await ccore.delete_namespaced_pod(urgent, compute_ns, grace_period_seconds=0)
            again = await eventually(lambda: running_pods(tcore, tenant_ns, 2), timeout=90,
                                     what="the replacements Running once the node is free")
        assert not {p.metadata.name for p in again} & {p.metadata.name for p in first}
        assert _running(await compute_copies(compute_api, tenant_ns), 2) is not None  # one copy each, no more
        await tcustom.delete_namespaced_custom_object("ray.io", "v1", tenant_ns, "rayclusters", "soak")


async def _podgroup(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(await custom.get_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", ns, "podgroups",
                                                              name))
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
