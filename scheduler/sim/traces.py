"""Reading trace files: every bad row is reported with its file, line and reason."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
# The traces the simulators and benchmarks use, shipped with the repository (data/traces/README.md).
TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


class TraceError(ValueError):
    """A trace row that cannot be used; ``str()`` names file, line and reason."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = path, line, reason


@dataclass
class Problems:
    """Rows skipped while reading, kept so a run can print them and say how many."""

    errors: list[TraceError]

    def __bool__(self) -> bool:
        return bool(self.errors)


def read_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        fh = path.open(newline="")
    except OSError as exc:
        raise TraceError(path, 0, f"cannot open: {exc.strerror}") from None
    with fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(path, 1, f"missing column(s) {', '.join(missing)}")
        for row in reader:
            yield reader.line_num, row


def parse_int(row: dict[str, str], key: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    text = (row.get(key) or "").strip()
    if text == "":
        raise ValueError(f"{key} is missing")
    try:
        value = int(float(text)) if "." in text or "e" in text.lower() else int(text)
    except ValueError:
        raise ValueError(f"{key}={text!r} is not a number") from None
    if value < minimum:
        raise ValueError(f"{key}={value} is below {minimum}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{key}={value} is above {maximum}")
    return value


def load(path: Path, required: tuple[str, ...], parse: Callable[[dict[str, str]], T],
         problems: Problems, strict: bool) -> list[T]:
    """Parse every row; a bad row raises (strict) or is recorded in ``problems`` and skipped."""
    out: list[T] = []
    for line, row in read_rows(path, required):
        try:
            out.append(parse(row))
        except ValueError as exc:
            err = TraceError(path, line, str(exc))
            if strict:
                raise err from None
            problems.errors.append(err)
    return out
