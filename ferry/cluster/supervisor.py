"""Keep a started set of components alive: restart what dies, with back-off, and log it."""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

import structlog

from ferry.cluster.planes import ControlPlanes

MIN_BACKOFF = 1.0
MAX_BACKOFF = 30.0
HEALTHY_AFTER = 30.0  # a component up this long has its back-off reset


class Supervisor:
    def __init__(self, planes: ControlPlanes, log: structlog.typing.FilteringBoundLogger) -> None:
        self.planes = planes
        self.log = log
        self.stopping = threading.Event()
        self._failures: dict[str, int] = {}
        self._restart_at: dict[str, float] = {}
        self._started_at: dict[str, float] = {}
        self._held: set[str] = set()
        self.restarts: dict[str, int] = {}  # component → restarts done by this supervisor

    def hold(self, name: str) -> None:
        """Leave ``name`` down until :meth:`release` (an outage someone else ends, e.g. a chaos run)."""
        self._held.add(name)

    def release(self, name: str) -> None:
        self._held.discard(name)
        self._restart_at.pop(name, None)
        self._started_at[name] = time.monotonic()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.log.info("stop requested", signal=signal.Signals(signum).name)
        self.stopping.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_signal)

    def tick(self, now: float) -> bool:
        """One pass over the components; returns True if anything changed."""
        changed = False
        for name, comp in self.planes.components.items():
            if name in self._held:
                continue
            if comp.alive():
                if now - self._started_at.get(name, now) > HEALTHY_AFTER:
                    self._failures.pop(name, None)
                continue
            if name not in self._restart_at:
                failures = self._failures.get(name, 0) + 1
                self._failures[name] = failures
                delay = min(MIN_BACKOFF * 2 ** (failures - 1), MAX_BACKOFF)
                self._restart_at[name] = now + delay
                code = comp.proc.returncode if comp.proc is not None else None
                self.log.warning("component exited", component=name, exit_code=code,
                                 reason=comp.failure_reason(), restart_in_s=delay, failures=failures)
                changed = True
            elif now >= self._restart_at[name]:
                del self._restart_at[name]
                try:
                    comp.start()
                except Exception as exc:
                    self.log.error("restart failed", component=name, error=str(exc))
                    continue
                self._started_at[name] = now
                self.restarts[name] = self.restarts.get(name, 0) + 1
                self.log.info("component restarted", component=name, pid=comp.pid, starts=comp.starts)
                changed = True
        return changed

    def run(self, supervisor_pid: int) -> None:
        """Supervise until a stop signal; then stop everything and remove the state file."""
        now = time.monotonic()
        for name in self.planes.components:
            self._started_at[name] = now
        self.planes.write_state(supervisor_pid, ready=True)
        self.log.info("supervising", components=len(self.planes.components))
        try:
            while not self.stopping.wait(0.5):
                if self.tick(time.monotonic()):
                    self.planes.write_state(supervisor_pid, ready=True)
        finally:
            self.log.info("stopping all components")
            self.planes.stop()
            self.planes.remove_state()
            self.log.info("stopped")
