"""An unmodified LeaderWorkerSet controller (v0.7.0, built from its Go module; what multi-node inference
such as vLLM is deployed with) in a tenant cluster, with its Volcano gang scheduling on: a group's leader
and worker, pods of StatefulSets that LWS's pod webhook labels, names a Volcano PodGroup on and gives
``LWS_LEADER_ADDRESS``, run through the virtual node as one gang (the vnode is the tenant's Volcano) and
the worker finds its leader by that name (answered by `ferry dns`). A deleted worker makes LWS recreate the whole
group under the same names (``RecreateGroupOnPodRestart``): the compute cluster then holds the new
pods' copies and nothing of the old ones, and they run as one gang. (LWS v0.7.0 keeps the old group's
PodGroup, owned by the old leader, when it finds it still there, else makes a new one; a kept one the
tenant's garbage collector removes later, and the running group is left alone.) A deleted
LeaderWorkerSet leaves no copy behind.

The controller's admission webhooks are served by the process itself and called by URL with a certificate
the test issues (local planes have no cluster network), as in test_jobset.py."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.binaries import Binaries
from ferry.binaries.clients import LEADER_WORKER_SET, ensure_operator
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from ferry.keys import DOMAIN_LABEL, POD_GROUP_LABEL
from tests.helpers import (
    compute_copies,
    controller_with_webhooks,
    eventually,
    install_crd,
    racks_of_groups,
    resolve,
    url_webhook,
)
from vnode import naming
from vnode.dnsserver import PeerDNS

TENANT = "tenant-1"
WEBHOOKS = ("lws-ferry-test-mutating", "lws-ferry-test-validating")
GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"


def webhook_configurations(port: int, ca: bytes) -> list[dict[str, Any]]:
    """The release's webhooks (config/webhook, with its patches: pods only of a LeaderWorkerSet), by URL."""
    sets = {"apiGroups": [GROUP], "apiVersions": [VERSION], "resources": [PLURAL],
            "operations": ["CREATE", "UPDATE"]}
    of_sets = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}

    hook = partial(url_webhook, port, ca)

    pods = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": WEBHOOKS[0]},
         "webhooks": [hook("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", sets),
                      hook("mpod.kb.io", "/mutate--v1-pod", {**pods, "operations": ["CREATE"]}, of_sets)]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": WEBHOOKS[1]},
         "webhooks": [hook("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", sets),
                      hook("vpod.kb.io", "/validate--v1-pod", {**pods, "operations": ["CREATE", "UPDATE"]},
                           of_sets)]},
    ]


