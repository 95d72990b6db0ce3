"""Where our own processes spend a benchmark phase: py-spy samples them without pausing them.

A missed target is shown with its cause, not only its number: while a phase runs, ``py-spy record``
samples each of Kube-Ferry's processes (collapsed stacks); the report lists the functions that were
on the CPU most (self time) and the code paths that hold most of the time (inclusive).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


def _py_spy() -> str | None:
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


@dataclass
class Profile:
    process: str
    samples: int = 0
    self_time: list[tuple[str, float]] = field(default_factory=list)  # (function, share of samples)
    inclusive: list[tuple[str, float]] = field(default_factory=list)
    error: str = ""


class Sampler:
    """``with Sampler({name: pid}, folder) as s: ...`` then ``s.profiles``."""

    def __init__(self, pids: dict[str, int], folder: Path, rate: int = 50) -> None:
        self.pids, self.folder, self.rate = pids, folder, rate
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.profiles: list[Profile] = []

    def __enter__(self) -> Sampler:
        tool = _py_spy()
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, pid in self.pids.items():
            if tool is None:
                self.profiles.append(Profile(name, error="py-spy is not installed"))
                continue
            self._procs[name] = subprocess.Popen(
                [tool, "record", "--pid", str(pid), "--rate", str(self.rate), "--nonblocking", "--format", "raw",
                 "--output", str(self.folder / f"{name}.folded")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, proc in self._procs.items():
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on interrupt
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                err = b"timed out writing its profile"
            out = self.folder / f"{name}.folded"
            if out.exists():
                self.profiles.append(summarise(name, out.read_text()))
            else:
                self.profiles.append(Profile(name, error=err.decode(errors="replace").strip()[-300:]))


def summarise(process: str, folded: str, top: int = 8) -> Profile:
    """Top functions by self and inclusive share from py-spy's collapsed stacks ("a;b;c count")."""
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        total += n
        leaf[_short(frames[-1])] += n
        for f in {_short(f) for f in frames[1:]}:  # the first frame is the process/thread
            inclusive[f] += n
    if not total:
        return Profile(process, error="no samples")
    paths = [(f, n / total) for f, n in inclusive.most_common() if n / total < 0.9 and not _plumbing(f)]
    return Profile(process, total, [(f, n / total) for f, n in leaf.most_common(top)], paths[:top])


_PLUMBING = ("(base_events.py)", "(runners.py)", "(events.py)", "(selectors.py)", "(<frozen runpy>)",
             "(__main__.py)", "(tasks.py)", "(taskgroups.py)")


def _plumbing(frame: str) -> bool:
    """The event loop's own frames: on every stack, they say nothing about where the time goes."""
    return frame.endswith(_PLUMBING)


def _short(frame: str) -> str:
    """``func (path/to/module.py:12)`` -> ``func (module.py)``."""
    name, _, where = frame.partition(" (")
    module = where.rstrip(")").rsplit("/", 1)[-1].split(":", 1)[0]
    return f"{name} ({module})" if module else name


def table(profiles: list[Profile]) -> list[str]:
    md: list[str] = []
    for p in profiles:
        if p.error:
            md += [f"- **{p.process}**: no profile ({p.error})"]
            continue
        md += ["", f"**{p.process}** ({p.samples} samples at 50 Hz, py-spy):", "",
               "| self time | share | | inclusive | share |", "|---|---:|---|---|---:|"]
        rows = max(len(p.self_time), len(p.inclusive))
        for i in range(rows):
            s = p.self_time[i] if i < len(p.self_time) else ("", 0.0)
            c = p.inclusive[i] if i < len(p.inclusive) else ("", 0.0)
            md.append(f"| `{s[0]}` | {s[1]:.0%} | | `{c[0]}` | {c[1]:.0%} |")
    return md
