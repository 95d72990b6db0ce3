"""Peer names across the bridge: the DNS names a tenant's operator gives its pods, found in the compute cluster.

A distributed job finds its peers by names of the tenant cluster: ``<host>.<subdomain>.<namespace>.svc.<zone>``
(MPI Operator's hostfile, JobSet, Indexed Jobs with a subdomain), or their short forms through the pod's
search path. In the compute cluster those pods run in the tenant's compute namespace behind a Service of
another name (vnode/naming.py), so the cluster's own DNS does not know the tenant's names. ``ferry dns``
(vnode/dnsserver.py) answers them from this index: every bridged compute pod carries its tenant, upstream
namespace, hostname and subdomain, the asking pod's IP says which tenant asks, and a tenant finds only its
own pods. This module is the pure part: no I/O, fed with pod objects by an informer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vnode import naming

Obj = dict[str, Any]
TERMINAL = ("Succeeded", "Failed")  # a finished pod keeps its IP in its status; another may get it


@dataclass(frozen=True)
class PeerName:
    """``<host>.<subdomain>.<namespace>.svc.<zone>``: a pod with that hostname and subdomain in that namespace."""

    namespace: str
    subdomain: str
    host: str


def parse(qname: str, zone: str) -> PeerName | None:
    """The peer a fully qualified query names, or None when it names something else (a Service, another
    zone, a search-path expansion that does not fit)."""
    labels = qname.rstrip(".").lower().split(".")
    suffix = ["svc", *zone.strip(".").lower().split(".")]
    if len(labels) != 3 + len(suffix) or labels[3:] != suffix or not all(labels[:3]):
        return None
    host, subdomain, namespace = labels[:3]
    return PeerName(namespace, subdomain, host)


@dataclass(frozen=True)
class _Entry:
    """What one compute pod contributes: its IP, its tenant, and the peer key it answers (if it has a subdomain)."""

    ip: str
    tenant: str
    peer: tuple[str, str, str, str] | None  # (tenant, upstream namespace, compute subdomain, hostname)


def _entry(pod: Obj) -> _Entry | None:
    meta, spec, st = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    labels = meta.get("labels") or {}
    tenant, ip = labels.get(naming.TENANT_LABEL), st.get("podIP")
    if not tenant or not ip or st.get("phase") in TERMINAL or meta.get("deletionTimestamp"):
        return None
    peer = None
    if (sub := spec.get("subdomain")) and (ns := labels.get(naming.UPSTREAM_NS_LABEL)):
        host = (spec.get("hostname") or meta.get("name", "")).lower()
        peer = (tenant, ns, sub, host)
    return _Entry(ip, tenant, peer)


class PeerIndex:
    """Bridged compute pods by IP (who asks) and by peer name (what it may find)."""

    def __init__(self) -> None:
        self._by_pod: dict[str, _Entry] = {}  # compute pod key -> what it contributed
        self._tenants_at: dict[str, dict[str, str]] = {}  # pod IP -> {pod key: tenant}
        self._peers: dict[tuple[str, str, str, str], dict[str, str]] = {}  # peer key -> {pod key: IP}

    def __len__(self) -> int:
        return len(self._by_pod)

    def update(self, key: str, pod: Obj | None) -> None:
        """The pod at ``key`` is now ``pod`` (None: deleted)."""
        new = _entry(pod) if pod is not None else None
        old = self._by_pod.get(key)
        if old == new:
            return
        if old is not None:
            del self._by_pod[key]
            _drop(self._tenants_at, old.ip, key)
            if old.peer is not None:
                _drop(self._peers, old.peer, key)
        if new is not None:
            self._by_pod[key] = new
            self._tenants_at.setdefault(new.ip, {})[key] = new.tenant
            if new.peer is not None:
                self._peers.setdefault(new.peer, {})[key] = new.ip

    def tenant_of(self, ip: str) -> str | None:
        """The tenant whose pod has this IP; None for any other address (or while two tenants' pods claim it,
        as for a moment when an IP is reused)."""
        tenants = set((self._tenants_at.get(ip) or {}).values())
        return tenants.pop() if len(tenants) == 1 else None

    def answer(self, source_ip: str, qname: str, zone: str) -> list[str] | None:
        """The IPs of the peer ``qname`` names, among the asking tenant's pods; None when the name is not one of
        that tenant's peers (the cluster's own DNS answers it)."""
        tenant = self.tenant_of(source_ip)
        peer = parse(qname, zone)
        if tenant is None or peer is None:
            return None
        sub = naming.compute_name(tenant, peer.namespace, peer.subdomain)
        ips = self._peers.get((tenant, peer.namespace, sub, peer.host))
        return sorted(set(ips.values())) if ips else None


def _drop(index: dict[Any, dict[str, str]], at: Any, key: str) -> None:
    entries = index.get(at)
    if entries is not None:
        entries.pop(key, None)
        if not entries:
            del index[at]
