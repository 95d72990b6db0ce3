"""``kubectl top`` in a tenant cluster: an unmodified metrics-server (v0.8.0, built from its Go module) in
each cluster, as its release installs it (an aggregated API, its own ServiceAccount and RBAC). The
compute cluster's scrapes the kwok nodes (what the copies use: kwok's ``usage-cpu``/``usage-memory``
annotations); the tenant's scrapes the virtual node's kubelet API, whose ``/metrics/resource`` serves
its pods' usage read from the compute cluster's metrics API with the vnode's own credentials.

The local planes have no cluster network, so each APIService names an ExternalName Service for this
host (the aggregator dials an ExternalName as it is written) and skips TLS verification as the
release's manifest does."""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client

from ferry.binaries.clients import METRICS_SERVER, ensure_operator
from ferry.cluster.planes import COMPUTE, ControlPlanes
from ferry.cluster.process import Component
from ferry.kube import quantity
from ferry.kube.rest import Rest
from tests.helpers import MERGE_PATCH, eventually, free_port, kubectl, logged_process, wait_sync
from tests.integration.test_install import token_kubeconfig
from tests.integration.test_vnode import tenant_pod

TENANT = "tenant-1"
SYSTEM = "kube-system"
USAGE_CPU, USAGE_MEMORY = "kwok.x-k8s.io/usage-cpu", "kwok.x-k8s.io/usage-memory"


def release_objects(port: int) -> list[dict[str, Any]]:
    """What metrics-server's release installs beside its Deployment: its ServiceAccount and rights (read
    nodes and pods, scrape kubelets' ``nodes/metrics``, delegate authentication and authorisation), the
    Service and the APIService."""
    account = [{"kind": "ServiceAccount", "name": "metrics-server", "namespace": SYSTEM}]
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "metrics-server", "namespace": SYSTEM}},
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "ferry-test:metrics-server"},
         "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "ferry-test:metrics-server"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "ferry-test:metrics-server"}, "subjects": account},
        {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "ferry-test:metrics-server:delegator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
         "subjects": account},
        {"apiVersion": rbac, "kind": "RoleBinding",
         "metadata": {"name": "ferry-test:metrics-server:auth-reader", "namespace": SYSTEM},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "extension-apiserver-authentication-reader"}, "subjects": account},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "metrics-server", "namespace": SYSTEM},
         "spec": {"type": "ExternalName", "externalName": "localhost", "ports": [{"port": port}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": "v1beta1.metrics.k8s.io"},
         "spec": {"service": {"name": "metrics-server", "namespace": SYSTEM, "port": port},
                  "group": "metrics.k8s.io", "version": "v1beta1", "insecureSkipTLSVerify": True,
                  "groupPriorityMinimum": 100, "versionPriority": 100}},
    ]


