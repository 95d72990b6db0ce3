"""Build and cache the peers Kube-Ferry is measured against: Volcano's scheduler (``vc-scheduler``), and CoreDNS
beside `ferry dns`.

kube-scheduler is already part of the control-plane set. Volcano v1.15.1 is built from its Go module
as its own repository builds it (its go.mod and replaces), with one gap filled: its go.mod replaces
``volcano.sh/apis`` with the in-repository folder ``staging/src/volcano.sh/apis``, which no module zip
carries (a nested module) and which the module proxy here does not serve. That folder is taken from a
git clone of volcano-sh/volcano at the same tag — ``$FERRY_VOLCANO_GIT``, else a mirror under
``/work/.mirror`` — after checking that the tag's commit is the module's origin commit. Nothing of it is
kept in this repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ferry.binaries import (
    BuildError,
    Progress,
    _build_one,
    _go_env,
    _print_progress,
    building,
    cache_root,
    go_version,
)

VOLCANO_MODULE, VOLCANO_VERSION = "volcano.sh/volcano", "v1.15.1"
VOLCANO_GIT_DEFAULT = Path("/work/.mirror/volcano-sh+volcano/repo")
APIS_DIR = "staging/src/volcano.sh/apis"


@dataclass(frozen=True)
class Volcano:
    root: Path

    @property
    def scheduler(self) -> Path:
        return self.root / "vc-scheduler"

    @property
    def crds(self) -> Path:
        return self.root / "crds"


def ensure_volcano(progress: Progress = _print_progress) -> Volcano:
    def make(src: Path, out: Path, module: dict[str, object]) -> None:
        origin = module.get("Origin")
        _add_staging_apis(src, origin.get("Hash", "") if isinstance(origin, dict) else "")
        _build_one("vc-scheduler", src, "./cmd/scheduler", out / "vc-scheduler", progress)
        shutil.copytree(src / "config" / "crd" / "volcano" / "bases", out / "crds")
        res = subprocess.run([str(out / "vc-scheduler"), "--version"], capture_output=True, text=True, timeout=60,
                             check=False)
        if res.returncode != 0:
            raise BuildError(f"built vc-scheduler does not run: {(res.stderr or res.stdout).strip()[-300:]}")

    return Volcano(build_from_module("peers", "Volcano's scheduler", VOLCANO_MODULE, VOLCANO_VERSION, make, progress))


COREDNS_MODULE, COREDNS_VERSION = "github.com/coredns/coredns", "v1.12.1"


def ensure_coredns(progress: Progress = _print_progress) -> Path:
    """CoreDNS, the DNS of most Kubernetes clusters (`ferry dns` relays to it), built from its Go module."""
    def make(src: Path, out: Path, _: dict[str, object]) -> None:
        _build_one("coredns", src, ".", out / "coredns", progress)
        res = subprocess.run([str(out / "coredns"), "-version"], capture_output=True, text=True, timeout=60,
                             check=False)
        if res.returncode != 0:
            raise BuildError(f"built coredns does not run: {(res.stderr or res.stdout).strip()[-300:]}")

    return build_from_module("peers", "CoreDNS", COREDNS_MODULE, COREDNS_VERSION, make, progress) / "coredns"


def build_from_module(folder: str, what: str, module: str, version: str,
                      make: Callable[[Path, Path, dict[str, object]], None], progress: Progress) -> Path:
    """Build ``module@version`` once per Go version into ``cache_root()/folder``: ``make(src, out, info)``
    builds from a writable copy of the module's files into ``out``, which becomes the cached folder only
    when it returns (a failed or interrupted build leaves nothing that looks complete)."""
    _, _, go_text = go_version()
    base = re.sub(r"/v\d+$", "", module).rsplit("/", 1)[-1]  # a major version's suffix does not name it
    key = f"{base}-{version}-{hashlib.sha256(go_text.encode()).hexdigest()[:8]}"
    final = cache_root() / folder / key
    if (final / ".complete").exists():
        return final
    with building(final):
        if (final / ".complete").exists():  # built meanwhile by whoever held the lock
            return final
        started = time.monotonic()
        progress(f"building {what} {version} from its Go module into {final}")
        info = download_module(module, version)
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{key}-") as tmp:
            src, out = Path(tmp) / "src", Path(tmp) / "out"
            shutil.copytree(str(info["Dir"]), src)
            for p in [src, *src.rglob("*")]:
                p.chmod(p.stat().st_mode | 0o200)
            out.mkdir()
            make(src, out, info)
            (out / ".complete").write_text(f"{module} {version}\n{go_text}\n")
            if final.exists():
                shutil.rmtree(final)
            out.rename(final)
        progress(f"{what} ready in {time.monotonic() - started:.0f} s: {final}")
    return final


def download_module(module: str, version: str) -> dict[str, object]:
    res = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], env=_go_env(),
                         capture_output=True, text=True, check=False, cwd=tempfile.gettempdir())
    info: dict[str, object] = json.loads(res.stdout or "{}")
    if res.returncode != 0 or "Dir" not in info:
        raise BuildError(f"cannot download {module}@{version}: {info.get('Error') or res.stderr.strip()[-300:]}")
    return info


def _add_staging_apis(src: Path, origin: object) -> None:
    git = Path(os.environ.get("FERRY_VOLCANO_GIT") or VOLCANO_GIT_DEFAULT)
    if not git.exists():
        raise BuildError(f"Volcano's {APIS_DIR} is in no module zip: point FERRY_VOLCANO_GIT at a git clone of "
                         f"github.com/volcano-sh/volcano that has tag {VOLCANO_VERSION}")
    tag = subprocess.run(["git", "-C", str(git), "rev-parse", f"{VOLCANO_VERSION}^{{commit}}"], capture_output=True,
                         text=True, check=False).stdout.strip()
    if not tag or tag != origin:
        raise BuildError(f"{git}: tag {VOLCANO_VERSION} is commit {tag or 'missing'}, the module's origin is {origin}")
    archive = subprocess.run(["git", "-C", str(git), "archive", VOLCANO_VERSION, APIS_DIR], capture_output=True,
                             check=False)
    if archive.returncode != 0:
        raise BuildError(f"git archive of {APIS_DIR} failed: {archive.stderr.decode(errors='replace')[-300:]}")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
