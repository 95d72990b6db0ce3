"""``make bench-scheduler``: the scheduler service on real control planes with 1,000 kwok nodes x 8 GPUs.

Prints pods bound per second for 5,000 single-GPU pods and for 500 gangs of 8, and the p50/p99 time
from a gang's last member being created to all its members being bound (seen through a watch).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from ferry import binaries
from ferry.cluster.planes import ControlPlanes, Shape
from ferry.kube.rest import api_client

GROUP, VERSION = "scheduling.kubeferry.io", "v1alpha1"


def _pod(name: str, group: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubeferry.io/pod-group": group} if group else {}},
            "spec": {"schedulerName": "kube-ferry", "restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


class BoundWatch:
    """Records when each pod of a namespace is first seen bound."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.bound: dict[str, float] = {}

    async def run(self) -> None:
        rv = ""
        while True:
            resp = await self.core.list_namespaced_pod(self.ns, watch=True, resource_version=rv,
                                                       allow_watch_bookmarks=True, timeout_seconds=120,
                                                       _preload_content=False)
            async with resp:
                async for line in resp.content:
                    ev = json.loads(line)
                    obj = ev.get("object", {})
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev.get("type") in ("ADDED", "MODIFIED") and obj.get("spec", {}).get("nodeName"):
                        self.bound.setdefault(obj["metadata"]["name"], time.monotonic())


async def _wait(cond: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("benchmark step did not finish in time")
        await asyncio.sleep(0.2)


async def bench(kubeconfig: Path, pods: int, gangs: int) -> None:
    api = await api_client(kubeconfig)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    sem = asyncio.Semaphore(32)

    async def create(ns: str, body: dict[str, Any]) -> None:
        async with sem:
            await core.create_namespaced_pod(ns, body)

    for ns in ("bench-pods", "bench-gangs"):
        await core.create_namespace({"metadata": {"name": ns}})
        await _wait_sa(core, ns)

    watch = BoundWatch(api, "bench-pods")
    task = asyncio.create_task(watch.run())
    t0 = time.monotonic()
    await asyncio.gather(*(create("bench-pods", _pod(f"p{i:05d}")) for i in range(pods)))
    created = time.monotonic()
    await _wait(lambda: len(watch.bound) >= pods, 900)
    done = max(watch.bound.values())
    print(f"single-GPU pods: {pods} created in {created - t0:.1f} s, all bound {done - t0:.1f} s after the first "
          f"create: {pods / (done - t0):.0f} pods bound/s (creation alone {pods / (created - t0):.0f} pods/s)",
          flush=True)
    task.cancel()
    await core.delete_collection_namespaced_pod("bench-pods", grace_period_seconds=0)
    await _wait_async(lambda: _empty(core, "bench-pods"), 600)

    watch = BoundWatch(api, "bench-gangs")
    task = asyncio.create_task(watch.run())
    complete: dict[str, float] = {}

    async def gang(g: int) -> None:
        name = f"g{g:04d}"
        await custom.create_namespaced_custom_object(GROUP, VERSION, "bench-gangs", "podgroups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"minMember": 8}})
        await asyncio.gather(*(create("bench-gangs", _pod(f"{name}-{i}", name)) for i in range(8)))
        complete[name] = time.monotonic()

    t0 = time.monotonic()
    await asyncio.gather(*(gang(g) for g in range(gangs)))
    await _wait(lambda: len(watch.bound) >= gangs * 8, 900)
    done = max(watch.bound.values())
    lat = sorted(max(watch.bound[f"{g}-{i}"] for i in range(8)) - complete[g] for g in complete)
    print(f"gangs of 8: {gangs * 8} pods bound {done - t0:.1f} s after the first create: "
          f"{gangs * 8 / (done - t0):.0f} pods bound/s; gang complete -> all bound: "
          f"p50 {statistics.median(lat) * 1000:.0f} ms, p99 {lat[int(len(lat) * 0.99) - 1] * 1000:.0f} ms", flush=True)
    task.cancel()
    await api.close()


async def _wait_sa(core: client.CoreV1Api, ns: str) -> None:
    for _ in range(300):
        if any(sa.metadata.name == "default" for sa in (await core.list_namespaced_service_account(ns)).items):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no default ServiceAccount in {ns}")


async def _empty(core: client.CoreV1Api, ns: str) -> bool:
    return not (await core.list_namespaced_pod(ns, limit=1)).items


async def _wait_async(cond: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not await cond():
        if time.monotonic() > end:
            raise TimeoutError("benchmark step did not finish in time")
        await asyncio.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--gangs", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferry-bench-") as tmp:
        planes = ControlPlanes(Path(tmp), Shape(tenants=0, gpu_nodes=args.nodes, gpus_per_node=8), binaries.ensure())
        planes.prepare()
        planes.add_scheduler(extra=("--period=0.2",))
        t0 = time.monotonic()
        planes.start(lambda s: print(f"  {s}", flush=True))
        took = time.monotonic() - t0
        print(f"control planes + {args.nodes} kwok nodes + scheduler ready in {took:.1f} s", flush=True)
        try:
            asyncio.run(bench(planes.kubeconfig("compute"), args.pods, args.gangs))
        finally:
            planes.stop()


if __name__ == "__main__":
    main()
