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
from ferry.kube.rest import Rest, path
from tests.helpers import api_client, eventually
from tests.integration.test_vnode import tenant_pod
from vnode import naming

Obj = dict[str, Any]
EXPLAINED_WITHIN_S = 90.0
FERRY = ("scheduling.kubeferry.io", "v1alpha1")
# Examples are derandomised (CI sees the same ones every run) and never shrunk: each is a batch on real
# API servers, seconds to minutes, not a function call.
ON_REAL_SERVERS = settings(deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
                           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                  HealthCheck.data_too_large])

ANNOTATION_KEYS = ("kubeferry.io/gpu-milli", "kubeferry.io/queue", "kubeferry.io/tier", "kubeferry.io/priority",
                   "kubeferry.io/gpu-model", "scheduling.k8s.io/group-name", "kubeferry.io/sim-exit-code")
ODD_VALUES = ("250", "0", "-5", "1001", "99999999999999999999", "abc", "½", "tenant-2", "Guaranteed", "Elastic",
              "H900", "", " ", "1e3", "\u202e")
GPU_LIMITS = ("1", "1", "0", "2", "64", "-1", "1.5", "abc", "1Ki")
HOSTILE = (None, None, "hostPath", "privileged", "hostNetwork", "capabilities", "hostPort", "unsupportedVolume",
           "seccompUnconfined", "unsafeSysctl", "procMount")

# where a pod says it may run: met by the virtual node and the compute nodes, met by no node, one per node,
# together in a rack, together by a label no node has, spread over nodes
PLACEMENT = (None, None, None, "affinity", "affinityNowhere", "antiAffinity", "together", "togetherNowhere",
             "spread")


