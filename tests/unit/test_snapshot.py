"""The scheduler's snapshot: job shapes are reused only while the objects they came from are unchanged."""

from __future__ import annotations

import copy
from typing import Any

from scheduler.core.model import ReplicaPhase
from scheduler.service.snapshot import ShapeCache, build

NODES = {"n0": {"metadata": {"name": "n0", "labels": {}},
                "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}}


def pod(name: str, gpus: str = "1", node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "kube-ferry",
                            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if node:
        spec["nodeName"] = node
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"kubeferry.io/pod-group": "g"},
            "creationTimestamp": "2026-11-29T10:00:00Z"}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


GROUP = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 2}}


def test_shape_is_reused_until_a_pod_is_replaced_and_bad_specs_stay_reported() -> None:
    cache = ShapeCache()
    pods = {"ns/a": pod("a"), "ns/b": pod("b")}
    first = build(NODES, pods, {"ns/g": GROUP}, {}, 0.0, cache)
    shape = cache.entries["ns/g"][3]
    second = build(NODES, pods, {"ns/g": GROUP}, {}, 0.0, cache)
    assert cache.entries["ns/g"][3] is shape  # same objects: not derived again
    assert first.cluster.jobs["ns/g"] is not second.cluster.jobs["ns/g"]  # but each cycle gets its own Job

    # the informer replaces an updated object: the shape follows it
    pods["ns/a"] = bound = copy.deepcopy(pods["ns/a"])
    bound["spec"]["nodeName"] = "n0"
    third = build(NODES, pods, {"ns/g": GROUP}, {}, 0.0, cache)
    assert cache.entries["ns/g"][3] is not shape
    phases = sorted(r.phase for r in third.cluster.jobs["ns/g"].replicas)
    assert phases == [ReplicaPhase.BOUND, ReplicaPhase.PENDING]

    # a bad spec is explained on every cycle, cached or not
    pods["ns/b"] = pod("b", gpus="2")
    pods["ns/b"]["metadata"]["uid"] = "uid-b-recreated"
    for _ in range(2):
        snap = build(NODES, pods, {"ns/g": GROUP}, {}, 0.0, cache)
        assert "ask for different resources" in snap.problems["ns/g"]
        assert "ns/g" not in snap.cluster.jobs

    # a job that is gone leaves the cache
    build(NODES, {}, {}, {}, 0.0, cache)
    assert cache.entries == {}
