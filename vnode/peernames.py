"""Peer names across the bridge: the DNS names a tenant's operator gives its pods, found in the compute cluster.

A distributed job finds its peers by names of the tenant cluster: ``<host>.<subdomain>.<namespace>.svc.<zone>``
(MPI Operator's hostfile, JobSet, Indexed Jobs with a subdomain) or a Service's
``<service>.<namespace>.svc.<zone>`` (a PyTorchJob's ``MASTER_ADDR``, a Ray head), or their short forms through
the pod's search path. In the compute cluster those pods, and the vnode's copies of those Services, live in the
tenant's compute namespace under other names (vnode/naming.py), so the cluster's own DNS does not know the
tenant's names. ``ferry dns`` (vnode/dnsserver.py) answers them from this index: every bridged compute pod and
Service copy carries its tenant and upstream namespace (and name, hostname, subdomain), the asking pod's IP
says which tenant asks, and a tenant finds only its own. This module is the pure part: no I/O, fed with
objects by informers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vnode import naming
from vnode.translate import SERVICE_NAME_LABEL

Obj = dict[str, Any]
TERMINAL = ("Succeeded", "Failed")  # a finished pod keeps its IP in its status; another may get it
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PeerName:
    """``<host>.<subdomain>.<namespace>.svc.<zone>``: a pod with that hostname and subdomain in that namespace."""

    namespace: str
    subdomain: str
    host: str


@dataclass(frozen=True)
class ServiceName:
    """``<service>.<namespace>.svc.<zone>``."""

    namespace: str
    service: str


def parse(qname: str, zone: str) -> PeerName | ServiceName | None:
    """The pod or Service a fully qualified query names, or None when it names something else (another zone,
    a search-path expansion that does not fit)."""
    labels = qname.rstrip(".").lower().split(".")
    suffix = ["svc", *zone.strip(".").lower().split(".")]
    head = labels[:-len(suffix)]
    if labels[len(head):] != suffix or not all(head):
        return None
    if len(head) == 3:
        return PeerName(head[2], head[1], head[0])
    if len(head) == 2:
        return ServiceName(head[1], head[0])
    return None


@dataclass(frozen=True)
class _Pod:
    """What one compute pod contributes: its IP, its tenant and compute namespace, the peer key it answers
    (if it has a subdomain) and its labels (what a headless Service's copy selects)."""

    ip: str
    tenant: str
    namespace: str
    peer: tuple[str, str, str, str] | None  # (tenant, upstream namespace, compute subdomain, hostname)
    labels: Labels


def _pod(pod: Obj) -> _Pod | None:
    meta, spec, st = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    labels = meta.get("labels") or {}
    tenant, ip = labels.get(naming.TENANT_LABEL), st.get("podIP")
    if not tenant or not ip or st.get("phase") in TERMINAL or meta.get("deletionTimestamp"):
        return None
    peer = None
    if (sub := spec.get("subdomain")) and (ns := labels.get(naming.UPSTREAM_NS_LABEL)):
        host = (spec.get("hostname") or meta.get("name", "")).lower()
        peer = (tenant, ns, sub, host)
    return _Pod(ip, tenant, meta.get("namespace", ""), peer, tuple(sorted(labels.items())))


@dataclass(frozen=True)
class _Service:
    """A vnode's copy of a tenant Service: its cluster IP, or the selector whose pods a headless one answers."""

    name: tuple[str, str, str]  # (tenant, upstream namespace, upstream name)
    namespace: str  # the copy's compute namespace
    cluster_ip: str | None
    selector: Labels
    alias: str | None = None  # an ExternalName Service's other name (its CNAME)


def _service(svc: Obj) -> _Service | None:
    meta, spec = svc.get("metadata", {}), svc.get("spec", {})
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    tenant, ns = labels.get(naming.TENANT_LABEL), labels.get(naming.UPSTREAM_NS_LABEL)
    name = notes.get(naming.UPSTREAM_NAME_ANNOTATION)
    if not tenant or not ns or not name or meta.get("deletionTimestamp"):
        return None
    ip = spec.get("clusterIP")
    alias = str(spec.get("externalName") or "").rstrip(".").lower() if spec.get("type") == "ExternalName" else None
    return _Service((tenant, ns, name.lower()), meta.get("namespace", ""), None if ip in (None, "", "None") else ip,
                    tuple(sorted((spec.get("selector") or {}).items())), alias or None)


def _slice(es: Obj) -> tuple[str, tuple[str, ...]] | None:
    """A copied EndpointSlice (of a Service with endpoints of its own): the key of the compute Service it
    belongs to, and its addresses that are not marked unready."""
    meta = es.get("metadata", {})
    service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    if not service or meta.get("deletionTimestamp"):
        return None
    ready = {a for e in es.get("endpoints") or [] if (e.get("conditions") or {}).get("ready") is not False
             for a in e.get("addresses") or []}
    return f"{meta.get('namespace', '')}/{service}", tuple(sorted(ready))


class PeerIndex:
    """Bridged compute pods by IP (who asks) and by peer name, and the vnodes' Service copies by tenant name."""

    def __init__(self) -> None:
        self._pods: dict[str, _Pod] = {}  # compute pod key -> what it contributed
        self._tenants_at: dict[str, dict[str, str]] = {}  # pod IP -> {pod key: tenant}
        self._peers: dict[tuple[str, str, str, str], dict[str, str]] = {}  # peer key -> {pod key: IP}
        self._in_ns: dict[tuple[str, str], dict[str, str]] = {}  # (tenant, compute namespace) -> {pod key: IP}
        self._services: dict[str, _Service] = {}  # compute Service key -> what it answers
        self._by_name: dict[tuple[str, str, str], dict[str, _Service]] = {}  # tenant name -> {Service key: it}
        self._slices: dict[str, tuple[str, tuple[str, ...]]] = {}  # slice key -> (Service key, addresses)
        self._slice_ips: dict[str, dict[str, tuple[str, ...]]] = {}  # Service key -> {slice key: addresses}
        self.version = 0  # moves at every change of what the index answers (answers cached before are stale)

    def __len__(self) -> int:
        return len(self._pods)

    @property
    def services(self) -> int:
        return len(self._services)

    def update(self, key: str, pod: Obj | None) -> None:
        """The pod at ``key`` is now ``pod`` (None: deleted)."""
        new = _pod(pod) if pod is not None else None
        old = self._pods.get(key)
        if old == new:
            return
        self.version += 1
        if old is not None:
            del self._pods[key]
            _drop(self._tenants_at, old.ip, key)
            _drop(self._in_ns, (old.tenant, old.namespace), key)
            if old.peer is not None:
                _drop(self._peers, old.peer, key)
        if new is not None:
            self._pods[key] = new
            self._tenants_at.setdefault(new.ip, {})[key] = new.tenant
            self._in_ns.setdefault((new.tenant, new.namespace), {})[key] = new.ip
            if new.peer is not None:
                self._peers.setdefault(new.peer, {})[key] = new.ip

    def update_service(self, key: str, svc: Obj | None) -> None:
        """The Service copy at ``key`` is now ``svc`` (None: deleted)."""
        new = _service(svc) if svc is not None else None
        old = self._services.get(key)
        if old == new:
            return
        self.version += 1
        if old is not None:
            del self._services[key]
            _drop(self._by_name, old.name, key)
        if new is not None:
            self._services[key] = new
            self._by_name.setdefault(new.name, {})[key] = new

    def update_slice(self, key: str, es: Obj | None) -> None:
        """The copied EndpointSlice at ``key`` is now ``es`` (None: deleted)."""
        new = _slice(es) if es is not None else None
        old = self._slices.get(key)
        if old == new:
            return
        self.version += 1
        if old is not None:
            del self._slices[key]
            _drop(self._slice_ips, old[0], key)
        if new is not None:
            self._slices[key] = new
            self._slice_ips.setdefault(new[0], {})[key] = new[1]

    def tenant_of(self, ip: str) -> str | None:
        """The tenant whose pod has this IP; None for any other address (or while two tenants' pods claim it,
        as for a moment when an IP is reused)."""
        tenants = set((self._tenants_at.get(ip) or {}).values())
        return tenants.pop() if len(tenants) == 1 else None

    def answer(self, source_ip: str, qname: str, zone: str) -> list[str] | None:
        """The IPs ``qname`` names among the asking tenant's pods and Services; None when it names none of
        them (the cluster's own DNS answers it)."""
        tenant = self.tenant_of(source_ip)
        name = parse(qname, zone)
        if tenant is None or name is None:
            return None
        if isinstance(name, ServiceName):
            return self._service_ips(tenant, name)
        sub = naming.compute_name(tenant, name.namespace, name.subdomain)
        ips = self._peers.get((tenant, name.namespace, sub, name.host))
        return sorted(set(ips.values())) if ips else None

    def alias_of(self, source_ip: str, qname: str, zone: str) -> str | None:
        """The other name that ``qname`` stands for, when it names an ExternalName Service of the asking
        tenant (``ferry dns`` answers its CNAME); None otherwise."""
        tenant = self.tenant_of(source_ip)
        name = parse(qname, zone)
        if tenant is None or not isinstance(name, ServiceName):
            return None
        copies = self._by_name.get((tenant, name.namespace, name.service))
        return next(iter(copies.values())).alias if copies else None

    def _service_ips(self, tenant: str, name: ServiceName) -> list[str] | None:
        """A copied Service's cluster IP, or a headless one's pods (of its tenant and compute namespace, as
        its selector chooses them), or, without a selector, the addresses of its copied EndpointSlices."""
        copies = self._by_name.get((tenant, name.namespace, name.service))
        if not copies:
            return None
        key, svc = next(iter(copies.items()))
        if svc.alias is not None:
            return None  # a name for another name, not for addresses (``alias_of``)
        if svc.cluster_ip is not None:
            return [svc.cluster_ip]
        if not svc.selector:
            return sorted({a for addresses in (self._slice_ips.get(key) or {}).values() for a in addresses}) or None
        wanted = set(svc.selector)
        ips = {ip for key, ip in (self._in_ns.get((tenant, svc.namespace)) or {}).items()
               if wanted <= set(self._pods[key].labels)}
        return sorted(ips) or None


def _drop(index: dict[Any, dict[str, Any]], at: Any, key: str) -> None:
    entries = index.get(at)
    if entries is not None:
        entries.pop(key, None)
        if not entries:
            del index[at]
