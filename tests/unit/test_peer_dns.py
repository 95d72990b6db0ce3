"""Peer names across the bridge (vnode/peernames.py, vnode/dnsserver.py): which names are a tenant's peers,
who may find them, the DNS settings a compute pod gets, and the server's answers over UDP and TCP."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from dnslib import QTYPE, RCODE, RR, A, DNSRecord

from vnode import naming
from vnode.dnsserver import QUERIES, PeerDNS, bind_udp_and_tcp, serve, slim_pod, slim_service, slim_slice
from vnode.peernames import PeerIndex, PeerName, ServiceName, parse
from vnode.translate import (
    MANAGED_BY_LABEL,
    SERVICE_NAME_LABEL,
    SLICES_MANAGED_BY,
    Bridge,
    compute_endpoint_slice,
    compute_pod,
    compute_service,
    has_own_endpoints,
    is_alias,
    selects,
    slice_digest,
    used_by,
)

ZONE = "cluster.local"


def bridged(tenant: str, ns: str, host: str, ip: str, subdomain: str | None = "job",
            phase: str = "Running") -> dict[str, Any]:
    """A compute pod as the vnode of ``tenant`` makes it for a tenant pod in ``ns``."""
    spec: dict[str, Any] = {"hostname": host}
    if subdomain:
        spec["subdomain"] = naming.compute_name(tenant, ns, subdomain)
    return {"metadata": {"name": naming.compute_name(tenant, ns, host), "namespace": tenant, "resourceVersion": "1",
                         "labels": {naming.TENANT_LABEL: tenant, naming.UPSTREAM_NS_LABEL: ns, "app": "x"}},
            "spec": spec, "status": {"podIP": ip, "phase": phase}}


def key(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def test_peer_names_are_host_subdomain_namespace_in_the_zone() -> None:
    assert parse("w-0.job.ml.svc.cluster.local.", ZONE) == PeerName("ml", "job", "w-0")
    assert parse("W-0.Job.ML.svc.cluster.local", ZONE) == PeerName("ml", "job", "w-0"), "DNS names ignore case"
    assert parse("w-0.job.ml.svc.corp.example", "corp.example") == PeerName("ml", "job", "w-0")
    assert parse("Master-0.ML.svc.cluster.local.", ZONE) == ServiceName("ml", "master-0")
    for other in ("x.w-0.job.ml.svc.cluster.local",
                  "w-0.job.ml.svc.cluster.local.ml.svc.cluster.local",  # a search-path expansion of a full name
                  "w-0.job.ml.svc.other.zone", "w-0.job.ml.pod.cluster.local", "example.com", "..ml.svc.cluster.local"):
        assert parse(other, ZONE) is None, other


def test_a_tenant_finds_its_own_peers_and_no_other_tenants() -> None:
    index = PeerIndex()
    for pod in (bridged("t1", "ml", "w-0", "10.0.0.1"), bridged("t1", "ml", "w-1", "10.0.0.2"),
                bridged("t2", "ml", "w-1", "10.0.0.9")):  # the same names in another tenant
        index.update(key(pod), pod)
    assert index.answer("10.0.0.1", "w-1.job.ml.svc.cluster.local.", ZONE) == ["10.0.0.2"]
    assert index.answer("10.0.0.9", "w-1.job.ml.svc.cluster.local.", ZONE) == ["10.0.0.9"]
    assert index.answer("10.0.0.9", "w-0.job.ml.svc.cluster.local.", ZONE) is None, "t1's pod is not t2's peer"
    assert index.answer("10.0.0.1", "w-1.job.other.svc.cluster.local.", ZONE) is None, "another namespace"
    assert index.answer("192.168.1.1", "w-1.job.ml.svc.cluster.local.", ZONE) is None, "not a bridged pod"


def test_the_index_follows_pods_as_they_change_finish_and_go() -> None:
    index = PeerIndex()
    w0, w1 = bridged("t1", "ml", "w-0", "10.0.0.1"), bridged("t1", "ml", "w-1", "10.0.0.2")
    for pod in (w0, w1):
        index.update(key(pod), pod)
    moved = bridged("t1", "ml", "w-1", "10.0.0.3")
    index.update(key(moved), moved)
    assert index.answer("10.0.0.1", "w-1.job.ml.svc.cluster.local", ZONE) == ["10.0.0.3"]
    assert index.tenant_of("10.0.0.2") is None, "the old address is nobody's"
    index.update(key(moved), bridged("t1", "ml", "w-1", "10.0.0.3", phase="Succeeded"))
    assert index.answer("10.0.0.1", "w-1.job.ml.svc.cluster.local", ZONE) is None, "a finished pod is no peer"
    assert index.tenant_of("10.0.0.3") is None, "its IP may go to another pod"
    index.update(key(w0), None)
    assert len(index) == 0 and index.tenant_of("10.0.0.1") is None


def test_an_address_two_tenants_claim_at_once_answers_for_neither() -> None:
    """While an IP passes from one pod to another (the first deleted late), the asker is unknown."""
    index = PeerIndex()
    a, b = bridged("t1", "ml", "w-0", "10.0.0.1"), bridged("t2", "ml", "w-0", "10.0.0.1")
    index.update(key(a), a)
    index.update(key(b), b)
    assert index.tenant_of("10.0.0.1") is None
    index.update(key(a), None)
    assert index.tenant_of("10.0.0.1") == "t2"


def test_a_pod_without_a_subdomain_asks_but_is_not_found() -> None:
    index = PeerIndex()
    solo, peer = bridged("t1", "ml", "solo", "10.0.0.5", subdomain=None), bridged("t1", "ml", "w-0", "10.0.0.1")
    index.update(key(solo), solo)
    index.update(key(peer), peer)
    assert index.answer("10.0.0.5", "w-0.job.ml.svc.cluster.local", ZONE) == ["10.0.0.1"]
    assert index.answer("10.0.0.1", "solo.job.ml.svc.cluster.local", ZONE) is None


def copied_service(tenant: str, ns: str, name: str, selector: dict[str, str], cluster_ip: str = "None",
                   compute_ns: str | None = None) -> dict[str, Any]:
    """A vnode's compute copy of tenant Service ``ns/name`` (vnode/translate.py ``compute_service``)."""
    svc = compute_service({"metadata": {"name": name, "namespace": ns},
                           "spec": {"selector": selector, "clusterIP": cluster_ip, "ports": [{"port": 23456}]}},
                          Bridge(tenant=tenant, node=f"ferry-{tenant}", namespace=compute_ns or tenant, queue=tenant))
    svc["spec"]["clusterIP"] = cluster_ip  # as the API allocated it
    return svc


