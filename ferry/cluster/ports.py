"""Loopback port allocation: ask the kernel for free ports, or take a fixed range and check it."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

LISTEN_RANGE_START = 10000


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux; the common default elsewhere)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


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
        # Outside the ephemeral range: a port the kernel picks (bind to 0) is one it also gives outgoing
        # connections, and between release() and the component's own bind one of the many client
        # connections of a busy machine can take it (a component then fails with "address in use").
        lo, hi = ephemeral_range()
        candidates = list(range(LISTEN_RANGE_START, lo)) + list(range(hi + 1, 65536))
        for port in random.sample(candidates, min(len(candidates), 2000)):
            if port in self._given:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            # Keep it bound until release() so that no two purposes get the same port.
            self._held.append(s)
            self._given.add(port)
            return port
        raise PortInUse(f"no free port outside the ephemeral range {lo}-{hi} for {purpose}")

    def take_block(self, count: int, purpose: str) -> int:
        """The first of ``count`` consecutive free ports (a vnode's kubelet API and its GPU pools')."""
        if self._next is not None or count == 1:
            first = self.take(purpose)
            for _ in range(count - 1):
                self.take(purpose)
            return first
        lo, hi = ephemeral_range()
        for _ in range(200):
            first = self.take(purpose)
            rest: list[socket.socket] = []
            try:
                for port in range(first + 1, first + count):
                    if port in self._given or port > 65535 or lo <= port <= hi:  # kept outside, as take's
                        raise OSError(f"port {port} is taken")
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    rest.append(s)
                    s.bind(("127.0.0.1", port))
            except OSError:
                for s in rest:
                    s.close()
                continue
            self._held += rest
            self._given.update(range(first + 1, first + count))
            return first
        raise PortInUse(f"no {count} consecutive free ports for {purpose}")

    def release(self) -> None:
        for s in self._held:
            with contextlib.suppress(OSError):
                s.close()
        self._held.clear()