def _placement(body: Obj, kind: str | None) -> None:
    model = {"key": "kubeferry.io/gpu-model", "operator": "NotIn" if kind == "affinity" else "In", "values": ["H900"]}
    if kind in ("affinity", "affinityNowhere"):
        on_vnode = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["ferry-tenant-1"]}
        body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [on_vnode, model]}]}}}
    elif kind == "antiAffinity":
        body["metadata"].setdefault("labels", {})["app"] = "apart"
        body["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "apart"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    elif kind in ("together", "togetherNowhere"):
        body["metadata"].setdefault("labels", {})["app"] = "close"
        key = "kubeferry.io/topology-domain" if kind == "together" else "example.com/no-such-label"
        body["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "close"}}, "topologyKey": key}]}}
    elif kind == "spread":
        body["metadata"].setdefault("labels", {})["app"] = "even"
        body["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                      "whenUnsatisfiable": "DoNotSchedule",
                                                      "labelSelector": {"matchLabels": {"app": "even"}}}]


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
    elif kind == "seccompUnconfined":
        container["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    elif kind == "unsafeSysctl":
        spec["securityContext"] = {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}
    elif kind == "procMount":
        container["securityContext"] = {"procMount": "Unmasked"}
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
    _placement(body, draw(st.sampled_from(PLACEMENT)))
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
        why = ": ".join(x for x in (st_.reason, st_.message) if x) or ", ".join(exits)
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
            _clear(rejected)
            await _explained_beside_a_plain_pod(core, ns, accepted, outcome)
        finally:
            await core.delete_namespace(ns)
    return outcome


async def _explained_beside_a_plain_pod(core: client.CoreV1Api, ns: str, names: list[str],
                                       outcome: dict[str, str]) -> None:
    """Each pod of ``names`` explained where its user looks (into ``outcome``), and a plain pod submitted
    beside them runs to completion."""
    await core.create_namespaced_pod(ns, tenant_pod("control", duration="1s"))
    missing = list(names)

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


def _clear(rejected: list[ApiException]) -> None:
    """A clear rejection: invalid (422) or malformed (400), with the reason."""
    for exc in rejected:
        assert exc.status in (400, 422), f"{exc.status} {exc.reason}"
        assert exc.body and "message" in exc.body, "a rejection says why"


async def _has_sa(core: client.CoreV1Api, ns: str) -> bool:
    return any(sa.metadata.name == "default" for sa in (await core.list_namespaced_service_account(ns)).items)


@pytest.mark.faults
@settings(ON_REAL_SERVERS, max_examples=4)
@given(batch=st.lists(pods(), min_size=10, max_size=10, unique_by=lambda p: str(p["metadata"]["name"])))
def test_hostile_pods_are_rejected_or_explained_and_nothing_stops(
        planes: ControlPlanes, vnodes: dict[str, Component], ferry_scheduler: Component, batch: list[Obj]) -> None:
    outcome = asyncio.run(_submit_batch(planes, copy.deepcopy(batch)))
    assert len(outcome) == len(batch)
    for name, comp in (*vnodes.items(), ("scheduler", ferry_scheduler)):
        assert comp.alive(), f"{name} died on the batch: {outcome}"
    hostile = [b["metadata"]["name"] for b in batch if b["spec"].get("hostNetwork") or b["spec"].get("volumes")
               or b["spec"].get("securityContext") or b["spec"]["containers"][0].get("securityContext")
               or b["spec"]["containers"][0].get("ports")]
    for name in hostile:  # rejected, refused by the vnode or never placed: never run
        assert not outcome[name].startswith(("Running", "Succeeded")), (name, outcome[name])


# ------------------------------------------------------------------------------- Queues (platform admins)
QUEUE_DEFECTS = ("unicode name", "long name", "max below guaranteed", "negative",
                 "text quantity", "weight", "grace", "parent", "bad namespace")


@st.composite
def queues(draw: st.DrawFn) -> Obj:
    """Queues as an admin might write them: most valid (some listing a namespace another Queue already
    lists), the others with one defect each: odd names and quantities, max below the guarantee, weights
    and graces out of range, an unknown field (a ``parent`` naming itself), an invalid namespace."""
    defect = draw(st.one_of(st.none(), st.sampled_from(QUEUE_DEFECTS)))  # about half are valid
    name = draw(st.from_regex(r"fz-[a-z0-9]{1,8}", fullmatch=True))
    if defect == "unicode name":
        name = draw(st.text(min_size=1, max_size=12).filter(lambda t: not t.isascii()))
    elif defect == "long name":
        name = draw(st.from_regex(r"fz-[a-z0-9-]{250,260}[a-z0-9]", fullmatch=True))
    guaranteed = draw(st.sampled_from(("0", "1", "8", "1.5", "99999999999999999999")))
    spec: Obj = {"namespaces": draw(st.lists(st.sampled_from(("tenant-1", "tenant-2", "fz-own")), max_size=2)),
                 "guaranteed": {"gpu": guaranteed}, "max": {"gpu": guaranteed + "0"},
                 "weight": draw(st.integers(1, 1000)),
                 "preemption": {"victimGraceSeconds": draw(st.integers(0, 86400)), "reclaim": draw(st.booleans())}}
    if defect == "max below guaranteed":
        spec["guaranteed"], spec["max"] = {"gpu": "16"}, {"gpu": "8"}
    elif defect == "negative":
        spec["guaranteed"] = {"gpu": "-1"}
    elif defect == "text quantity":
        spec["max"] = {"gpu": draw(st.sampled_from(("abc", "1e3", "", "½", "8Gi")))}
    elif defect == "weight":
        spec["weight"] = draw(st.sampled_from((0, -1, 1001, "abc")))
    elif defect == "grace":
        spec["preemption"]["victimGraceSeconds"] = draw(st.sampled_from((-1, 86401, "soon")))
    elif defect == "parent":
        spec["parent"] = name
    elif defect == "bad namespace":
        spec["namespaces"] = [draw(st.sampled_from(("x" * 64, "UPPER", "", "ünï")))]
    return {"apiVersion": "scheduling.kubeferry.io/v1alpha1", "kind": "Queue", "metadata": {"name": name,
            "annotations": {"fuzz/defect": str(defect)}}, "spec": spec}


async def _queue_batch(planes: ControlPlanes, batch: list[Obj]) -> dict[str, str]:
    """Each Queue's fate: the API's rejection, or the status and condition the scheduler writes on it."""
    outcome: dict[str, str] = {}
    async with api_client(planes.kubeconfig("compute")) as api:
        rest = Rest(api)
        made: list[str] = []
        rejected: list[ApiException] = []
        try:
            for body in batch:
                try:  # as kubectl sends it: unknown fields are errors, not silently dropped
                    await rest.call("POST", path(*FERRY, "queues"), body, query={"fieldValidation": "Strict"})
                    made.append(body["metadata"]["name"])
                except ApiException as exc:
                    rejected.append(exc)
                    outcome[body["metadata"]["name"]] = f"rejected {exc.status}"
            _clear(rejected)

            async def all_judged() -> bool:
                for name in made:
                    status = (await rest.get(path(*FERRY, "queues", name=name))).get("status") or {}
                    claimed = [c for c in status.get("conditions") or [] if c["type"] == "NamespacesClaimed"]
                    if "allocated" not in status or not claimed:
                        outcome[name] = f"no status yet: {status}"
                        return False
                    outcome[name] = f"{claimed[0]['status']}: {claimed[0]['message']}"
                return True

            try:
                await eventually(all_judged, timeout=60, what="a status on every accepted Queue")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {outcome}, batch {batch}") from exc
            async with api_client(planes.kubeconfig("tenant-1")) as tapi:
                core = client.CoreV1Api(tapi)
                ns = f"fuzz-{uuid.uuid4().hex[:8]}"
                await core.create_namespace({"metadata": {"name": ns}})
                try:
                    await eventually(lambda: _has_sa(core, ns), timeout=30, what=f"ServiceAccount in {ns}")
                    await _explained_beside_a_plain_pod(core, ns, [], outcome)
                finally:
                    await core.delete_namespace(ns)
            owner = (await rest.get(path(*FERRY, "queues", name="tenant-1")))["status"]["conditions"][0]
            assert owner["status"] == "True", f"the tenant's own Queue lost its namespace: {owner}"
        finally:
            for name in made:
                await rest.delete(path(*FERRY, "queues", name=name))
    return outcome


@pytest.mark.faults
@settings(ON_REAL_SERVERS, max_examples=3)
@given(batch=st.lists(queues(), min_size=10, max_size=10, unique_by=lambda q: str(q["metadata"]["name"])))
def test_broken_queues_are_rejected_or_judged_and_tenants_keep_their_namespaces(
        planes: ControlPlanes, vnodes: dict[str, Component], ferry_scheduler: Component, batch: list[Obj]) -> None:
    outcome = asyncio.run(_queue_batch(planes, copy.deepcopy(batch)))
    assert len(outcome) == len(batch)
    assert ferry_scheduler.alive(), f"the scheduler died on the batch: {outcome}"
    listed = {}
    for body in batch:
        name, defect = body["metadata"]["name"], body["metadata"]["annotations"]["fuzz/defect"]
        if defect != "None":  # every defect is the API server's to refuse, with its reason
            assert outcome[name].startswith("rejected"), (name, defect, outcome[name])
        else:
            listed[name] = set(body["spec"]["namespaces"])
    for name, mine in listed.items():
        shared = {"tenant-1", "tenant-2"}.union(*(ns for other, ns in listed.items() if other != name))
        if mine & {"tenant-1", "tenant-2"}:  # the tenants' Queues are older: they keep their namespaces
            assert outcome[name].startswith("False") and "Queue tenant-" in outcome[name], (name, outcome[name])
        elif not mine & shared:
            assert outcome[name].startswith("True"), (name, outcome[name])
    for ns in set().union(*listed.values()) - {"tenant-1", "tenant-2"}:  # one owner each, named to the others
        owners = [name for name, mine in listed.items() if ns in mine and f"{ns} (Queue" not in outcome[name]]
        assert len(owners) == 1, (ns, owners, outcome)


# ------------------------------------------------------------------------------- tenant gangs (operators)
@st.composite
def gangs(draw: st.DrawFn) -> tuple[Obj, list[Obj]]:
    """A Volcano PodGroup as a buggy or hostile operator writes it, and 0–3 members that name it (some
    also naming another group by the scheduler-plugins label)."""
    name = draw(st.from_regex(r"g[a-z0-9]{1,8}", fullmatch=True))
    spec: Obj = {"minMember": draw(st.sampled_from((0, 1, 2, 3, -1, 100001, 2 ** 40, "abc")))}
    if draw(st.booleans()):
        spec["minResources"] = draw(st.dictionaries(
            st.sampled_from(("nvidia.com/gpu", "cpu", "kubeferry.io/x", "ünï")),
            st.sampled_from(("1", "-1", "abc", "1Ki", 5, [], {"a": 1})), max_size=2))
    if draw(st.booleans()):
        spec["minTaskMember"] = draw(st.dictionaries(st.sampled_from(("worker", "Master", "ünï", "")),
                                                     st.sampled_from((0, 1, -1, "abc", 10 ** 9)), max_size=2))
    if (queue := draw(st.sampled_from((None, "tenant-2", "default", "")))) is not None:
        spec["queue"] = queue
    if draw(st.booleans()):
        spec["priorityClassName"] = "system-cluster-critical"
    annotations = {}
    if (tier := draw(st.sampled_from((None, "Elastic", "Guaranteed", "bogus")))) is not None:
        annotations["kubeferry.io/tier"] = tier
    group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
             "metadata": {"name": name, "annotations": annotations}, "spec": spec}
    members = []
    for i in range(draw(st.integers(0, 3))):
        pod = tenant_pod(f"{name}-{i}", duration="1s")
        pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = name
        pod["spec"]["schedulerName"] = "volcano"
        del pod["spec"]["tolerations"]
        if draw(st.booleans()):
            pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "another"}
        members.append(pod)
    return group, members


