"""Local GPUs first, the shared cluster when they are full: a tenant with GPU nodes of its own
(`ferry up --tenant-gpu-nodes 2`) runs pods that may use the virtual node on its own nodes while they
have room, and on the virtual node when they do not — with no per-pod change."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.binaries import Binaries
from ferry.cluster.planes import LOCAL_NODE_PREFIX
from tests.helpers import api_client, eventually
from tests.integration.test_up_down import ferry

VIRTUAL_NODE = "ferry-tenant-1"


@pytest.fixture(scope="module")
def local_up(tmp_path_factory: pytest.TempPathFactory, binaries: Binaries) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("local-first")
    res = ferry("up", "--dir", str(directory), "--tenants", "1", "--gpu-nodes", "4", "--tenant-gpu-nodes", "2",
                "--detach")
    assert res.returncode == 0, res.stderr
    yield directory
    ferry("down", "--dir", str(directory))


@pytest.fixture
async def tenant(local_up: Path) -> AsyncIterator[client.CoreV1Api]:
    async with api_client(local_up / "tenant-1.kubeconfig") as api:
        core = client.CoreV1Api(api)

        async def node_ready() -> bool:
            nodes = (await core.list_node()).items
            return any(n.metadata.name == VIRTUAL_NODE for n in nodes)

        await eventually(node_ready, what="the virtual node registered")
        yield core


def trainer(name: str) -> dict[str, Any]:
    """An 8-GPU pod as a tenant writes it for the shared cluster: it tolerates the virtual node. Its CPU and
    memory make a local node look busier than the (much larger) virtual node to a least-allocated score,
    so only the local-first preference keeps it local."""
    return {"metadata": {"name": name}, "spec": {
        "automountServiceAccountToken": False,
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
        "containers": [{"name": "main", "image": "trainer:1", "resources": {"limits": {
            "nvidia.com/gpu": "8", "cpu": "16", "memory": "128Gi"}}}]}}


async def placed(core: client.CoreV1Api, name: str) -> str | None:
    """The node a Running pod is on."""
    pod = await core.read_namespaced_pod(name, "default")
    return pod.spec.node_name if pod.status.phase == "Running" else None


async def test_local_gpu_nodes_fill_first_and_the_virtual_node_takes_the_overflow(
        tenant: client.CoreV1Api) -> None:
    local = sorted(n.metadata.name for n in (await tenant.list_node()).items
                   if n.metadata.name.startswith(LOCAL_NODE_PREFIX))
    assert len(local) == 2
    for name in ("train-a", "train-b", "train-c"):  # one at a time: the order says who overflows
        await tenant.create_namespaced_pod("default", trainer(name))
        await eventually(lambda name=name: placed(tenant, name), timeout=60, what=f"{name} Running")
    nodes = {n: await placed(tenant, n) for n in ("train-a", "train-b", "train-c")}
    assert sorted([nodes["train-a"], nodes["train-b"]]) == local, nodes
    assert nodes["train-c"] == VIRTUAL_NODE, "the third 8-GPU pod overflows to the shared cluster"

    freed = nodes["train-a"]
    await tenant.delete_namespaced_pod("train-a", "default", grace_period_seconds=0)

    async def gone() -> bool:
        return "train-a" not in {p.metadata.name for p in (await tenant.list_namespaced_pod("default")).items}

    await eventually(gone, what="train-a deleted")
    await tenant.create_namespaced_pod("default", trainer("train-d"))
    got = await eventually(lambda: placed(tenant, "train-d"), timeout=60, what="train-d Running")
    assert got == freed, "a freed local node is used before the shared cluster"
