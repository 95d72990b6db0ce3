"""What a pod needs in the compute cluster before it starts: copied ConfigMaps and Secrets, a
service-account token issued by the tenant cluster, the headless Service behind its subdomain; and the
tenant Services that select it, copied so that their names resolve and route to compute pods (with those of
its namespace that select no pods: ExternalName Services, and Services with hand-made endpoints, whose
EndpointSlices are copied with them).

Copies are owned by labels and found through the compute caches; they are refreshed when the
tenant object changes and collected by :meth:`Copies.sweep` once no owned pod references them.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import structlog

from ferry.keys import PREFIX
from ferry.kube.informer import Informer
from ferry.kube.rest import Rest, message_of, path, status_of
from vnode import metrics, naming, status
from vnode.caches import SLICES, Caches
from vnode.translate import (
    SERVICE_NAME_LABEL,
    Bridge,
    compute_endpoint_slice,
    compute_service,
    content_digest,
    copy_of,
    has_own_endpoints,
    is_alias,
    needs_of,
    pod_view,
    selects,
    slice_digest,
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
        self.slices_of: dict[tuple[str, str], dict[str, Obj]] = {}  # hand-made EndpointSlices by (ns, Service)
        # ``default/kubernetes`` as compute pods reach the tenant API (translate.py ``api_service``), if known
        self.api: tuple[Obj, Obj] | None = None

    def on_tenant_service(self, event: str, svc: Obj) -> None:
        """Keep :attr:`services_in` with the tenant Services' cache (a pod asks only of its namespace)."""
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        if event == "DELETED":
            self.services_in.get(ns, {}).pop(name, None)
        else:
            self.services_in.setdefault(ns, {})[name] = svc

    def on_tenant_slice(self, event: str, es: Obj) -> tuple[str, str] | None:
        """Keep :attr:`slices_of` with the tenant's hand-made EndpointSlices' cache; the (namespace, Service)
        the slice belongs to, if it names one."""
        meta = es["metadata"]
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if not service:
            return None
        key = (meta["namespace"], service)
        if event == "DELETED":
            self.slices_of.get(key, {}).pop(meta["name"], None)
            if not self.slices_of.get(key, True):
                del self.slices_of[key]
        else:
            self.slices_of.setdefault(key, {})[meta["name"]] = es
        return key

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
        if self.api is not None:
            await self._copy_service_object(self.api[0])
            await self._copy_slices(self.api[0], [self.api[1]])
        refresh = None
        if needs.token is not None:
            refresh = await self._token(pod, needs.token)
        elif needs.identity:
            await self._identity(pod)
        if needs.identity:
            await self._follow_view(pod)
        return refresh

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
        """Create or update the compute copy of a tenant Service (vnode/translate.py ``compute_service``), and
        of its EndpointSlices where it has endpoints of its own. A copy the compute API refuses is logged and
        left: the pod runs without it, as beside a broken Service."""
        await self._copy_service_object(svc)
        if has_own_endpoints(svc):
            await self._copy_slices(svc, list(self.slices_of.get((svc["metadata"]["namespace"],
                                                                  svc["metadata"]["name"]), {}).values()))

    async def _copy_slices(self, svc: Obj, slices: list[Obj]) -> None:
        """The copies of ``slices``, the tenant EndpointSlices of a Service without a selector, as they are
        upstream; a copy whose tenant slice is gone is deleted."""
        meta = svc["metadata"]
        ns, url, cache = meta["namespace"], path(*SLICES, self.b.namespace), self.caches.compute_slices
        kept: set[str] = set()
        for es in slices:
            want = compute_endpoint_slice(es, self.b)
            digest = slice_digest(want)
            want["metadata"]["annotations"][DIGEST_ANNOTATION] = digest
            name = want["metadata"]["name"]
            kept.add(name)
            try:
                have = cache.store.get(f"{self.b.namespace}/{name}") or await self._create(url, want, cache)
                if have is not None and (have["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION) != digest:
                    want["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
                    cache.remember(await self.compute.put(f"{url}/{name}", want), replaces=have)
            except Exception as exc:
                if status_of(exc) != 422:
                    raise
                log.warning("the compute cluster refused an EndpointSlice's copy", slice=es["metadata"]["name"],
                            namespace=ns, error=message_of(exc)[:300])
        service = naming.compute_name(self.b.tenant, ns, meta["name"])
        for have in list(cache.store.values()):
            hmeta = have["metadata"]
            if (hmeta.get("labels") or {}).get(SERVICE_NAME_LABEL) == service and hmeta["name"] not in kept:
                await self._collect("endpointslices", have)

    async def _copy_service_object(self, svc: Obj) -> None:
        want = compute_service(svc, self.b)
        digest = spec_digest(want)
        want["metadata"]["annotations"][DIGEST_ANNOTATION] = digest
        name = want["metadata"]["name"]
        key, url = f"{self.b.namespace}/{name}", path("", "v1", "services", self.b.namespace)
        cache = self.caches.compute_services
        try:
            have = cache.store.get(key) or await self._create(url, want, cache)
            if have is None or (have["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION) == digest:
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
        if have is not None and _of_pod(have, pod):  # else an earlier pod's of this name: its token is void
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
        body = self._identity_secret(pod, {"token": resp["status"]["token"]})
        body["metadata"]["annotations"] |= {TOKEN_ISSUED: str(now), TOKEN_EXPIRES: str(expires)}
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

    def _identity_secret(self, pod: Obj, extra: dict[str, str]) -> Obj:
        """The pod's compute Secret (``token_secret_name``): its tenant namespace, name, UID, labels and
        annotations, which its downward-API files read (translate.py ``IDENTITY_KEYS``, ``pod_view``), and
        ``extra`` (its token)."""
        meta = pod["metadata"]
        return {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": token_secret_name(self.b, pod), "namespace": self.b.namespace,
                         "labels": {**naming.owner_labels(self.b.tenant, self.b.node, meta["namespace"], meta["uid"]),
                                    naming.KIND_LABEL: "ServiceAccountToken"},
                         "annotations": {naming.UPSTREAM_NAME_ANNOTATION: meta["name"]}},
            "stringData": {**extra, **pod_view(pod)},
        }

    async def _identity(self, pod: Obj) -> None:
        """The pod's Secret without a token, for a pod whose downward-API files name it but that mounts no
        ServiceAccount token: made once per pod (an earlier pod's of the same name is replaced)."""
        body = self._identity_secret(pod, {})
        url = path("", "v1", "secrets", self.b.namespace)
        name = body["metadata"]["name"]
        cache = self.caches.compute_secrets
        have = cache.store.get(f"{self.b.namespace}/{name}") or await self._create(url, body, cache)
        if have is None or _of_pod(have, pod):
            return
        body["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
        self.caches.compute_secrets.remember(await self.compute.put(f"{url}/{name}", body), replaces=have)

    async def _follow_view(self, pod: Obj) -> None:
        """A label or annotation the tenant changes on a live pod reaches its downward-API files, as the
        kubelet rewrites them: the keys of the pod's Secret that differ are written."""
        name = token_secret_name(self.b, pod)
        have = self.caches.compute_secrets.store.get(f"{self.b.namespace}/{name}")
        if have is None or not _of_pod(have, pod):
            return  # being made (ensure, above), or an earlier pod's that is replaced first
        data = have.get("data") or {}
        stale = {k: v for k, v in pod_view(pod).items()
                 if base64.b64decode(data.get(k, "")).decode(errors="replace") != v}
        if stale:  # an update of the version read (a conflict is retried by the pod's reconcile)
            self.caches.compute_secrets.remember(await self.compute.put(
                path("", "v1", "secrets", self.b.namespace, name), {**have, "stringData": stale}), replaces=have)

    async def _create(self, url: str, want: Obj, cache: Informer) -> Obj | None:
        """Create ``want`` at ``url``, remembered in ``cache``: None; or, where it exists already (made
        before a restart, or by a reconcile the cache has not seen yet), what is there."""
        try:
            cache.remember(await self.compute.create(url, want))
            return None
        except Exception as exc:
            if status_of(exc) != 409:
                raise
            return await self.compute.get(f"{url}/{want['metadata']['name']}")

    async def sweep(self, min_age_s: float) -> int:
        """Delete owned copies that no owned compute pod references any more (only after caches synced)
        and that are older than ``min_age_s`` (copies are made before their pod)."""
        used: dict[str, set[str]] = {"configmaps": set(), "secrets": set(), "services": set(),
                                     "endpointslices": set()}
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
            namespace_wide = (is_alias(tenant_svc) and is_alias(svc)) or \
                (has_own_endpoints(tenant_svc) and has_own_endpoints(svc))  # and of the same form
            if (namespace_wide and ns in labels_in) or \
                    any(selects(selector, labels) for labels in labels_in.get(ns, ())):
                used["services"].add(meta["name"])
        api = naming.compute_name(self.b.tenant, "default", "kubernetes")
        if self.api is not None and labels_in:  # every pod may ask for its cluster's API by name
            used["services"].add(api)
            used["endpointslices"].add(api)
        for es in list(self.caches.compute_slices.store.values()):  # copies of a used Service's own slices
            meta = es["metadata"]
            upstream = f"{(meta.get('labels') or {}).get(naming.UPSTREAM_NS_LABEL, '')}/" \
                       f"{(meta.get('annotations') or {}).get(naming.UPSTREAM_NAME_ANNOTATION)}"
            if (meta.get("labels") or {}).get(SERVICE_NAME_LABEL) in used["services"] and \
                    upstream in self.caches.tenant_slices.store:
                used["endpointslices"].add(meta["name"])
        deleted = 0
        now = time.time()
        for plural, cache in (("configmaps", self.caches.compute_configmaps.store),
                              ("secrets", self.caches.compute_secrets.store),
                              ("services", self.caches.compute_services.store),
                              ("endpointslices", self.caches.compute_slices.store)):
            for obj in list(cache.values()):
                meta = obj["metadata"]
                if meta["name"] in used[plural] or now - status.epoch(meta.get("creationTimestamp")) < min_age_s:
                    continue
                deleted += await self._collect(plural, obj)
        return deleted

    async def _collect(self, plural: str, obj: Obj) -> int:
        """Delete a copy (1), or log why not (0)."""
        name = obj["metadata"]["name"]
        group = SLICES[:2] if plural == "endpointslices" else ("", "v1")
        base = path(*group, plural, self.b.namespace)
        try:
            await self.compute.delete(f"{base}/{name}")
        except Exception as exc:
            if status_of(exc) != 404:
                log.warning("collecting a copy failed", kind=plural, name=name, error=str(exc)[:200])
                return 0
        cache = {"configmaps": self.caches.compute_configmaps, "secrets": self.caches.compute_secrets,
                 "services": self.caches.compute_services, "endpointslices": self.caches.compute_slices}[plural]
        cache.store.pop(f"{self.b.namespace}/{name}", None)
        metrics.GC_DELETED.labels(plural).inc()
        return 1


def _of_pod(secret: Obj, pod: Obj) -> bool:
    """The pod's Secret was made for this pod, not for an earlier one of the same name."""
    return bool((secret["metadata"].get("labels") or {}).get(naming.UPSTREAM_UID_LABEL) == pod["metadata"]["uid"])


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
