"""Loopback port allocation: ask the kernel for free ports, or take a fixed range and check it."""

from __future__ import annotations

import contextlib
import socket


class PortInUse(RuntimeError):
    pass


def is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PortAllocator:
    """Hands out distinct loopback ports, sequentially from ``base`` or kernel-chosen."""

    def __init__(self, base: int | None = None) -> None:
        self._next = base
        self._given: set[int] = set()
        self._held: list[socket.socket] = []

    def take(self, purpose: str) -> int:
        if self._next is not None:
            port = self._next
            self._next += 1
            if port > 65535:
                raise PortInUse(f"port range exhausted at {purpose}")
            if not is_free(port):
                raise PortInUse(f"port {port} (for {purpose}) is already in use on 127.0.0.1")
            self._given.add(port)
            return port
        while True:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            # Keep it bound until release() so that no two purposes get the same port.
            self._held.append(s)
            if port not in self._given:
                self._given.add(port)
                return port

    def release(self) -> None:
        for s in self._held:
            with contextlib.suppress(OSError):
                s.close()
        self._held.clear()
