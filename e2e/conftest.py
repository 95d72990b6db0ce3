"""The end-to-end suite's clusters: any compute cluster and tenant clusters with Kube-Ferry installed.

Point it at yours with ``FERRY_E2E_COMPUTE=<compute kubeconfig>`` and
``FERRY_E2E_TENANTS=tenant-1=<kubeconfig>[,tenant-2=<kubeconfig>...]`` (tenant names as the compute
cluster's Queues and namespaces know them); the compute kubeconfig must read pods in the tenants'
namespaces. Without them the suite starts local control planes (``ferry up``, 8 GPU nodes, 2 tenants)
and stops them at the end. ``FERRY_E2E_IMAGE`` is the image the test pods run (default busybox).
Everything is done with ``kubectl`` and ``kubectl ferry``, as users do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.kube import Cluster, Clusters


def _kubectl_binary() -> str:
    if env := os.environ.get("KUBECTL"):
        return env
    if found := shutil.which("kubectl"):
        return found
    from ferry import binaries

    return str(binaries.ensure().path("kubectl"))


@pytest.fixture(scope="session")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    kubectl = _kubectl_binary()
    if compute := os.environ.get("FERRY_E2E_COMPUTE"):
        tenants = dict(item.split("=", 1) for item in os.environ.get("FERRY_E2E_TENANTS", "").split(",") if item)
        if not tenants:
            raise pytest.UsageError("FERRY_E2E_COMPUTE is set but FERRY_E2E_TENANTS is not "
                                    "(tenant-1=<kubeconfig>,tenant-2=<kubeconfig>)")
        yield Clusters(Cluster("compute", Path(compute), kubectl),
                       {t: Cluster(t, Path(p), kubectl) for t, p in tenants.items()})
        return
    d = tmp_path_factory.mktemp("e2e")
    up = subprocess.run([sys.executable, "-m", "ferry", "up", "--dir", str(d), "--tenants", "2", "--gpu-nodes", "8",
                         "--detach"], capture_output=True, text=True, timeout=1200, check=False)
    if up.returncode != 0:
        raise RuntimeError(f"ferry up failed: {up.stderr[-3000:]}")
    try:
        yield Clusters(Cluster("compute", d / "compute.kubeconfig", kubectl),
                       {t: Cluster(t, d / f"{t}.kubeconfig", kubectl) for t in ("tenant-1", "tenant-2")})
    finally:
        subprocess.run([sys.executable, "-m", "ferry", "down", "--dir", str(d)], capture_output=True, timeout=120,
                       check=False)


@pytest.fixture
def tenant(clusters: Clusters) -> Cluster:
    return next(iter(clusters.tenants.values()))


@pytest.fixture
def ns(tenant: Cluster) -> Iterator[str]:
    """A fresh namespace in the first tenant cluster, deleted afterwards (its pods leave the compute
    cluster with it)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    tenant.kubectl("create", "namespace", name)
    tenant.wait(lambda: tenant.get_or_none("serviceaccount", "default", "-n", name), 60,
                f"ServiceAccount default in {name}")
    yield name
    tenant.kubectl("delete", "namespace", name, "--wait=false", check=False)
