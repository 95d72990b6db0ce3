"""A stop is never lost, and the clean-up (the leader Lease release) always gets its share of the grace."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from ferry.aio import wait_event


async def _cancel_as_the_event_fires(waiter: asyncio.Task[None], event: asyncio.Event) -> bool:
    """Set the event and cancel the waiting task in one loop iteration; whether the task stopped."""
    await asyncio.sleep(0)  # the task is waiting
    event.set()
    await asyncio.sleep(0)  # the event's waiter is woken, the task not yet resumed
    waiter.cancel()
    done, _ = await asyncio.wait({waiter}, timeout=1.0)
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    return bool(done)


async def test_a_cancel_arriving_with_the_event_stops_a_loop_that_waits_on_it() -> None:
    # the scheduler's loop: wake on every pod change, or after a period; the pod changes never stop
    event = asyncio.Event()

    async def loop() -> None:
        while True:
            await wait_event(event, 5.0)
            event.clear()

    assert await _cancel_as_the_event_fires(asyncio.create_task(loop()), event)


async def test_wait_event_tells_set_from_timed_out() -> None:
    event = asyncio.Event()
    assert not await wait_event(event, 0.01)
    event.set()
    assert await wait_event(event, 0.01)


_STUBBORN = """
import asyncio, sys, time
from ferry.shutdown import run_until_signalled

async def work():
    print("ready", flush=True)
    unwound_by = None
    while unwound_by is None or time.monotonic() < unwound_by:
        try:
            await asyncio.sleep(0.05 if unwound_by else 3600)
        except asyncio.CancelledError:  # takes 2.5 s to unwind, longer than the whole grace
            unwound_by = unwound_by or time.monotonic() + 2.5

async def cleanup():
    await asyncio.sleep(0.3)  # a Lease release over a loaded apiserver
    print("cleaned", flush=True)

asyncio.run(run_until_signalled(work(), cleanup, grace_s=2.0, bound_s=4.0, cleanup_s=0.8))
print("exited", flush=True)
"""


def test_cleanup_runs_in_its_reserved_share_even_when_the_work_does_not_stop(tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent(_STUBBORN))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=root)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    took = time.monotonic() - t0
    assert "cleaned" in out.split(), out  # before the reserve, a work that ate the grace left it 0.1 s
    assert proc.returncode == 0 and took < 4.0, (proc.returncode, took)  # the work ended, not the watchdog
