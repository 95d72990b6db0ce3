"""The manifests as a platform admin installs them (kustomize, server-side apply), and the
ServiceAccounts they create: the scheduler and a vnode run on those tokens alone — no admin
credentials — and do their whole job; the same tokens are refused what they do not need."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.cluster.planes import COMPUTE, MANIFESTS, ControlPlanes, local_webhooks
from ferry.cluster.process import Component
from ferry.kube.rest import JSON, MERGE, Rest, api_client, path
from tests.helpers import compute_copies, eventually, swapped
from tests.integration.test_gang_lifecycle import VOLCANO, member, status_of, tenant_group
from vnode.dnsserver import informers
from vnode.peernames import PeerIndex

pytestmark = pytest.mark.usefixtures("vnodes")
SYSTEM = "kube-ferry-system"


def kubectl(planes: ControlPlanes, cluster: str, *args: str, stdin: str | None = None) -> str:
    res = subprocess.run([str(planes.bin.path("kubectl")), f"--kubeconfig={planes.kubeconfig(cluster)}", *args],
                         input=stdin, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
    return res.stdout


def token_kubeconfig(planes: ControlPlanes, cluster: str, namespace: str, account: str, out: Path) -> Path:
    """A kubeconfig holding only a token of ``namespace/account`` (minted as a kubelet would)."""
    token = kubectl(planes, cluster, "-n", namespace, "create", "token", account, "--duration=1h").strip()
    info = planes.clusters[cluster]
    out.write_text(f"apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {info.server}\n"
                   f"    certificate-authority: {info.pki / 'ca.crt'}\nusers:\n- name: u\n  user:\n"
                   f"    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\n"
                   f"current-context: c\n")
    return out


@pytest.fixture(scope="module")
def installed(planes: ControlPlanes, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both bases applied (server-side dry-run first, then for real) and a kubeconfig per identity. A
    dry run cannot create a namespace for the objects after it, so the namespaces go first. The Queue
    webhook is called by URL instead of through its Service: local planes have no cluster network."""
    kubectl(planes, COMPUTE, "apply", "--server-side", "-f", str(MANIFESTS / "compute" / "namespace.yaml"))
    kubectl(planes, "tenant-1", "apply", "--server-side", "-f", str(MANIFESTS / "tenant" / "namespace.yaml"))
    for cluster, base in ((COMPUTE, "crds"), (COMPUTE, "compute"), ("tenant-1", "tenant")):
        built = local_webhooks(kubectl(planes, cluster, "kustomize", str(MANIFESTS / base)), planes.webhook_port)
        kubectl(planes, cluster, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=built)
        kubectl(planes, cluster, "apply", "--server-side", "-f", "-", stdin=built)
    template = (MANIFESTS / "tenant-template.yaml").read_text().replace("${TENANT}", "tenant-1")
    kubectl(planes, COMPUTE, "apply", "--server-side", "-f", "-", stdin=template)
    out = tmp_path_factory.mktemp("identities")
    return {
        "scheduler": token_kubeconfig(planes, COMPUTE, SYSTEM, "kube-ferry-scheduler", out / "scheduler"),
        "vnode-compute": token_kubeconfig(planes, COMPUTE, "tenant-1", "kube-ferry-vnode", out / "vnode-compute"),
        "vnode-tenant": token_kubeconfig(planes, "tenant-1", SYSTEM, "kube-ferry-vnode", out / "vnode-tenant"),
        "dns": token_kubeconfig(planes, COMPUTE, SYSTEM, "kube-ferry-dns", out / "dns"),
    }


