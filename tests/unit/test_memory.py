"""Freed heap memory that glibc would keep goes back to the OS."""

from __future__ import annotations

import pytest

from ferry import memory


@pytest.mark.skipif(memory._TRIM is None, reason="not glibc")
def test_memory_freed_between_survivors_is_given_back() -> None:
    # 2 KB blocks come from malloc, not Python's small-object arenas; one in 20 survives, so no heap
    # shrinks from its top and, untrimmed, the ~40 MB freed stays resident
    blocks = [bytes(2000) for _ in range(20_000)]
    survivors = blocks[::20]
    del blocks
    assert memory.give_back() >= 10 << 20
    assert len(survivors) == 1000
