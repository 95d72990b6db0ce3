"""Build and cache the unmodified tenant-side clients Kube-Ferry is checked with: Kubeflow's Training
Operator and KubeRay's operator, each from its Go module as its own repository builds it, with the CRDs its
release installs.

Nothing of it is kept in this repository; the build is cached next to the control-plane binaries.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ferry.binaries import BuildError, Progress, _build_one, _print_progress
from ferry.binaries.peers import build_from_module

TRAINING_OPERATOR_MODULE, TRAINING_OPERATOR_VERSION = "github.com/kubeflow/training-operator", "v1.8.1"
KUBERAY_MODULE, KUBERAY_VERSION = "github.com/ray-project/kuberay/ray-operator", "v1.5.0"


@dataclass(frozen=True)
class TrainingOperator:
    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "training-operator"

    @property
    def crds(self) -> Path:
        return self.root / "crds"


def ensure_training_operator(progress: Progress = _print_progress) -> TrainingOperator:
    """The operator's binary and CRDs, built once per Go version."""
    def make(src: Path, out: Path, _: dict[str, object]) -> None:
        _build_one("training-operator", src, "./cmd/training-operator.v1", out / "training-operator", progress)
        shutil.copytree(src / "manifests" / "base" / "crds", out / "crds")
        res = subprocess.run([str(out / "training-operator"), "--help"], capture_output=True, text=True, timeout=60,
                             check=False)
        if "gang-scheduler-name" not in res.stdout + res.stderr:
            raise BuildError(f"built training-operator does not run: {(res.stderr or res.stdout).strip()[-300:]}")

    return TrainingOperator(build_from_module("clients", "Kubeflow Training Operator", TRAINING_OPERATOR_MODULE,
                                              TRAINING_OPERATOR_VERSION, make, progress))


@dataclass(frozen=True)
class KubeRay:
    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "ray-operator"

    @property
    def crds(self) -> Path:
        return self.root / "crds"


def ensure_kuberay(progress: Progress = _print_progress) -> KubeRay:
    """KubeRay's operator (RayCluster, RayJob) and its CRDs, built once per Go version."""
    def make(src: Path, out: Path, _: dict[str, object]) -> None:
        _build_one("ray-operator", src, ".", out / "ray-operator", progress)
        shutil.copytree(src / "config" / "crd" / "bases", out / "crds")
        res = subprocess.run([str(out / "ray-operator"), "--help"], capture_output=True, text=True, timeout=60,
                             check=False)
        if "batch-scheduler" not in res.stdout + res.stderr:
            raise BuildError(f"built ray-operator does not run: {(res.stderr or res.stdout).strip()[-300:]}")

    return KubeRay(build_from_module("clients", "KubeRay operator", KUBERAY_MODULE, KUBERAY_VERSION, make, progress))
