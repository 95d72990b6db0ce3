"""The kubelet API of the virtual node (TLS): ``/containerLogs`` streamed from the compute cluster;
``/exec``, ``/attach`` and ``/portForward`` relayed to the compute pod (:mod:`vnode.streams`);
``/metrics/resource``, its pods' usage from the compute cluster's metrics API (:mod:`vnode.usage`), what
a tenant's metrics-server scrapes for ``kubectl top``.

Callers are authenticated like a kubelet does it (a client certificate from the tenant cluster's CA,
else a bearer token checked by TokenReview) and authorised by SubjectAccessReview on
``nodes/proxy`` (``nodes/log`` style paths map to it on real kubelets too; the verb follows the HTTP
method: ``create`` for POST, as a kubelet does), ``/metrics/*`` on ``nodes/metrics``. Log bytes are relayed
chunk by chunk; ``await write`` is the backpressure, so a slow reader never buffers a whole log.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from ferry.kube.rest import Rest, message_of, path, status_of
from vnode import metrics, naming, streams, usage
from vnode.status import epoch

Obj = dict[str, Any]
LOG_PARAMS = ("follow", "tailLines", "sinceSeconds", "sinceTime", "timestamps", "previous", "limitBytes")
log = structlog.get_logger("ferry.vnode.kubelet")


def ssl_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(cafile=str(client_ca))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def _subject(cert: dict[str, Any]) -> tuple[str, list[str]]:
    user, groups = "", []
    for rdn in cert.get("subject", ()):
        for k, v in rdn:
            if k == "commonName":
                user = v
            elif k == "organizationName":
                groups.append(v)
    return user, groups


class KubeletAPI:
    def __init__(self, node: str, tenant_name: str, compute_ns: str, tenant: Rest, compute: Rest,
                 tenant_pod: Callable[[str], Obj | None], compute_pod: Callable[[str], Obj | None],
                 copies_selector: str) -> None:
        self.node = node
        self.tenant_name = tenant_name
        self.compute_ns = compute_ns
        self.tenant = tenant
        self.compute = compute
        self.tenant_pod = tenant_pod
        self.compute_pod = compute_pod
        self.copies_selector = copies_selector
        self.usage = usage.Usage()
        self._usage_failing = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        app.router.add_get("/metrics/resource", self._resource_metrics)
        for kind in ("exec", "attach"):
            for tail in ("{container}", "{uid}/{container}"):
                for method in ("GET", "POST"):
                    app.router.add_route(method, f"/{kind}/{{namespace}}/{{pod}}/{tail}", self._stream)
        for tail in ("", "/{uid}"):
            for method in ("GET", "POST"):
                app.router.add_route(method, f"/portForward/{{namespace}}/{{pod}}{tail}", self._stream)
        return app

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _who(self, request: web.Request) -> tuple[str, list[str]] | None:
        transport = request.transport
        sslobj = transport.get_extra_info("ssl_object") if transport is not None else None
        cert = sslobj.getpeercert() if sslobj is not None else None
        if cert:
            return _subject(cert)
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            return None
        review = await self.tenant.create(path("authentication.k8s.io", "v1", "tokenreviews"), {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": auth[7:]}})
        st = review.get("status", {})
        if not st.get("authenticated"):
            return None
        return st["user"].get("username", ""), list(st["user"].get("groups") or [])

    async def _allowed(self, user: str, groups: list[str], verb: str, subresource: str) -> bool:
        review = await self.tenant.create(path("authorization.k8s.io", "v1", "subjectaccessreviews"), {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": {
                "verb": verb, "resource": "nodes", "subresource": subresource, "name": self.node}}})
        return bool(review.get("status", {}).get("allowed"))

    async def _denied(self, request: web.Request, verb: str, subresource: str) -> web.Response | None:
        """401 / 403 for a caller who may not ``verb`` this node's ``subresource``, else None."""
        who = await self._who(request)
        if who is None:
            return web.Response(status=401, text="Unauthorized")
        if not await self._allowed(*who, verb, subresource):
            return web.Response(status=403, text=f"Forbidden (user={who[0]}, verb={verb}, resource=nodes, "
                                                 f"subresource={subresource})")
        return None

    async def _refusal(self, request: web.Request) -> web.Response | None:
        """401 / 403 / 404 for a caller who may not reach this pod through this node, else None."""
        verb = "create" if request.method == "POST" else "get"
        if (denied := await self._denied(request, verb, "proxy")) is not None:
            return denied
        ns, name = request.match_info["namespace"], request.match_info["pod"]
        pod = self.tenant_pod(f"{ns}/{name}")
        if pod is None or pod.get("spec", {}).get("nodeName") != self.node:
            return web.Response(status=404, text=f"pod {ns}/{name} is not on node {self.node}")
        uid = request.match_info.get("uid")
        if uid and uid != pod["metadata"].get("uid"):
            return web.Response(status=404, text=f"pod {ns}/{name} with UID {uid} is not on node {self.node}")
        return None

    async def _resource_metrics(self, request: web.Request) -> web.Response:
        """The usage of this node's pods under their tenant names; 502 with the compute cluster's answer when
        its metrics API cannot be read (no metrics-server there, or no right to read it)."""
        if (denied := await self._denied(request, "get", "metrics")) is not None:
            return denied
        try:
            listed = await self.compute.get(path("metrics.k8s.io", "v1beta1", "pods", self.compute_ns),
                                            labelSelector=self.copies_selector)
        except Exception as exc:  # any failure of the compute side is the scraper's 502
            status = status_of(exc)
            said = ("not served there (is metrics-server installed in the compute cluster?)" if status == 404
                    else message_of(exc)[:300])
            if not self._usage_failing:  # once per outage: scrapers ask every few seconds
                log.warning("resource metrics: the compute cluster's metrics API does not answer", status=status,
                            error=said)
            self._usage_failing = True
            return web.Response(status=502, text=f"compute cluster's metrics.k8s.io: {said}")
        if self._usage_failing:
            log.info("resource metrics: the compute cluster's metrics API answers again")
            self._usage_failing = False
        samples: list[usage.Sample] = []
        for item in listed.get("items") or []:
            copy = self.compute_pod(f"{self.compute_ns}/{item['metadata']['name']}")
            if copy is None:
                continue
            meta = copy["metadata"]
            ns = (meta.get("labels") or {}).get(naming.UPSTREAM_NS_LABEL, "")
            name = (meta.get("annotations") or {}).get(naming.UPSTREAM_NAME_ANNOTATION, "")
            pod = self.tenant_pod(f"{ns}/{name}")
            if pod is None or pod.get("spec", {}).get("nodeName") != self.node \
                    or (meta.get("labels") or {}).get(naming.UPSTREAM_UID_LABEL) != pod["metadata"].get("uid"):
                continue  # not this pod's copy: one of an earlier pod of the name, on its way out
            started = {cs["name"]: epoch(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
                       for cs in (copy.get("status") or {}).get("containerStatuses") or []}
            samples += usage.samples_of(item, ns, name, [c["name"] for c in pod["spec"].get("containers") or []],
                                        started)
        self.usage.observe(samples)
        return web.Response(text=self.usage.render(), content_type="text/plain")

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if (refused := await self._refusal(request)) is not None:
            return refused
        if "upgrade" not in request.headers.get("Connection", "").lower():
            return web.Response(status=400, text="an upgrade request (SPDY or WebSocket) is required")
        kind = request.path.split("/", 2)[1]
        ns, name = request.match_info["namespace"], request.match_info["pod"]
        cname = naming.compute_name(self.tenant_name, ns, name)
        url = path("", "v1", "pods", self.compute_ns, cname, streams.SUBRESOURCE[kind])
        query = streams.compute_query(request.query.items(), request.match_info.get("container"))
        try:
            upstream = await self.compute.upgrade(request.method, url, query,
                                                  streams.negotiation_headers(request.headers.items()))
        except (TimeoutError, OSError, ValueError) as exc:
            return web.Response(status=502, text=f"compute cluster: {exc}")
        if upstream.status != 101:
            said = upstream.body[:500].decode(errors="replace")
            return web.Response(status=upstream.status, text=f"compute cluster: {said}")
        protocol = request.headers.get("Upgrade", "")
        log.info("stream", kind=kind, protocol=protocol, pod=f"{ns}/{name}", compute_pod=cname)
        metrics.STREAMS.labels(kind, protocol.lower()).inc()
        await streams.relay(request, upstream)
        # The connection is gone by now; aiohttp finds it closed and writes nothing.
        return web.Response(status=101)

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        if (refused := await self._refusal(request)) is not None:
            return refused
        ns, name, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        query: Obj = {"container": container}
        for k in LOG_PARAMS:
            if k in request.query:
                query[k] = request.query[k]
        follow = query.get("follow") in ("true", "1")
        cname = naming.compute_name(self.tenant_name, ns, name)
        try:
            upstream = await self.compute.raw("GET", path("", "v1", "pods", self.compute_ns, cname, "log"),
                                              query=query, timeout=None if follow else 60.0)
        except Exception as exc:
            code = status_of(exc) or 502
            body = getattr(exc, "body", None) or str(exc)
            return web.Response(status=code, text=f"compute cluster: {str(body)[:500]}")
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        async with upstream:
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
        await resp.write_eof()
        return resp
