"""Plain-JSON access to any API path through a ``kubernetes_asyncio`` ApiClient.

The bridge copies whole objects between clusters; typed models would cost a round of
(de)serialisation per object and lose unknown fields, so it works on dicts end to end while keeping
the client's auth, TLS and connection pool.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import orjson
from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"  # lists merged by key (a pod's conditions by type)
JSON = "application/json"


async def api_client(kubeconfig: Path | None, pool: int = 100, context: str | None = None) -> ApiClient:
    """A client with room for ``pool`` concurrent requests (the library default is a handful); without a
    kubeconfig, the pod's own ServiceAccount (in-cluster, token re-read as the kubelet rotates it)."""
    conf = Configuration()
    if kubeconfig is None:
        kconfig.load_incluster_config(client_configuration=conf)
    else:
        await kconfig.load_kube_config(config_file=str(kubeconfig), client_configuration=conf, context=context)
    conf.connection_pool_maxsize = pool
    return without_env_lookups(ApiClient(conf))


PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "NETRC")


def without_env_lookups(api: ApiClient) -> ApiClient:
    """Stop the client's session from reading the proxy environment and ~/.netrc on every request.

    ``kubernetes_asyncio`` opens its aiohttp session with ``trust_env=True``: each request then parses
    ~/.netrc and the proxy variables in two thread-pool hops, which was a seventh of the vnode's CPU
    while it forwarded a burst. Kept as is when any proxy variable is set (the user asked for it)."""
    if any(os.environ.get(v) or os.environ.get(v.lower()) for v in PROXY_VARS):
        return api
    old: aiohttp.ClientSession = api.rest_client.pool_manager
    connector = old.connector
    old.detach()  # hands the connector (pool, TLS context) over without closing it
    api.rest_client.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False,
                                                         read_bufsize=2**21)
    return api


def status_of(exc: BaseException) -> int:
    """HTTP status of an API error (0 for a transport error)."""
    return exc.status if isinstance(exc, ApiException) and exc.status else 0


def message_of(exc: BaseException) -> str:
    """The API server's own words for an error (its Status message), else the exception's text."""
    body = getattr(exc, "body", None)
    try:
        message = orjson.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    return str(message or exc)[:1000]


def path(group: str, version: str, plural: str, namespace: str | None = None, name: str | None = None,
         sub: str | None = None) -> str:
    """``/api/v1/...`` or ``/apis/<group>/<version>/...`` for a resource, collection or subresource."""
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    if name:
        base += f"/{quote(name)}"
    if sub:
        base += f"/{sub}"
    return base


@dataclass
class Upgrade:
    """The answer to an HTTP/1.1 upgrade request: on 101 the connection is the caller's to use."""

    status: int
    headers: list[tuple[str, str]]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    body: bytes = field(default=b"")


