"""GPU pools on the real control planes: where the compute cluster's GPU nodes differ (two products), one
vnode gives each pool a virtual node of its own, which a pod of the tenant's own kube-scheduler (or a Kueue
flavor's selector) picks by the pool's labels, and whose pods run on that pool's compute nodes."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from ferry.kube.rest import Rest
from ferry.whypending import explain
from tests.helpers import eventually, free_port, kubectl, swapped
from tests.integration.test_vnode import compute_pod_of, tenant_pod
from tests.integration.test_vnode_faults import served_pod
from vnode import naming

POOL_KEY = "ferry-test-pool"
NODE, POOL_NODE = "ferry-tenant-1", "ferry-tenant-1-big"


def free_ports(pools: int) -> int:
    """A port, free now, whose next ``pools`` ports are free too: the vnode's kubelet API and its pools'."""
    while True:
        port = free_port()
        try:
            for p in range(port + 1, port + 1 + pools):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


@asynccontextmanager
async def pooled_vnode(vnodes: dict[str, Component], compute_api: client.ApiClient, tenant_api: client.ApiClient,
                       pools: dict[str, str]) -> AsyncIterator[dict[str, list[str]]]:
    """tenant-1's vnode restarted with a GPU pool per entry of ``pools`` (name -> value of ``POOL_KEY``), each of
    two compute nodes given that label; yields each pool's compute nodes. Afterwards the pools' Nodes and labels
    are gone and the session's vnode runs again."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    free = sorted(n.metadata.name for n in (await ccore.list_node(label_selector="type=kwok,!ferry-test")).items)
    members = {name: free[2 * i: 2 * i + 2] for i, name in enumerate(pools)}  # `private_node` takes the last
    vnode = swapped(vnodes["tenant-1"], "tenant-1-vnode-pools", [
        f"--kubelet-port={free_ports(len(pools))}",
        *(f"--gpu-pool={name}={POOL_KEY}={value}" for name, value in pools.items())])
    try:
        for name, value in pools.items():
            for node in members[name]:
                await ccore.patch_node(node, {"metadata": {"labels": {POOL_KEY: value}}})
        vnodes["tenant-1"].stop()
        vnode.start()
        vnode.wait_ready()
        yield members
    finally:
        vnode.stop()
        for name in pools:
            try:
                await core.delete_node(f"{NODE}-{name}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for node in (n for ns in members.values() for n in ns):
            await ccore.patch_node(node, {"metadata": {"labels": {POOL_KEY: None}}})
        vnodes["tenant-1"].start()
        vnodes["tenant-1"].wait_ready()


async def copies_gone(compute_api: client.ApiClient, tenant_ns: str) -> bool:
    left = await client.CoreV1Api(compute_api).list_namespaced_pod(
        "tenant-1", label_selector=f"{naming.UPSTREAM_NS_LABEL}={tenant_ns}")
    return not left.items


async def test_a_gpu_pool_is_a_virtual_node_of_its_own_whose_pods_run_on_its_compute_nodes(
        planes: ControlPlanes, vnodes: dict[str, Component], tenant_api: client.ApiClient,
        compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Before, the one virtual node carried only what every GPU node shares, so a pod selecting one product
    stayed Pending in the tenant cluster. Here two compute nodes form a pool (a label no other node has): its
    virtual node offers their 16 GPUs and carries their label; a pod of the tenant's kube-scheduler selecting
    it is bound there, a pod the vnode binds that selects it goes there too, and both copies run on the pool's
    nodes; `kubectl logs` reaches the pool's pod through the pool node's own kubelet API. A pod asking for no
    pool stays on the vnode's own node."""
    core = client.CoreV1Api(tenant_api)
    async with pooled_vnode(vnodes, compute_api, tenant_api, {"big": tenant_ns}) as members:
        pool_nodes = members["big"]

        async def offered() -> Any:
            pool, own = await core.read_node(POOL_NODE), await core.read_node(NODE)
            gpus = min(16, int(own.status.allocatable["nvidia.com/gpu"]))  # the tenant Queue's max caps both
            ready = next(c.status for c in pool.status.conditions if c.type == "Ready") == "True"
            return pool if ready and pool.status.allocatable["nvidia.com/gpu"] == str(gpus) \
                and pool.metadata.labels.get(POOL_KEY) == tenant_ns else None

        pool = await eventually(offered, timeout=30, what="the pool's virtual node offering its two nodes' GPUs")
        assert pool.metadata.labels["kubernetes.io/hostname"] == POOL_NODE
        assert POOL_KEY not in (await core.read_node(NODE)).metadata.labels  # the other GPU nodes lack it

        picked = tenant_pod("picked", automountServiceAccountToken=False, nodeSelector={POOL_KEY: tenant_ns})
        served = served_pod("served")
        served["spec"]["nodeSelector"] = {POOL_KEY: tenant_ns}
        uids = {"picked": (await core.create_namespaced_pod(tenant_ns, picked)).metadata.uid,
                "served": (await core.create_namespaced_pod(tenant_ns, served)).metadata.uid,
                "anywhere": (await core.create_namespaced_pod(tenant_ns, served_pod("anywhere"))).metadata.uid}

        async def running() -> dict[str, tuple[str, str, dict[str, str]]] | None:
            out = {}
            for name, uid in uids.items():
                pod = await core.read_namespaced_pod(name, tenant_ns)
                copy = await compute_pod_of(compute_api, "tenant-1", uid)
                if pod.status.phase != "Running" or copy is None:
                    return None
                out[name] = (pod.spec.node_name, copy.spec.node_name, copy.spec.node_selector or {})
            return out

        placed = await eventually(running, timeout=60, what="the three pods Running")
        for name in ("picked", "served"):
            node, compute_node, selector = placed[name]
            assert node == POOL_NODE and compute_node in pool_nodes, placed
            assert selector == {POOL_KEY: tenant_ns}, placed
        assert placed["anywhere"][0] == NODE, placed

        k = planes.bin.path("kubectl")
        copy = await compute_pod_of(compute_api, "tenant-1", uids["picked"])
        direct = kubectl(k, planes.kubeconfig("compute"), "logs", "-n", "tenant-1", copy.metadata.name).stdout
        through = kubectl(k, planes.kubeconfig("tenant-1"), "logs", "-n", tenant_ns, "picked").stdout
        assert direct and through == direct
        for name in uids:
            await core.delete_namespaced_pod(name, tenant_ns, grace_period_seconds=0)
        await eventually(lambda: copies_gone(compute_api, tenant_ns), timeout=60,
                         what="the copies deleted with their pods")


async def test_a_pod_selecting_gpu_nodes_no_virtual_node_carries_is_told_what_the_shared_cluster_has(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Two compute nodes of a GPU product the others lack: a pod of the tenant's kube-scheduler selecting it
    waits in the tenant cluster (no virtual node carries it) and is told, where `kubectl describe pod` shows
    it, that two GPU nodes there have it and that a GPU pool is what is missing; one selecting a product no
    node has is told that. Before, all it had was the scheduler's "didn't match Pod's node affinity/selector"."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    product = "nvidia.com/gpu.product"
    free = sorted(n.metadata.name for n in (await ccore.list_node(label_selector="type=kwok,!ferry-test")).items)
    try:
        for name in free[:2]:
            await ccore.patch_node(name, {"metadata": {"labels": {product: f"test-{tenant_ns}"}}})
        for name, value in (("rare", f"test-{tenant_ns}"), ("absent", f"none-{tenant_ns}")):
            await core.create_namespaced_pod(tenant_ns, tenant_pod(name, automountServiceAccountToken=False,
                                                                   nodeSelector={product: value}))

        async def told(name: str) -> str | None:
            events = (await core.list_namespaced_event(tenant_ns, field_selector=f"involvedObject.name={name}")).items
            return next((e.message for e in events if e.reason == "NoVirtualNodeSelected"), None)

        rare = await eventually(lambda: told("rare"), timeout=30, what="the pod of a rare product told why it waits")
        assert rare.startswith("2 of the shared cluster's ") and f"--gpu-pool NAME={product}=test-{tenant_ns}" in rare
        absent = await eventually(lambda: told("absent"), timeout=30, what="the pod of no product told why")
        assert absent.startswith(f"no schedulable GPU node of the shared cluster has the {product}"), absent
        for name in ("rare", "absent"):
            assert (await core.read_namespaced_pod(name, tenant_ns)).spec.node_name is None
        verdict = await explain(Rest(tenant_api), tenant_ns, "rare")  # `kubectl ferry why-pending rare`
        assert verdict.reason == "NoVirtualNodeSelected" and verdict.message == rare, verdict
        assert "ask the admin for a GPU pool" in verdict.hint
    finally:
        for name in free[:2]:
            await ccore.patch_node(name, {"metadata": {"labels": {product: None}}})
