"""Binary builds fail with one clear line when Go is missing or too old."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


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
