"""Hostile and broken tenant pods, generated (hypothesis) and submitted to the real tenant API server.

Each generated pod is either rejected by the API server with a message, or, once accepted, explained
where its user looks within a deadline: it runs, it fails with a reason, a Warning Event names it, or
its PodScheduled condition says why it waits. Meanwhile the vnodes and the scheduler stay up, and a
plain pod submitted beside the batch still runs to completion. Examples are derandomised, so CI sees
the same ones every run."""

from __future__ import annotations

import asyncio
import copy
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import api_client, eventually
from tests.integration.test_vnode import tenant_pod

Obj = dict[str, Any]
EXPLAINED_WITHIN_S = 90.0

ANNOTATION_KEYS = ("kubeferry.io/gpu-milli", "kubeferry.io/queue", "kubeferry.io/tier", "kubeferry.io/priority",
                   "kubeferry.io/gpu-model", "scheduling.k8s.io/group-name", "kubeferry.io/sim-exit-code")
ODD_VALUES = ("250", "0", "-5", "1001", "99999999999999999999", "abc", "½", "tenant-2", "Guaranteed", "Elastic",
              "H900", "", " ", "1e3", "\u202e")
GPU_LIMITS = ("1", "1", "0", "2", "64", "-1", "1.5", "abc", "1Ki")
HOSTILE = (None, None, "hostPath", "privileged", "hostNetwork", "capabilities", "hostPort", "unsupportedVolume")


def _hostile(spec: Obj, kind: str | None) -> None:
    container = spec["containers"][0]
    if kind == "hostPath":
        spec["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
        container["volumeMounts"] = [{"name": "root", "mountPath": "/host"}]
    elif kind == "privileged":
        container["securityContext"] = {"privileged": True}
    elif kind == "hostNetwork":
        spec["hostNetwork"] = True
    elif kind == "capabilities":
        container["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    elif kind == "hostPort":
        container["ports"] = [{"containerPort": 80, "hostPort": 80}]
    elif kind == "unsupportedVolume":
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "nowhere"}}]
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]


@st.composite
def pods(draw: st.DrawFn) -> Obj:
    short = st.from_regex(r"[a-z][a-z0-9]{0,12}", fullmatch=True)
    long = st.from_regex(r"[a-z][a-z0-9-]{40,61}[a-z0-9](\.[a-z][a-z0-9]{40,61}){1,3}", fullmatch=True)  # ≤ 253
    broken = st.one_of(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=260),
                       st.text(min_size=1, max_size=20))
    name = draw(st.one_of(short, short, long, broken))
    body = tenant_pod("x", duration="1s")
    body["metadata"]["name"] = name
    annotations = draw(st.dictionaries(st.sampled_from(ANNOTATION_KEYS),
                                       st.one_of(st.sampled_from(ODD_VALUES), st.text(max_size=30)), max_size=3))
    body["metadata"]["annotations"].update(annotations)
    if draw(st.booleans()):
        body["metadata"]["labels"] = {"kubeferry.io/pod-group": draw(st.sampled_from(("g", "tenant-2-gang", "x" * 63)))}
    limit = draw(st.sampled_from(GPU_LIMITS))
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": limit}}
    _hostile(body["spec"], draw(st.sampled_from(HOSTILE)))
    return body


async def _explanation(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    """Where the user would read what happened to this pod, if anywhere yet."""
    pod = await core.read_namespaced_pod(name, ns)
    st_ = pod.status
    if st_.phase in ("Running", "Succeeded"):
        return st_.phase
    if st_.phase == "Failed":
        exits = [f"exit code {cs.state.terminated.exit_code}" for cs in st_.container_statuses or []
                 if cs.state and cs.state.terminated]
        why = st_.reason or st_.message or ", ".join(exits)
        return f"Failed: {why}" if why else None
    for c in st_.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.message:
            return f"PodScheduled=False: {c.message}"
    events = await core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
    warnings = [e for e in events.items if e.type == "Warning" and e.message]
    return f"Event {warnings[0].reason}: {warnings[0].message}" if warnings else None


async def _submit_batch(planes: ControlPlanes, batch: list[Obj]) -> dict[str, str]:
    """What became of each pod: the API's rejection or the explanation its user sees."""
    outcome: dict[str, str] = {}
    async with api_client(planes.kubeconfig("tenant-1")) as api:
        core = client.CoreV1Api(api)
        ns = f"fuzz-{uuid.uuid4().hex[:8]}"
        await core.create_namespace({"metadata": {"name": ns}})
        try:
            await eventually(lambda: _has_sa(core, ns), timeout=30, what=f"ServiceAccount in {ns}")
            accepted, rejected = [], []
            for body in batch:
                try:
                    await core.create_namespaced_pod(ns, body)
                    accepted.append(body["metadata"]["name"])
                except ApiException as exc:
                    rejected.append(exc)
                    outcome[body["metadata"]["name"]] = f"rejected {exc.status}"
            for exc in rejected:  # a clear rejection: invalid (422) or malformed (400), with the reason
                assert exc.status in (400, 422), f"{exc.status} {exc.reason}"
                assert exc.body and "message" in exc.body, "a rejection says why"
            await core.create_namespaced_pod(ns, tenant_pod("control", duration="1s"))
            missing = list(accepted)

            async def all_explained() -> bool:
                for name in list(missing):
                    if why := await _explanation(core, ns, name):
                        outcome[name] = why
                        missing.remove(name)
                return not missing

            try:
                await eventually(all_explained, timeout=EXPLAINED_WITHIN_S, what="every accepted pod explained")
            except AssertionError as exc:
                raise AssertionError(f"no explanation for {missing} (others: {outcome})") from exc

            async def control_done() -> bool:
                return bool((await core.read_namespaced_pod("control", ns)).status.phase == "Succeeded")

            await eventually(control_done, timeout=60, what="the plain pod beside the batch Succeeded")
        finally:
            await core.delete_namespace(ns)
    return outcome


async def _has_sa(core: client.CoreV1Api, ns: str) -> bool:
    return any(sa.metadata.name == "default" for sa in (await core.list_namespaced_service_account(ns)).items)


@pytest.mark.faults
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is minutes on real servers
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(batch=st.lists(pods(), min_size=10, max_size=10, unique_by=lambda p: str(p["metadata"]["name"])))
def test_hostile_pods_are_rejected_or_explained_and_nothing_stops(
        planes: ControlPlanes, vnodes: dict[str, Component], ferry_scheduler: Component, batch: list[Obj]) -> None:
    outcome = asyncio.run(_submit_batch(planes, copy.deepcopy(batch)))
    assert len(outcome) == len(batch)
    for name, comp in (*vnodes.items(), ("scheduler", ferry_scheduler)):
        assert comp.alive(), f"{name} died on the batch: {outcome}"
    hostile = [b["metadata"]["name"] for b in batch if b["spec"].get("hostNetwork") or b["spec"].get("volumes")
               or b["spec"]["containers"][0].get("securityContext") or b["spec"]["containers"][0].get("ports")]
    for name in hostile:  # rejected, refused by the vnode or never placed: never run
        assert not outcome[name].startswith(("Running", "Succeeded")), (name, outcome[name])
