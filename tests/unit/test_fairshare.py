"""The shared write limit hands freed slots out by key in turn, and never loses a slot to cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from ferry.fairshare import FairLimiter
from tests.helpers import eventually


async def _order_served(limiter: FairLimiter, keys: list[str]) -> list[str]:
    """One holder per key, all started at once (in this order); each keeps its slot until the holders
    served before it are done. Returns the keys in the order they got a slot."""
    served: list[int] = []
    done = [asyncio.Event() for _ in keys]

    async def hold(i: int, key: str) -> None:
        async with limiter.slot(key):
            served.append(i)
            await done[i].wait()

    async with asyncio.TaskGroup() as tg:
        for i, key in enumerate(keys):
            tg.create_task(hold(i, key))
        for step in range(len(keys)):
            await _until(lambda: len(served) > step)  # noqa: B023 -- awaited within the iteration
            done[served[step]].set()
    return [keys[i] for i in served]


async def _until(cond: Callable[[], bool]) -> None:
    await eventually(cond, timeout=5, interval=0, what="the limiter's turn")


async def test_one_tenants_write_goes_next_instead_of_behind_another_tenants_burst() -> None:
    served = await _order_served(FairLimiter(2), ["loud"] * 10 + ["quiet"])
    # a FIFO semaphore serves "quiet" last (11th); here it is next after the first slot frees
    assert served.index("quiet") <= 3, served
    assert served.count("loud") == 10


async def test_turns_alternate_between_keys_that_all_wait() -> None:
    served = await _order_served(FairLimiter(1), ["a"] * 4 + ["b"] * 4)
    # the first "a" found a slot free; then the keys take turns, in the order they first waited
    assert served == ["a", "a", "b", "a", "b", "a", "b", "b"], served


async def test_a_cancelled_waiter_gives_up_its_place_and_loses_no_slot() -> None:
    limiter = FairLimiter(1)
    release = asyncio.Event()

    async def hold() -> None:
        async with limiter.slot("a"):
            await release.wait()

    holder = asyncio.create_task(hold())
    await _until(lambda: limiter._free == 0)
    waiter = asyncio.create_task(hold())
    await _until(lambda: limiter.waiting == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.waiting == 0
    release.set()
    await holder
    async with asyncio.timeout(1), limiter.slot("b"):  # the one slot is free again
        pass


async def test_a_waiter_cancelled_as_it_is_handed_the_slot_passes_it_on() -> None:
    limiter = FairLimiter(1)
    got: list[str] = []

    async def take(key: str) -> None:
        async with limiter.slot(key):
            got.append(key)

    mine = limiter.slot("a")
    await mine.__aenter__()
    second, third = asyncio.create_task(take("b")), asyncio.create_task(take("c"))
    await _until(lambda: limiter.waiting == 2)
    await mine.__aexit__(None, None, None)  # hands the slot to "b" without yielding to the loop ...
    second.cancel()  # ... which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await second
    await asyncio.wait_for(third, 1)
    assert got == ["c"]
    assert limiter._free == 1


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="never"):
        FairLimiter(0)