@pytest.fixture(scope="module")
def lws_controller(planes: ControlPlanes, binaries: Binaries, vnodes: dict[str, Component],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """The controller watching every namespace of tenant-1, its webhooks registered while it runs."""
    op = ensure_operator(LEADER_WORKER_SET)
    kubeconfig = planes.kubeconfig(TENANT)
    kubectl = [str(binaries.path("kubectl")), f"--kubeconfig={kubeconfig}"]
    install_crd(kubectl, op.crds / "leaderworkerset.x-k8s.io_leaderworkersets.yaml", f"{PLURAL}.{GROUP}")
    with controller_with_webhooks(op.binary, "config.lws.x-k8s.io/v1alpha1",
                                  {"gangSchedulingManagement": {"schedulerProvider": "volcano"}}, kubeconfig,
                                  kubectl, tmp_path_factory.mktemp("lws"), webhook_configurations) as proc:
        yield proc


def leader_worker_set(name: str, size: int) -> dict[str, Any]:
    """A LeaderWorkerSet as its examples write one for Volcano's gang scheduling: one group of ``size``
    GPU pods of scheduler ``volcano`` (LWS makes a Volcano PodGroup per group, of ``size`` members, and
    names it on the pods), the leader from the worker template, the whole group recreated when one of its
    pods restarts or goes (LWS's default)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LeaderWorkerSet", "metadata": {"name": name},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {
                "size": size, "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": {"spec": {"schedulerName": "volcano", "automountServiceAccountToken": False,
                                            "containers": [{"name": "main", "image": "vllm:1", "resources": {
                                                "limits": {"nvidia.com/gpu": "1"}}}]}}}}}


async def _group(core: client.CoreV1Api, compute: client.ApiClient, ns: str,
                 names: list[str]) -> dict[str, tuple[Any, Any]] | None:
    """Each of the tenant pods ``names`` Running, with its one live compute copy Running with an IP, once
    the compute namespace holds no other copy of those names."""
    tenant = {p.metadata.name: p for p in (await core.list_namespaced_pod(ns)).items}
    copies = [c for c in await compute_copies(compute, ns)
              if c.metadata.annotations[naming.UPSTREAM_NAME_ANNOTATION] in names]
    out = {}
    for name in names:
        pod = tenant.get(name)
        mine = [c for c in copies if c.metadata.annotations[naming.UPSTREAM_NAME_ANNOTATION] == name]
        if pod is None or pod.status.phase != "Running" or len(mine) != 1:
            return None
        cp = mine[0]
        if cp.metadata.labels[naming.UPSTREAM_UID_LABEL] != pod.metadata.uid or cp.status.phase != "Running" \
                or not cp.status.pod_ip or cp.metadata.deletion_timestamp is not None:
            return None
        out[name] = (pod, cp)
    return out


async def _groups_of(api: client.ApiClient, ns: str, lws: str,
                     leader_uid: str) -> tuple[list[dict[str, Any]]] | None:
    """The set's PodGroups (in a tuple: none is an answer too), once every one left is owned by the leader
    of ``leader_uid`` (none at all, or the one LWS made for that leader)."""
    groups = (await client.CustomObjectsApi(api).list_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", ns, "podgroups",
        label_selector=f"leaderworkerset.sigs.k8s.io/name={lws}"))["items"]
    owners = {o["uid"] for g in groups for o in g["metadata"].get("ownerReferences") or []}
    return (groups,) if owners <= {leader_uid} and not any(g["metadata"].get("deletionTimestamp") for g in groups) \
        else None


async def _running_gang(api: client.ApiClient, ns: str, lws: str) -> dict[str, Any] | None:
    """The Volcano PodGroup LWS made for the set's one group, once Running and not being deleted."""
    groups = (await client.CustomObjectsApi(api).list_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", ns, "podgroups",
        label_selector=f"leaderworkerset.sigs.k8s.io/name={lws}"))["items"]
    live = [g for g in groups if not g["metadata"].get("deletionTimestamp")]
    return live[0] if len(live) == 1 and (live[0].get("status") or {}).get("phase") == "Running" else None


