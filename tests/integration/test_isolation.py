"""Tenant isolation through the bridge, each check one that fails if the protection breaks: what a
tenant writes cannot pick the compute scheduler's queue, priority, gang or scheduler, and no Secret or
token value ever shows in Kube-Ferry's logs or in Events."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.cluster.planes import ControlPlanes
from tests.helpers import eventually
from tests.integration.test_vnode import compute_pod_of, tenant_pod

pytestmark = pytest.mark.usefixtures("vnodes")


async def _running(core: client.CoreV1Api, ns: str, name: str) -> Any:
    pod = await core.read_namespaced_pod(name, ns)
    return pod if pod.status.phase == "Running" else None


async def test_a_tenant_cannot_choose_queue_priority_gang_or_scheduler_in_the_compute_cluster(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    body = tenant_pod("climber")
    body["metadata"]["annotations"].update({"kubeferry.io/queue": "tenant-2", "kubeferry.io/tier": "Guaranteed",
                                            "kubeferry.io/priority": "1000000"})
    body["metadata"]["labels"] = {"kubeferry.io/pod-group": "tenant-2-gang", "kubeferry.io/queue": "tenant-2"}
    body["spec"].update({"priorityClassName": "system-cluster-critical", "preemptionPolicy": "PreemptLowerPriority",
                         "schedulerName": "default-scheduler"})
    uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid
    await eventually(lambda: _running(core, tenant_ns, "climber"), what="climber Running")
    cpod = await compute_pod_of(compute_api, "tenant-1", uid)
    assert cpod.metadata.namespace == "tenant-1", "its own namespace, so its own Queue"
    assert cpod.spec.scheduler_name == "kube-ferry"
    assert not cpod.spec.priority_class_name and not cpod.spec.priority, "no priority from the tenant"
    kept = {**(cpod.metadata.annotations or {}), **(cpod.metadata.labels or {})}
    assert "tenant-2" not in " ".join(f"{k}={v}" for k, v in kept.items()), kept
    assert "kubeferry.io/pod-group" not in kept and "kubeferry.io/tier" not in kept


async def test_secret_and_token_values_never_reach_logs_or_events(
        planes: ControlPlanes, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    core = client.CoreV1Api(tenant_api)
    value = f"s3cr3t-{uuid.uuid4().hex}"
    await core.create_namespaced_secret(tenant_ns, {"metadata": {"name": "creds"}, "stringData": {"key": value}})
    body = tenant_pod("keeper", duration="2s")
    body["spec"]["volumes"] = [
        {"name": "creds", "secret": {"secretName": "creds"}},
        {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "token",
                                                                          "expirationSeconds": 600}}]}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "creds", "mountPath": "/creds"},
                                                     {"name": "tok", "mountPath": "/tok"}]
    body["spec"]["containers"][0]["env"] = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                                         "key": "key"}}}]
    uid = (await core.create_namespaced_pod(tenant_ns, body)).metadata.uid

    async def succeeded() -> bool:
        return (await core.read_namespaced_pod("keeper", tenant_ns)).status.phase == "Succeeded"

    await eventually(succeeded, timeout=40, what="keeper Succeeded")
    cpod = await compute_pod_of(compute_api, "tenant-1", uid)
    ccore = client.CoreV1Api(compute_api)
    token_secret = next(s.secret.name for v in cpod.spec.volumes if v.projected
                        for s in v.projected.sources if s.secret and s.secret.name.endswith("-sa-token"))
    token = base64.b64decode((await ccore.read_namespaced_secret(token_secret, "tenant-1")).data["token"]).decode()
    copied = next(v.secret.secret_name for v in cpod.spec.volumes if v.secret)
    assert base64.b64decode((await ccore.read_namespaced_secret(copied, "tenant-1")).data["key"]).decode() == value

    logs = planes.dir / "logs"
    ours = [p for p in logs.glob("*.log") if "vnode" in p.name or "kube-ferry-scheduler" in p.name]
    assert any("vnode" in p.name for p in ours) and any("scheduler" in p.name for p in ours)
    for path in ours:
        text = path.read_text(errors="replace")
        assert value not in text, f"the Secret's value is in {path.name}"
        assert token not in text and token.split(".")[-1] not in text, f"a token is in {path.name}"
    for api, ns in ((tenant_api, tenant_ns), (compute_api, "tenant-1")):
        for event in (await client.CoreV1Api(api).list_namespaced_event(ns)).items:
            said = f"{event.message} {event.reason}"
            assert value not in said and token not in said, event
