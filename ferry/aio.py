"""Waiting with a deadline without losing a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the awaited result when the task is cancelled in the same
loop iteration as that result arrives, and the cancellation is gone (cpython gh-86296, fixed in 3.12
by building ``wait_for`` on ``asyncio.timeout``). A loop waiting on an Event that is set often, such as
the scheduler's wake-up on every pod change, then never stops: a clean shutdown ran out of its grace
and the leader Lease was not released. ``asyncio.timeout`` keeps the cancellation.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passes; whether it was set."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
