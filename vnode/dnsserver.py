"""``ferry dns``: the compute cluster's name server for bridged pods (vnode/peernames.py says what it answers).

One Deployment in the compute cluster, behind a Service whose ClusterIP every vnode is given
(``ferry vnode --dns-server``): the vnode makes that address the nameserver of each compute pod whose tenant
pod uses the cluster's DNS, with the tenant namespace's search path. Names of the asking tenant's pods and
Services are answered from informers over the bridged pods and the vnodes' Service copies (cluster-wide,
read-only); every other query is relayed as it came to the cluster's own DNS (``--upstream``), so the
compute cluster's own Services, other zones and the Internet resolve as before. UDP and TCP, as resolvers
use both; nothing is served before the informers have synced, so a starting server never calls a peer
missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import structlog
from dnslib import AAAA, CNAME, QTYPE, RCODE, RR, A, DNSError, DNSRecord
from prometheus_client import CollectorRegistry, Counter, Gauge

from ferry.health import make_app
from ferry.health import serve as serve_http
from ferry.kube.informer import Informer, key_of
from ferry.kube.rest import Rest, api_client, path
from ferry.shutdown import run_until_signalled
from vnode import naming
from vnode.peernames import PeerIndex
from vnode.translate import MANAGED_BY_LABEL, SLICES_MANAGED_BY

Obj = dict[str, Any]
log = structlog.get_logger("ferry.dns")
TTL = 5  # seconds: a peer that restarts elsewhere is found again soon
ANSWERS_CACHED = 50_000  # packed answers kept at most (the cache starts again when full)
ADDRESS_TYPES = {QTYPE.A: (A, 4), QTYPE.AAAA: (AAAA, 6)}
ALIAS_HOPS = 8  # ExternalName Services naming each other: a loop ends here, as a SERVFAIL

REGISTRY = CollectorRegistry()
QUERIES = Counter("kube_ferry_dns_queries_total", "Queries by how they were served: answered (a tenant's peer), "
                  "relayed (to the cluster's DNS), failed (the upstream did not answer), malformed",
                  ["outcome"], registry=REGISTRY)
PODS = Gauge("kube_ferry_dns_bridged_pods", "Bridged compute pods with an IP that the index holds", registry=REGISTRY)
SERVICES = Gauge("kube_ferry_dns_services", "The vnodes' copies of tenant Services that the index holds",
                 registry=REGISTRY)
META = ("name", "namespace", "resourceVersion", "deletionTimestamp", "labels")


def slim_pod(pod: Obj) -> Obj:
    """Only what the index reads: bridged pods cluster-wide are many."""
    meta, spec, st = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    return {"metadata": {k: meta[k] for k in META if k in meta},
            "spec": {k: spec[k] for k in ("hostname", "subdomain") if k in spec},
            "status": {k: st[k] for k in ("podIP", "phase") if k in st}}


def slim_service(svc: Obj) -> Obj:
    meta, spec = svc.get("metadata", {}), svc.get("spec", {})
    notes = meta.get("annotations") or {}
    return {"metadata": {**{k: meta[k] for k in META if k in meta},
                         "annotations": {k: v for k, v in notes.items() if k == naming.UPSTREAM_NAME_ANNOTATION}},
            "spec": {k: spec[k] for k in ("clusterIP", "selector", "type", "externalName") if k in spec}}


def slim_slice(es: Obj) -> Obj:
    meta = es.get("metadata", {})
    return {"metadata": {k: meta[k] for k in META if k in meta},
            "endpoints": [{k: e[k] for k in ("addresses", "conditions") if k in e} for e in es.get("endpoints") or []]}


def reply_for(index: PeerIndex, zone: str, source_ip: str, query: DNSRecord) -> DNSRecord | None:
    """The answer to ``query`` when it names one of the asking tenant's pods or Services; None to relay it."""
    q = query.q
    if q.qclass != 1 or q.qtype not in (QTYPE.A, QTYPE.AAAA, QTYPE.ANY):
        return None
    ips = index.answer(source_ip, str(q.qname), zone)
    if ips is None:
        return None
    reply = query.reply()  # authoritative for the name: no address of the other family is NOERROR, no records
    add_addresses(reply, q.qname, q.qtype, ips)
    return reply