def test_a_services_name_answers_its_cluster_ip_or_the_pods_it_selects() -> None:
    index = PeerIndex()
    pods = [bridged("t1", "ml", "master-0", "10.0.0.1"), bridged("t1", "ml", "worker-0", "10.0.0.2"),
            bridged("t1", "other", "master-0", "10.0.0.3"), bridged("t2", "ml", "master-0", "10.0.0.9")]
    pods[0]["metadata"]["labels"]["role"] = "master"
    pods[2]["metadata"]["labels"]["role"] = "master"  # the same labels in another namespace
    pods[3]["metadata"]["labels"]["role"] = "master"  # and in another tenant
    for pod in pods:
        index.update(key(pod), pod)
    headless = copied_service("t1", "ml", "job-master-0", {"role": "master"})
    routed = copied_service("t1", "ml", "head-svc", {"role": "master"}, cluster_ip="10.96.7.7")
    for svc in (headless, routed):
        index.update_service(key(svc), svc)
    assert index.answer("10.0.0.2", "job-master-0.ml.svc.cluster.local.", ZONE) == ["10.0.0.1"]
    assert index.answer("10.0.0.2", "head-svc.ml.svc.cluster.local.", ZONE) == ["10.96.7.7"]
    assert index.answer("10.0.0.9", "job-master-0.ml.svc.cluster.local.", ZONE) is None, "t1's Service is not t2's"
    assert index.answer("10.0.0.2", "kubernetes.default.svc.cluster.local.", ZONE) is None, "not copied: relayed"
    index.update_service(key(headless), None)
    assert index.answer("10.0.0.2", "job-master-0.ml.svc.cluster.local.", ZONE) is None
    assert index.services == 1


