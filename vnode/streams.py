"""``kubectl exec`` / ``attach`` / ``port-forward`` (and ``cp``, which is exec of tar): the kubelet's
streaming endpoints, relayed byte for byte to the compute pod through the compute apiserver.

A tenant apiserver reaches a kubelet with an HTTP/1.1 upgrade (SPDY/3.1 today; WebSocket
``v5.channel.k8s.io`` where it may send that to a kubelet). The compute apiserver accepts the same
upgrades on ``pods/exec``, ``pods/attach`` and ``pods/portforward``, so the virtual node does what an
apiserver's own upgrade-aware proxy does: it rewrites the request (tenant pod → compute pod, kubelet
query names → API query names), sends it upstream with its own credentials and, on ``101``, splices the
two connections. Neither protocol is parsed here: stdin, tty, resize, exit codes and port-forward
streams pass through whichever protocol the two ends agreed on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiohttp import web

from ferry.kube.rest import Upgrade

# kubelet query names (what an apiserver sends a kubelet) → PodExecOptions / PodAttachOptions /
# PodPortForwardOptions names (what an apiserver takes).
KUBELET_TO_API = {"input": "stdin", "output": "stdout", "error": "stderr", "tty": "tty", "command": "command",
                  "port": "ports"}
# Request headers that carry the protocol negotiation; credentials are never forwarded.
NEGOTIATION = ("connection", "upgrade", "x-stream-protocol-version", "sec-websocket-key", "sec-websocket-version",
               "sec-websocket-protocol", "sec-websocket-extensions")
# Response headers the HTTP layer, not the protocol, owns.
NOT_RELAYED = ("content-length", "transfer-encoding", "date", "server")
SUBRESOURCE = {"exec": "exec", "attach": "attach", "portForward": "portforward"}
CHUNK = 65536


def compute_query(query: Iterable[tuple[str, str]], container: str | None) -> list[tuple[str, str]]:
    """The compute apiserver's query for a kubelet streaming request (repeated keys kept in order)."""
    out = [("container", container)] if container else []
    out += [(KUBELET_TO_API[k], v) for k, v in query if k in KUBELET_TO_API]
    return out


def negotiation_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() in NEGOTIATION]


def switching_protocols(headers: Iterable[tuple[str, str]]) -> bytes:
    """The ``101`` head sent down: the upstream's negotiated protocol, verbatim."""
    lines = ["HTTP/1.1 101 Switching Protocols",
             *(f"{k}: {v}" for k, v in headers if k.lower() not in NOT_RELAYED)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Takeover(asyncio.Protocol):
    """Owns a server connection after the upgrade: aiohttp would parse SPDY bytes as HTTP.

    Reading pauses while the upstream is slower than the caller; the loss of the connection is passed
    on to aiohttp's own protocol so its request handler ends as usual."""

    HIGH, LOW = 32, 8

    def __init__(self, transport: asyncio.Transport, owner: asyncio.BaseProtocol) -> None:
        self.transport = transport
        self.owner = owner
        self.chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self.writable = asyncio.Event()
        self.writable.set()
        self.paused = False

    def data_received(self, data: bytes) -> None:
        self.chunks.put_nowait(data)
        if not self.paused and self.chunks.qsize() >= self.HIGH:
            self.paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        self.chunks.put_nowait(b"")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.chunks.put_nowait(b"")
        self.writable.set()
        self.owner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    async def read(self) -> bytes:
        data = await self.chunks.get()
        if self.paused and self.chunks.qsize() <= self.LOW:
            self.paused = False
            self.transport.resume_reading()
        return data

    async def write(self, data: bytes) -> None:
        if self.transport.is_closing():
            raise ConnectionResetError("caller went away")
        self.transport.write(data)
        await self.writable.wait()


async def relay(request: web.Request, upstream: Upgrade) -> None:
    """Answer ``101`` with the upstream's negotiated headers and splice both connections until
    either side closes; then close both (buffered bytes are flushed first)."""
    transport = request.transport
    if transport is None:
        upstream.writer.close()
        return
    assert isinstance(transport, asyncio.Transport)
    down = _Takeover(transport, request.protocol)
    transport.set_protocol(down)  # before the 101 leaves: the caller may answer at once
    transport.write(switching_protocols(upstream.headers))

    async def downward() -> None:
        while data := await upstream.reader.read(CHUNK):
            await down.write(data)

    async def upward() -> None:
        while data := await down.read():
            upstream.writer.write(data)
            await upstream.writer.drain()

    tasks = [asyncio.create_task(downward()), asyncio.create_task(upward())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        upstream.writer.close()
        transport.close()