@pytest.fixture(scope="module")
def metrics_servers(planes: ControlPlanes, vnodes: dict[str, Component],
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """metrics-server in the compute cluster and in tenant-1, each on its ServiceAccount's token; the
    APIService is removed before its server stops (an API that does not answer stalls namespace deletion)."""
    binary = ensure_operator(METRICS_SERVER).binary
    k = planes.bin.path("kubectl")
    work = tmp_path_factory.mktemp("metrics-server")
    with _served(planes, COMPUTE, binary, k, work / COMPUTE) as compute_log, \
            _served(planes, TENANT, binary, k, work / TENANT) as tenant_log:
        yield {COMPUTE: compute_log, TENANT: tenant_log}


class _served:
    """One cluster's metrics-server process and release objects, for a ``with`` block."""

    def __init__(self, planes: ControlPlanes, cluster: str, binary: Path, k: Path, work: Path) -> None:
        self.planes, self.cluster, self.binary, self.k, self.work = planes, cluster, binary, k, work
        self.port = free_port()
        self.objects = release_objects(self.port)
        self._proc: Any = None

    def __enter__(self) -> Path:
        self.work.mkdir(parents=True)
        kubeconfig = self.planes.kubeconfig(self.cluster)
        kubectl(self.k, kubeconfig, "apply", "-f", str(self._write(self.objects[:-2])))
        token = token_kubeconfig(self.planes, self.cluster, SYSTEM, "metrics-server", self.work / "kubeconfig")
        log = self.work / "metrics-server.log"
        self._proc = logged_process([
            str(self.binary), f"--kubeconfig={token}", f"--authentication-kubeconfig={token}",
            f"--authorization-kubeconfig={token}", "--bind-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={self.work / 'certs'}", "--kubelet-use-node-status-port",
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-certificate-authority={self.planes.clusters[self.cluster].pki / 'ca.crt'}",
            "--metric-resolution=10s", "--kubelet-request-timeout=5s"], dict(os.environ), log)
        proc = self._proc.__enter__()
        wait_sync(lambda: b"Serving securely" in log.read_bytes() or proc.poll() is not None, 60,
                  f"metrics-server of {self.cluster} to serve (log: {log})")
        assert proc.poll() is None, log.read_text()[-3000:]
        kubectl(self.k, kubeconfig, "apply", "-f", str(self._write(self.objects[-2:])))
        return log

    def __exit__(self, *exc: object) -> None:
        kubeconfig = self.planes.kubeconfig(self.cluster)
        for m in reversed(self.objects):
            kubectl(self.k, kubeconfig, "delete", m["kind"].lower(), m["metadata"]["name"], "--ignore-not-found",
                    *(["-n", m["metadata"]["namespace"]] if "namespace" in m["metadata"] else []), check=False)
        if self._proc is not None:
            self._proc.__exit__(*exc)

    def _write(self, objects: list[dict[str, Any]]) -> Path:
        out = self.work / f"objects-{len(list(self.work.iterdir()))}.yaml"
        out.write_text(yaml.safe_dump_all(objects))
        return out


async def test_without_a_compute_metrics_api_the_vnode_answers_502_with_the_compute_clusters_reason(
        planes: ControlPlanes, vnodes: dict[str, Component]) -> None:
    """Before either metrics-server is installed (the first test here): what a tenant's metrics-server
    would log, instead of an empty node."""
    pki = planes.clusters[TENANT].pki
    tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    tls.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    url = f"https://127.0.0.1:{vnodes[TENANT].spec.ports[0]}/metrics/resource"
    async with aiohttp.ClientSession() as http, http.get(url, ssl=tls) as resp:
        text = await resp.text()
    assert resp.status == 502, text
    assert text == "compute cluster's metrics.k8s.io: not served there (is metrics-server installed in the compute " \
                   "cluster?)"


async def _usage(rest: Rest, ns: str, pod: str, cpu_m: int) -> tuple[int, int] | None:
    """The pod's (CPU millicores, memory bytes) from the cluster's metrics API once its CPU is within 10 % of
    ``cpu_m``; None before (no API yet, no sample yet, or an older rate)."""
    try:
        got = await rest.get_or_none(f"/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods/{pod}")
    except Exception:  # the APIService not yet available: 503 until its first answer
        return None
    if not got or not got.get("containers"):
        return None
    use = got["containers"][0]["usage"]
    cpu, memory = quantity.milli(use["cpu"]), int(quantity.parse(use["memory"]))
    return (cpu, memory) if abs(cpu - cpu_m) <= cpu_m / 10 else None


async def test_kubectl_top_in_the_tenant_cluster_shows_what_its_pod_uses_in_the_compute_cluster(
        planes: ControlPlanes, metrics_servers: dict[str, Path], tenant_api: client.ApiClient,
        compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    pod = tenant_pod("busy", automountServiceAccountToken=False)
    pod["metadata"]["annotations"] = {USAGE_CPU: "250m", USAGE_MEMORY: "300Mi"}  # followed to the copy
    await core.create_namespaced_pod(tenant_ns, pod)

    async def copy_name() -> str | None:
        copies = (await client.CoreV1Api(compute_api).list_namespaced_pod(
            TENANT, label_selector=f"kubeferry.io/upstream-namespace={tenant_ns}")).items
        return copies[0].metadata.name if copies and copies[0].status.phase == "Running" else None

    copy = await eventually(copy_name, timeout=60, what="the copy Running")
    logs = "; ".join(f"{c}: {p}" for c, p in metrics_servers.items())
    await eventually(lambda: _usage(Rest(compute_api), TENANT, copy, 250), timeout=90,
                     what=f"the copy's usage in the compute cluster's metrics API (logs {logs})")
    _, memory = await eventually(lambda: _usage(Rest(tenant_api), tenant_ns, "busy", 250), timeout=90,
                                   what=f"the pod's usage in the tenant cluster's metrics API (logs {logs})")
    assert memory == 300 * 2**20

    k, kc = planes.bin.path("kubectl"), planes.kubeconfig(TENANT)
    name, cpu_text, memory_text = kubectl(k, kc, "top", "pod", "-n", tenant_ns, "busy", "--no-headers").stdout.split()
    assert (name, memory_text) == ("busy", "300Mi") and abs(quantity.milli(cpu_text) - 250) <= 25

    # The tenant changes what its pod does (here: what kwok simulates): the new rate comes through, which
    # the vnode's counters carry across the change without a jump.
    await core.patch_namespaced_pod("busy", tenant_ns, {"metadata": {"annotations": {USAGE_CPU: "1"}}},
                                    _content_type=MERGE_PATCH)
    await eventually(lambda: _usage(Rest(tenant_api), tenant_ns, "busy", 1000), timeout=120,
                     what="the new rate in the tenant cluster's metrics API")

    node = f"ferry-{TENANT}"
    line = kubectl(k, kc, "top", "node", node, "--no-headers").stdout.split()
    assert line[0] == node and quantity.milli(line[1]) >= 900, line  # what its pods use, at least this one


async def test_the_vnode_serves_resource_metrics_only_to_callers_allowed_nodes_metrics(
        planes: ControlPlanes, vnodes: dict[str, Component], tenant_ns: str) -> None:
    """As a kubelet: a token without ``nodes/metrics`` (a namespace's default ServiceAccount) is refused."""
    kc = planes.kubeconfig(TENANT)
    k = planes.bin.path("kubectl")
    await eventually(lambda: kubectl(k, kc, "-n", tenant_ns, "get", "serviceaccount", "default", check=False)
                     .returncode == 0, what="the namespace's default ServiceAccount")
    token = kubectl(k, kc, "-n", tenant_ns, "create", "token", "default").stdout.strip()
    url = f"https://127.0.0.1:{vnodes[TENANT].spec.ports[0]}/metrics/resource"
    tls = ssl.create_default_context(cafile=str(planes.clusters[TENANT].pki / "ca.crt"))
    async with aiohttp.ClientSession() as http:
        async with http.get(url, ssl=tls, headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 403, await resp.text()
            assert "subresource=metrics" in await resp.text()
        async with http.get(url, ssl=tls) as resp:
            assert resp.status == 401


async def test_a_horizontal_pod_autoscaler_in_the_tenant_cluster_scales_on_what_its_pods_use(
        planes: ControlPlanes, metrics_servers: dict[str, Path], tenant_api: client.ApiClient, tenant_ns: str) -> None:
    """The tenant's own kube-controller-manager (its HPA controller, unmodified) reads the PodMetrics the vnode
    serves: a Deployment whose pods use 250m of the 100m they request (250 %) is scaled from 1 to its maximum
    of 3 against a 50 % target."""
    template = tenant_pod("web", automountServiceAccountToken=False)
    template["metadata"] = {"labels": {"app": "web"}, "annotations": {USAGE_CPU: "250m", USAGE_MEMORY: "64Mi"}}
    template["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    await client.AppsV1Api(tenant_api).create_namespaced_deployment(tenant_ns, {
        "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": template}})
    await client.AutoscalingV2Api(tenant_api).create_namespaced_horizontal_pod_autoscaler(tenant_ns, {
        "metadata": {"name": "web"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                 "minReplicas": 1, "maxReplicas": 3,
                 "metrics": [{"type": "Resource", "resource": {
                     "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]}})

    async def scaled() -> tuple[int, Any] | None:
        hpa = await client.AutoscalingV2Api(tenant_api).read_namespaced_horizontal_pod_autoscaler("web", tenant_ns)
        return (hpa.status.desired_replicas, hpa.status) if (hpa.status.desired_replicas or 0) == 3 else None

    _, status = await eventually(scaled, timeout=150, interval=2,
                                 what="the autoscaler asking for 3 replicas (its status says why not)")
    (current,) = status.current_metrics
    assert current.resource.current.average_utilization >= 200, current  # 250m of 100m, read through the vnode

    async def running() -> int | None:
        pods = (await client.CoreV1Api(tenant_api).list_namespaced_pod(tenant_ns, label_selector="app=web")).items
        up = [p for p in pods if p.status.phase == "Running" and p.spec.node_name == f"ferry-{TENANT}"]
        return len(up) if len(up) == 3 else None

    await eventually(running, timeout=60, what="3 replicas Running on the virtual node")
