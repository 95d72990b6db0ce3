"""The service's model at 10,000 nodes: built from API-shaped objects, then kept in step by one pod's delta.

Synthetic informer stores (plain dicts shaped like the API's objects) stand in for the caches; the code
timed is the service's own: :class:`scheduler.service.mirror.Mirror` and the core cycle after it.
"""

from __future__ import annotations

import copy
import random
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.service.mirror import Mirror

Obj = dict[str, Any]
CREATED = "2026-11-30T10:00:00Z"


def _node(i: int) -> Obj:
    return {"metadata": {"name": f"n{i:05d}", "labels": {"kubeferry.io/domain": f"rack-{i // 16}"}}, "spec": {},
            "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(ns: str, name: str, group: str, node: str | None, device: int | None) -> Obj:
    spec: Obj = {"schedulerName": "kube-ferry", "containers": [{"name": "c", "resources": {
        "limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "2", "memory": "8Gi"}}}]}
    meta: Obj = {"name": name, "namespace": ns, "uid": f"{ns}-{name}", "labels": {"kubeferry.io/pod-group": group},
                 "creationTimestamp": CREATED, "annotations": {}}
    if node is not None:
        spec["nodeName"] = node
        meta["annotations"]["kubeferry.io/gpu-devices"] = str(device)
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


@dataclass
class MirrorFigures:
    objects_s: float
    rebuild_s: float
    delta_s: list[float]  # one pod's change filed and synced into the model
    cycle_s: list[float]  # the core cycle after it
    rss_mib: float
    queue_status_s: list[float]  # a Queue's status rewritten (the service's own report) and synced
    queue_spec_s: list[float]  # a Queue's spec changed and synced: every job re-derived


def bench_mirror(nodes: int = 10_000, running: int = 80_000, pending: int = 20_000, seed: int = 7) -> MirrorFigures:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    node_objs = {f"n{i:05d}": _node(i) for i in range(nodes)}
    queues: dict[str, Obj] = {f"q{i}": {"metadata": {"name": f"q{i}"}, "spec": {"guaranteed": {"gpu": str(nodes * 2)},
                                                                 "namespaces": [f"ns{i}"]}} for i in range(4)}
    pods: dict[str, Obj] = {}
    groups: dict[str, Obj] = {}
    slot = 0  # running pods fill the nodes' GPUs in order
    g = 0
    for total, bound in ((running, True), (pending, False)):
        n = 0
        while n < total:
            ns = f"ns{g % 4}"
            size = min(64, max(1, int(rng.paretovariate(1.2))), total - n)
            name = f"{'r' if bound else 'p'}{g}"
            groups[f"{ns}/{name}"] = {"metadata": {"name": name, "namespace": ns, "uid": f"g-{ns}-{name}"},
                                      "spec": {"minMember": size}}
            for k in range(size):
                node = f"n{slot // 8:05d}" if bound else None
                pods[f"{ns}/{name}-{k}"] = _pod(ns, f"{name}-{k}", name, node, slot % 8 if bound else None)
                slot += bound
            n += size
            g += 1
    objects = time.perf_counter() - t0
    mirror = Mirror(SchedulerConfig.preset("ferry").without_actions("grow"), lambda: pods, lambda: node_objs,
                    lambda: groups, lambda: queues)
    t0 = time.perf_counter()
    sched, _ = mirror.sync(100.0, {})
    rebuild = time.perf_counter() - t0
    sched.cycle(100.0)
    deltas, cycles = [], []
    running_keys = [k for k, p in pods.items() if p["spec"].get("nodeName")]
    for i in range(30):  # a running pod ends (its gang gives the GPU back), as the watch would deliver it
        key = running_keys[rng.randrange(len(running_keys))]
        ended = copy.deepcopy(pods[key])
        ended["status"]["phase"] = "Succeeded"
        t0 = time.perf_counter()
        pods[key] = ended
        mirror.pod_changed(key, ended)
        sched, _ = mirror.sync(200.0 + i, {})
        t1 = time.perf_counter()
        sched.cycle(200.0 + i)
        deltas.append(t1 - t0)
        cycles.append(time.perf_counter() - t1)
    statuses: list[float] = []
    specs: list[float] = []
    for i in range(5):
        for timings, part in ((statuses, "status"), (specs, "spec")):
            changed = copy.deepcopy(queues["q0"])
            if part == "status":
                changed["status"] = {"allocated": {"gpu": str(i)}}
            else:
                changed["spec"]["weight"] = 1 + (i + 1) % 2
            t0 = time.perf_counter()
            queues["q0"] = changed
            mirror.queue_changed("q0")
            mirror.sync(300.0 + i, {})
            timings.append(time.perf_counter() - t0)
    assert mirror.rebuilds == 1 and mirror.queue_syncs == len(specs)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return MirrorFigures(objects, rebuild, deltas, cycles, rss, statuses, specs)


def report(f: MirrorFigures) -> str:
    return (f"service model, 10,000 nodes and 100,000 pods as API objects: built in {f.rebuild_s:.1f} s; one pod's "
            f"delta filed and synced median {statistics.median(f.delta_s) * 1000:.2f} ms, max "
            f"{max(f.delta_s) * 1000:.2f} ms (target <= 10 ms); the cycle after it median "
            f"{statistics.median(f.cycle_s) * 1000:.0f} ms; peak RSS {f.rss_mib:.0f} MiB (target <= 2,048 MiB); "
            f"a Queue's status report synced median {statistics.median(f.queue_status_s) * 1000:.2f} ms, its spec "
            f"changed (every job re-derived) {statistics.median(f.queue_spec_s) * 1000:.0f} ms")
