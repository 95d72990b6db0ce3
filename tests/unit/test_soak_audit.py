"""The soak's audit: each count it prints moves with the fault it names, and a healthy picture is clean."""

from __future__ import annotations

from typing import Any

from ferry.keys import GPU, POD_GROUP_LABEL
from tests.soak import audit
from vnode import naming

Obj = dict[str, Any]


def tenant_pod(name: str, phase: str = "Running", node: str = "ferry-tenant-1", reason: str | None = None) -> Obj:
    status: Obj = {"phase": phase}
    if reason:
        status["reason"] = reason
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {"nodeName": node}, "status": status}


def copy(name: str, phase: str = "Running", node: str = "kwok-0", gpus: int = 1, group: str | None = None,
         deleting: bool = False) -> Obj:
    labels = {naming.UPSTREAM_UID_LABEL: f"uid-{name}"}
    if group:
        labels[POD_GROUP_LABEL] = group
    meta: Obj = {"name": f"c-{name}", "namespace": "tenant-1", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [
        {"name": "w", "resources": {"limits": {GPU: str(gpus)}}}]}, "status": {"phase": phase}}


def queue(allocated: str) -> Obj:
    return {"metadata": {"name": "tenant-1"}, "spec": {"namespaces": ["tenant-1"]},
            "status": {"allocated": {"gpu": allocated}}}


def group(name: str, min_member: int) -> Obj:
    return {"metadata": {"namespace": "tenant-1", "name": name}, "spec": {"minMember": min_member}}


def test_a_healthy_picture_is_clean() -> None:
    pods = [tenant_pod("a"), tenant_pod("b", "Succeeded")]
    result = audit({"tenant-1": pods}, [copy("a", gpus=2), copy("b", "Succeeded")], [], [queue("2")])
    assert result.clean(), result


def test_each_fault_is_counted_under_its_name() -> None:
    tenant = [tenant_pod("dup"), tenant_pod("lost"), tenant_pod("gone", "Failed", reason="ComputePodLost"),
              tenant_pod("behind", "Pending"), tenant_pod("waiting", "Pending", node="")]
    compute = [copy("dup"), copy("dup"), copy("behind", "Running"), copy("orphan"),
               copy("old", deleting=True)]  # being deleted: not an orphan
    result = audit({"tenant-1": tenant}, compute, [], [queue("4")], vanished=1)
    assert (result.duplicates, result.orphans, result.status_mismatches) == (1, 1, 1)
    assert result.lost == 3  # bound without a copy, ComputePodLost, and the one vanished
    assert result.unsettled == 2  # behind and waiting are neither Running nor terminal
    assert result.accounting_off_gpus == 0  # four live copies hold one GPU each, as the Queue says
    assert not result.clean() and result.examples


def test_a_gang_bound_below_its_minimum_is_partial_but_a_finishing_one_is_not() -> None:
    members = [tenant_pod(f"g{i}") for i in range(4)]
    half = [copy("g0", group="g"), copy("g1", group="g"), copy("g2", node="", phase="Pending", group="g"),
            copy("g3", node="", phase="Pending", group="g")]
    result = audit({"tenant-1": members}, half, [group("g", 4)], [])
    assert result.partial_gangs == 1
    finishing = [copy("g0", group="g"), copy("g1", "Succeeded", group="g"), copy("g2", "Succeeded", group="g"),
                 copy("g3", "Succeeded", group="g")]
    done = [tenant_pod("g0"), *(tenant_pod(f"g{i}", "Succeeded") for i in (1, 2, 3))]
    assert audit({"tenant-1": done}, finishing, [group("g", 4)], []).partial_gangs == 0


def test_a_queue_that_miscounts_its_pods_is_off_by_the_difference() -> None:
    pods = [tenant_pod("a"), tenant_pod("b", "Succeeded")]
    compute = [copy("a", gpus=8), copy("b", "Succeeded", gpus=8)]  # a finished pod holds nothing
    assert audit({"tenant-1": pods}, compute, [], [queue("16")]).accounting_off_gpus == 8
    assert audit({"tenant-1": pods}, compute, [], [queue("8")]).accounting_off_gpus == 0


def test_a_failed_batch_job_is_counted_though_every_pod_is_clean() -> None:
    pods = [tenant_pod("b1-x"), tenant_pod("b1-y")]
    compute = [copy("b1-x"), copy("b1-y")]
    assert audit({"tenant-1": pods}, compute, [], []).clean()
    result = audit({"tenant-1": pods}, compute, [], [], failed_jobs={"tenant-1/b1"})
    assert result.failed_jobs == 1 and not result.clean() and "tenant-1/b1" in result.examples[0]
