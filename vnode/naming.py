"""Names and ownership marks of objects the vnode creates in the compute cluster.

Every tenant namespace/name maps to one compute name: deterministic (a restarted vnode finds what it
made), collision-free across namespaces and tenants (a digest of the full upstream identity), and at
most 63 characters (usable as a hostname, Service name and label value).
"""

from __future__ import annotations

import hashlib
import re

from ferry.keys import PREFIX

TENANT_LABEL = PREFIX + "tenant"
VNODE_LABEL = PREFIX + "vnode"
UPSTREAM_NS_LABEL = PREFIX + "upstream-namespace"
UPSTREAM_UID_LABEL = PREFIX + "upstream-uid"
UPSTREAM_NAME_ANNOTATION = PREFIX + "upstream-name"
KIND_LABEL = PREFIX + "copy-of"  # on copied ConfigMaps/Secrets/Services: what they copy
SUBDOMAIN_LABEL = PREFIX + "subdomain"

MAX = 63
_DIGEST = 10
_BAD = re.compile(r"[^a-z0-9-]")


def compute_name(tenant: str, namespace: str, name: str) -> str:
    """``<namespace>-<name>-<digest>``, cut to 63 characters; the digest covers tenant, namespace and name."""
    digest = hashlib.sha256(f"{tenant}/{namespace}/{name}".encode()).hexdigest()[:_DIGEST]
    base = _BAD.sub("-", f"{namespace}-{name}".lower())
    base = base[: MAX - _DIGEST - 1].strip("-") or "x"
    return f"{base}-{digest}"


def owner_labels(tenant: str, vnode: str, namespace: str, uid: str | None = None) -> dict[str, str]:
    labels = {TENANT_LABEL: tenant, VNODE_LABEL: vnode, UPSTREAM_NS_LABEL: namespace}
    if uid:
        labels[UPSTREAM_UID_LABEL] = uid
    return labels


def owned_selector(tenant: str, vnode: str) -> str:
    return f"{TENANT_LABEL}={tenant},{VNODE_LABEL}={vnode}"
