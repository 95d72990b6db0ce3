"""Go's ``math/rand`` (seeded source), bit for bit, for reproducing Go-based simulators exactly.

The published FGD results were produced by a Go simulator whose pod order, cloning and node
tie-break ranks come from ``math/rand``; any other generator gives different per-seed figures.
The algorithm is an additive lagged Fibonacci generator seeded through a Park-Miller LCG, mixed with
a 607-entry table of precomputed values that ships with Go's standard library: we read that table
from the installed Go's sources (Go is already required to build the control planes).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_LEN = 607
_TAP = 273
_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1
_INT32MAX = (1 << 31) - 1


class GoRandUnavailable(RuntimeError):
    pass


@cache
def _cooked() -> tuple[int, ...]:
    go = shutil.which("go")
    if go is None:
        raise GoRandUnavailable("Go's math/rand table needs an installed Go (`go` not on PATH)")
    root = subprocess.run([go, "env", "GOROOT"], capture_output=True, text=True, check=True).stdout.strip()
    source = (Path(root) / "src" / "math" / "rand" / "rng.go").read_text()
    body = source.split("rngCooked [rngLen]int64 = [...]int64{", 1)[1].split("}", 1)[0]
    values = tuple(int(v) for v in re.findall(r"-?\d+", body))
    if len(values) != _LEN:
        raise GoRandUnavailable(f"unexpected rngCooked table in {root} ({len(values)} values)")
    return values


def _seedrand(x: int) -> int:
    hi, lo = divmod(x, 44488)  # x > 0 here, so floor division equals Go's truncation
    x = 48271 * lo - 3399 * hi
    return x + _INT32MAX if x < 0 else x


class GoRand:
    """``rand.New(rand.NewSource(seed))`` with the methods the simulators use."""

    def __init__(self, seed: int) -> None:
        cooked = _cooked()
        seed %= _INT32MAX
        if seed < 0:
            seed += _INT32MAX
        if seed == 0:
            seed = 89482311
        x = seed
        vec = [0] * _LEN
        for i in range(-20, _LEN):
            x = _seedrand(x)
            if i >= 0:
                u = (x << 40) & _MASK64
                x = _seedrand(x)
                u ^= (x << 20) & _MASK64
                x = _seedrand(x)
                u ^= x
                u ^= cooked[i] & _MASK64
                vec[i] = u
        self._vec = vec
        self._tap = 0
        self._feed = _LEN - _TAP

    def uint64(self) -> int:
        self._tap -= 1
        if self._tap < 0:
            self._tap += _LEN
        self._feed -= 1
        if self._feed < 0:
            self._feed += _LEN
        x = (self._vec[self._feed] + self._vec[self._tap]) & _MASK64
        self._vec[self._feed] = x
        return x

    def int63(self) -> int:
        return self.uint64() & _MASK63

    def int_(self) -> int:
        """Go's ``Int()`` (on 64-bit platforms the same value as ``Int63()``)."""
        return self.int63()

    def uint32(self) -> int:
        return self.int63() >> 31

    def int31(self) -> int:
        return self.int63() >> 32

    def int63n(self, n: int) -> int:
        if n & (n - 1) == 0:
            return self.int63() & (n - 1)
        top = (1 << 63) - 1 - ((1 << 63) % n)
        v = self.int63()
        while v > top:
            v = self.int63()
        return v % n

    def int31n(self, n: int) -> int:
        if n & (n - 1) == 0:
            return self.int31() & (n - 1)
        top = (1 << 31) - 1 - ((1 << 31) % n)
        v = self.int31()
        while v > top:
            v = self.int31()
        return v % n

    def _int31n_lemire(self, n: int) -> int:
        prod = self.uint32() * n
        low = prod & 0xFFFFFFFF
        if low < n:
            thresh = ((1 << 32) - n) % n
            while low < thresh:
                prod = self.uint32() * n
                low = prod & 0xFFFFFFFF
        return prod >> 32

    def intn(self, n: int) -> int:
        if n <= 0:
            raise ValueError("intn needs n > 0")
        return self.int31n(n) if n <= _INT32MAX else self.int63n(n)

    def float64(self) -> float:
        while True:
            f = self.int63() / (1 << 63)
            if f != 1.0:
                return f

    def perm(self, n: int) -> list[int]:
        m = [0] * n
        for i in range(n):
            j = self.intn(i + 1)
            m[i] = m[j]
            m[j] = i
        return m

    def shuffle(self, items: list[T]) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self._int31n_lemire(i + 1)
            items[i], items[j] = items[j], items[i]
