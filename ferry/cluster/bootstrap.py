"""API work done once the servers answer: GPU nodes, and waits for what tests rely on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.cluster.gpunodes import gpu_node
from ferry.kube.rest import api_client


async def _api(kubeconfig: Path) -> client.ApiClient:
    return await api_client(kubeconfig)


async def create_gpu_nodes(kubeconfig: Path, count: int, gpus: int, concurrency: int = 16,
                           prefix: str = "gpu-node", models: tuple[str, ...] = ()) -> None:
    """Create (idempotently) ``count`` kwok GPU nodes with capacity and topology in their status; of
    ``models`` in equal blocks (default: one model)."""
    api = await _api(kubeconfig)
    try:
        core = client.CoreV1Api(api)
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            body = gpu_node(i, gpus, prefix=prefix, **({"model": models[i * len(models) // count]} if models else {}))
            async with sem:
                try:
                    await core.create_node(body)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                # Status is the kubelet's to write: set capacity through the status subresource so it
                # holds whether or not create kept it.
                await core.patch_node_status(body["metadata"]["name"], {"status": body["status"]})

        async with asyncio.TaskGroup() as tg:
            for i in range(count):
                tg.create_task(one(i))
    finally:
        await api.close()


def _ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


async def wait_nodes_ready(kubeconfig: Path, count: int, timeout: float) -> None:
    api = await _api(kubeconfig)
    try:
        core = client.CoreV1Api(api)
        end = time.monotonic() + timeout
        while True:
            nodes = (await core.list_node(label_selector="type=kwok")).items
            ready = sum(1 for n in nodes if _ready(n))
            if ready >= count:
                return
            if time.monotonic() > end:
                raise TimeoutError(f"only {ready}/{count} kwok GPU nodes became Ready in {timeout:.0f} s")
            await asyncio.sleep(0.5)
    finally:
        await api.close()


async def wait_service_account(kubeconfig: Path, namespace: str, timeout: float) -> None:
    """Pods cannot be created before the controller-manager made the namespace's ``default`` SA."""
    api = await _api(kubeconfig)
    try:
        core = client.CoreV1Api(api)
        end = time.monotonic() + timeout
        while True:
            try:
                await core.read_namespaced_service_account("default", namespace)
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            if time.monotonic() > end:
                raise TimeoutError(f"no default ServiceAccount in {namespace} after {timeout:.0f} s")
            await asyncio.sleep(0.3)
    finally:
        await api.close()
