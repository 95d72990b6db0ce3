"""A de-duplicating, rate-limited work queue (client-go's workqueue, in asyncio).

A key added while it waits is stored once; a key added while a worker holds it is processed again
after that worker is done (never by two workers at once). Failed keys come back after a per-key
exponential delay, so one bad object cannot starve the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("ferry.workqueue")


class WorkQueue:
    def __init__(self, name: str, base_delay: float = 0.05, max_delay: float = 30.0) -> None:
        self.name = name
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._waiting: set[str] = set()  # in the queue, not yet taken
        self._active: set[str] = set()  # held by a worker
        self._dirty: set[str] = set()  # added again while held
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._base = base_delay
        self._max = max_delay

    def __len__(self) -> int:
        return len(self._waiting) + len(self._active)

    def add(self, key: str) -> None:
        if key in self._active:
            self._dirty.add(key)
            return
        if key in self._waiting:
            return
        self._waiting.add(key)
        self._queue.put_nowait(key)

    def add_after(self, key: str, delay: float) -> None:
        """Add ``key`` once ``delay`` seconds have passed; of two pending timers the earlier wins (client-go's
        delaying queue): a failure's short retry must not wait behind a refresh planned minutes ahead."""
        loop = asyncio.get_running_loop()
        pending = self._timers.get(key)
        if pending is not None:
            if pending.when() <= loop.time() + delay:
                return
            pending.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_later(delay, fire)

    def retry(self, key: str) -> float:
        """Schedule a failed key again with exponential back-off; returns the delay."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay = float(min(self._base * (2 ** n), self._max))
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    async def _get(self) -> str:
        key = await self._queue.get()
        self._waiting.discard(key)
        self._active.add(key)
        return key

    def _done(self, key: str) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    async def run(self, handler: Callable[[str], Awaitable[None]], workers: int) -> None:
        """Process keys with ``workers`` concurrent handlers until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for _ in range(workers):
                tg.create_task(self._worker(handler))

    async def _worker(self, handler: Callable[[str], Awaitable[None]]) -> None:
        while True:
            key = await self._get()
            try:
                await handler(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the key is retried; the worker keeps going
                delay = self.retry(key)
                log.warning("reconcile failed; retrying", queue=self.name, key=key, in_s=round(delay, 2),
                            error=str(exc)[:300])
            else:
                self.forget(key)
            finally:
                self._done(key)