@pytest.mark.usefixtures("lws_controller")
async def test_a_leader_worker_groups_worker_finds_its_leader_and_the_group_is_recreated_whole(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, peer_dns: PeerDNS) -> None:
    core, sets = client.CoreV1Api(tenant_api), client.CustomObjectsApi(tenant_api)
    await sets.create_namespaced_custom_object(GROUP, VERSION, tenant_ns, PLURAL, leader_worker_set("llm", 2))
    names = ["llm-0", "llm-0-1"]
    group = await eventually(lambda: _group(core, compute_api, tenant_ns, names), timeout=90,
                             what="the group's leader and worker Running, each with its copy")
    (leader, leader_copy), (worker, worker_copy) = group["llm-0"], group["llm-0-1"]
    gang = await eventually(lambda: _running_gang(tenant_api, tenant_ns, "llm"), timeout=30,
                            what="LWS's Volcano PodGroup Running (the vnode is the tenant's Volcano)")
    assert gang["spec"]["minMember"] == 2 and leader_copy.metadata.labels.get(POD_GROUP_LABEL) \
        == worker_copy.metadata.labels.get(POD_GROUP_LABEL) is not None, "one gang in the compute cluster"
    env = {e.name: e.value for e in worker.spec.containers[0].env or []}
    address = env.get("LWS_LEADER_ADDRESS")
    assert address == f"llm-0.llm.{tenant_ns}", env  # LWS's pod webhook, in the tenant cluster
    for name in (address, f"{address}.svc.cluster.local"):
        assert await resolve(peer_dns, worker_copy, name) == [leader_copy.status.pod_ip], name

    await core.delete_namespaced_pod("llm-0-1", tenant_ns)  # LWS recreates the whole group

    async def recreated() -> dict[str, tuple[Any, Any]] | None:
        now = await _group(core, compute_api, tenant_ns, names)
        return now if now and now["llm-0"][0].metadata.uid != leader.metadata.uid \
            and now["llm-0-1"][0].metadata.uid != worker.metadata.uid else None

    group = await eventually(recreated, timeout=120, what="the group recreated under its names, one copy each")
    old = {leader_copy.metadata.name: leader.metadata.uid, worker_copy.metadata.name: worker.metadata.uid}
    assert not [c for c in await compute_copies(compute_api, tenant_ns)
                if c.metadata.labels[naming.UPSTREAM_UID_LABEL] in old.values()], "no copy of the old group"
    new_leader, new_worker = group["llm-0"][1], group["llm-0-1"][1]
    assert new_leader.metadata.labels.get(POD_GROUP_LABEL) == new_worker.metadata.labels.get(POD_GROUP_LABEL) \
        is not None, "the new group runs as one gang"
    # Which PodGroup the new group has is a race of LWS's: when the new leader finds the old group's PodGroup
    # (owned by the old leader) not yet collected, LWS keeps it and the tenant's garbage collector removes
    # it later, leaving none; otherwise LWS makes a new one. Either way the running group is left alone.
    new_uid = group["llm-0"][0].metadata.uid
    (groups,) = await eventually(lambda: _groups_of(tenant_api, tenant_ns, "llm", new_uid), timeout=120,
                                 what="the old leader's PodGroup collected")
    if groups:
        await eventually(lambda: _running_gang(tenant_api, tenant_ns, "llm"), timeout=30,
                         what="the new leader's PodGroup Running")
    still = await _group(core, compute_api, tenant_ns, names)
    assert still is not None and {n: p.metadata.uid for n, (p, _) in still.items()} == \
        {n: p.metadata.uid for n, (p, _) in group.items()}, "the running group undisturbed"
    assert await resolve(peer_dns, new_worker, address) == [new_leader.status.pod_ip]

    await sets.delete_namespaced_custom_object(GROUP, VERSION, tenant_ns, PLURAL, "llm")

    async def collected() -> bool:
        return not [c for c in await compute_copies(compute_api, tenant_ns)
                    if c.metadata.annotations[naming.UPSTREAM_NAME_ANNOTATION] in names]

    await eventually(collected, timeout=90, what="no copy left once the LeaderWorkerSet is deleted")


@pytest.mark.usefixtures("lws_controller")
async def test_exclusive_placement_gives_each_leader_worker_group_a_rack_of_its_own_in_the_compute_cluster(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """LWS's exclusive placement (one group per rack): LWS reads its leader's node's rack for the workers'
    nodeSelector; the virtual node carries the rack key with its own name (it stands for several racks), and
    a worker's copy follows its leader by a pod affinity with its group instead, as a leader's copy keeps
    LWS's affinity with its group and anti-affinity with the others: each group runs in one compute rack,
    the two in different racks."""
    body = leader_worker_set("excl", 2)
    body["metadata"]["annotations"] = {"leaderworkerset.sigs.k8s.io/exclusive-topology": DOMAIN_LABEL}
    body["spec"]["replicas"] = 2
    await client.CustomObjectsApi(tenant_api).create_namespaced_custom_object(GROUP, VERSION, tenant_ns, PLURAL,
                                                                              body)
    by_group = await eventually(
        lambda: racks_of_groups(compute_api, tenant_ns, "leaderworkerset.sigs.k8s.io/group-index", 4), timeout=180,
        what="the two groups' 4 pods Running in the compute cluster")
    assert sorted(by_group) == ["0", "1"] and all(len(r) == 1 for r in by_group.values()), by_group
    assert by_group["0"] != by_group["1"], by_group
    for copy in await compute_copies(compute_api, tenant_ns):
        if copy.metadata.labels.get("leaderworkerset.sigs.k8s.io/worker-index") not in (None, "0"):
            assert DOMAIN_LABEL not in (copy.spec.node_selector or {}), copy.spec.node_selector
            (near,) = copy.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
            assert near.topology_key == DOMAIN_LABEL
    await client.CustomObjectsApi(tenant_api).delete_namespaced_custom_object(GROUP, VERSION, tenant_ns, PLURAL,
                                                                              "excl")