def test_a_services_copy_selects_its_tenants_pods_of_its_namespace_on_the_same_ports() -> None:
    svc = {"metadata": {"name": "head-svc", "namespace": "ml"},
           "spec": {"type": "LoadBalancer", "clusterIP": "10.0.0.10", "selector": {"app": "ray"},
                    "ports": [{"name": "gcs", "port": 6379, "targetPort": "gcs", "nodePort": 30001}]}}
    copy = compute_service(svc, B)
    assert copy["metadata"]["name"] == naming.compute_name("t1", "ml", "head-svc")
    assert copy["metadata"]["namespace"] == "t1"
    assert copy["spec"] == {"type": "ClusterIP", "publishNotReadyAddresses": False,
                            "selector": {"app": "ray", naming.TENANT_LABEL: "t1", naming.UPSTREAM_NS_LABEL: "ml"},
                            "ports": [{"name": "gcs", "port": 6379, "targetPort": "gcs"}]}
    svc["spec"]["clusterIP"] = "None"
    assert compute_service(svc, B)["spec"]["clusterIP"] == "None", "headless stays headless"
    pod = compute_pod({"metadata": {"name": "head", "namespace": "ml", "uid": "u", "labels": {"app": "ray"}},
                       "spec": {"containers": [{"name": "c", "image": "i"}]}}, B)
    assert selects(copy["spec"]["selector"], pod["metadata"]["labels"]), "the copy selects the pod's copy"
    assert not selects({}, {"app": "ray"}) and not selects({"app": "x"}, {"app": "ray"})


def alias_copy(tenant: str, ns: str, name: str, external_name: str) -> dict[str, Any]:
    """A vnode's compute copy of tenant ExternalName Service ``ns/name``."""
    return compute_service({"metadata": {"name": name, "namespace": ns},
                            "spec": {"type": "ExternalName", "externalName": external_name}},
                           Bridge(tenant=tenant, node=f"ferry-{tenant}", namespace=tenant, queue=tenant))


def test_an_external_name_services_copy_is_the_same_alias_and_names_no_addresses() -> None:
    copy = alias_copy("t1", "ml", "db", "pg.example.com")
    assert copy["metadata"]["name"] == naming.compute_name("t1", "ml", "db")
    assert copy["spec"] == {"type": "ExternalName", "externalName": "pg.example.com"}
    assert is_alias(copy) and not is_alias(copied_service("t1", "ml", "head", {"a": "b"}))
    index = PeerIndex()
    pod = bridged("t1", "ml", "w-0", "10.0.0.1")
    index.update(key(pod), pod)
    slim = slim_service(copy)
    index.update_service(key(slim), slim)
    assert index.alias_of("10.0.0.1", "DB.ml.svc.cluster.local.", ZONE) == "pg.example.com"
    assert index.answer("10.0.0.1", "db.ml.svc.cluster.local.", ZONE) is None, "not every pod of its namespace"
    assert index.alias_of("10.0.0.9", "db.ml.svc.cluster.local.", ZONE) is None, "not a pod of the tenant"
    assert index.alias_of("10.0.0.1", "w-0.job.ml.svc.cluster.local.", ZONE) is None