async def test_the_scheduler_and_a_vnode_do_their_job_on_service_account_tokens_alone(
        planes: ControlPlanes, installed: dict[str, Path], vnodes: dict[str, Component],
        ferry_scheduler: Component, tenant_api: client.ApiClient, compute_api: client.ApiClient,
        tenant_ns: str) -> None:
    schedulers = [c for n, c in planes.components.items() if n.startswith("kube-ferry-scheduler") and c.alive()]
    scheduler = swapped(ferry_scheduler, "kube-ferry-scheduler-rbac",
                         [f"--kubeconfig={installed['scheduler']}", "--identity=rbac"])
    vnode = swapped(vnodes["tenant-1"], "tenant-1-vnode-rbac",
                     [f"--tenant-kubeconfig={installed['vnode-tenant']}",
                      f"--compute-kubeconfig={installed['vnode-compute']}"])
    for c in [*schedulers, vnodes["tenant-1"]]:
        c.stop()
    try:
        scheduler.start()
        vnode.start()
        scheduler.wait_ready()
        vnode.wait_ready()
        # A Volcano gang from an operator's pods: the vnode binds them, admits the group, copies the pods
        # and their gang down; the scheduler binds the gang and reports; status and logs come back up.
        core = client.CoreV1Api(tenant_api)
        await tenant_group(tenant_api, VOLCANO, tenant_ns, "job", 2)
        for i in range(2):
            await core.create_namespaced_pod(tenant_ns, member(f"job-w-{i}", "volcano", "job", duration="3s"))

        async def completed() -> dict[str, Any] | None:
            st = await status_of(tenant_api, VOLCANO, tenant_ns, "job")
            return st if st.get("phase") == "Completed" else None

        st = await eventually(completed, timeout=60, what="the gang Completed through SA-token components")
        assert st.get("succeeded") == 2, st
        logs = kubectl(planes, "tenant-1", "logs", "-n", tenant_ns, "job-w-0")
        assert "simulated workload" in logs
        queue = await Rest(compute_api).get(path("scheduling.kubeferry.io", "v1alpha1", "queues", name="tenant-1"))
        assert "allocated" in (queue.get("status") or {}), "the scheduler writes Queue status"
        refused = [ln for c in (scheduler, vnode) for ln in c.spec.log.read_text().splitlines()
                   if re.search(r'"status": 403|Forbidden', ln) and "unable to create new content" not in ln]
        assert not refused, refused[:3]
    finally:
        scheduler.stop()
        vnode.stop()
        for c in [*schedulers, vnodes["tenant-1"]]:
            c.start()
        for c in [*schedulers, vnodes["tenant-1"]]:
            c.wait_ready()


async def _access(core: client.CoreV1Api) -> Any:
    node = await core.read_node("ferry-tenant-1")
    return next((c for c in node.status.conditions or [] if c.type == "TenantClusterAccess"), None)


