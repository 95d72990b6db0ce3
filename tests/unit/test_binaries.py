"""Binary builds fail with one clear line when Go is missing or too old, and run once for processes that need
them at once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ferry.binaries import peers


def _ferry(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry", "binaries"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def test_missing_go_is_named(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "FERRY_CACHE_DIR": str(tmp_path / "cache")}
    res = _ferry(env)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].startswith("ferry: error: Go is not installed (no `go` on PATH)")


def test_old_go_is_named(tmp_path: Path) -> None:
    fake = tmp_path / "go"
    fake.write_text("#!/bin/sh\necho go1.22.4\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "FERRY_CACHE_DIR": str(tmp_path / "cache")}
    res = _ferry(env)
    assert res.returncode == 1
    assert "ferry: error: Go go1.22.4 is too old: Kubernetes v1.36.3 needs Go >= 1.26" in res.stderr


def test_two_processes_needing_one_module_build_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Test workers start at once on a cold cache: the second waits for the first's build and reuses it
    (before the lock, both built, and one replaced the folder the other was running from)."""
    module_dir = tmp_path / "module"
    module_dir.mkdir()
    (module_dir / "main.go").write_text("package main\n")
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(peers, "go_version", lambda: (1, 26, "go1.26.8"))
    monkeypatch.setattr(peers, "download_module", lambda module, version: {"Dir": str(module_dir)})
    builds: list[str] = []
    second = threading.Event()

    def make(src: Path, out: Path, _: dict[str, object]) -> None:
        builds.append(threading.current_thread().name)
        if len(builds) > 1:
            second.set()  # only without the lock does a second build start while the first runs
        else:
            second.wait(timeout=2)
        (out / "tool").write_text("built")

    results: list[Path] = []
    workers = [threading.Thread(target=lambda: results.append(
        peers.build_from_module("clients", "a tool", "example.com/tool", "v1.0.0", make, lambda _: None)),
        name=f"worker-{i}") for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    assert len(builds) == 1, builds
    assert len(results) == 2 and results[0] == results[1]
    assert (results[0] / "tool").read_text() == "built"


def test_every_client_operator_is_built_before_the_tests() -> None:
    """``ferry binaries --clients`` (``make test-clients``) builds ``ALL``: a client missing there would be
    built inside its first test's timeout on a cold cache."""
    from ferry.binaries import clients

    defined = {v for v in vars(clients).values() if isinstance(v, clients.OperatorSource)}
    assert defined == set(clients.ALL)
    assert len(clients.ALL) == len(set(clients.ALL))