def hand_made_slice(ns: str, service: str, name: str, endpoints: list[dict[str, Any]]) -> dict[str, Any]:
    """A tenant EndpointSlice as one is made by hand, or mirrored from a hand-made Endpoints object."""
    mirrored = {SERVICE_NAME_LABEL: service, MANAGED_BY_LABEL: "endpointslicemirroring-controller.k8s.io"}
    return {"metadata": {"name": name, "namespace": ns, "labels": mirrored},
            "addressType": "IPv4", "endpoints": endpoints, "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}


def test_a_service_with_endpoints_of_its_own_is_copied_without_a_selector_with_its_slices() -> None:
    """A database outside the cluster behind a Service without a selector: any pod of its namespace may use
    it; its copy has no selector, and its EndpointSlices are copied for the copy, tenant references left out."""
    own = {"metadata": {"name": "db", "namespace": "ml"}, "spec": {"ports": [{"name": "pg", "port": 5432}]}}
    assert has_own_endpoints(own) and used_by(own, {"any": "pod"}) and used_by(own, None)
    alias = {"metadata": {"name": "x", "namespace": "ml"}, "spec": {"type": "ExternalName", "externalName": "e.org"}}
    selecting = {"metadata": {"name": "y", "namespace": "ml"}, "spec": {"selector": {"app": "ray"}}}
    assert not has_own_endpoints(alias) and not has_own_endpoints(selecting)
    assert not used_by(selecting, {"app": "other"})
    api = {"metadata": {"name": "kubernetes", "namespace": "default"}, "spec": {"ports": [{"port": 443}]}}
    assert not has_own_endpoints(api) and not used_by(api, {}), "the tenant cluster's API is not copied"
    copy = compute_service(own, B)
    assert copy["spec"] == {"type": "ClusterIP", "publishNotReadyAddresses": False,
                            "ports": [{"name": "pg", "port": 5432}]}
    es = hand_made_slice("ml", "db", "db-abcde", [
        {"addresses": ["192.0.2.10"], "conditions": {"ready": True}, "nodeName": "tenant-node-1",
         "targetRef": {"kind": "Pod", "name": "p"}}])
    got = compute_endpoint_slice(es, B)
    assert got["metadata"]["name"] == naming.compute_name("t1", "ml", "db-abcde")
    assert got["metadata"]["namespace"] == "t1"
    assert got["metadata"]["labels"][SERVICE_NAME_LABEL] == copy["metadata"]["name"]
    assert got["metadata"]["labels"][MANAGED_BY_LABEL] == SLICES_MANAGED_BY, "no cluster controller manages it"
    assert got["metadata"]["labels"][naming.TENANT_LABEL] == "t1"
    assert got["endpoints"] == [{"addresses": ["192.0.2.10"], "conditions": {"ready": True}}]
    assert got["ports"] == es["ports"] and got["addressType"] == "IPv4"
    moved = compute_endpoint_slice(hand_made_slice("ml", "db", "db-abcde", [{"addresses": ["192.0.2.11"]}]), B)
    assert slice_digest(moved) != slice_digest(got), "a changed address is written again"


def test_a_headless_service_without_a_selector_answers_its_copied_endpoints() -> None:
    own = {"metadata": {"name": "db", "namespace": "ml"}, "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}}
    copy = compute_service(own, B)
    copy["spec"]["clusterIP"] = "None"
    index = PeerIndex()
    pods = [bridged("t1", "ml", "app", "10.0.0.1", subdomain=None), bridged("t2", "ml", "app", "10.0.0.9")]
    for pod in pods:
        index.update(key(pod), pod)
    index.update_service(key(copy), slim_service(copy))
    name = "db.ml.svc.cluster.local."
    assert index.answer("10.0.0.1", name, ZONE) is None, "no endpoints yet (and not every pod of its namespace)"
    first = slim_slice(compute_endpoint_slice(hand_made_slice("ml", "db", "db-1", [
        {"addresses": ["192.0.2.10"], "conditions": {"ready": True}},
        {"addresses": ["192.0.2.12"], "conditions": {"ready": False}}]), B))
    second = slim_slice(compute_endpoint_slice(hand_made_slice("ml", "db", "db-2", [
        {"addresses": ["192.0.2.11"]}]), B))  # no conditions: ready
    for es in (first, second):
        index.update_slice(key(es), es)
    assert index.answer("10.0.0.1", name, ZONE) == ["192.0.2.10", "192.0.2.11"], "ready addresses of both slices"
    assert index.answer("10.0.0.9", name, ZONE) is None, "t1's Service is not t2's"
    index.update_slice(key(second), None)
    assert index.answer("10.0.0.1", name, ZONE) == ["192.0.2.10"]


def test_the_cached_service_keeps_only_what_the_index_reads() -> None:
    svc = copied_service("t1", "ml", "job-master-0", {"role": "master"})
    svc["metadata"]["annotations"]["kubeferry.io/content-digest"] = "x"
    slim = slim_service(svc)
    assert "ports" not in slim["spec"] and list(slim["metadata"]["annotations"]) == [naming.UPSTREAM_NAME_ANNOTATION]
    index = PeerIndex()
    index.update_service(key(slim), slim)
    master = bridged("t1", "ml", "master-0", "10.0.0.1")
    master["metadata"]["labels"]["role"] = "master"
    index.update(key(master), master)
    assert index.answer("10.0.0.1", "job-master-0.ml.svc.cluster.local", ZONE) == ["10.0.0.1"]


def test_the_cached_pod_keeps_only_what_the_index_reads() -> None:
    pod = bridged("t1", "ml", "w-0", "10.0.0.1")
    pod["spec"]["containers"] = [{"name": "main", "image": "big"}]
    slim = slim_pod(pod)
    assert "containers" not in slim["spec"] and slim["metadata"]["labels"] == pod["metadata"]["labels"]
    index = PeerIndex()
    index.update(key(slim), slim)
    assert index.answer("10.0.0.1", "w-0.job.ml.svc.cluster.local", ZONE) == ["10.0.0.1"]


# ------------------------------------------------------------------ what a compute pod is given
B = Bridge(tenant="t1", node="ferry-t1", namespace="t1", queue="t1", dns_server="10.96.0.53")


def tenant_pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w-0", "namespace": "ml", "uid": "u-1"},
            "spec": {"containers": [{"name": "main", "image": "i"}], **spec}}


def test_a_cluster_first_pod_resolves_through_ferry_dns_with_its_tenant_namespaces_search_path() -> None:
    for policy in ({}, {"dnsPolicy": "ClusterFirst"}):
        spec = compute_pod(tenant_pod(**policy), B)["spec"]
        assert spec["dnsPolicy"] == "None"
        assert spec["dnsConfig"] == {"nameservers": ["10.96.0.53"],
                                     "searches": ["ml.svc.cluster.local", "svc.cluster.local", "cluster.local"],
                                     "options": [{"name": "ndots", "value": "5"}]}


def test_a_pods_own_dns_settings_are_kept_or_merged_as_a_kubelet_merges_them() -> None:
    own = {"nameservers": ["1.1.1.1"], "searches": ["corp.example"], "options": [{"name": "ndots", "value": "2"},
                                                                                 {"name": "edns0"}]}
    spec = compute_pod(tenant_pod(dnsConfig=own), B)["spec"]
    assert spec["dnsConfig"]["nameservers"] == ["10.96.0.53", "1.1.1.1"]
    assert spec["dnsConfig"]["searches"][-1] == "corp.example"
    assert spec["dnsConfig"]["options"] == [{"name": "ndots", "value": "2"}, {"name": "edns0"}]
    for policy in ("Default", "None"):
        kept = compute_pod(tenant_pod(dnsPolicy=policy, dnsConfig=own), B)["spec"]
        assert kept["dnsPolicy"] == policy and kept["dnsConfig"] == own
    plain = compute_pod(tenant_pod(), Bridge(tenant="t1", node="ferry-t1", namespace="t1", queue="t1"))["spec"]
    assert "dnsConfig" not in plain and "dnsPolicy" not in plain, "without ferry dns: the compute cluster's DNS"


# ---------------------------------------------------------------------------------- the server
class Upstream(asyncio.DatagramProtocol):
    """The cluster's DNS, as far as a relay can tell: one address for every name."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        query = DNSRecord.parse(data)
        reply = query.reply()
        reply.add_answer(RR(query.q.qname, QTYPE.A, rdata=A("10.96.0.1"), ttl=30))
        self.transport.sendto(reply.pack(), addr)


async def upstream_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The same over TCP, answering a query with a reply too long for UDP's 512 bytes (as TCP is for)."""
    query = DNSRecord.parse(await reader.readexactly(struct.unpack("!H", await reader.readexactly(2))[0]))
    reply = query.reply()
    for i in range(40):
        reply.add_answer(RR(query.q.qname, QTYPE.A, rdata=A(f"10.96.1.{i}"), ttl=30))
    packed = reply.pack()
    writer.write(struct.pack("!H", len(packed)) + packed)
    await writer.drain()
    writer.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, int]]:
    """``ferry dns`` on a free port of 127.0.0.1, where 127.0.0.1 is a pod of tenant t1; its upstream's port."""
    up, up_tcp = await bind_udp_and_tcp("127.0.0.1", 0, Upstream, upstream_tcp)
    up_port = up.get_extra_info("sockname")[1]
    index = PeerIndex()
    for pod in (bridged("t1", "ml", "w-0", "127.0.0.1"), bridged("t1", "ml", "w-1", "10.0.0.2"),
                bridged("t1", "ml", "v6", "fd00::7")):
        index.update(key(pod), pod)
    async with asyncio.TaskGroup() as tg:
        dns = PeerDNS(index, ZONE, ("127.0.0.1", up_port), timeout_s=0.5)
        udp, tcp = await serve(dns, "127.0.0.1", 0, tg)
        try:
            yield udp.get_extra_info("sockname")[1], up_port
        finally:
            udp.close()
            tcp.close()
            dns.close()
            up.close()
            up_tcp.close()