async def _said(core: client.CoreV1Api, namespace: str, name: str, reason: str) -> list[Any]:
    return [e for e in (await core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")).items
            if e.reason == reason]


async def test_a_vnode_without_its_tenant_rbac_says_so_on_its_node_and_pods_and_recovers_when_granted(
        planes: ControlPlanes, installed: dict[str, Path], vnodes: dict[str, Component],
        tenant_api: client.ApiClient, tenant_ns: str) -> None:
    """The upgrade done in the wrong order: the vnode's Deployment before its ClusterRole, which lacks a
    rule the new vnode needs (here EndpointSlices). The vnode heartbeats, but serves no pod before every
    cache has synced; it says why on its Node (condition and Event) and on each pod bound to it, and
    serves them as soon as the rule is granted, without a restart."""
    rbac = Rest(tenant_api)
    url = path("rbac.authorization.k8s.io", "v1", "clusterroles", name="kube-ferry-vnode")
    role = await rbac.get(url)
    kept = [r for r in role["rules"] if "discovery.k8s.io" not in r.get("apiGroups", [])]
    assert len(kept) == len(role["rules"]) - 1
    await rbac.patch(url, {"rules": kept})
    vnode = swapped(vnodes["tenant-1"], "tenant-1-vnode-rbac-missing",
                    [f"--tenant-kubeconfig={installed['vnode-tenant']}",
                     f"--compute-kubeconfig={installed['vnode-compute']}", "--unreachable-after=2"])
    vnodes["tenant-1"].stop()
    core = client.CoreV1Api(tenant_api)
    try:
        vnode.start()

        async def refused() -> Any:
            c = await _access(core)
            return c if c is not None and c.status == "False" else None

        cond = await eventually(refused, timeout=60, what="the node saying the tenant API refuses it")
        assert cond.reason == "Forbidden" and "endpointslices" in cond.message, cond
        assert "rbac-vnode.yaml" in cond.message, cond.message
        assert next(c for c in (await core.read_node("ferry-tenant-1")).status.conditions
                    if c.type == "Ready").status == "True", "a refused list evicts nothing"
        await eventually(lambda: _said(core, "default", "ferry-tenant-1", "TenantAccessDenied"), timeout=30,
                         what="a Warning Event on the node")
        await core.create_namespaced_pod(tenant_ns, {
            "metadata": {"name": "waits-for-rbac"},
            "spec": {"automountServiceAccountToken": False, "nodeName": "ferry-tenant-1",
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                     "containers": [{"name": "main", "image": "trainer:1"}]}})
        told = await eventually(lambda: _said(core, tenant_ns, "waits-for-rbac", "TenantAccessDenied"), timeout=30,
                                what="the pod told why it does not start")
        assert "endpointslices" in told[0].message and told[0].type == "Warning", told[0].message
        assert (await core.read_namespaced_pod("waits-for-rbac", tenant_ns)).status.phase == "Pending"

        await rbac.patch(url, {"rules": role["rules"]})

        async def running() -> bool:
            return (await core.read_namespaced_pod("waits-for-rbac", tenant_ns)).status.phase == "Running"

        await eventually(running, timeout=60, what="the pod served once the rule is granted")
        cond = await eventually(lambda: _access_granted(core), timeout=30, what="the node's condition True again")
        assert cond.reason == "TenantAPIAnswers", cond
        await eventually(lambda: _said(core, "default", "ferry-tenant-1", "TenantAccessRestored"), timeout=30,
                         what="a Normal Event on the node")
        vnode.wait_ready()
    finally:
        await rbac.patch(url, {"rules": role["rules"]})
        vnode.stop()
        vnodes["tenant-1"].start()
        vnodes["tenant-1"].wait_ready()


async def _access_granted(core: client.CoreV1Api) -> Any:
    c = await _access(core)
    return c if c is not None and c.status == "True" else None


async def _status(kubeconfig: Path, method: str, url: str, body: dict[str, Any] | None = None) -> int:
    api = await api_client(kubeconfig)
    try:
        resp = await Rest(api).raw(method, url, body, content_type=MERGE if method == "PATCH" else JSON)
        resp.release()
        return int(resp.status)
    except ApiException as exc:
        return int(exc.status)
    finally:
        await api.close()


@pytest.mark.parametrize(("who", "method", "url"), [
    ("scheduler", "GET", "/api/v1/secrets"),
    ("scheduler", "GET", "/api/v1/namespaces/kube-system/configmaps"),
    ("scheduler", "POST", "/api/v1/namespaces/tenant-1/pods"),
    ("scheduler", "DELETE", "/api/v1/nodes/gpu-node-0000"),
    ("scheduler", "PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/someone-else"),
    ("scheduler", "GET", "/api/v1/namespaces/kube-ferry-system/secrets"),
    ("scheduler", "PUT", "/api/v1/namespaces/kube-ferry-system/secrets/kube-ferry-webhook-tls"),
    ("scheduler", "PUT", "/api/v1/namespaces/kube-ferry-system/configmaps/kube-ferry-scheduler"),  # its own notes only
    ("scheduler", "DELETE", "/api/v1/namespaces/kube-ferry-system/configmaps/kube-ferry-scheduler-runs"),
    ("scheduler", "PUT", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/someone-else"),
    ("scheduler", "POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"),
    ("vnode-compute", "GET", "/api/v1/namespaces/tenant-2/pods"),
    ("vnode-compute", "GET", "/api/v1/namespaces/tenant-2/secrets"),
    ("vnode-compute", "GET", "/api/v1/namespaces/kube-system/secrets"),
    ("vnode-compute", "GET", "/api/v1/secrets"),
    ("vnode-compute", "POST", "/api/v1/nodes"),
    ("vnode-compute", "PATCH", "/apis/scheduling.kubeferry.io/v1alpha1/queues/tenant-1"),
    ("vnode-compute", "POST", "/api/v1/namespaces/tenant-2/pods/x/exec"),
    ("vnode-compute", "POST", "/apis/discovery.k8s.io/v1/namespaces/tenant-2/endpointslices"),
    ("vnode-compute", "PATCH", "/api/v1/namespaces/tenant-2/pods/x/ephemeralcontainers"),
    ("vnode-compute", "POST", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"),
    ("dns", "GET", "/api/v1/secrets"),
    ("dns", "GET", "/api/v1/namespaces/tenant-1/configmaps"),
    ("dns", "DELETE", "/api/v1/namespaces/tenant-1/pods/x"),
    ("dns", "PATCH", "/api/v1/namespaces/tenant-1/pods/x"),
    ("dns", "POST", "/apis/discovery.k8s.io/v1/namespaces/tenant-1/endpointslices"),
    ("vnode-tenant", "DELETE", "/api/v1/namespaces/default"),
    ("vnode-tenant", "POST", "/api/v1/namespaces/default/secrets"),
    ("vnode-tenant", "POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles"),
    ("vnode-tenant", "POST", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"),
])
async def test_the_service_accounts_are_refused_what_they_do_not_need(
        installed: dict[str, Path], who: str, method: str, url: str) -> None:
    assert await _status(installed[who], method, url, {} if method in ("POST", "PUT", "PATCH") else None) == 403


async def test_ferry_dns_indexes_the_bridged_pods_on_its_service_account_token_alone(
        installed: dict[str, Path], tenant_api: client.ApiClient, compute_api: client.ApiClient,
        tenant_ns: str) -> None:
    """Its informers list and watch bridged pods and Service copies cluster-wide: a pod bridged after the
    list is found, by its own name and by its subdomain's Service."""
    index = PeerIndex()
    api = await api_client(installed["dns"])
    watched = informers(Rest(api), index)
    tasks = [asyncio.create_task(i.run()) for i in watched]
    try:
        for i in watched:
            await eventually(lambda i=i: i.synced.is_set() or i.error, timeout=30, what=f"{i.name} listed")
        assert all(i.error is None and i.synced.is_set() for i in watched), [i.error for i in watched]
        await client.CoreV1Api(tenant_api).create_namespaced_pod(tenant_ns, {
            "metadata": {"name": "w-0"},
            "spec": {"hostname": "w-0", "subdomain": "ring", "automountServiceAccountToken": False,
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                     "containers": [{"name": "main", "image": "trainer:1"}]}})

        async def found() -> bool:
            ips = [p.status.pod_ip for p in await compute_copies(compute_api, tenant_ns) if p.status.pod_ip]
            return bool(ips) and all(index.answer(ips[0], f"{name}.{tenant_ns}.svc.cluster.local.", "cluster.local")
                                     == ips for name in ("w-0.ring", "ring"))  # the pod finding itself

        await eventually(found, timeout=60, what="the bridged pod and its subdomain's Service in the index")
        assert all(i.error is None for i in watched), [i.error for i in watched]
    finally:
        for t in tasks:
            t.cancel()
        await api.close()


async def test_every_vnode_is_a_flow_of_its_own_at_the_bridges_priority_level(
        planes: ControlPlanes, installed: dict[str, Path], compute_api: client.ApiClient) -> None:
    """API Priority and Fairness (flowcontrol.yaml, tenant-template.yaml): a vnode's requests, on a token
    or on ferry up's certificate, are classified into kube-ferry-bridges, one flow per vnode, so one
    tenant's burst queues behind its own requests; the admin's are not. The apiserver names the
    FlowSchema and priority level it chose in each response's headers."""
    level = await Rest(compute_api).get(path("flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations",
                                             name="kube-ferry-bridges"))
    schemas = {n: (await Rest(compute_api).get(path("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", name=n)))
               ["metadata"]["uid"] for n in ("kube-ferry-vnodes", "kube-ferry-vnode-tenant-1")}

    async def classified(kubeconfig: Path) -> tuple[str, str]:
        api = await api_client(kubeconfig)
        try:
            resp = await Rest(api).raw("GET", path("", "v1", "pods", "tenant-1"))
            resp.release()
            assert resp.status == 200
            return (resp.headers.get("X-Kubernetes-PF-PriorityLevel-UID", ""),
                    resp.headers.get("X-Kubernetes-PF-FlowSchema-UID", ""))
        finally:
            await api.close()

    uid = level["metadata"]["uid"]
    assert await classified(installed["vnode-compute"]) == (uid, schemas["kube-ferry-vnode-tenant-1"])
    assert await classified(planes.clusters[COMPUTE].pki / "vnode-tenant-1.kubeconfig") == (
        uid, schemas["kube-ferry-vnodes"])
    assert (await classified(planes.kubeconfig(COMPUTE)))[0] != uid