def add_addresses(reply: DNSRecord, rname: Any, qtype: int, ips: list[str]) -> None:
    """``rname``'s addresses among ``ips`` of the type asked (A, AAAA, or both for ANY)."""
    for ip in ips:
        family = 6 if ":" in ip else 4
        for atype, (rdata, fam) in ADDRESS_TYPES.items():
            if fam == family and qtype in (atype, QTYPE.ANY):
                reply.add_answer(RR(rname, atype, rdata=rdata(ip), ttl=TTL))


class PeerDNS:
    """Answers from the index, relays the rest to ``upstream`` (host, port): over one UDP socket for queries
    that came by UDP, over TCP for those that came by TCP (a reply too long for UDP comes whole)."""

    def __init__(self, index: PeerIndex, zone: str, upstream: tuple[str, int], timeout_s: float = 2.0) -> None:
        self.index = index
        self.zone = zone
        self.upstream = upstream
        self.timeout_s = timeout_s
        self._udp = _Relay(upstream)
        # Answers already packed, by tenant and query (without its ID), while the index has not changed: a
        # job's pods ask the same few names, and parsing and packing is most of an answer's cost.
        self._answers: dict[tuple[str, bytes], bytes] = {}
        self._answers_of = -1  # the index version they were made from

    def _cached(self, data: bytes, source_ip: str) -> tuple[tuple[str, bytes] | None, bytes | None]:
        """The cache key of this query (None: not cacheable) and the answer cached for it."""
        tenant = self.index.tenant_of(source_ip)
        if tenant is None or len(data) <= 12:
            return None, None
        if self._answers_of != self.index.version:
            self._answers.clear()
            self._answers_of = self.index.version
        key = (tenant, bytes(data[2:]))
        return key, self._answers.get(key)

    async def handle(self, data: bytes, source_ip: str, tcp: bool = False) -> bytes | None:
        """The reply to one query message (None: nothing to send back)."""
        key, hit = self._cached(data, source_ip)
        if hit is not None:
            QUERIES.labels("answered").inc()
            return bytes(data[:2]) + hit
        try:
            query = DNSRecord.parse(data)
        except (DNSError, IndexError, ValueError, struct.error):
            QUERIES.labels("malformed").inc()
            return None
        if query.header.qr or not query.questions:
            QUERIES.labels("malformed").inc()
            return None
        aliased = await self._alias_reply(query, source_ip, tcp)
        if aliased is not None:  # not cached: its last part may come from the upstream
            QUERIES.labels("answered").inc()
            return bytes(aliased.pack())
        reply = reply_for(self.index, self.zone, source_ip, query)
        if reply is not None:
            QUERIES.labels("answered").inc()
            packed = bytes(reply.pack())
            if key is not None:
                if len(self._answers) >= ANSWERS_CACHED:
                    self._answers.clear()
                self._answers[key] = packed[2:]
            return packed
        relayed = await self._relay(data, tcp)
        if relayed is None:
            QUERIES.labels("failed").inc()
            fail = query.reply()
            fail.header.rcode = RCODE.SERVFAIL
            return bytes(fail.pack())
        QUERIES.labels("relayed").inc()
        return relayed

    async def _relay(self, data: bytes, tcp: bool) -> bytes | None:
        """The upstream's reply to a query message; None when it gave none in time."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await (self._relay_tcp(data) if tcp else self._udp.ask(data))
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            log.debug("relay failed", upstream=self.upstream, error=str(exc) or type(exc).__name__)
            return None

    async def _alias_reply(self, query: DNSRecord, source_ip: str, tcp: bool) -> DNSRecord | None:
        """The answer for a name of one of the asking tenant's ExternalName Services, as the cluster DNS gives
        it: its CNAME (and those of any of the tenant's aliases it names in turn), then the addresses of the
        last name, from the index when it is the tenant's, else from the upstream. None: not such a name."""
        q = query.q
        name = str(q.qname)
        target = self.index.alias_of(source_ip, name, self.zone) if q.qclass == 1 else None
        if target is None:
            return None
        reply = query.reply()
        for _ in range(ALIAS_HOPS):
            reply.add_answer(RR(name, QTYPE.CNAME, rdata=CNAME(target), ttl=TTL))
            name, target = target, self.index.alias_of(source_ip, target, self.zone)
            if target is None:
                break
        else:
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        if q.qtype not in (QTYPE.A, QTYPE.AAAA, QTYPE.ANY):
            return reply
        ips = self.index.answer(source_ip, name, self.zone)
        if ips is not None:
            add_addresses(reply, name, q.qtype, ips)
            return reply
        question = DNSRecord.question(name, QTYPE[q.qtype])
        try:
            got = DNSRecord.parse(await self._relay(bytes(question.pack()), tcp) or b"")
        except (DNSError, IndexError, ValueError, struct.error):  # no reply in time, or garbage
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        for rr in got.rr:
            reply.add_answer(rr)
        reply.header.rcode = got.header.rcode
        return reply

    def close(self) -> None:
        if self._udp.transport is not None:
            self._udp.transport.close()

    async def _relay_tcp(self, data: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(*self.upstream)
        try:
            writer.write(struct.pack("!H", len(data)) + data)
            await writer.drain()
            size = struct.unpack("!H", await reader.readexactly(2))[0]
            return await reader.readexactly(size)
        finally:
            writer.close()


class _Relay(asyncio.DatagramProtocol):
    """One UDP socket to the upstream for every relayed query, as a forwarder keeps one: each query leaves
    with an ID of ours (random, unused) and its reply gets the asker's ID back. A new socket per query
    would cost more than the answer."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.waiting: dict[int, asyncio.Future[bytes]] = {}
        self.transport: asyncio.DatagramTransport | None = None
        self._opening: asyncio.Lock | None = None

    async def ask(self, data: bytes) -> bytes:
        transport = await self._transport()
        loop = asyncio.get_running_loop()
        qid = secrets.randbelow(65536)
        while qid in self.waiting:
            if len(self.waiting) >= 65536:
                raise OSError("too many queries in flight to the upstream")
            qid = secrets.randbelow(65536)
        got: asyncio.Future[bytes] = loop.create_future()
        self.waiting[qid] = got
        try:
            transport.sendto(qid.to_bytes(2, "big") + data[2:])
            return data[:2] + (await got)[2:]
        finally:
            self.waiting.pop(qid, None)

    async def _transport(self) -> asyncio.DatagramTransport:
        if self.transport is not None and not self.transport.is_closing():
            return self.transport
        self._opening = self._opening or asyncio.Lock()
        async with self._opening:
            if self.transport is None or self.transport.is_closing():
                loop = asyncio.get_running_loop()
                self.transport, _ = await loop.create_datagram_endpoint(lambda: self, remote_addr=self.upstream)
        return self.transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        got = self.waiting.get(int.from_bytes(data[:2], "big")) if len(data) >= 12 else None
        if got is not None and not got.done():
            got.set_result(data)

    def error_received(self, exc: Exception) -> None:
        """The upstream refused (ICMP port unreachable): every query waiting on it fails now, not at its
        timeout."""
        for got in self.waiting.values():
            if not got.done():
                got.set_exception(OSError(f"upstream {self.upstream[0]}:{self.upstream[1]}: {exc}"))


class _UDP(asyncio.DatagramProtocol):
    def __init__(self, dns: PeerDNS, spawn: Callable[[Any], None]) -> None:
        self.dns = dns
        self.spawn = spawn
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # the selector's is not a subclass

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.spawn(self._serve(data, addr))

    async def _serve(self, data: bytes, addr: Any) -> None:
        try:
            reply = await self.dns.handle(data, addr[0])
        except Exception as exc:  # one query must never stop the server
            log.warning("query failed", source=addr[0], error=str(exc)[:200])
            return
        if reply is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(reply, addr)


async def _serve_tcp(dns: PeerDNS, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Length-prefixed messages (RFC 1035 4.2.2) until the client closes."""
    source = writer.get_extra_info("peername")[0]
    try:
        while True:
            size = struct.unpack("!H", await reader.readexactly(2))[0]
            reply = await dns.handle(await reader.readexactly(size), source, tcp=True)
            if reply is None:
                break
            writer.write(struct.pack("!H", len(reply)) + reply)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    except Exception as exc:  # one connection must never stop the server
        log.warning("query failed", source=source, error=str(exc)[:200])
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def serve(dns: PeerDNS, host: str, port: int, tg: asyncio.TaskGroup) -> tuple[asyncio.DatagramTransport,
                                                                                     asyncio.Server]:
    """Listen on UDP and TCP ``host:port``; each query is a task of ``tg`` (cancelled with it)."""
    def spawn(coro: Any) -> None:
        tg.create_task(coro)

    return await bind_udp_and_tcp(host, port, lambda: _UDP(dns, spawn),
                                  lambda r, w: _serve_tcp(dns, r, w))


PORT_PICKS = 20  # port 0: tries at a port free for both UDP and TCP


async def bind_udp_and_tcp(host: str, port: int, udp: Callable[[], asyncio.DatagramProtocol],
                           tcp: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any],
                           ) -> tuple[asyncio.DatagramTransport, asyncio.Server]:
    """UDP and TCP listeners on one port. Port 0 takes the port UDP is given, and picks again while TCP
    finds that port taken: the kernel hands both out of the same ephemeral range, where any outgoing
    connection may hold it."""
    loop = asyncio.get_running_loop()
    for attempt in range(1, PORT_PICKS + 1):
        transport, _ = await loop.create_datagram_endpoint(udp, local_addr=(host, port))
        given = transport.get_extra_info("sockname")[1]
        try:
            return transport, await asyncio.start_server(tcp, host, given)
        except OSError:
            transport.close()
            if port != 0 or attempt == PORT_PICKS:
                raise
    raise AssertionError("unreachable")


def pod_informer(lister: Any, index: PeerIndex) -> Informer:
    """Bridged pods of every tenant, fed into ``index``."""
    def changed(kind: str, pod: Obj) -> None:
        index.update(key_of(pod), None if kind == "DELETED" else pod)
        PODS.set(len(index))

    return Informer("bridged-pods", lister, on_change=changed, transform=slim_pod)


def service_informer(lister: Any, index: PeerIndex) -> Informer:
    """The vnodes' copies of tenant Services (and of subdomains' Services), fed into ``index``."""
    def changed(kind: str, svc: Obj) -> None:
        index.update_service(key_of(svc), None if kind == "DELETED" else svc)
        SERVICES.set(index.services)

    return Informer("service-copies", lister, on_change=changed, transform=slim_service)


def slice_informer(lister: Any, index: PeerIndex) -> Informer:
    """The vnodes' copies of the EndpointSlices of tenant Services without a selector, fed into ``index``."""
    def changed(kind: str, es: Obj) -> None:
        index.update_slice(key_of(es), None if kind == "DELETED" else es)

    return Informer("endpointslice-copies", lister, on_change=changed, transform=slim_slice)


def informers(compute: Rest, index: PeerIndex) -> list[Informer]:
    """What ``ferry dns`` watches: everything the vnodes made, of three kinds, cluster-wide."""
    return [pod_informer(compute.lister(path("", "v1", "pods"), labelSelector=naming.TENANT_LABEL), index),
            service_informer(compute.lister(path("", "v1", "services"), labelSelector=naming.TENANT_LABEL), index),
            slice_informer(compute.lister(path("discovery.k8s.io", "v1", "endpointslices"),
                                          labelSelector=f"{MANAGED_BY_LABEL}={SLICES_MANAGED_BY}"), index)]


async def main(compute_kubeconfig: Path | None, host: str, port: int, upstream: tuple[str, int], zone: str,
               metrics_address: str, metrics_port: int) -> None:
    """Sync the index, then serve DNS, health and metrics until signalled."""
    api = await api_client(compute_kubeconfig)
    compute = Rest(api)
    index = PeerIndex()
    watched = informers(compute, index)
    runners = [await serve_http(make_app(lambda: all(i.synced.is_set() for i in watched), REGISTRY),
                                metrics_address, metrics_port)]
    listeners: list[asyncio.BaseTransport | asyncio.Server] = []
    dns = PeerDNS(index, zone, upstream)

    async def work() -> None:
        async with asyncio.TaskGroup() as tg:
            for informer in watched:
                tg.create_task(informer.run())
            for informer in watched:
                await informer.synced.wait()
            listeners.extend(await serve(dns, host, port, tg))
            log.info("serving", address=f"{host}:{port}", upstream=f"{upstream[0]}:{upstream[1]}", zone=zone,
                     bridged_pods=len(index), services=index.services)

    async def cleanup() -> None:
        for listener in listeners:
            listener.close()
        dns.close()
        for r in runners:
            with contextlib.suppress(Exception):
                await r.cleanup()
        await api.close()

    await run_until_signalled(work(), cleanup)