async def ask_udp(port: int, name: str, qtype: str = "A") -> DNSRecord:
    loop = asyncio.get_running_loop()
    got: asyncio.Future[bytes] = loop.create_future()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: Any) -> None:
            got.set_result(data)

    transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))
    try:
        transport.sendto(DNSRecord.question(name, qtype).pack())
        async with asyncio.timeout(5):
            return DNSRecord.parse(await got)
    finally:
        transport.close()


async def test_relayed_queries_share_one_socket_and_keep_their_ids(server: tuple[int, int]) -> None:
    """Many queries at once through the relay: each reply comes back to its asker with its own ID."""
    port, _ = server

    async def one(i: int) -> None:
        reply = await ask_udp(port, f"name-{i}.example.com")
        assert str(reply.q.qname) == f"name-{i}.example.com." and [str(r.rdata) for r in reply.rr] == ["10.96.0.1"]

    async with asyncio.TaskGroup() as tg:
        for i in range(50):
            tg.create_task(one(i))


async def test_the_server_answers_peers_and_relays_every_other_name(server: tuple[int, int]) -> None:
    port, _ = server
    peer = await ask_udp(port, "w-1.job.ml.svc.cluster.local")
    assert peer.header.rcode == RCODE.NOERROR and [str(r.rdata) for r in peer.rr] == ["10.0.0.2"]
    assert peer.rr[0].ttl == 5
    v6 = await ask_udp(port, "v6.job.ml.svc.cluster.local", "AAAA")
    assert [str(r.rdata) for r in v6.rr] == ["fd00::7"]
    none = await ask_udp(port, "w-1.job.ml.svc.cluster.local", "AAAA")
    assert none.header.rcode == RCODE.NOERROR and not none.rr, "the name exists, with no IPv6 address"
    other = await ask_udp(port, "kubernetes.default.svc.cluster.local")
    assert [str(r.rdata) for r in other.rr] == ["10.96.0.1"], "a Service name: the cluster's DNS answers"


