"""What a pod needs in the compute cluster before it starts: copied ConfigMaps and Secrets, a
service-account token issued by the tenant cluster, the headless Service behind its subdomain; and the
tenant Services that select it, copied so that their names resolve and route to compute pods.

Copies are owned by labels and found through the compute caches; they are refreshed when the
tenant object changes and collected by :meth:`Copies.sweep` once no owned pod references them.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from ferry.keys import PREFIX
from ferry.kube.rest import Rest, message_of, path, status_of
from vnode import metrics, naming, status
from vnode.caches import Caches
from vnode.translate import (
    Bridge,
    compute_service,
    content_digest,
    copy_of,
    is_alias,
    needs_of,
    selects,
    spec_digest,
    subdomain_service,
    token_secret_name,
    used_by,
)

Obj = dict[str, Any]
DIGEST_ANNOTATION = PREFIX + "content-digest"
TOKEN_EXPIRES = PREFIX + "token-expires"
TOKEN_ISSUED = PREFIX + "token-issued"
log = structlog.get_logger("ferry.vnode.copies")


class MissingDependency(Exception):
    """A referenced ConfigMap/Secret does not exist (yet): the pod waits, as on a kubelet."""


class Copies:
    def __init__(self, b: Bridge, tenant: Rest, compute: Rest, caches: Caches, token_refresh_at: float = 0.8) -> None:
        self.b = b
        self.token_refresh_at = token_refresh_at
        self.tenant = tenant
        self.compute = compute
        self.caches = caches
        self.services_in: dict[str, dict[str, Obj]] = {}  # tenant Services by namespace, then name

    def on_tenant_service(self, event: str, svc: Obj) -> None:
        """Keep :attr:`services_in` with the tenant Services' cache (a pod asks only of its namespace)."""
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        if event == "DELETED":
            self.services_in.get(ns, {}).pop(name, None)
        else:
            self.services_in.setdefault(ns, {})[name] = svc

    async def ensure(self, pod: Obj) -> float | None:
        """Make every dependency of ``pod`` exist; returns seconds until its token needs refreshing."""
        ns = pod["metadata"]["namespace"]
        needs = needs_of(pod)
        optional = _optional_refs(pod)
        for kind, names, src, dst in (
            ("ConfigMap", needs.configmaps, self.caches.tenant_configmaps.store,
             self.caches.compute_configmaps.store),
            ("Secret", needs.secrets, self.caches.tenant_secrets.store, self.caches.compute_secrets.store),
        ):
            for name in sorted(names):
                obj = src.get(f"{ns}/{name}")
                if obj is None:
                    if name in optional:
                        continue
                    raise MissingDependency(f'{kind.lower()} "{name}" not found')
                await self._upsert(kind, obj, dst)
        if needs.subdomain:
            await self._service(ns, needs.subdomain)
        for svc in self.services_for(pod):
            if svc["metadata"]["name"] != needs.subdomain:  # that one is its subdomain's, above
                await self._copy_service(svc)
        if needs.token is not None:
            return await self._token(pod, needs.token)
        return None

    async def _upsert(self, kind: str, obj: Obj, cache: dict[str, Obj]) -> None:
        want = copy_of(obj, self.b, kind)
        digest = content_digest(obj)
        want["metadata"]["annotations"][DIGEST_ANNOTATION] = digest
        name = want["metadata"]["name"]
        have = cache.get(f"{self.b.namespace}/{name}")
        plural = "configmaps" if kind == "ConfigMap" else "secrets"
        url = path("", "v1", plural, self.b.namespace)
        if have is None:
            try:
                cache[f"{self.b.namespace}/{name}"] = await self.compute.create(url, want)
                return
            except Exception as exc:
                if status_of(exc) != 409:
                    raise
                have = await self.compute.get(f"{url}/{name}")
        if (have.get("metadata", {}).get("annotations") or {}).get(DIGEST_ANNOTATION) == digest:
            return
        if have.get("immutable"):  # an immutable copy cannot change: replace it
            await self.compute.delete(f"{url}/{name}")
            cache[f"{self.b.namespace}/{name}"] = await self.compute.create(url, want)
            return
        want["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
        cache[f"{self.b.namespace}/{name}"] = await self.compute.put(f"{url}/{name}", want)

    async def _service(self, ns: str, subdomain: str) -> None:
        name = naming.compute_name(self.b.tenant, ns, subdomain)
        if f"{self.b.namespace}/{name}" in self.caches.compute_services.store:
            return
        upstream = await self.tenant.get_or_none(path("", "v1", "services", ns, subdomain))
        body = subdomain_service(ns, subdomain, upstream, self.b)
        try:
            created = await self.compute.create(path("", "v1", "services", self.b.namespace), body)
            self.caches.compute_services.remember(created)
        except Exception as exc:
            if status_of(exc) != 409:
                raise

    def services_for(self, pod: Obj) -> list[Obj]:
        """The tenant Services of the pod's namespace that its copy needs (translate.py ``used_by``)."""
        meta = pod["metadata"]
        return [svc for svc in list(self.services_in.get(meta["namespace"], {}).values())
                if used_by(svc, meta.get("labels"))]

    async def _copy_service(self, svc: Obj) -> None:
        """Create or update the compute copy of a tenant Service (vnode/translate.py ``compute_service``). A copy
        the compute API refuses is logged and left: the pod runs without it, as beside a broken Service."""
        want = compute_service(svc, self.b)
        digest = spec_digest(want)
        want["metadata"]["annotations"][DIGEST_ANNOTATION] = digest
        name = want["metadata"]["name"]
        key, url = f"{self.b.namespace}/{name}", path("", "v1", "services", self.b.namespace)
        cache = self.caches.compute_services
        have = cache.store.get(key)
        try:
            if have is None:
                try:
                    cache.remember(await self.compute.create(url, want))
                    return
                except Exception as exc:
                    if status_of(exc) != 409:
                        raise
                    have = await self.compute.get(f"{url}/{name}")
            if (have["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION) == digest:
                return
            if naming.SUBDOMAIN_LABEL in (have["spec"].get("selector") or {}):
                return  # made for pods of that subdomain, which it must keep choosing (``_service``)
            if _service_form(have) != _service_form(want):
                await self.compute.delete(f"{url}/{name}")  # headless, alias or not cannot change in place
                cache.store.pop(key, None)
                cache.remember(await self.compute.create(url, want))
                return
            for k in ("clusterIP", "clusterIPs"):
                if k in have["spec"]:
                    want["spec"][k] = have["spec"][k]
            want["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
            cache.remember(await self.compute.put(f"{url}/{name}", want), replaces=have)
        except Exception as exc:
            if status_of(exc) != 422:
                raise
            log.warning("the compute cluster refused a Service's copy", service=svc["metadata"]["name"],
                        namespace=svc["metadata"]["namespace"], error=message_of(exc)[:300])

    async def _token(self, pod: Obj, source: Obj) -> float:
        """A token for the pod's ServiceAccount, bound to the tenant pod, kept fresh in a compute Secret."""
        meta, spec = pod["metadata"], pod.get("spec", {})
        name = token_secret_name(self.b, pod)
        key = f"{self.b.namespace}/{name}"
        have = self.caches.compute_secrets.store.get(key)
        now = time.time()
        if have is not None:
            ann = have["metadata"].get("annotations") or {}
            issued, expires = float(ann.get(TOKEN_ISSUED, 0)), float(ann.get(TOKEN_EXPIRES, 0))
            refresh_at = issued + self.token_refresh_at * (expires - issued)
            if now < refresh_at:
                return refresh_at - now
        sa = spec.get("serviceAccountName") or "default"
        req: Obj = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
            "expirationSeconds": int(source.get("expirationSeconds") or 3607),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
        }}
        if source.get("audience"):
            req["spec"]["audiences"] = [source["audience"]]
        resp = await self.tenant.create(path("", "v1", "serviceaccounts", meta["namespace"], sa, "token"), req)
        expires = status.epoch(resp["status"]["expirationTimestamp"])
        body: Obj = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": self.b.namespace,
                         "labels": {**naming.owner_labels(self.b.tenant, self.b.node, meta["namespace"]),
                                    naming.KIND_LABEL: "ServiceAccountToken"},
                         "annotations": {naming.UPSTREAM_NAME_ANNOTATION: meta["name"],
                                         TOKEN_ISSUED: str(now), TOKEN_EXPIRES: str(expires)}},
            "stringData": {"token": resp["status"]["token"], "namespace": meta["namespace"]},
        }
        url = path("", "v1", "secrets", self.b.namespace)
        if have is None:
            try:
                self.caches.compute_secrets.remember(await self.compute.create(url, body))
            except Exception as exc:
                if status_of(exc) != 409:
                    raise
                have = await self.compute.get(f"{url}/{name}")
        if have is not None:
            body["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
            self.caches.compute_secrets.remember(await self.compute.put(f"{url}/{name}", body), replaces=have)
        return self.token_refresh_at * (expires - now)

    async def sweep(self, min_age_s: float) -> int:
        """Delete owned copies that no owned compute pod references any more (only after caches synced)
        and that are older than ``min_age_s`` (copies are made before their pod)."""
        used: dict[str, set[str]] = {"configmaps": set(), "secrets": set(), "services": set()}
        labels_in: dict[str, list[dict[str, str]]] = {}  # upstream namespace -> its compute pods' labels
        for pod in list(self.caches.compute_pods.store.values()):
            needs = needs_of(pod)
            used["configmaps"] |= needs.configmaps
            used["secrets"] |= needs.secrets
            if needs.subdomain:
                used["services"].add(needs.subdomain)
            labels = pod["metadata"].get("labels") or {}
            labels_in.setdefault(labels.get(naming.UPSTREAM_NS_LABEL, ""), []).append(labels)
        for svc in list(self.caches.compute_services.store.values()):  # copies of Services its pods use
            meta, selector = svc["metadata"], (svc.get("spec") or {}).get("selector") or {}
            ns = (meta.get("labels") or {}).get(naming.UPSTREAM_NS_LABEL, "")
            upstream = f"{ns}/{(meta.get('annotations') or {}).get(naming.UPSTREAM_NAME_ANNOTATION)}"
            tenant_svc = self.caches.tenant_services.store.get(upstream)
            if tenant_svc is None or naming.SUBDOMAIN_LABEL in selector:
                continue
            if (is_alias(tenant_svc) and is_alias(svc) and ns in labels_in) or \
                    any(selects(selector, labels) for labels in labels_in.get(ns, ())):
                used["services"].add(meta["name"])
        deleted = 0
        now = time.time()
        for plural, cache in (("configmaps", self.caches.compute_configmaps.store),
                              ("secrets", self.caches.compute_secrets.store),
                              ("services", self.caches.compute_services.store)):
            for obj in list(cache.values()):
                meta = obj["metadata"]
                if meta["name"] in used[plural] or now - status.epoch(meta.get("creationTimestamp")) < min_age_s:
                    continue
                try:
                    await self.compute.delete(path("", "v1", plural, self.b.namespace, meta["name"]))
                except Exception as exc:
                    if status_of(exc) != 404:
                        log.warning("collecting a copy failed", kind=plural, name=meta["name"], error=str(exc)[:200])
                        continue
                cache.pop(f"{self.b.namespace}/{meta['name']}", None)
                metrics.GC_DELETED.labels(plural).inc()
                deleted += 1
        return deleted


def _service_form(svc: Obj) -> str:
    """What a Service is that an update cannot change: an alias (ExternalName), headless, or with a cluster IP."""
    spec = svc.get("spec") or {}
    return "alias" if is_alias(svc) else "headless" if spec.get("clusterIP") == "None" else "clusterIP"


def _optional_refs(pod: Obj) -> set[str]:
    spec = pod.get("spec", {})
    out: set[str] = set()
    for vol in spec.get("volumes", []):
        for key in ("configMap", "secret"):
            src = vol.get(key) or {}
            if src.get("optional"):
                out.add(src.get("name") or src.get("secretName") or "")
        for src in (vol.get("projected") or {}).get("sources") or []:
            for key in ("configMap", "secret"):
                if (src.get(key) or {}).get("optional"):
                    out.add(src[key]["name"])
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for env in c.get("env") or []:
            for ref in (env.get("valueFrom") or {}).values():
                if isinstance(ref, dict) and ref.get("optional") and "name" in ref:
                    out.add(ref["name"])
        for src in c.get("envFrom") or []:
            for ref in src.values():
                if isinstance(ref, dict) and ref.get("optional"):
                    out.add(ref.get("name", ""))
    return out