async def _gang_batch(planes: ControlPlanes, batch: list[tuple[Obj, list[Obj]]]) -> dict[str, str]:
    outcome: dict[str, str] = {}
    async with api_client(planes.kubeconfig("tenant-1")) as api, api_client(planes.kubeconfig("compute")) as capi:
        core, rest = client.CoreV1Api(api), Rest(api)
        ns = f"fuzz-{uuid.uuid4().hex[:8]}"
        await core.create_namespace({"metadata": {"name": ns}})
        try:
            await eventually(lambda: _has_sa(core, ns), timeout=30, what=f"ServiceAccount in {ns}")
            members: list[str] = []
            rejected: list[ApiException] = []
            for group, pods in batch:
                try:
                    await rest.create(path("scheduling.volcano.sh", "v1beta1", "podgroups", ns), group)
                except ApiException as exc:
                    rejected.append(exc)
                    outcome[group["metadata"]["name"]] = f"rejected {exc.status}"
                for pod in pods:
                    await core.create_namespaced_pod(ns, pod)
                    members.append(pod["metadata"]["name"])
            _clear(rejected)
            await _explained_beside_a_plain_pod(core, ns, members, outcome)
            groups = (await Rest(capi).get(path(*FERRY, "podgroups", "tenant-1"),
                                           labelSelector=f"{naming.UPSTREAM_NS_LABEL}={ns}"))["items"]
            for g in groups:  # whatever the tenant wrote, its queue and the vnode's priority ceiling
                assert g["spec"]["queue"] == "tenant-1" and g["spec"].get("priority", 0) == 0, g["spec"]
        finally:
            await core.delete_namespace(ns)
    return outcome


@pytest.mark.faults
@settings(ON_REAL_SERVERS, max_examples=4)
@given(batch=st.lists(gangs(), min_size=6, max_size=6, unique_by=lambda g: str(g[0]["metadata"]["name"])))
def test_broken_tenant_gangs_are_rejected_or_explained_and_keep_their_queue(
        planes: ControlPlanes, vnodes: dict[str, Component], ferry_scheduler: Component,
        batch: list[tuple[Obj, list[Obj]]]) -> None:
    outcome = asyncio.run(_gang_batch(planes, copy.deepcopy(batch)))
    for name, comp in (*vnodes.items(), ("scheduler", ferry_scheduler)):
        assert comp.alive(), f"{name} died on the batch: {outcome}"
    assert len(outcome) >= sum(len(pods) for _, pods in batch)