async def test_the_server_answers_over_tcp(server: tuple[int, int]) -> None:
    port, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for name in ("w-1.job.ml.svc.cluster.local", "example.com"):
            query = DNSRecord.question(name).pack()
            writer.write(struct.pack("!H", len(query)) + query)
            await writer.drain()
            size = struct.unpack("!H", await reader.readexactly(2))[0]
            reply = DNSRecord.parse(await reader.readexactly(size))
            if name.startswith("w-1"):
                assert [str(r.rdata) for r in reply.rr] == ["10.0.0.2"]
            else:  # relayed over TCP, so it comes whole
                assert len(reply.rr) == 40 and size > 512 and reply.header.id == DNSRecord.parse(query).header.id
    finally:
        writer.close()


async def test_an_external_name_is_its_cname_then_the_addresses_of_what_it_names(server: tuple[int, int]) -> None:
    """As the cluster DNS answers an ExternalName Service: the CNAME, then the addresses of the name it gives,
    the tenant's own (through its other aliases too) from the index, any other from the upstream."""
    _, up_port = server
    index = PeerIndex()
    asker, head = bridged("t1", "ml", "w-0", "10.0.0.1"), bridged("t1", "ml", "head-0", "10.0.0.2")
    for pod in (asker, head, bridged("t2", "ml", "w-0", "10.0.0.9")):
        index.update(key(pod), pod)
    for svc in (copied_service("t1", "ml", "head-svc", {"role": "head"}, cluster_ip="10.96.7.7"),
                alias_copy("t1", "ml", "db", "pg.example.com"),
                alias_copy("t1", "ml", "head", "head-svc.ml.svc.cluster.local"),
                alias_copy("t1", "ml", "primary", "head.ml.svc.cluster.local."),
                alias_copy("t1", "ml", "a", "b.ml.svc.cluster.local"),
                alias_copy("t1", "ml", "b", "a.ml.svc.cluster.local")):
        index.update_service(key(svc), svc)
    dns = PeerDNS(index, ZONE, ("127.0.0.1", up_port), timeout_s=0.5)

    async def records(source: str, name: str, qtype: str = "A") -> tuple[int, list[tuple[str, str, str]]]:
        reply = await dns.handle(DNSRecord.question(name, qtype).pack(), source)
        assert reply is not None
        got = DNSRecord.parse(reply)
        return got.header.rcode, [(str(r.rname), QTYPE[r.rtype], str(r.rdata)) for r in got.rr]

    try:
        assert await records("10.0.0.1", "db.ml.svc.cluster.local") == (RCODE.NOERROR, [
            ("db.ml.svc.cluster.local.", "CNAME", "pg.example.com."), ("pg.example.com.", "A", "10.96.0.1")])
        assert await records("10.0.0.1", "primary.ml.svc.cluster.local") == (RCODE.NOERROR, [
            ("primary.ml.svc.cluster.local.", "CNAME", "head.ml.svc.cluster.local."),
            ("head.ml.svc.cluster.local.", "CNAME", "head-svc.ml.svc.cluster.local."),
            ("head-svc.ml.svc.cluster.local.", "A", "10.96.7.7")])
        assert await records("10.0.0.1", "db.ml.svc.cluster.local", "TXT") == (RCODE.NOERROR, [
            ("db.ml.svc.cluster.local.", "CNAME", "pg.example.com.")]), "other types: the CNAME alone"
        rcode, loop = await records("10.0.0.1", "a.ml.svc.cluster.local")
        assert rcode == RCODE.SERVFAIL and len(loop) == 8, "two aliases naming each other end"
        assert await records("10.0.0.9", "db.ml.svc.cluster.local") == (RCODE.NOERROR, [
            ("db.ml.svc.cluster.local.", "A", "10.96.0.1")]), "t1's alias is not t2's: relayed as it came"
    finally:
        dns.close()


