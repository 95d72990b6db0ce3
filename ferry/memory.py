"""Give freed memory back to the operating system now and then, so a long-lived process's RSS follows what
it holds rather than the highest it ever held.

A fault (an apiserver outage, a relist, a reconnect storm) makes a burst of short-lived allocations:
request and response bodies, TLS buffers, exceptions and their tracebacks. Once freed, glibc keeps that
memory in its heaps for reuse, so RSS rises in steps at faults and stays there. ``malloc_trim(0)`` hands
whole free pages in every heap back to the kernel; Dask's workers trim the same way for the same reason.
Without glibc (musl, macOS) it does nothing. (No forced ``gc.collect()``: a full collection of the
scheduler's model would stall its loop.)
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from collections.abc import Callable

import structlog

log = structlog.get_logger("ferry.memory")
TRIM_EVERY_S = 60.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_TRIM = _malloc_trim()


def rss_bytes() -> int:
    """Resident set size now (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


def give_back() -> int:
    """Trim the heaps; returns how many bytes of RSS that released."""
    if _TRIM is None:
        return 0
    before = rss_bytes()
    _TRIM(0)
    return max(0, before - rss_bytes())


async def give_back_periodically(released: Callable[[int], None], every_s: float = TRIM_EVERY_S) -> None:
    """Run :func:`give_back` every ``every_s`` seconds for the life of the process; ``released`` is told
    each time how many bytes went back (a metric's ``inc``)."""
    while True:
        await asyncio.sleep(every_s)
        freed = give_back()
        released(freed)
        if freed >= 1 << 20:
            log.debug("memory given back", mib=round(freed / (1 << 20), 1))
