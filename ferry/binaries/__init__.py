"""Build and cache the real control-plane binaries from pinned Go modules.

Nothing can be downloaded here but modules, so Kubernetes (apiserver, controller-manager,
scheduler, kubectl as one multi-call binary), etcd and kwok are compiled from the wrapper
modules under ``go/``. The result is cached per *version set*: a hash of those modules' files,
the Go version and the build flags; a changed pin builds a new set, an unchanged one is reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

GO_DIR = Path(__file__).parent / "go"
KUBERNETES_VERSION = "v1.36.3"
MIN_GO = (1, 26)

# name -> (wrapper module folder, package to build)
TARGETS: dict[str, tuple[str, str]] = {
    "k8s": ("k8s", "."),
    "etcd": ("etcd", "go.etcd.io/etcd/server/v3"),
    "kwok": ("kwok", "sigs.k8s.io/kwok/cmd/kwok"),
}
# Names the multi-call k8s binary answers to (it dispatches on argv[0]).
K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
COMMANDS = (*K8S_COMMANDS, "etcd", "kwok")


class BuildError(RuntimeError):
    """The binaries cannot be built; the message says why, in one line."""


@dataclass(frozen=True)
class Binaries:
    """A complete, verified set of control-plane executables in one folder."""

    root: Path

    def path(self, command: str) -> Path:
        if command not in COMMANDS:
            raise KeyError(command)
        return self.root / command


def cache_root() -> Path:
    """Where built sets live: $FERRY_CACHE_DIR, else $XDG_CACHE_HOME/kube-ferry, else ~/.cache/kube-ferry."""
    if env := os.environ.get("FERRY_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kube-ferry"


def _ldflags() -> str:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBERNETES_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(flags)


def go_version() -> tuple[int, int, str]:
    """The machine's Go as (major, minor, text); BuildError if missing or older than MIN_GO."""
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "Go is not installed (no `go` on PATH): Kube-Ferry compiles kube-apiserver, etcd and kwok "
            f"from Go modules and needs Go >= {MIN_GO[0]}.{MIN_GO[1]}"
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, env=_go_env(), check=False)
    text = out.stdout.strip()
    m = re.match(r"go(\d+)\.(\d+)", text)
    if out.returncode != 0 or m is None:
        raise BuildError(f"cannot tell the Go version (`go env GOVERSION` said {text or out.stderr.strip()!r})")
    major, minor = int(m.group(1)), int(m.group(2))
    if (major, minor) < MIN_GO:
        raise BuildError(
            f"Go {text} is too old: Kubernetes {KUBERNETES_VERSION} needs Go >= {MIN_GO[0]}.{MIN_GO[1]}"
        )
    return major, minor, text


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=readonly -trimpath")
    return env


def version_key(go_text: str) -> str:
    """Hash of everything that decides the binaries' content."""
    h = hashlib.sha256()
    h.update(go_text.encode())
    h.update(_ldflags().encode())
    for path in sorted(GO_DIR.rglob("*")):
        if path.is_file() and path.suffix in {".mod", ".sum", ".go"}:
            h.update(str(path.relative_to(GO_DIR)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def locate() -> Binaries | None:
    """The ready set for the current pins, or None. $FERRY_BIN_DIR overrides the cache."""
    if env := os.environ.get("FERRY_BIN_DIR"):
        b = Binaries(Path(env))
        missing = [c for c in COMMANDS if not b.path(c).exists()]
        if missing:
            raise BuildError(f"FERRY_BIN_DIR={env} lacks {', '.join(missing)}")
        return b
    _, _, text = go_version()
    root = cache_root() / "bin" / version_key(text)
    return Binaries(root) if (root / ".complete").exists() else None


Progress = Callable[[str], None]
_PACKAGE_LINE = re.compile(r"^[\w.\-/]+$")


def _print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure(progress: Progress = _print_progress) -> Binaries:
    """Return the cached set, building it first when the pins changed or nothing is cached."""
    return locate() or build(progress, reuse=True)


@contextmanager
def building(final: Path) -> Iterator[None]:
    """Hold the cache's lock on ``final`` while it is built. Two processes that need one set at once (two test
    workers, a test and `ferry up`) then build it once: the second waits, and finds it complete."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with (final.parent / f".{final.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def build(progress: Progress = _print_progress, reuse: bool = False) -> Binaries:
    """Build the set for the current pins under the cache's lock (``ferry binaries --rebuild`` too, so a
    rebuild never replaces a folder another build is writing); with ``reuse``, a set completed meanwhile by
    whoever held the lock is returned as it is."""
    _, _, text = go_version()
    key = version_key(text)
    final = cache_root() / "bin" / key
    with building(final):
        if reuse and (final / ".complete").exists():
            return Binaries(final)
        started = time.monotonic()
        progress(f"building control-plane binaries (Kubernetes {KUBERNETES_VERSION}, etcd, kwok) with {text} "
                 f"into {final}")
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{key}-") as tmp:
            staging = Path(tmp)
            for name, (folder, package) in TARGETS.items():
                _build_one(name, GO_DIR / folder, package, staging / name, progress)
            for command in K8S_COMMANDS:
                (staging / command).symlink_to("k8s")
            for command in COMMANDS:
                _check_runs(staging / command)
            (staging / ".complete").write_text(f"{KUBERNETES_VERSION}\n{text}\n")
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)
        progress(f"binaries ready in {time.monotonic() - started:.0f} s: {final}")
    return Binaries(final)


def _build_one(name: str, module: Path, package: str, out: Path, progress: Progress) -> None:
    env = _go_env()
    listing = subprocess.run(
        ["go", "list", "-deps", package], cwd=module, env=env, capture_output=True, text=True, check=False
    )
    if listing.returncode != 0:
        raise BuildError(f"{name}: `go list` failed in {module}: {_last_line(listing.stderr)}")
    total = len(listing.stdout.split())
    cmd = ["go", "build", "-v", "-o", str(out)]
    if name == "k8s":
        cmd += ["-ldflags", _ldflags()]
    cmd.append(package)
    t0 = time.monotonic()
    last = t0
    done = 0
    tail: list[str] = []
    proc = subprocess.Popen(cmd, cwd=module, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        tail = [*tail[-20:], line.rstrip()]
        if _PACKAGE_LINE.match(line):
            done += 1
        now = time.monotonic()
        if now - last >= 10:
            last = now
            progress(f"  [{name}] compiled {min(done, total)}/{total} packages ({now - t0:.0f} s)")
    if proc.wait() != 0:
        raise BuildError(f"{name}: go build failed: {_last_line(chr(10).join(tail))}")
    progress(f"  [{name}] built in {time.monotonic() - t0:.0f} s")


def _check_runs(path: Path) -> None:
    args = ["--version"] if path.name != "kubectl" else ["version", "--client"]
    res = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise BuildError(f"built {path.name} does not run: {_last_line(res.stderr or res.stdout)}")


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"