async def test_port_0_picks_again_while_tcp_finds_the_udp_port_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel gives UDP a port that an outgoing TCP connection may hold (CI saw it): pick again."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    held = taken.getsockname()[1]
    loop = asyncio.get_running_loop()
    real, asked = loop.create_datagram_endpoint, []

    async def first_on_the_held_port(factory: Any, local_addr: tuple[str, int]) -> Any:
        asked.append(local_addr)
        return await real(factory, local_addr=(local_addr[0], held) if len(asked) == 1 else local_addr)

    monkeypatch.setattr(loop, "create_datagram_endpoint", first_on_the_held_port)
    try:
        udp, tcp = await bind_udp_and_tcp("127.0.0.1", 0, asyncio.DatagramProtocol, upstream_tcp)
        port = udp.get_extra_info("sockname")[1]
        assert len(asked) == 2 and port != held and tcp.sockets[0].getsockname()[1] == port
        udp.close()
        tcp.close()
        with pytest.raises(OSError, match="address already in use"):  # a port asked by number is kept
            await bind_udp_and_tcp("127.0.0.1", held, asyncio.DatagramProtocol, upstream_tcp)
    finally:
        taken.close()


async def test_an_upstream_that_does_not_answer_is_a_servfail_and_garbage_is_dropped() -> None:
    loop = asyncio.get_running_loop()
    silent, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
    try:
        dns = PeerDNS(PeerIndex(), ZONE, ("127.0.0.1", silent.get_extra_info("sockname")[1]), timeout_s=0.2)
        reply = await dns.handle(DNSRecord.question("example.com").pack(), "127.0.0.1")
        assert reply is not None and DNSRecord.parse(reply).header.rcode == RCODE.SERVFAIL
        before = QUERIES.labels("malformed")._value.get()
        assert await dns.handle(b"\x00\x01garbage", "127.0.0.1") is None
        assert QUERIES.labels("malformed")._value.get() == before + 1
    finally:
        silent.close()


