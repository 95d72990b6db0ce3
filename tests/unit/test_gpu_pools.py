"""GPU pools of one vnode: a virtual node per pool, the pods a binder gives each, what their copies select, and
the capacity and labels each node reports (pure parts; the real planes in tests/integration/test_vnode.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ferry.cluster.gpunodes import pool_name
from ferry.cluster.ports import PortAllocator
from ferry.kube.informer import Informer
from vnode.caches import PodsOnNodes
from vnode.config import VnodeConfig, parse_pool
from vnode.node import advertised, capacity, in_pool
from vnode.selection import tolerates_vnode, unmet_selection, unschedulable
from vnode.translate import Bridge, admits, compute_pod, node_for

MODEL = "kubeferry.io/gpu-model"
H100, A100 = ((MODEL, "H100"),), ((MODEL, "A100"),)
B = Bridge(tenant="t", node="ferry-t", namespace="t", queue="t", pools=(("ferry-t-h100", H100), ("ferry-t-a100", A100)))


def pod(node: str = "", selector: dict[str, str] | None = None, affinity: list[dict[str, Any]] | None = None
        ) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if node:
        spec["nodeName"] = node
    if selector is not None:
        spec["nodeSelector"] = selector
    if affinity is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": affinity}]}}}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec}


def test_a_pool_is_named_and_selected_by_node_labels() -> None:
    assert parse_pool("h100=kubeferry.io/gpu-model=H100-SXM5-80GB,zone=a") == (
        "h100", (("kubeferry.io/gpu-model", "H100-SXM5-80GB"), ("zone", "a")))
    for bad in ("h100", "H100=k=v", "h100=k", "h100=k=v,", "h100=k=bad value", "h100=/k=v"):
        with pytest.raises(ValueError, match=r"h100|H100"):
            parse_pool(bad)


def test_pools_must_differ_and_their_node_names_fit_a_hostname(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("")
    cfg = VnodeConfig(tenant="t", compute_kubeconfig=kubeconfig, kubelet_port=10250,
                      gpu_pools=(("h100", H100), ("a100", A100)))
    assert cfg.kubelets == {"ferry-t": 10250, "ferry-t-h100": 10251, "ferry-t-a100": 10252}
    assert cfg.bridge().pools == B.pools and cfg.bridge().nodes == ("ferry-t", "ferry-t-h100", "ferry-t-a100")
    with pytest.raises(ValidationError, match="pool names must differ"):
        VnodeConfig(tenant="t", compute_kubeconfig=kubeconfig, gpu_pools=(("h100", H100), ("h100", A100)))
    with pytest.raises(ValidationError, match="two pools select the same nodes"):
        VnodeConfig(tenant="t", compute_kubeconfig=kubeconfig, gpu_pools=(("h100", H100), ("big", H100)))
    with pytest.raises(ValidationError, match="longer than 63"):
        VnodeConfig(tenant="t" * 40, compute_kubeconfig=kubeconfig, gpu_pools=(("a" * 22, H100),))
    with pytest.raises(ValidationError, match="is the metrics port 10252"):
        VnodeConfig(tenant="t", compute_kubeconfig=kubeconfig, kubelet_port=10250, metrics_port=10252,
                    gpu_pools=(("h100", H100), ("a100", A100)))
    with pytest.raises(ValidationError, match="exceed 65535"):
        VnodeConfig(tenant="t", compute_kubeconfig=kubeconfig, kubelet_port=65535, gpu_pools=(("h100", H100),))


def test_a_bound_pod_goes_to_the_pool_its_node_selection_asks_for() -> None:
    assert node_for(pod(selector={MODEL: "H100"}), B) == "ferry-t-h100"
    assert node_for(pod(selector={MODEL: "A100", "nvidia.com/gpu.present": "true"}), B) == "ferry-t-a100"
    assert node_for(pod(affinity=[{"key": MODEL, "operator": "In", "values": ["A100"]}]), B) == "ferry-t-a100"
    # one that asks for no pool, or admits their absence, is the vnode's own node's
    assert node_for(pod(), B) == "ferry-t"
    assert node_for(pod(selector={"nvidia.com/gpu.present": "true"}), B) == "ferry-t"
    assert node_for(pod(affinity=[{"key": MODEL, "operator": "NotIn", "values": ["A100"]}]), B) == "ferry-t"
    # several pools admitted, none's absence: the first of them
    assert node_for(pod(affinity=[{"key": MODEL, "operator": "In", "values": ["A100", "H100"]}]), B) == "ferry-t-h100"
    assert node_for(pod(affinity=[{"key": MODEL, "operator": "Exists"}]), B) == "ferry-t-h100"
    # no pools: always the node
    assert node_for(pod(selector={MODEL: "H100"}), Bridge(tenant="t", node="ferry-t", namespace="t", queue="t")) \
        == "ferry-t"


def test_node_selection_is_read_as_the_node_affinity_filter_reads_it() -> None:
    labels = {"gen": "9", MODEL: "H100"}
    keys = {"gen", MODEL}
    assert admits(pod(affinity=[{"key": "gen", "operator": "Gt", "values": ["8"]}]), labels, keys)
    assert not admits(pod(affinity=[{"key": "gen", "operator": "Lt", "values": ["8"]}]), labels, keys)
    assert not admits(pod(affinity=[{"key": "gen", "operator": "Gt", "values": ["x"]}]), labels, keys)
    assert admits(pod(affinity=[{"key": "other", "operator": "Exists"}]), labels, keys)  # not a pool key
    assert not admits(pod(affinity=[{"key": MODEL, "operator": "DoesNotExist"}]), labels, keys)
    assert admits(pod(affinity=[{"key": MODEL, "operator": "DoesNotExist"}]), {}, keys)


def test_a_pools_pod_is_copied_to_run_on_the_pools_compute_nodes() -> None:
    copied = compute_pod(pod("ferry-t-h100", selector={"kubernetes.io/hostname": "ferry-t-h100", "zone": "a"}), B)
    assert copied["spec"]["nodeSelector"] == {"zone": "a", MODEL: "H100"}
    own = compute_pod(pod("ferry-t", selector={"zone": "a"}), B)
    assert own["spec"]["nodeSelector"] == {"zone": "a"}
    # the downward API's spec.nodeName is the pod's own virtual node
    body = pod("ferry-t-a100")
    body["spec"]["containers"][0]["env"] = [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    env = compute_pod(body, B)["spec"]["containers"][0]["env"]
    assert env == [{"name": "NODE", "value": "ferry-t-a100"}]


def test_a_pool_reports_its_own_nodes_capacity_and_labels() -> None:
    def node(model: str, gpus: str = "8") -> dict[str, Any]:
        return {"metadata": {"labels": {MODEL: model, "nvidia.com/gpu.present": "true"}}, "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": gpus}}}

    nodes = [node("H100"), node("H100"), node("A100", "4")]
    keys = ("nvidia.com/gpu.", MODEL)
    assert capacity(in_pool(nodes, dict(H100)), None, 10)["nvidia.com/gpu"] == "16"
    assert capacity(in_pool(nodes, dict(A100)), None, 10)["nvidia.com/gpu"] == "4"
    assert capacity(in_pool(nodes, {}), None, 10)["nvidia.com/gpu"] == "20"
    assert advertised(in_pool(nodes, dict(H100)), keys) == {MODEL: "H100", "nvidia.com/gpu.present": "true"}
    assert advertised(nodes, keys) == {"nvidia.com/gpu.present": "true"}  # the vnode's own node: models differ


def test_the_pods_of_every_node_read_as_one_cache() -> None:
    async def never(**_: Any) -> Any:
        raise AssertionError("not listed")

    by_node = {n: Informer(f"tenant-pods-{n}", never) for n in B.nodes}
    pods = PodsOnNodes(by_node)
    on_h100, on_own = pod("ferry-t-h100"), {**pod("ferry-t"), "metadata": {"name": "q", "namespace": "ns"}}
    pods.remember(on_h100)
    pods.remember(on_own)
    pods.remember(pod("elsewhere"))  # not one of the vnode's nodes: no cache of it
    assert set(pods.store) == {"ns/p", "ns/q"}
    assert list(by_node["ferry-t-h100"].store) == ["ns/p"] and list(by_node["ferry-t"].store) == ["ns/q"]
    seen: list[str] = []
    pods.on_change = lambda kind, _: seen.append(kind)
    assert all(i.on_change is pods.on_change for i in by_node.values())
    assert not pods.synced()


def _unschedulable(selector: dict[str, str], toleration: dict[str, str] | None = None) -> dict[str, Any]:
    body = pod(selector=selector)
    body["spec"]["tolerations"] = [toleration or {"key": "virtual-kubelet.io/provider", "operator": "Exists"}]
    body["status"] = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    return body


def test_a_pod_no_virtual_node_meets_is_told_what_the_shared_cluster_has_of_what_it_selects() -> None:
    def gpu_node(**labels: str) -> dict[str, Any]:
        return {"metadata": {"labels": labels}, "spec": {}, "status": {
            "conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"nvidia.com/gpu": "8"}}}

    compute = [gpu_node(**{MODEL: "H100"}), gpu_node(**{MODEL: "H100"}), gpu_node(**{MODEL: "A100"})]
    virtual = [{"kubernetes.io/hostname": "ferry-t", "nvidia.com/gpu.present": "true"}]
    keys = ("nvidia.com/gpu.", MODEL)
    said = unmet_selection(_unschedulable({MODEL: "H100"}), virtual, compute, keys)
    assert said is not None and said.startswith("2 of the shared cluster's 3 schedulable GPU nodes have the "
                                                f"{MODEL}") and f"--gpu-pool NAME={MODEL}=H100" in said, said
    said = unmet_selection(_unschedulable({MODEL: "B200"}), virtual, compute, keys)
    assert said is not None and said.startswith(f"no schedulable GPU node of the shared cluster has the {MODEL}")
    # a virtual node meets it (it waits for room, or for another reason), or it selects no GPU label: nothing
    assert unmet_selection(_unschedulable({MODEL: "H100"}), [*virtual, {MODEL: "H100"}], compute, keys) is None
    assert unmet_selection(_unschedulable({"nvidia.com/gpu.present": "true"}), virtual, compute, keys) is None
    assert unmet_selection(_unschedulable({"disk": "ssd"}), virtual, compute, keys) is None
    # only pods that may go to a virtual node and that their scheduler found no node for are looked at
    assert tolerates_vnode(_unschedulable({}, {"operator": "Exists"}))
    assert not tolerates_vnode(_unschedulable({}, {"key": "other", "operator": "Exists"}))
    assert unschedulable(_unschedulable({})) and not unschedulable(pod())


def test_ferry_up_names_a_pool_after_its_product_and_gives_a_vnode_consecutive_kubelet_ports() -> None:
    assert pool_name("H100-SXM5-80GB") == "h100-sxm5-80gb" and pool_name("A100 80GB (PCIe)") == "a100-80gb-pcie"
    ports = PortAllocator()
    try:
        first = ports.take_block(3, "a vnode's kubelet APIs")
        later = {ports.take("another") for _ in range(20)}
    finally:
        ports.release()
    assert not later & {first, first + 1, first + 2}
