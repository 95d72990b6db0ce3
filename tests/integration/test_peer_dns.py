"""Peers by their tenant names on real control planes: pods of a distributed job (hostname + subdomain, as
MPI Operator, JobSet and Indexed Jobs make them) find each other through `ferry dns` by the names their
tenant cluster gives them, and a tenant finds only its own pods."""

from __future__ import annotations

import asyncio
import sys
import urllib.request
from collections.abc import Awaitable
from typing import Any

import pytest
from dnslib import QTYPE, RCODE, DNSRecord
from kubernetes_asyncio import client

from ferry.cluster.planes import ControlPlanes
from ferry.cluster.ports import PortAllocator
from ferry.cluster.process import Component
from tests.helpers import api_client, ask, closed_port, compute_copies, eventually, resolve, swapped
from vnode import naming
from vnode.dnsserver import PeerDNS

pytestmark = pytest.mark.usefixtures("vnodes")
TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}
DNS_SERVER = "10.96.0.53"  # what conftest gives the vnodes as --dns-server
ZONE = "cluster.local"


def peer(host: str) -> dict[str, Any]:
    return {"metadata": {"name": host, "labels": {"job": "ring"}},
            "spec": {"hostname": host, "subdomain": "ring", "tolerations": [TOLERATION],
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "trainer:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def running_copies(compute: client.ApiClient, ns: str, count: int) -> dict[str, Any] | None:
    """The compute pods of tenant namespace ``ns`` by upstream name, once ``count`` of them run with an IP."""
    pods = {p.metadata.annotations[naming.UPSTREAM_NAME_ANNOTATION]: p for p in await compute_copies(compute, ns)
            if p.status.pod_ip and p.status.phase == "Running" and p.metadata.deletion_timestamp is None}
    return pods if len(pods) == count else None


async def test_peers_find_each_other_by_tenant_names_and_only_within_their_tenant(
        planes: ControlPlanes, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str,
        peer_dns: PeerDNS) -> None:
    dns = peer_dns
    core = client.CoreV1Api(tenant_api)
    await core.create_namespaced_service(tenant_ns, {"metadata": {"name": "ring"}, "spec": {
        "clusterIP": "None", "selector": {"job": "ring"}}})
    for host in ("w-0", "w-1"):
        await core.create_namespaced_pod(tenant_ns, peer(host))
    copies = await eventually(lambda: running_copies(compute_api, tenant_ns, 2), timeout=60,
                              what="both peers running in the compute cluster")
    w0, w1 = copies["w-0"], copies["w-1"]
    assert w0.spec.dns_policy == "None"
    assert w0.spec.dns_config.nameservers == [DNS_SERVER]
    assert w0.spec.dns_config.searches[0] == f"{tenant_ns}.svc.{ZONE}", "short names search the tenant namespace"

    name = f"w-1.ring.{tenant_ns}.svc.{ZONE}."
    await eventually(lambda: _answers(dns, w0.status.pod_ip, name, [w1.status.pod_ip]), timeout=10,
                     what="w-0 finding w-1")
    for short in ("w-1.ring", f"w-1.ring.{tenant_ns}", f"w-1.ring.{tenant_ns}.svc"):  # through the search path
        assert await resolve(dns, w0, short) == [w1.status.pod_ip], short
    assert await ask(dns, w1.status.pod_ip, f"w-0.ring.{tenant_ns}.svc.{ZONE}.") == [w0.status.pod_ip]
    assert await ask(dns, "192.0.2.1", name) is None, "an address of no bridged pod is only relayed"

    # The very same names in another tenant cluster (a namespace of the same name) are that tenant's alone.
    async with api_client(planes.kubeconfig("tenant-2")) as other_api:
        other = client.CoreV1Api(other_api)
        await other.create_namespace({"metadata": {"name": tenant_ns}})
        try:
            await eventually(lambda: _has_default_account(other, tenant_ns), timeout=30, what="tenant-2's namespace")
            await _apart(dns, other_api, compute_api, tenant_ns, w0.status.pod_ip, w1.status.pod_ip)
        finally:
            await other.delete_namespace(tenant_ns)

    await core.delete_namespaced_pod("w-1", tenant_ns, grace_period_seconds=0)
    await eventually(lambda: _answers(dns, w0.status.pod_ip, name, None), timeout=30, what="w-1 forgotten")


async def _has_default_account(core: client.CoreV1Api, ns: str) -> bool:
    return any(a.metadata.name == "default" for a in (await core.list_namespaced_service_account(ns)).items)


async def _apart(dns: PeerDNS, other_api: client.ApiClient, compute_api: client.ApiClient, ns: str,
                 first_ip: str, first_peer_ip: str) -> None:
    """tenant-2's ``w-1`` in namespace ``ns``, where tenant-1 has its own ``w-1`` (at ``first_peer_ip``, asked
    for by its pod at ``first_ip``): each tenant's pods find their own."""
    theirs = peer("w-1")
    theirs["metadata"]["name"] = "x"
    await client.CoreV1Api(other_api).create_namespaced_pod(ns, theirs)

    async def running() -> Any:
        pods = [p for p in await compute_copies(compute_api, ns) if p.metadata.labels[naming.TENANT_LABEL] == "tenant-2"
                and p.status.pod_ip and p.status.phase == "Running"]
        return pods[0] if pods else None

    their_ip = (await eventually(running, timeout=60, what="tenant-2's pod running")).status.pod_ip
    name = f"w-1.ring.{ns}.svc.{ZONE}."
    await eventually(lambda: _answers(dns, their_ip, name, [their_ip]), timeout=10,
                     what="tenant-2's pod finding itself")
    assert await ask(dns, first_ip, name) == [first_peer_ip], "tenant-1 finds its own w-1, never tenant-2's"


async def _answers(dns: PeerDNS, source: str, name: str, want: list[str] | None) -> bool:
    return await ask(dns, source, name) == want


async def test_a_tenant_services_name_resolves_and_routes_to_the_compute_pods_it_selects(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, peer_dns: PeerDNS) -> None:
    """As a Ray head or a PyTorchJob's master is reached: a Service (made after its pods, as operators may)
    is copied to the compute cluster, its name resolves to the copy's cluster IP, or to the pods a headless
    one selects, and the compute cluster's EndpointSlices route it to the compute pods; deleted upstream,
    the copy goes and the name is relayed again."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    for name, role in (("head", "head"), ("worker", "worker")):
        body = peer(name)
        body["spec"].pop("subdomain")
        body["metadata"]["labels"] = {"app": "ray", "role": role}
        await core.create_namespaced_pod(tenant_ns, body)
    copies = await eventually(lambda: running_copies(compute_api, tenant_ns, 2), timeout=60, what="both running")
    head, worker = copies["head"], copies["worker"]
    await core.create_namespaced_service(tenant_ns, {"metadata": {"name": "head-svc"}, "spec": {
        "selector": {"app": "ray", "role": "head"}, "ports": [{"name": "gcs", "port": 6379}]}})
    await core.create_namespaced_service(tenant_ns, {"metadata": {"name": "workers"}, "spec": {
        "clusterIP": "None", "selector": {"role": "worker"}}})
    copy_name = naming.compute_name("tenant-1", tenant_ns, "head-svc")

    async def copied() -> Any:
        found = [s for s in (await ccore.list_namespaced_service("tenant-1")).items if s.metadata.name == copy_name]
        return found[0] if found else None

    svc = await eventually(copied, timeout=30, what="the Service copied")
    assert svc.spec.cluster_ip not in (None, "None") and svc.spec.ports[0].port == 6379
    assert svc.spec.selector == {"app": "ray", "role": "head", naming.TENANT_LABEL: "tenant-1",
                                 naming.UPSTREAM_NS_LABEL: tenant_ns}
    await eventually(lambda: _resolves(peer_dns, worker, "head-svc", [svc.spec.cluster_ip]), timeout=10,
                     what="head-svc from the worker")
    assert await resolve(peer_dns, worker, f"head-svc.{tenant_ns}.svc.{ZONE}") == [svc.spec.cluster_ip]
    await eventually(lambda: _resolves(peer_dns, head, "workers", [worker.status.pod_ip]), timeout=10,
                     what="the headless workers Service from the head")

    async def routed() -> bool:  # kube-controller-manager's EndpointSlice controller, in the compute cluster
        slices = await client.DiscoveryV1Api(compute_api).list_namespaced_endpoint_slice(
            "tenant-1", label_selector=f"kubernetes.io/service-name={copy_name}")
        return [a for s in slices.items for e in s.endpoints or [] for a in e.addresses] == [head.status.pod_ip]

    await eventually(routed, timeout=30, what="the copy's endpoints: the head's compute pod")

    await core.delete_namespaced_service("head-svc", tenant_ns)
    await eventually(lambda: _gone(ccore, copy_name), timeout=60, what="the copy collected")
    await eventually(lambda: _resolves(peer_dns, worker, "head-svc", None), timeout=10, what="head-svc relayed")


async def test_a_label_the_tenant_gives_a_running_pod_puts_it_behind_the_service_that_selects_it(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, peer_dns: PeerDNS) -> None:
    """A leader labelled after it started (as a leader election or a user's `kubectl label` does): the label
    reaches the pod's compute copy, so the Service selecting it is copied, routes to it and resolves;
    removed, the copy loses it and the Service routes to nobody. A label the compute cluster's own
    admission added to the copy stays, and Kube-Ferry's keys are not changed on a running pod."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    for name in ("db-0", "db-1"):
        body = peer(name)
        body["spec"].pop("subdomain")
        body["metadata"]["labels"] = {"app": "db"}
        body["metadata"]["annotations"] = {"kubeferry.io/movable": "true"}
        await core.create_namespaced_pod(tenant_ns, body)
    copies = await eventually(lambda: running_copies(compute_api, tenant_ns, 2), timeout=60, what="both running")
    leader, other = copies["db-0"], copies["db-1"]
    await ccore.patch_namespaced_pod(leader.metadata.name, "tenant-1",
                                     {"metadata": {"labels": {"mesh.example/injected": "true"}}})
    await core.create_namespaced_service(tenant_ns, {"metadata": {"name": "primary"}, "spec": {
        "selector": {"app": "db", "role": "leader"}, "ports": [{"name": "sql", "port": 5432}]}})
    copy_name = naming.compute_name("tenant-1", tenant_ns, "primary")
    await core.patch_namespaced_pod("db-0", tenant_ns, {"metadata": {
        "labels": {"role": "leader"}, "annotations": {"example.com/elected": "1", "kubeferry.io/movable": "false"}}})

    async def labelled() -> Any:
        pod = await ccore.read_namespaced_pod(leader.metadata.name, "tenant-1")
        return pod if (pod.metadata.labels or {}).get("role") == "leader" else None

    pod = await eventually(labelled, timeout=30, what="the label on the compute copy")
    assert pod.metadata.labels["app"] == "db" and pod.metadata.labels["mesh.example/injected"] == "true"
    assert pod.metadata.annotations["example.com/elected"] == "1"
    assert pod.metadata.annotations["kubeferry.io/movable"] == "true", "read once, at creation"

    async def copied() -> Any:
        found = [s for s in (await ccore.list_namespaced_service("tenant-1")).items if s.metadata.name == copy_name]
        return found[0] if found else None

    svc = await eventually(copied, timeout=30, what="the Service copied for its newly selected pod")

    async def routes_to() -> list[str]:
        slices = await client.DiscoveryV1Api(compute_api).list_namespaced_endpoint_slice(
            "tenant-1", label_selector=f"kubernetes.io/service-name={copy_name}")
        return [a for s in slices.items for e in s.endpoints or [] for a in e.addresses]

    await eventually(lambda: _equal(routes_to(), [leader.status.pod_ip]), timeout=30, what="routed to the leader")
    await eventually(lambda: _resolves(peer_dns, other, "primary", [svc.spec.cluster_ip]), timeout=10,
                     what="primary from the other pod")

    await core.patch_namespaced_pod("db-0", tenant_ns, {"metadata": {"labels": {"role": None}}})

    async def unlabelled() -> Any:
        pod = await ccore.read_namespaced_pod(leader.metadata.name, "tenant-1")
        return pod if "role" not in (pod.metadata.labels or {}) else None

    pod = await eventually(unlabelled, timeout=30, what="the label gone from the compute copy")
    assert pod.metadata.labels["mesh.example/injected"] == "true", "the compute side's own label stays"
    await eventually(lambda: _equal(routes_to(), []), timeout=30, what="the Service routing to nobody")


async def test_kubernetes_default_svc_names_the_tenant_api_for_bridged_pods_given_its_address(
        vnodes: dict[str, Component], tenant_api: client.ApiClient, compute_api: client.ApiClient,
        tenant_ns: str, peer_dns: PeerDNS) -> None:
    """`https://kubernetes.default.svc` (Spark's default master, many charts) from a bridged pod names the
    tenant's API, as its KUBERNETES_SERVICE_HOST does: the vnode given the API's address keeps a copy of
    `default/kubernetes` on 443 with an EndpointSlice to that address and port, and `ferry dns` answers
    the name with the copy's cluster IP. Started without it, the vnode collects the copy. (The address is
    a documentation one: local planes have no network to route it; what routes is the compute cluster's.)"""
    api_copy = naming.compute_name("tenant-1", "default", "kubernetes")
    ccore = client.CoreV1Api(compute_api)
    vnode = swapped(vnodes["tenant-1"], "tenant-1-vnode-api-address", ["--tenant-api=198.51.100.7:6443"])
    vnodes["tenant-1"].stop()
    try:
        vnode.start()
        vnode.wait_ready()
        body = peer("asks-api")
        body["spec"].pop("subdomain")
        await client.CoreV1Api(tenant_api).create_namespaced_pod(tenant_ns, body)
        pod = (await eventually(lambda: running_copies(compute_api, tenant_ns, 1), timeout=60,
                                what="the pod running"))["asks-api"]
        env = {e.name: e.value for e in pod.spec.containers[0].env or []}
        assert env["KUBERNETES_SERVICE_HOST"] == "198.51.100.7" and env["KUBERNETES_SERVICE_PORT"] == "6443"
        svc = await ccore.read_namespaced_service(api_copy, "tenant-1")
        assert svc.spec.selector is None and svc.spec.cluster_ip not in (None, "None")
        assert [(p.port, p.target_port) for p in svc.spec.ports] == [(443, 6443)]
        slices = await client.DiscoveryV1Api(compute_api).list_namespaced_endpoint_slice(
            "tenant-1", label_selector=f"kubernetes.io/service-name={api_copy}")
        assert [(a, p.port) for s in slices.items for e in s.endpoints for a in e.addresses
                for p in s.ports] == [("198.51.100.7", 6443)]
        for name in (f"kubernetes.default.svc.{ZONE}", "kubernetes.default", "kubernetes.default.svc"):
            await eventually(lambda name=name: _resolves(peer_dns, pod, name, [svc.spec.cluster_ip]), timeout=10,
                             what=f"{name} from the bridged pod")
    finally:
        vnode.stop()
        vnodes["tenant-1"].start()
        vnodes["tenant-1"].wait_ready()
    await eventually(lambda: _gone(ccore, api_copy), timeout=60, what="the copy collected by a vnode without it")


async def test_an_external_name_service_is_copied_for_its_namespaces_pods_and_answers_its_cname(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, peer_dns: PeerDNS) -> None:
    """A tenant's ExternalName Service (a database outside, a Service of another namespace) selects no pod,
    but every pod of its namespace may look it up: it is copied for them, `ferry dns` answers its CNAME as the
    cluster's DNS does, a change follows, and deleted upstream the copy goes."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    await core.create_namespaced_service(tenant_ns, {"metadata": {"name": "db"}, "spec": {
        "type": "ExternalName", "externalName": "pg.example.com"}})
    body = peer("app")
    body["spec"].pop("subdomain")
    await core.create_namespaced_pod(tenant_ns, body)
    app = (await eventually(lambda: running_copies(compute_api, tenant_ns, 1), timeout=60, what="app running"))["app"]
    copy_name = naming.compute_name("tenant-1", tenant_ns, "db")

    async def copy_names(target: str) -> bool:
        found = [s for s in (await ccore.list_namespaced_service("tenant-1")).items if s.metadata.name == copy_name]
        return bool(found) and found[0].spec.type == "ExternalName" and found[0].spec.external_name == target

    async def cname(target: str) -> bool:  # the world's name is relayed, here to an upstream that never answers
        for name in (f"db.{tenant_ns}.svc.{ZONE}.", f"DB.{tenant_ns}.svc.{ZONE}."):
            reply = await peer_dns.handle(DNSRecord.question(name).pack(), app.status.pod_ip)
            got = DNSRecord.parse(reply or b"")
            if [(QTYPE[r.rtype], str(r.rdata)) for r in got.rr] != [("CNAME", f"{target}.")]:
                return False
        return True

    await eventually(lambda: copy_names("pg.example.com"), timeout=30, what="the ExternalName Service copied")
    await eventually(lambda: cname("pg.example.com"), timeout=10, what="db's CNAME from the app's pod")
    await core.patch_namespaced_service("db", tenant_ns, {"spec": {"externalName": "pg-2.example.com"}})
    await eventually(lambda: copy_names("pg-2.example.com"), timeout=30, what="the copy following the change")
    await eventually(lambda: cname("pg-2.example.com"), timeout=10, what="the new CNAME")
    await core.delete_namespaced_service("db", tenant_ns)
    await eventually(lambda: _gone(ccore, copy_name), timeout=60, what="the copy collected")


async def test_a_service_with_endpoints_of_its_own_is_copied_with_them_and_its_name_resolves(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, peer_dns: PeerDNS) -> None:
    """A database outside the cluster, behind a Service without a selector and a hand-made Endpoints object
    (which the tenant's controller-manager mirrors to an EndpointSlice), and a headless one with an
    EndpointSlice made by hand: both are copied with their endpoints for the namespace's pods; the first
    resolves to its copy's cluster IP, the second to its addresses; an address change follows, and deleted
    upstream, the copies go."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    discovery, tdiscovery = client.DiscoveryV1Api(compute_api), client.DiscoveryV1Api(tenant_api)
    pg = [{"name": "pg", "port": 5432, "protocol": "TCP"}]
    await core.create_namespaced_service(tenant_ns, {"metadata": {"name": "db"}, "spec": {"ports": pg}})
    await core.create_namespaced_endpoints(tenant_ns, {"metadata": {"name": "db"}, "subsets": [
        {"addresses": [{"ip": "192.0.2.10"}], "ports": pg}]})
    await core.create_namespaced_service(tenant_ns, {"metadata": {"name": "replicas"}, "spec": {
        "clusterIP": "None", "ports": pg}})
    await tdiscovery.create_namespaced_endpoint_slice(tenant_ns, {
        "metadata": {"name": "replicas-1", "labels": {"kubernetes.io/service-name": "replicas"}},
        "addressType": "IPv4", "ports": pg,
        "endpoints": [{"addresses": ["192.0.2.20"]}, {"addresses": ["192.0.2.21"], "conditions": {"ready": False}}]})
    body = peer("app")
    body["spec"].pop("subdomain")
    await core.create_namespaced_pod(tenant_ns, body)
    app = (await eventually(lambda: running_copies(compute_api, tenant_ns, 1), timeout=60, what="app running"))["app"]
    db_copy = naming.compute_name("tenant-1", tenant_ns, "db")

    async def copied() -> Any:
        found = [s for s in (await ccore.list_namespaced_service("tenant-1")).items if s.metadata.name == db_copy]
        return found[0] if found else None

    async def copied_addresses(service: str) -> list[str]:
        copy = naming.compute_name("tenant-1", tenant_ns, service)
        slices = await discovery.list_namespaced_endpoint_slice(
            "tenant-1", label_selector=f"kubernetes.io/service-name={copy}")
        return sorted(a for s in slices.items for e in s.endpoints or [] for a in e.addresses)

    svc = await eventually(copied, timeout=30, what="the Service without a selector copied")
    assert svc.spec.selector is None and svc.spec.cluster_ip not in (None, "None")
    assert svc.spec.ports[0].port == 5432
    await eventually(lambda: _equal(copied_addresses("db"), ["192.0.2.10"]), timeout=30,
                     what="its mirrored EndpointSlice copied")
    await eventually(lambda: _equal(copied_addresses("replicas"), ["192.0.2.20", "192.0.2.21"]), timeout=30,
                     what="the headless one's EndpointSlice copied")
    await eventually(lambda: _resolves(peer_dns, app, "db", [svc.spec.cluster_ip]), timeout=10,
                     what="db from the app's pod: the copy's cluster IP")
    await eventually(lambda: _resolves(peer_dns, app, "replicas", ["192.0.2.20"]), timeout=10,
                     what="replicas from the app's pod: its ready address")

    await core.patch_namespaced_endpoints("db", tenant_ns, {"subsets": [
        {"addresses": [{"ip": "192.0.2.11"}], "ports": pg}]})
    await eventually(lambda: _equal(copied_addresses("db"), ["192.0.2.11"]), timeout=30,
                     what="the copy following the address change")
    await tdiscovery.patch_namespaced_endpoint_slice("replicas-1", tenant_ns, {"endpoints": [
        {"addresses": ["192.0.2.20"]}, {"addresses": ["192.0.2.21"], "conditions": {"ready": True}}]})
    await eventually(lambda: _resolves(peer_dns, app, "replicas", ["192.0.2.20", "192.0.2.21"]), timeout=30,
                     what="replicas answering the address now ready")

    await core.delete_namespaced_service("db", tenant_ns)
    await eventually(lambda: _gone(ccore, db_copy), timeout=60, what="the copy collected")
    await eventually(lambda: _equal(copied_addresses("db"), []), timeout=60, what="its EndpointSlice collected")
    assert await copied_addresses("replicas") == ["192.0.2.20", "192.0.2.21"], "the other Service's kept"


async def _equal(got: Awaitable[Any], want: Any) -> bool:
    return await got == want


async def _resolves(dns: PeerDNS, pod: Any, name: str, want: list[str] | None) -> bool:
    return await resolve(dns, pod, name) == want


async def _gone(core: client.CoreV1Api, name: str) -> bool:
    return all(s.metadata.name != name for s in (await core.list_namespaced_service("tenant-1")).items)


async def test_ferry_dns_serves_once_synced_and_relays_what_it_does_not_know(planes: ControlPlanes) -> None:
    """The command as a Deployment runs it: ready only after its informer synced, then serving UDP."""
    # outside the ephemeral range: `ferry dns` listens on UDP and TCP at dns_port, and an ephemeral number
    # free for UDP could be an outgoing TCP connection's (the process then exits after it turned ready)
    ports = PortAllocator()
    dns_port, metrics_port = ports.take("ferry dns"), ports.take("its metrics")
    ports.release()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ferry", "dns", f"--compute-kubeconfig={planes.kubeconfig('compute')}",
        f"--listen=127.0.0.1:{dns_port}", f"--upstream=127.0.0.1:{closed_port()}",
        "--metrics-address=127.0.0.1", f"--metrics-port={metrics_port}",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        await eventually(lambda: _ready(metrics_port), timeout=30, what="ferry dns ready")
        reply = await asyncio.to_thread(_udp_query, dns_port, "example.com")
        assert reply.header.rcode == RCODE.SERVFAIL, "relayed to an upstream that does not answer"
        metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{metrics_port}/metrics")
        assert 'kube_ferry_dns_queries_total{outcome="failed"} 1.0' in metrics
    finally:
        proc.terminate()
        async with asyncio.timeout(10):
            _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]


def _get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def _ready(port: int) -> bool:
    try:
        return _get(f"http://127.0.0.1:{port}/readyz") == "ok"
    except OSError:
        return False


def _udp_query(port: int, name: str) -> DNSRecord:
    return DNSRecord.parse(DNSRecord.question(name).send("127.0.0.1", port, timeout=5))
