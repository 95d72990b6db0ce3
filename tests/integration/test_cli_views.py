"""`ferry status` and `ferry why-pending` (also `kubectl ferry ...`) as users run them, against the
compute cluster and a tenant cluster of the real control planes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.cluster.planes import ControlPlanes
from tests.helpers import eventually
from tests.integration.test_gang_lifecycle import VOLCANO, member, tenant_group
from tests.integration.test_scheduler_service import GROUP, VERSION, _make_queue, _sa, fill_then_preempt, pod
from tests.integration.test_vnode import tenant_pod

pytestmark = pytest.mark.usefixtures("vnodes")


def ferry(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry", *args, f"--kubeconfig={kubeconfig}"], capture_output=True,
                          text=True, timeout=60, check=False)


def verdict(kubeconfig: Path, ns: str, target: str) -> dict[str, Any]:
    res = ferry(kubeconfig, "why-pending", target, "-n", ns, "-o", "json")
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


async def test_status_shows_queue_use_equal_to_a_recount_and_the_virtual_node(
        planes: ControlPlanes, compute_api: client.ApiClient, tenant_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    body = tenant_pod("holder", gpus=2)
    await core.create_namespaced_pod(tenant_ns, body)

    async def running() -> bool:
        return (await core.read_namespaced_pod("holder", tenant_ns)).status.phase == "Running"

    await eventually(running, timeout=30, what="holder Running")

    async def agrees() -> tuple[str, float] | None:
        pods = (await client.CoreV1Api(compute_api).list_namespaced_pod("tenant-1")).items
        recount = sum(float(c.resources.limits.get("nvidia.com/gpu", 0)) for p in pods
                      if p.spec.node_name and p.status.phase in ("Pending", "Running")
                      and not p.metadata.deletion_timestamp for c in p.spec.containers if c.resources.limits)
        res = ferry(planes.kubeconfig("compute"), "status", "-o", "json")
        assert res.returncode == 0, res.stderr
        row = next(q for q in json.loads(res.stdout)["queues"] if q["NAME"] == "tenant-1")
        return (row["ALLOCATED"], recount) if float(row["ALLOCATED"]) == recount and recount >= 2 else None

    await eventually(agrees, timeout=30, what="queue tenant-1 ALLOCATED equal to a recount from pods")
    table = ferry(planes.kubeconfig("compute"), "status").stdout
    assert table.splitlines()[0].split()[:4] == ["NAME", "GUARANTEED", "MAX", "ALLOCATED"]

    res = ferry(planes.kubeconfig("tenant-1"), "status", "-o", "json")
    (row,) = json.loads(res.stdout)["virtualNodes"]
    node = await core.read_node("ferry-tenant-1")
    assert row["NODE"] == "ferry-tenant-1" and row["GPUS"] == node.status.allocatable["nvidia.com/gpu"]
    assert float(row["GPUS-IN-USE"]) >= 2 and row["COMPUTE-REACHABLE"] == "True" and row["TENANT-ACCESS"] == "True"


async def test_why_pending_from_a_tenant_cluster(planes: ControlPlanes, tenant_api: client.ApiClient,
                                                 tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    kc = planes.kubeconfig("tenant-1")
    # A gang short of GPUs: its replicas are bigger than any compute node.
    await tenant_group(tenant_api, VOLCANO, tenant_ns, "big", 2)
    for i in range(2):
        body = member(f"big-{i}", "volcano", "big")
        body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "16"
        await core.create_namespaced_pod(tenant_ns, body)

    async def explained() -> dict[str, Any] | None:  # first "waiting for gang members", then the verdict
        v = verdict(kc, tenant_ns, "podgroup/big")
        return v if "no node has 16 GPUs" in v["message"] else None

    v = await eventually(explained, timeout=30, what="the scheduler's reason for the gang")
    assert v["state"] == "Pending" and "ask for less" in v["hint"]
    assert "no node has 16 GPUs" in verdict(kc, tenant_ns, "big-0")["message"]

    # A pod refused as unsafe.
    unsafe = tenant_pod("unsafe", gpus=0)
    unsafe["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    await core.create_namespaced_pod(tenant_ns, unsafe)

    async def refused() -> dict[str, Any] | None:
        v = verdict(kc, tenant_ns, "unsafe")
        return v if v["state"] == "Failed" else None

    v = await eventually(refused, timeout=30, what="the refusal")
    assert v["reason"] == "Refused" and "privileged" in v["message"]
    text = ferry(kc, "why-pending", "unsafe", "-n", tenant_ns).stdout
    assert "Refused" in text and "What would let it run" in text

    missing = ferry(kc, "why-pending", "nothing-here", "-n", tenant_ns)
    assert missing.returncode != 0 and "no pod" in missing.stderr


async def test_why_pending_in_the_compute_cluster(planes: ControlPlanes, compute_api: client.ApiClient,
                                                  compute_ns: str) -> None:
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    kc = planes.kubeconfig("compute")
    capped = f"cap-{compute_ns}"
    await custom.create_cluster_custom_object(GROUP, VERSION, "queues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": capped},
        "spec": {"namespaces": [compute_ns], "max": {"gpu": "1"}}})
    try:
        # A queue at its maximum: two GPUs asked, one allowed.
        await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "over"},
            "spec": {"minMember": 1, "queue": capped}})
        await core.create_namespaced_pod(compute_ns, pod("over-0", compute_ns, gpus=2, group="over"))
        # An unknown queue.
        await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "lost"},
            "spec": {"minMember": 1, "queue": "no-such-queue"}})
        await core.create_namespaced_pod(compute_ns, pod("lost-0", compute_ns, group="lost"))

        async def reasons() -> tuple[dict[str, Any], dict[str, Any]] | None:
            a, b = verdict(kc, compute_ns, "podgroup/over"), verdict(kc, compute_ns, "lost-0")
            return (a, b) if a["reason"] == "Unschedulable" and b["reason"] == "InvalidSpec" else None

        over, lost = await eventually(reasons, timeout=30, what="reasons for both groups")
        assert "maximum of 1 GPUs" in over["message"] and "spec.max" in over["hint"], over
        assert lost["reason"] == "InvalidSpec" and "no-such-queue" in lost["message"], lost
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", capped)


async def test_usage_matches_the_pods_run_times_and_outlives_them_and_the_scheduler(
        planes: ControlPlanes, compute_api: client.ApiClient, compute_ns: str, ferry_scheduler: Any) -> None:
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    kc = planes.kubeconfig("compute")
    await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": "acct"}, "spec": {"minMember": 2}})
    for i in range(2):
        body = pod(f"acct-{i}", compute_ns, gpus=2, group="acct", duration="3s")
        del body["spec"]["nodeSelector"]  # any node
        await core.create_namespaced_pod(compute_ns, body)

    async def finished() -> list[Any] | None:
        items = (await core.list_namespaced_pod(compute_ns)).items
        return items if len(items) == 2 and all(p.status.phase == "Succeeded" for p in items) else None

    pods = await eventually(finished, timeout=40, what="both pods Succeeded")
    expected = sum((p.status.container_statuses[0].state.terminated.finished_at - p.status.start_time)
                   .total_seconds() * 2 for p in pods)
    assert expected >= 2 * 2 * 3 * 0.9, expected

    def recorded() -> dict[str, Any] | None:
        res = ferry(kc, "usage", "--by", "job", "-o", "json")
        assert res.returncode == 0, res.stderr
        row = next((r for r in json.loads(res.stdout) if r["NAMESPACE"] == compute_ns and r["JOB"] == "acct"), None)
        return row if row and row["PODS"] == 2 else None

    row = await eventually(recorded, timeout=30, what="a usage record for both pods")
    assert abs(row["GPU-SECONDS"] - expected) <= 0.01 * expected, (row, expected)

    # The record outlives the pods, their PodGroup and the scheduler process.
    ferry_scheduler.kill()
    try:
        for p in pods:
            await core.delete_namespaced_pod(p.metadata.name, compute_ns, grace_period_seconds=0)
        await custom.delete_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", "acct")
        after = recorded()
        assert after is not None and after["GPU-SECONDS"] == row["GPU-SECONDS"]
        by_queue = json.loads(ferry(kc, "usage", "-o", "json").stdout)
        assert any(q["QUEUE"] == "default" and q["GPU-SECONDS"] >= row["GPU-SECONDS"] for q in by_queue)
        assert not json.loads(ferry(kc, "usage", "--since", "2020-01-01T00:00:00Z", "--until",
                                    "2020-01-02T00:00:00Z", "-o", "json").stdout), "nothing in a range before it"
    finally:
        ferry_scheduler.start()
        ferry_scheduler.wait_ready()


async def test_why_pending_names_a_preemption_grace_period(
        planes: ControlPlanes, compute_api: client.ApiClient, compute_ns: str, private_node: str) -> None:
    """A guaranteed gang that must wait while its victims checkpoint: the reason and the hint say so."""
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    queue = f"p-{compute_ns}"
    await _make_queue(custom, queue, compute_ns, victimGraceSeconds=300)
    try:
        await fill_then_preempt(core, custom, compute_ns, queue)

        seen: list[dict[str, Any]] = []

        def waiting() -> dict[str, Any] | None:
            seen.append(verdict(planes.kubeconfig("compute"), compute_ns, "podgroup/g"))
            return seen[-1] if seen[-1]["message"].startswith("preempting: waiting for 1 job(s)") else None

        try:
            v = await eventually(waiting, timeout=30, what="podgroup/g waiting for its victims")
        except AssertionError:
            raise AssertionError(f"last verdict: {seen[-1:]}") from None
        assert v["state"] == "Pending" and "grace period" in v["hint"], v
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)
