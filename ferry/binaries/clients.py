"""Build and cache the unmodified clients Kube-Ferry is checked with: Kubeflow's Training Operator and MPI
Operator, Kubeflow Trainer (v2), KubeRay's operator, the JobSet and LeaderWorkerSet controllers, Kueue,
Volcano's job controller (with its admission webhooks) and metrics-server, each from its Go module as its own
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
    crds: str  # the folder of the CRDs its release installs ("" for none)
    flag: str  # a flag its --help names: the build runs and is the one expected
    also: tuple[tuple[str, str], ...] = ()  # further binaries its release runs beside it: (name, main package)
    manifests: str = ""  # a folder of further objects its release installs (e.g. runtimes), kept as "manifests"


TRAINING_OPERATOR = OperatorSource("Kubeflow Training Operator", "github.com/kubeflow/training-operator", "v1.8.1",
                                   "training-operator", "./cmd/training-operator.v1", "manifests/base/crds",
                                   "gang-scheduler-name")
MPI_OPERATOR = OperatorSource("Kubeflow MPI Operator", "github.com/kubeflow/mpi-operator", "v0.6.0", "mpi-operator",
                              "./cmd/mpi-operator", "manifests/base", "gang-scheduling")
KUBERAY = OperatorSource("KubeRay operator", "github.com/ray-project/kuberay/ray-operator", "v1.5.0",
                         "ray-operator", ".", "config/crd/bases", "batch-scheduler")
# Kubeflow Trainer v2: a TrainJob names a training runtime (its release's ClusterTrainingRuntimes, kept from
# manifests/base/runtimes) and becomes a JobSet, with a scheduler-plugins PodGroup when the runtime asks
# for gang scheduling.
TRAINER = OperatorSource("Kubeflow Trainer", "github.com/kubeflow/trainer/v2", "v2.2.0", "trainer-controller-manager",
                         "./cmd/trainer-controller-manager", "manifests/base/crds", "feature-gates",
                         manifests="manifests/base/runtimes")
JOBSET = OperatorSource("JobSet controller", "sigs.k8s.io/jobset", "v0.11.0", "jobset", ".",
                        "config/components/crd/bases", "kube-api-qps")
LEADER_WORKER_SET = OperatorSource("LeaderWorkerSet controller", "sigs.k8s.io/lws", "v0.7.0", "lws", "./cmd",
                                   "config/crd/bases", "kube-api-qps")
# Kueue: quota and admission of a tenant's batch Jobs (it suspends a Job until its ClusterQueue admits it).
KUEUE = OperatorSource("Kueue controller", "sigs.k8s.io/kueue", "v0.17.0", "kueue", "./cmd/kueue",
                       "config/components/crd/bases", "feature-gates")
# What `kubectl top` reads: an aggregated API (metrics.k8s.io) over the kubelets' /metrics/resource; the
# tenant's scrapes the virtual node, which serves its pods' usage from the compute cluster's.
METRICS_SERVER = OperatorSource("metrics-server", "sigs.k8s.io/metrics-server", "v0.8.0", "metrics-server",
                                "./cmd/metrics-server", "", "kubelet-use-node-status-port")
# Volcano's job controller and webhooks from v1.10.0, the newest release served here that builds from its module
# alone (from v1.14 on, volcano.sh/apis is replaced by a folder no module zip holds, which is why the Volcano
# scheduler peer of the benchmarks needs a git mirror). The tenant's vcjob API is the same batch/v1alpha1.
VOLCANO_JOBS = OperatorSource("Volcano job controller", "volcano.sh/volcano", "v1.10.0", "vc-controller-manager",
                              "./cmd/controller-manager", "config/crd/volcano/bases", "worker-threads",
                              also=(("vc-webhook-manager", "./cmd/webhook-manager"),))

# every client the integration tests run: ``ferry binaries --clients`` builds them before the tests start, so
# that a cold cache costs build time once, not a test's timeout
ALL = (TRAINING_OPERATOR, MPI_OPERATOR, KUBERAY, TRAINER, JOBSET, LEADER_WORKER_SET, KUEUE, METRICS_SERVER,
       VOLCANO_JOBS)


@dataclass(frozen=True)
class Operator:
    root: Path
    name: str

    @property
    def binary(self) -> Path:
        return self.root / self.name

    def path(self, name: str) -> Path:
        """One of the further binaries its source names (``OperatorSource.also``)."""
        return self.root / name

    @property
    def crds(self) -> Path:
        return self.root / "crds"

    @property
    def manifests(self) -> Path:
        """``OperatorSource.manifests``, kept."""
        return self.root / "manifests"


def ensure_operator(source: OperatorSource, progress: Progress = _print_progress) -> Operator:
    """The operator's binary and CRDs, built once per Go version."""
    def make(src: Path, out: Path, _: dict[str, object]) -> None:
        for name, package in ((source.name, source.package), *source.also):
            _build_one(name, src, package, out / name, progress)
        if source.crds:
            shutil.copytree(src / source.crds, out / "crds")
        if source.manifests:
            shutil.copytree(src / source.manifests, out / "manifests")
        res = subprocess.run([str(out / source.name), "--help"], capture_output=True, text=True, timeout=60,
                             check=False)
        if source.flag not in res.stdout + res.stderr:
            raise BuildError(f"built {source.name} does not run: {(res.stderr or res.stdout).strip()[-300:]}")

    return Operator(build_from_module("clients", source.what, source.module, source.version, make, progress),
                    source.name)
