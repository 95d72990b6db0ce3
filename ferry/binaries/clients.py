"""Build and cache the unmodified tenant-side clients Kube-Ferry is checked with: Kubeflow's Training
Operator and MPI Operator, KubeRay's operator and the JobSet controller, each from its Go module as its own
repository builds it, with the CRDs its release installs.

Nothing of it is kept in this repository; the build is cached next to the control-plane binaries.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ferry.binaries import BuildError, Progress, _build_one, _print_progress
from ferry.binaries.peers import build_from_module


@dataclass(frozen=True)
class OperatorSource:
    """Where an operator's module keeps what its release builds and installs."""

    what: str
    module: str
    version: str
    name: str  # the binary's
    package: str  # its main package, relative to the module
    crds: str  # the folder of the CRDs its release installs
    flag: str  # a flag its --help names: the build runs and is the one expected


TRAINING_OPERATOR = OperatorSource("Kubeflow Training Operator", "github.com/kubeflow/training-operator", "v1.8.1",
                                   "training-operator", "./cmd/training-operator.v1", "manifests/base/crds",
                                   "gang-scheduler-name")
MPI_OPERATOR = OperatorSource("Kubeflow MPI Operator", "github.com/kubeflow/mpi-operator", "v0.6.0", "mpi-operator",
                              "./cmd/mpi-operator", "manifests/base", "gang-scheduling")
KUBERAY = OperatorSource("KubeRay operator", "github.com/ray-project/kuberay/ray-operator", "v1.5.0",
                         "ray-operator", ".", "config/crd/bases", "batch-scheduler")
JOBSET = OperatorSource("JobSet controller", "sigs.k8s.io/jobset", "v0.11.0", "jobset", ".",
                        "config/components/crd/bases", "kube-api-qps")


@dataclass(frozen=True)
class Operator:
    root: Path
    name: str

    @property
    def binary(self) -> Path:
        return self.root / self.name

    @property
    def crds(self) -> Path:
        return self.root / "crds"


def ensure_operator(source: OperatorSource, progress: Progress = _print_progress) -> Operator:
    """The operator's binary and CRDs, built once per Go version."""
    def make(src: Path, out: Path, _: dict[str, object]) -> None:
        _build_one(source.name, src, source.package, out / source.name, progress)
        shutil.copytree(src / source.crds, out / "crds")
        res = subprocess.run([str(out / source.name), "--help"], capture_output=True, text=True, timeout=60,
                             check=False)
        if source.flag not in res.stdout + res.stderr:
            raise BuildError(f"built {source.name} does not run: {(res.stderr or res.stdout).strip()[-300:]}")

    return Operator(build_from_module("clients", source.what, source.module, source.version, make, progress),
                    source.name)
