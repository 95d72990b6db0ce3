"""Shared fixtures: one set of real control planes per test session, fresh namespaces per test."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from ferry import binaries as ferry_binaries
from ferry.cluster.planes import ControlPlanes, Shape
from ferry.cluster.process import Component
from ferry.kube.rest import Rest
from tests.helpers import api_client, closed_port, fresh_namespace
from vnode.dnsserver import PeerDNS, informers
from vnode.peernames import PeerIndex

SESSION_GPU_NODES = int(os.environ.get("FERRY_TEST_GPU_NODES", "100"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def binaries() -> ferry_binaries.Binaries:
    return ferry_binaries.ensure()


@pytest.fixture(scope="session")
def planes(tmp_path_factory: pytest.TempPathFactory, binaries: ferry_binaries.Binaries) -> Iterator[ControlPlanes]:
    """Compute cluster with 100 kwok GPU nodes × 8 GPUs and two tenant clusters, for the whole session."""
    directory = tmp_path_factory.mktemp("planes")
    cp = ControlPlanes(directory, Shape(tenants=2, gpu_nodes=SESSION_GPU_NODES, gpus_per_node=8), binaries)
    cp.prepare()
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def ferry_scheduler(planes: ControlPlanes) -> Iterator[Component]:
    """The Kube-Ferry scheduler (no victim protection, so preemption tests run quickly)."""
    planes.install_crds()
    comp = planes.add_scheduler(extra=("--min-runtime=0", "--leader-elect", "--identity=primary"))
    comp.start()
    comp.wait_ready()
    yield comp
    comp.stop()


@pytest.fixture(scope="session")
def vnodes(planes: ControlPlanes, ferry_scheduler: Component) -> Iterator[dict[str, Component]]:
    """One vnode per tenant cluster, started once for the session (tests may kill and restart them)."""
    comps = {t: planes.add_vnode(t, extra=("--heartbeat=5", "--gc-interval=2", "--gc-min-age=10",
                                           "--dns-server=10.96.0.53"))
             for t in planes.tenant_names}
    for c in comps.values():
        c.start()
    for c in comps.values():
        c.wait_ready()
    yield comps
    for c in comps.values():
        c.stop()


@pytest.fixture
async def compute_api(planes: ControlPlanes) -> AsyncIterator[client.ApiClient]:
    async with api_client(planes.kubeconfig("compute")) as api:
        yield api


@pytest.fixture
async def tenant_api(planes: ControlPlanes) -> AsyncIterator[client.ApiClient]:
    async with api_client(planes.kubeconfig("tenant-1")) as api:
        yield api


@pytest.fixture
async def tenant2_api(planes: ControlPlanes) -> AsyncIterator[client.ApiClient]:
    async with api_client(planes.kubeconfig("tenant-2")) as api:
        yield api


@pytest.fixture
async def peer_dns(compute_api: client.ApiClient) -> AsyncIterator[PeerDNS]:
    """`ferry dns`'s answers (vnode/dnsserver.py), its index fed by a real informer over the compute cluster's
    bridged pods; what it would relay goes to an upstream that never answers (SERVFAIL)."""
    index = PeerIndex()
    watched = informers(Rest(compute_api), index)
    tasks = [asyncio.create_task(i.run()) for i in watched]
    try:
        async with asyncio.timeout(30):
            for i in watched:
                await i.synced.wait()
        yield PeerDNS(index, "cluster.local", ("127.0.0.1", closed_port()), timeout_s=0.2)
    finally:
        for t in tasks:
            t.cancel()


@pytest.fixture
async def compute_ns(compute_api: client.ApiClient) -> AsyncIterator[str]:
    async for ns in fresh_namespace(compute_api):
        yield ns


@pytest.fixture
async def tenant_ns(tenant_api: client.ApiClient) -> AsyncIterator[str]:
    async for ns in fresh_namespace(tenant_api):
        yield ns


@pytest.fixture
async def tenant2_ns(tenant2_api: client.ApiClient) -> AsyncIterator[str]:
    async for ns in fresh_namespace(tenant2_api):
        yield ns


@pytest.fixture
async def private_node(compute_api: client.ApiClient, compute_ns: str) -> str:
    """A GPU node only this test's pods select (label ferry-test=<namespace>)."""
    core = client.CoreV1Api(compute_api)
    nodes = (await core.list_node(label_selector="type=kwok,!ferry-test")).items
    name = sorted(n.metadata.name for n in nodes)[-1]
    await core.patch_node(name, {"metadata": {"labels": {"ferry-test": compute_ns}}})
    return name
