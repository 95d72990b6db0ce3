"""``ferry down``: stop what a ``ferry up`` started, even if its supervisor is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ferry.cluster.planes import STATE_FILE, read_state
from ferry.cluster.process import pid_alive


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    end = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p) and not _is_zombie(p)]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.1)  # waiting for other processes to exit


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


def down(directory: Path, progress: Callable[[str], None]) -> int:
    state = read_state(directory)
    if state is None:
        progress(f"nothing running in {directory}")
        return 0
    sup = state.get("supervisor_pid")
    comps = state.get("components")
    recorded: list[int] = []
    if isinstance(comps, dict):
        for info in comps.values():
            pid = info.get("pid") if isinstance(info, dict) else None
            # Only our own processes: a recycled pid would not carry DIR on its command line.
            if isinstance(pid, int) and str(directory) in _cmdline(pid):
                recorded.append(pid)
    if isinstance(sup, int) and pid_alive(sup):
        os.kill(sup, signal.SIGTERM)
        if _wait_gone([sup], 60):
            with contextlib.suppress(ProcessLookupError):
                os.kill(sup, signal.SIGKILL)
    left = _wait_gone(recorded, 15)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    still = _wait_gone(left, 10)
    (directory / STATE_FILE).unlink(missing_ok=True)
    if still:
        progress(f"could not stop pids {still}")
        return 1
    progress(f"stopped everything in {directory}")
    return 0