class Rest:
    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self._tls: ssl.SSLContext | None = None

    def _tls_context(self) -> ssl.SSLContext:
        """The client's own TLS settings (CA, client certificate, verification) as an SSLContext."""
        if self._tls is None:
            conf = self.api.configuration
            ctx = ssl.create_default_context(cafile=conf.ssl_ca_cert)
            if conf.cert_file:
                ctx.load_cert_chain(conf.cert_file, keyfile=conf.key_file)
            if not conf.verify_ssl:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._tls = ctx
        return self._tls

    async def upgrade(self, method: str, url: str, query: list[tuple[str, str]], headers: list[tuple[str, str]],
                      timeout: float = 30.0) -> Upgrade:
        """Send an upgrade request (SPDY or WebSocket streaming: exec, attach, port-forward) with the
        client's credentials on a connection of its own, and read the response head.

        aiohttp speaks WebSocket only; the streaming protocols are relayed byte for byte, so all this
        needs is the request line, the head of the answer and the raw connection after it."""
        conf = self.api.configuration
        base = urlsplit(conf.host)
        auth: dict[str, str] = {}
        await self.api.update_params_for_auth(auth, [], ["BearerToken"])
        host = base.hostname or "localhost"
        secure = base.scheme == "https"
        async with asyncio.timeout(timeout):  # each step bounded; not wait_for, which can lose a cancel (ferry.aio)
            reader, writer = await asyncio.open_connection(
                host, base.port or (443 if secure else 80), ssl=self._tls_context() if secure else None,
                server_hostname=(conf.tls_server_name or host) if secure else None)
        try:
            target = base.path.rstrip("/") + url + (f"?{urlencode(query)}" if query else "")
            lines = [f"{method} {target} HTTP/1.1", f"Host: {base.netloc}", *(f"{k}: {v}" for k, v in auth.items()),
                     *(f"{k}: {v}" for k, v in headers), "Content-Length: 0"]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            async with asyncio.timeout(timeout):
                head = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            status = int(status_line.split(" ", 2)[1])
            got = [(k.strip(), v.strip()) for k, _, v in (h.partition(":") for h in header_lines if h)]
            out = Upgrade(status, got, reader, writer)
            if status != 101:
                length = next((int(v) for k, v in got if k.lower() == "content-length"), None)
                async with asyncio.timeout(timeout):
                    out.body = await (reader.readexactly(length) if length is not None else reader.read(65536))
                writer.close()
            return out
        except BaseException:
            writer.close()
            raise

    async def raw(self, method: str, url: str, body: Any = None, query: dict[str, Any] | None = None,
                  content_type: str = JSON, timeout: float | None = 30.0) -> Any:
        """The raw aiohttp response (caller reads/streams it); non-2xx raises ApiException.

        Goes straight to the client's aiohttp session with the client's own auth (token refresh
        included), TLS, pool and proxy: its generic ``call_api`` walks every request body in Python to
        "sanitize" it, the biggest per-request cost when the bridge copies whole pods."""
        api = self.api
        params = [(k, _q(v)) for k, v in (query or {}).items() if v is not None]
        headers = {**api.default_headers, "Accept": JSON, "Content-Type": content_type}
        await api.update_params_for_auth(headers, params, ["BearerToken"])
        target = api.configuration.host + url + (f"?{urlencode(params)}" if params else "")
        rc = api.rest_client
        extra: dict[str, Any] = {}
        if rc.proxy:
            extra.update(proxy=rc.proxy, proxy_headers=rc.proxy_headers)
        if rc.server_hostname:
            extra["server_hostname"] = rc.server_hostname
        resp = await rc.pool_manager.request(
            method, target, headers=headers, data=None if body is None else orjson.dumps(body),
            timeout=aiohttp.ClientTimeout(total=timeout), **extra)
        if not 200 <= resp.status <= 299:
            data = await resp.read()
            resp.release()
            exc = ApiException(status=resp.status, reason=resp.reason or "")
            exc.body = data.decode(errors="replace")
            raise exc
        return resp

    async def call(self, method: str, url: str, body: Any = None, query: dict[str, Any] | None = None,
                   content_type: str = JSON) -> Obj:
        resp = await self.raw(method, url, body, query, content_type)
        async with resp:
            data = await resp.read()
        out: Obj = orjson.loads(data) if data else {}
        return out

    async def get(self, url: str, **query: Any) -> Obj:
        return await self.call("GET", url, query=query)

    async def create(self, url: str, body: Obj) -> Obj:
        return await self.call("POST", url, body)

    async def patch(self, url: str, body: Any, content_type: str = MERGE) -> Obj:
        return await self.call("PATCH", url, body, content_type=content_type)

    async def put(self, url: str, body: Obj) -> Obj:
        return await self.call("PUT", url, body)

    async def delete(self, url: str, body: Obj | None = None) -> Obj:
        return await self.call("DELETE", url, body)

    async def get_or_none(self, url: str) -> Obj | None:
        try:
            return await self.get(url)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def lister(self, url: str, **fixed: Any) -> Any:
        """A list/watch function for :class:`ferry.kube.informer.Informer`."""

        async def call(watch: bool = False, resource_version: str | None = None,
                       allow_watch_bookmarks: bool | None = None, timeout_seconds: int | None = None,
                       _preload_content: bool = False, limit: int | None = None,
                       _continue: str | None = None) -> Any:
            query: dict[str, Any] = dict(fixed)
            if limit:
                query["limit"] = limit
            if _continue:
                query["continue"] = _continue
            if watch:
                query.update(watch=True, resourceVersion=resource_version or None,
                             allowWatchBookmarks=allow_watch_bookmarks, timeoutSeconds=timeout_seconds)
            return await self.raw("GET", url, query=query,
                                  timeout=(timeout_seconds or 0) + 30 if watch else 120)

        return call


def _q(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
