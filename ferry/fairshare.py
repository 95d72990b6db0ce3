"""A concurrency limit shared fairly: at most ``limit`` holders at once, and when a slot frees it goes to
the next waiting *key* in turn (round-robin over keys, first come first served within one key).

``asyncio.Semaphore`` wakes its waiters in arrival order, so a tenant that queued 400 writes at once holds
every slot until they are all done and another tenant's one write waits behind all 400. With a key per
tenant, that one write is next as soon as any slot frees (the fair queuing of the API server's own
priority and fairness, applied to the client's side of it).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class FairLimiter:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a limit of {limit} would never let anything through")
        self._free = limit
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        """Hold one of the slots for the block; waits for its key's turn when none is free."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(key, deque()).append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # handed the slot as it was cancelled: pass it on
                    self._hand_on()
                else:
                    self._forget(key, turn)
                raise
        try:
            yield
        finally:
            self._hand_on()

    def _hand_on(self) -> None:
        """A slot freed: to the head of the key whose turn it is (that key then goes to the back)."""
        while self._waiting:
            key, queue = next(iter(self._waiting.items()))
            turn = queue.popleft()
            if queue:
                self._waiting.move_to_end(key)
            else:
                del self._waiting[key]
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def _forget(self, key: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(key)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[key]