def test_the_upstream_defaults_to_the_pods_own_nameserver_and_addresses_are_checked(tmp_path: Any) -> None:
    from vnode.cli import _host_port, _resolv_conf_nameserver

    conf = tmp_path / "resolv.conf"
    conf.write_text("search ns.svc.cluster.local\nnameserver 10.96.0.10\nnameserver 10.96.0.11\noptions ndots:5\n")
    assert _resolv_conf_nameserver(conf) == ("10.96.0.10", 53)
    conf.write_text("search x\n")
    assert _resolv_conf_nameserver(conf) is None
    assert _resolv_conf_nameserver(tmp_path / "missing") is None
    assert _host_port("0.0.0.0:5353") == ("0.0.0.0", 5353) and _host_port("[fd00::1]:53") == ("fd00::1", 53)
    for bad in ("10.96.0.10", ":53", "host:port", "host:70000"):
        with pytest.raises(Exception, match="HOST:PORT"):
            _host_port(bad)


def test_the_benchmarks_index_answers_what_coredns_is_given() -> None:
    """`make bench-dns` compares answers only if both servers know the same names with the same addresses."""
    from vnode.dnsbench import CLIENT_IP, ip_of, peer_index

    index = peer_index(300)
    assert len(index) == 301
    for i in (0, 255, 256, 299):
        assert index.answer(CLIENT_IP, f"w-{i}.ring.ml.svc.cluster.local.", ZONE) == [ip_of(i)]
    assert len({ip_of(i) for i in range(70_000)}) == 70_000 and CLIENT_IP not in {ip_of(i) for i in range(300)}


async def test_a_cached_answer_keeps_the_askers_id_and_never_outlives_a_change() -> None:
    index = PeerIndex()
    w0, w1 = bridged("t1", "ml", "w-0", "10.0.0.1"), bridged("t1", "ml", "w-1", "10.0.0.2")
    t2 = bridged("t2", "ml", "w-1", "10.0.0.9")
    for pod in (w0, w1, t2):
        index.update(key(pod), pod)
    dns = PeerDNS(index, ZONE, ("127.0.0.1", 9))

    async def ask(source: str, qid: int) -> DNSRecord:
        query = DNSRecord.question("w-1.job.ml.svc.cluster.local")
        query.header.id = qid
        reply = await dns.handle(query.pack(), source)
        assert reply is not None
        return DNSRecord.parse(reply)

    first, again = await ask("10.0.0.1", 1), await ask("10.0.0.1", 2)
    assert [str(r.rdata) for r in again.rr] == [str(r.rdata) for r in first.rr] == ["10.0.0.2"]
    assert (first.header.id, again.header.id) == (1, 2)
    assert [str(r.rdata) for r in (await ask("10.0.0.9", 3)).rr] == ["10.0.0.9"], "another tenant's own answer"
    moved = bridged("t1", "ml", "w-1", "10.0.0.3")
    index.update(key(moved), moved)
    assert [str(r.rdata) for r in (await ask("10.0.0.1", 4)).rr] == ["10.0.0.3"], "not the answer cached before"
