"""One supervised OS process of a local control plane: start, probe, stop, restart."""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class StartError(RuntimeError):
    """A component failed to start; the message names it and the cause in one line."""


def _die_with_parent(parent: int) -> Callable[[], None]:
    """preexec hook: the child is SIGKILLed when its starter dies, so a killed ``ferry up``
    leaves nothing running that a later run could trip over."""

    def hook() -> None:
        os.setsid()
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the starter died before prctl took effect
            os._exit(1)

    return hook


Probe = Callable[[], bool]


@dataclass
class ComponentSpec:
    """What to run and how to tell it is ready."""

    name: str
    argv: list[str]
    log: Path
    probe: Probe
    ports: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 90.0


class Component:
    """A running (or stopped) instance of a :class:`ComponentSpec`."""

    def __init__(self, spec: ComponentSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.alive():
            return
        self.spec.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env}
        with self.spec.log.open("ab") as log:
            log.write(f"\n=== start {self.spec.name} at {time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(
                    self.spec.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    preexec_fn=_die_with_parent(os.getpid()),
                )
            except OSError as exc:
                raise StartError(f"{self.name}: cannot execute {self.spec.argv[0]}: {exc.strerror}") from exc
        self.starts += 1

    def wait_ready(self, deadline: float | None = None) -> None:
        """Block until the probe passes; raise StartError if the process dies or time runs out."""
        end = deadline if deadline is not None else time.monotonic() + self.spec.ready_timeout
        delay = 0.05
        while True:
            if not self.alive():
                raise StartError(f"{self.name} exited at start-up: {self.failure_reason()}")
            with contextlib.suppress(OSError, http.client.HTTPException, ssl.SSLError):
                if self.spec.probe():
                    return
            if time.monotonic() > end:
                waited = self.spec.ready_timeout
                raise StartError(f"{self.name} not ready after {waited:.0f} s: {self.failure_reason()}")
            time.sleep(delay)  # polling a child process's readiness; there is no event to wait on
            delay = min(delay * 1.5, 0.5)

    def failure_reason(self) -> str:
        """The most telling line of the component's log (bind errors first)."""
        try:
            lines = self.spec.log.read_text(errors="replace").splitlines()[-80:]
        except OSError:
            return "(no log)"
        for needle in ("address already in use", "bind:", "permission denied", "no such file"):
            for line in lines:
                if needle in line.lower():
                    return line.strip()[:300]
        for line in reversed(lines):
            low = line.lower()
            if ("error" in low or "fatal" in low or low.startswith("e")) and line.strip():
                return line.strip()[:300]
        return lines[-1].strip()[:300] if lines else "(empty log)"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; waits for the process to be reaped."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()

    def kill(self) -> None:
        """SIGKILL without grace (fault tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _answers_200(connect: Callable[[], http.client.HTTPConnection], path: str) -> Probe:
    """A probe that passes when GET ``path`` on a fresh connection answers 200 (a connection per probe:
    the component may have restarted since the last one)."""
    def probe() -> bool:
        conn = connect()
        try:
            conn.request("GET", path)
            return conn.getresponse().status == 200
        finally:
            conn.close()

    return probe


def https_probe(url: str, ca: Path, cert: Path | None = None, key: Path | None = None) -> Probe:
    """A probe that passes when GET ``url`` answers 200 over TLS verified against ``ca``."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key else None)
    host_port, _, path = url.removeprefix("https://").partition("/")
    host, _, port = host_port.partition(":")
    return _answers_200(lambda: http.client.HTTPSConnection(host, int(port), context=ctx, timeout=2), "/" + path)


def insecure_https_probe(host: str, port: int, path: str) -> Probe:
    """For components serving a self-signed certificate on loopback (controller-manager, scheduler)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return _answers_200(lambda: http.client.HTTPSConnection(host, port, context=ctx, timeout=2), path)


def http_probe(host: str, port: int, path: str) -> Probe:
    return _answers_200(lambda: http.client.HTTPConnection(host, port, timeout=2), path)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
