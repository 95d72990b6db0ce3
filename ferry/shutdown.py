"""Prompt, clean stops for the daemons: SIGTERM/SIGINT stop taking work, cancel what is in flight,
run a bounded clean-up (release the leader Lease, close clients) and exit 0 -- within a fixed bound.

Each API write is one request, so cancelling it leaves it either done or not done, never half done;
what a restarted process finds it converges from. The bound holds even when the event loop is busy
in a long synchronous step (a scheduling cycle): the signal is taken by a Python-level handler, not
only by the loop, and a watchdog thread ends the process at the bound if the loop never returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

log = structlog.get_logger("ferry.shutdown")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def run_until_signalled(work: Coroutine[Any, Any, None], cleanup: Callable[[], Awaitable[None]],
                              grace_s: float = 3.0, bound_s: float = 4.5, cleanup_s: float = 1.0) -> None:
    """Run ``work`` until it ends or a stop signal arrives; then cancel it, give ``cleanup`` what is
    left of ``grace_s`` but never less than ``cleanup_s``, and return. ``cleanup`` runs however the work
    ended (an error of the work is raised after it). ``bound_s`` after the signal the process exits 0
    regardless.

    The clean-up's share is reserved because it is what the others wait on: a work slow to unwind must
    not leave the leader Lease unreleased, or a standby waits for it to run out."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            return
        watchdog = threading.Timer(bound_s, _exit_now, (signum,))
        watchdog.daemon = True
        watchdog.start()
        loop.call_soon_threadsafe(stop.set)

    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():  # the work ended by itself: clean up, then its error, if any, is the process's
            await cleanup()
            task.result()
            return
        log.info("stopping: cancelling work in flight")
        deadline = loop.time() + grace_s
        task.cancel()
        await asyncio.wait({task}, timeout=max(0.1, grace_s - cleanup_s))
        if not task.done():
            log.warning("work still unwinding at its share of the grace", after_s=round(grace_s - cleanup_s, 2))
        elif not task.cancelled() and task.exception() is not None:
            log.warning("work failed while stopping", error=str(task.exception())[:200])
        with contextlib.suppress(Exception):
            async with asyncio.timeout(max(cleanup_s, deadline - loop.time())):
                await cleanup()
        log.info("stopped")
    finally:
        stopper.cancel()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_now(signum: int) -> None:
    log.warning("clean-up did not finish in time; exiting", signal=signal.Signals(signum).name)
    os._exit(0)
