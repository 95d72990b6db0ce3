"""GPU pools on the real control planes: where the compute cluster's GPU nodes differ (two products), one
vnode gives each pool a virtual node of its own, which a pod of the tenant's own kube-scheduler (or a Kueue
flavor's selector) picks by the pool's labels, and whose pods run on that pool's compute nodes."""

from __future__ import annotations

import socket
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import eventually, free_port, kubectl, swapped
from tests.integration.test_vnode import compute_pod_of, tenant_pod
from tests.integration.test_vnode_faults import served_pod
from vnode import naming

POOL_KEY = "ferry-test-pool"
NODE, POOL_NODE = "ferry-tenant-1", "ferry-tenant-1-big"


def two_free_ports() -> int:
    """A port, free now, whose next port is free too: the vnode's kubelet API and its pool's."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


async def test_a_gpu_pool_is_a_virtual_node_of_its_own_whose_pods_run_on_its_compute_nodes(
        planes: ControlPlanes, vnodes: dict[str, Component], tenant_api: client.ApiClient,
        compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Before, the one virtual node carried only what every GPU node shares, so a pod selecting one product
    stayed Pending in the tenant cluster. Here two compute nodes form a pool (a label no other node has): its
    virtual node offers their 16 GPUs and carries their label; a pod of the tenant's kube-scheduler selecting
    it is bound there, a pod the vnode binds that selects it goes there too, and both copies run on the pool's
    nodes; `kubectl logs` reaches the pool's pod through the pool node's own kubelet API. A pod asking for no
    pool stays on the vnode's own node."""
    core, ccore = client.CoreV1Api(tenant_api), client.CoreV1Api(compute_api)
    free = sorted(n.metadata.name for n in (await ccore.list_node(label_selector="type=kwok,!ferry-test")).items)
    pool_nodes = free[:2]  # the `private_node` fixture takes the last
    for name in pool_nodes:
        await ccore.patch_node(name, {"metadata": {"labels": {POOL_KEY: tenant_ns}}})
    vnode = swapped(vnodes["tenant-1"], "tenant-1-vnode-pools",
                    [f"--kubelet-port={two_free_ports()}", f"--gpu-pool=big={POOL_KEY}={tenant_ns}"])
    vnodes["tenant-1"].stop()
    try:
        vnode.start()
        vnode.wait_ready()

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

        async def copies_gone() -> bool:
            left = await ccore.list_namespaced_pod("tenant-1", label_selector=f"{naming.UPSTREAM_NS_LABEL}={tenant_ns}")
            return not left.items

        await eventually(copies_gone, timeout=60, what="the copies deleted with their pods")
    finally:
        vnode.stop()
        try:
            await core.delete_node(POOL_NODE)
        except ApiException as exc:
            if exc.status != 404:
                raise
        for name in pool_nodes:
            await ccore.patch_node(name, {"metadata": {"labels": {POOL_KEY: None}}})
        vnodes["tenant-1"].start()
        vnodes["tenant-1"].wait_ready()
