"""Pure vnode rules: names, translation of a tenant pod, refusals, status mirroring, the work queue."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import re
import socket
from typing import Any

import pytest

from ferry.keys import EARLIER_RUN_ANNOTATION, PREFIX, UPSTREAM_CONTROLLER_LABEL
from ferry.kube.workqueue import WorkQueue
from vnode import naming, status, streams
from vnode.app import api_endpoint
from vnode.gangs import (
    VOLCANO_PHASE,
    InvalidGroup,
    depends_on,
    kept_members,
    members_status,
    min_resources,
    min_task_member,
    podset_of,
)
from vnode.node import Outage, advertised, capacity, domains, forbidden
from vnode.translate import (
    FOLLOWED_ANNOTATION,
    LABEL_VALUE,
    Bridge,
    GangRef,
    KueueLevel,
    api_service,
    compute_endpoint_slice,
    compute_ephemeral,
    compute_pod,
    compute_service,
    domain_value,
    gang_of,
    go_quote,
    kept_together,
    metadata_patch,
    needs_of,
    pod_rank,
    pod_view,
    refusal,
    role_of,
    sliced,
)

B = Bridge(tenant="tenant-1", node="ferry-tenant-1", namespace="tenant-1", queue="tenant-1", max_priority=100)


def tenant_pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "job-worker-0", "namespace": "ml", "uid": "u-1",
                         "labels": {"app": "x", "kubeferry.io/pod-group": "someone-elses-gang"},
                         "annotations": {"kubeferry.io/queue": "privileged-queue", "kubeferry.io/gpu-milli": "250"}},
            "spec": {"nodeName": "ferry-tenant-1", "schedulerName": "volcano", "priority": 1000000,
                     "priorityClassName": "top", "serviceAccountName": "trainer",
                     "containers": [{"name": "main", "image": "i"}], **spec}}


def test_the_hostname_is_the_pods_name_as_a_dns_label() -> None:
    """spec.hostname must be a DNS label (no dots, 63 characters), a pod name is a subdomain of up to 253:
    found by the fuzz test, where the compute API refused such a copy and the vnode retried forever."""
    label = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    for name in ("w-0", "worker.ml.example", "a" * 70 + "-b", "x" * 62 + "-.y" + "z" * 180):
        pod = tenant_pod()
        pod["metadata"]["name"] = name
        hostname = compute_pod(pod, B)["spec"]["hostname"]
        assert label.match(hostname), (name, hostname)
        assert name.startswith(hostname)
    assert compute_pod(tenant_pod(hostname="chosen"), B)["spec"]["hostname"] == "chosen"


def test_a_copy_names_its_tenant_controller_so_the_scheduler_continues_its_job_and_no_tenant_can_claim_one() -> None:
    """The scheduler gives the next pod of a controller whose pod it evicted that job's place and history
    (scheduler/service/runs.py): the copy names the controller by the vnode's word only."""
    forged = tenant_pod()
    forged["metadata"]["labels"][UPSTREAM_CONTROLLER_LABEL] = "someone-elses-job"
    forged["metadata"].setdefault("annotations", {})[EARLIER_RUN_ANNOTATION] = '{"arrivalTime": "2000-01-01T00:00:00Z"}'
    copied = compute_pod(forged, B)["metadata"]
    assert UPSTREAM_CONTROLLER_LABEL not in copied["labels"]
    assert EARLIER_RUN_ANNOTATION not in copied["annotations"]  # nor an earlier run to continue
    owned = tenant_pod()
    owned["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "x", "uid": "not-mine"},
                                            {"kind": "Job", "name": "train", "uid": "job-uid", "controller": True}]
    assert compute_pod(owned, B)["metadata"]["labels"][UPSTREAM_CONTROLLER_LABEL] == "job-uid"


def test_in_cluster_clients_are_pointed_at_the_tenant_api_when_it_is_given() -> None:
    """A pod's in-cluster client (client-go, the Python client) reads KUBERNETES_SERVICE_HOST/PORT, which the
    compute kubelet sets to the compute API; the pod's token and CA are the tenant's, so with --tenant-api the
    copy names the tenant API, in every container; a value the container sets itself stays."""
    pod = tenant_pod(initContainers=[{"name": "init", "image": "i"}])
    pod["spec"]["containers"].append({"name": "side", "image": "i", "env": [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "own.example"}, {"name": "X", "value": "1"}]})
    plain = compute_pod(pod, B)["spec"]
    assert not plain["containers"][0].get("env") and not plain["initContainers"][0].get("env"), "not given: unset"
    given = compute_pod(pod, dataclasses.replace(B, tenant_api=("192.0.2.1", 6443)))["spec"]
    init, main, side = given["initContainers"][0], *given["containers"]
    for c in (init, main):
        assert {e["name"]: e["value"] for e in c["env"]} == {
            "KUBERNETES_SERVICE_HOST": "192.0.2.1", "KUBERNETES_SERVICE_PORT": "6443",
            "KUBERNETES_SERVICE_PORT_HTTPS": "6443", "KUBERNETES_PORT": "tcp://192.0.2.1:6443"}
    env = {e["name"]: e["value"] for e in side["env"]}
    assert env["KUBERNETES_SERVICE_HOST"] == "own.example" and env["X"] == "1"
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"
    v6 = compute_pod(pod, dataclasses.replace(B, tenant_api=("fd00::1", 443)))["spec"]["containers"][0]["env"]
    assert {e["name"]: e["value"] for e in v6}["KUBERNETES_PORT"] == "tcp://[fd00::1]:443"


def test_a_debug_container_is_translated_as_the_pods_containers_and_refused_by_the_same_rules() -> None:
    pod = tenant_pod(ephemeralContainers=[
        {"name": "dbg", "image": "busybox", "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                                               "key": "k"}}}]},
        {"name": "root", "image": "busybox", "securityContext": {"privileged": True}}])
    assert "ephemeralContainers" not in compute_pod(pod, B)["spec"], "added later, through the subresource"
    assert "creds" in needs_of(pod).secrets, "its references are copied like the pod's"
    [dbg] = compute_ephemeral(pod, ["dbg"], dataclasses.replace(B, tenant_api=("192.0.2.1", 6443)))
    env = {e["name"]: e for e in dbg["env"]}
    assert env["K"]["valueFrom"]["secretKeyRef"]["name"] == naming.compute_name("tenant-1", "ml", "creds")
    assert env["KUBERNETES_SERVICE_HOST"]["value"] == "192.0.2.1"
    assert pod["spec"]["ephemeralContainers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "creds", \
        "the tenant pod is not changed"
    assert refusal({"spec": {"ephemeralContainers": [pod["spec"]["ephemeralContainers"][1]]}}) is not None
    assert refusal({"spec": {"ephemeralContainers": [pod["spec"]["ephemeralContainers"][0]]}}) is None


def test_a_refused_debug_container_is_shown_terminated_with_why_and_written_once() -> None:
    tenant = tenant_pod(ephemeralContainers=[{"name": "root", "image": "busybox"}])
    tenant["status"] = {"phase": "Running"}
    compute = {"status": {"phase": "Running", "containerStatuses": [{"name": "main", "ready": True}]}}
    refused = {"root": ("container 'root' is privileged", "2026-12-05T12:00:00Z")}
    new = status.mirrored(compute, tenant, "10.0.0.1", refused)
    assert new is not None
    [shown] = new["ephemeralContainerStatuses"]
    assert shown["name"] == "root" and shown["image"] == "busybox"
    assert shown["state"]["terminated"]["reason"] == "Refused"
    assert shown["state"]["terminated"]["message"] == "container 'root' is privileged"
    tenant["status"] = {**tenant["status"], **new}
    assert status.mirrored(compute, tenant, "10.0.0.1", refused) is None, "the same status is not written again"


def test_a_readiness_gate_holds_ready_until_the_tenants_controller_sets_its_condition_which_stays() -> None:
    """The copy has no gates (nothing in the compute cluster would set them); the tenant pod is Ready only once
    its gate's condition is True, and conditions the tenant's controllers set survive every status write."""
    tenant = tenant_pod(readinessGates=[{"conditionType": "example.com/lb-ready"}])
    assert "readinessGates" not in compute_pod(tenant, B)["spec"]
    tenant["status"] = {"phase": "Pending", "conditions": [
        {"type": "example.com/other", "status": "True", "lastTransitionTime": "2026-12-05T11:00:00Z"}]}
    compute = {"status": {"phase": "Running", "conditions": [
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-12-05T12:00:00Z"},
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-05T12:00:00Z"}]}}
    new = status.mirrored(compute, tenant, "10.0.0.1")
    assert new is not None
    conds = status.conditions(new)
    assert conds["ContainersReady"]["status"] == "True"
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "ReadinessGatesNotReady"
    assert '"example.com/lb-ready" does not exist' in conds["Ready"]["message"]
    assert conds["example.com/other"]["status"] == "True", "a condition the vnode does not own is kept"
    tenant["status"] = {**tenant["status"], **new}
    assert status.mirrored(compute, tenant, "10.0.0.1") is None, "nothing new: no write"
    tenant["status"]["conditions"].append({"type": "example.com/lb-ready", "status": "True",
                                           "lastTransitionTime": "2026-12-05T12:01:00Z"})
    new = status.mirrored(compute, tenant, "10.0.0.1")
    assert new is not None
    conds = status.conditions(new)
    assert conds["Ready"]["status"] == "True" and conds["example.com/lb-ready"]["status"] == "True"


def test_compute_names_are_deterministic_collision_free_and_short() -> None:
    a = naming.compute_name("t1", "a-b", "c")
    assert a == naming.compute_name("t1", "a-b", "c")
    assert a != naming.compute_name("t1", "a", "b-c")  # same "<ns>-<name>" text, different pods
    assert a != naming.compute_name("t2", "a-b", "c")  # same pod in another tenant
    long = naming.compute_name("t1", "n" * 63, "p" * 253)
    assert len(long) <= 63 and long[0].isalnum() and long[-1].isalnum()


def test_translation_owns_the_pod_and_drops_what_a_tenant_must_not_choose() -> None:
    # the virtual node's own labels (a Kueue ResourceFlavor's selector) chose the virtual node: no compute
    # node has them
    pod = compute_pod(tenant_pod(nodeSelector={"kubernetes.io/hostname": "ferry-tenant-1",
                                               "kubeferry.io/role": "virtual-node", "kubeferry.io/tenant": "tenant-1",
                                               "kubeferry.io/gpu-model": "A100"},
                                 tolerations=[{"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                                              {"key": "team", "operator": "Exists"}]), B)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["namespace"] == "tenant-1" and meta["labels"][naming.UPSTREAM_UID_LABEL] == "u-1"
    assert "kubeferry.io/pod-group" not in meta["labels"], "a tenant cannot join a compute gang by label"
    assert "kubeferry.io/queue" not in meta["annotations"], "a tenant cannot pick its compute queue"
    assert meta["annotations"]["kubeferry.io/gpu-milli"] == "250"
    assert spec["schedulerName"] == "kube-ferry" and spec["automountServiceAccountToken"] is False
    for gone in ("nodeName", "priority", "priorityClassName", "serviceAccountName"):
        assert gone not in spec
    assert spec["nodeSelector"] == {"kubeferry.io/gpu-model": "A100"}
    assert spec["tolerations"] == [{"key": "team", "operator": "Exists"}]
    assert spec["hostname"] == "job-worker-0"
    # held until the tenant pod is marked Forwarded: a copy deleted before that never ran
    assert spec["schedulingGates"] == [{"name": "kubeferry.io/forwarding"}]


def test_a_copy_keeps_the_node_affinity_that_picks_compute_nodes_and_drops_what_picked_the_virtual_node() -> None:
    gpu = {"key": "kubeferry.io/gpu-model", "operator": "In", "values": ["A100"]}
    host = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["ferry-tenant-1"]}
    role = {"key": "kubeferry.io/role", "operator": "Exists"}
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}

    def copied(required: list[dict[str, Any]], preferred: list[dict[str, Any]] | None = None) -> Any:
        aff: dict[str, Any] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": required}}
        if preferred is not None:
            aff["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
        spec = compute_pod(tenant_pod(affinity={"nodeAffinity": aff, "podAntiAffinity": {"x": 1}}), B)["spec"]
        assert spec["affinity"]["podAntiAffinity"] == {"x": 1}
        return spec["affinity"].get("nodeAffinity")

    # the virtual node's requirements go, the GPU model stays
    assert copied([{"matchExpressions": [host, gpu, role]}]) == {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [gpu]}]}}
    # ORed terms: one met by the virtual node alone lets the pod run anywhere
    assert copied([{"matchExpressions": [gpu]}, {"matchExpressions": [host]}]) is None
    assert copied([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["ferry-tenant-1"]}]}]) is None
    # a pod (anti-)affinity term looks at the copies' namespace, at the copies of the pods of the tenant
    # namespaces it names (its own by default), and never at another tenant's namespace
    own_ns = tenant_pod()["metadata"]["namespace"]
    own = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname",
           "namespaces": [own_ns]}
    other = {**copy.deepcopy(own), "namespaces": ["elsewhere", own_ns]}
    anywhere = {**copy.deepcopy(own), "namespaceSelector": {}}
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [own, other, anywhere],
                                "preferredDuringSchedulingIgnoredDuringExecution": [
                                    {"weight": 1, "podAffinityTerm": {k: v for k, v in copy.deepcopy(own).items()
                                                                      if k != "namespaces"}}]}}
    terms = compute_pod(tenant_pod(affinity=anti), B)["spec"]["affinity"]["podAntiAffinity"]
    required = terms["requiredDuringSchedulingIgnoredDuringExecution"]
    assert not any("namespaces" in t or "namespaceSelector" in t for t in required)
    ns_of = naming.UPSTREAM_NS_LABEL
    assert [t["labelSelector"].get("matchExpressions") for t in required] == [
        [{"key": ns_of, "operator": "In", "values": [own_ns]}],
        [{"key": ns_of, "operator": "In", "values": sorted(["elsewhere", own_ns])}], None]
    preferred = terms["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert preferred["labelSelector"]["matchExpressions"] == [{"key": ns_of, "operator": "In", "values": [own_ns]}]
    # a topology spread constraint counts the pods of its own namespace: the copies of that tenant namespace's
    spread = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
              "labelSelector": {"matchLabels": {"app": "x"}}}
    (counted,) = compute_pod(tenant_pod(topologySpreadConstraints=[spread]), B)["spec"]["topologySpreadConstraints"]
    assert counted["labelSelector"] == {"matchLabels": {"app": "x"},
                                        "matchExpressions": [{"key": ns_of, "operator": "In", "values": [own_ns]}]}
    # preferences keep what is about compute nodes, with their weights
    assert copied([{"matchExpressions": [role]}],
                  [{"weight": 5, "preference": {"matchExpressions": [zone, host]}},
                   {"weight": 1, "preference": {"matchExpressions": [role]}}]) == {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "preference": {"matchExpressions": [zone]}}]}


def test_references_are_renamed_to_copies_and_the_token_comes_from_the_tenant() -> None:
    pod = tenant_pod(
        subdomain="job",
        volumes=[{"name": "cfg", "configMap": {"name": "settings"}},
                 {"name": "kube-api-access", "projected": {"sources": [
                     {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                     {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                     {"downwardAPI": {"items": [{"path": "namespace",
                                                 "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}])
    pod["spec"]["containers"][0]["env"] = [
        {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "pw"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    needs = needs_of(pod)
    assert needs.configmaps == {"settings", "kube-root-ca.crt"} and needs.secrets == {"creds"}
    assert needs.token is not None and needs.subdomain == "job"
    out = compute_pod(pod, B)
    vols = {v["name"]: v for v in out["spec"]["volumes"]}
    assert vols["cfg"]["configMap"]["name"] == naming.compute_name("tenant-1", "ml", "settings")
    sources = vols["kube-api-access"]["projected"]["sources"]
    token_secret = naming.compute_name("tenant-1", "ml", "job-worker-0") + "-sa-token"
    assert sources[0] == {"secret": {"name": token_secret, "items": [{"key": "token", "path": "token"}]}}
    assert sources[2] == {"secret": {"name": token_secret, "items": [{"key": "namespace", "path": "namespace"}]}}
    env = {e["name"]: e for e in out["spec"]["containers"][0]["env"]}
    assert env["PW"]["valueFrom"]["secretKeyRef"]["name"] == naming.compute_name("tenant-1", "ml", "creds")
    assert env["NS"] == {"name": "NS", "value": "ml"}, "the pod sees its tenant namespace, not the compute one"
    assert env["UID"] == {"name": "UID", "value": "u-1"}, "its tenant UID (an owner reference to itself holds)"
    assert env["NODE"] == {"name": "NODE", "value": "ferry-tenant-1"}, "the node its tenant API knows"
    assert env["SA"] == {"name": "SA", "value": "trainer"}, "the copy runs under no ServiceAccount of its own"
    assert env["IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}, "its IP is the compute pod's"
    assert out["spec"]["subdomain"] == naming.compute_name("tenant-1", "ml", "job")


def test_downward_api_files_of_the_pods_identity_and_metadata_come_from_its_secret_the_rest_from_the_copy() -> None:
    """A kubelet writes the pod's own name, namespace, UID, labels and annotations; the copy's are other (its
    name, and Kube-Ferry's keys among its labels), so those files are projected from the pod's Secret (the
    one of its token), mode and defaultMode kept; its resources are the copy's."""
    info = {"name": "info", "downwardAPI": {"defaultMode": 0o440, "items": [
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}, "mode": 0o400},
        {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
        {"path": "cpu", "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu"}}]}}
    plain = {"name": "plain", "downwardAPI": {"items": [
        {"path": "cpu", "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu"}}]}}
    labels = {"name": "labels", "downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}
    pod = tenant_pod(volumes=[info, plain, labels])
    assert needs_of(pod).identity and not needs_of(tenant_pod(volumes=[plain])).identity
    assert needs_of(tenant_pod(volumes=[labels])).identity
    vols = {v["name"]: v for v in compute_pod(pod, B)["spec"]["volumes"]}
    secret = naming.compute_name("tenant-1", "ml", "job-worker-0") + "-sa-token"
    assert vols["info"] == {"name": "info", "projected": {"defaultMode": 0o440, "sources": [
        {"downwardAPI": {"items": [info["downwardAPI"]["items"][2]]}},  # type: ignore[index]
        {"secret": {"name": secret, "items": [{"key": "name", "path": "name", "mode": 0o400},
                                              {"key": "uid", "path": "uid"}]}}]}}
    assert vols["plain"] == plain, "resources only: the copy's own downward API"
    assert vols["labels"] == {"name": "labels", "projected": {"sources": [
        {"secret": {"name": secret, "items": [{"key": "labels", "path": "labels"},
                                              {"key": "annotations", "path": "annotations"}]}}]}}


def test_the_pods_secret_holds_its_labels_and_annotations_as_the_kubelet_writes_them() -> None:
    pod = tenant_pod()
    pod["metadata"]["labels"] = {"team": "vision", "app": "train", "kubeferry.io/queue-hint": "x"}
    pod["metadata"]["annotations"] = {"note": 'says "hi"\n\tand\\more', "kubeferry.io/gpu-milli": "500"}
    view = pod_view(pod)
    assert view["labels"] == 'app="train"\nteam="vision"', "sorted, quoted, Kube-Ferry's keys not the tenant's"
    assert view["annotations"] == 'note="says \\"hi\\"\\n\\tand\\\\more"'
    assert (view["name"], view["namespace"], view["uid"]) == ("job-worker-0", "ml", "u-1")


@pytest.mark.parametrize(("text", "go"), [
    ("plain", '"plain"'), ('q"b\\s', '"q\\"b\\\\s"'), ("é日本🙂", '"é日本🙂"'), ("\x01\x7f", '"\\x01\\x7f"'),
    ("\u00a0\u0085", '"\\u00a0\\u0085"'), ("\U000e0001", '"\\U000e0001"'), ("\a\b\f\r\v", '"\\a\\b\\f\\r\\v"'),
])
def test_go_quote_is_strconv_quote(text: str, go: str) -> None:
    assert go_quote(text) == go


@pytest.mark.parametrize(("patch", "words"), [
    ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "hostPath"),
    ({"volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "x"}}]}, "persistentVolumeClaim"),
    ({"hostNetwork": True}, "hostNetwork"),
    ({"containers": [{"name": "c", "image": "i", "securityContext": {"privileged": True}}]}, "privileged"),
    ({"containers": [{"name": "c", "image": "i", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]},
     "SYS_ADMIN"),
    ({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"},
                                      {"name": "net.ipv4.tcp_syncookies", "value": "1"}]}},
     "sysctls kernel.msgmax are"),
    ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "the pod sets seccomp profile Unconfined"),
    ({"containers": [{"name": "c", "image": "i", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]},
     "container 'c' sets seccomp profile Unconfined"),
    ({"containers": [{"name": "c", "image": "i", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}]},
     "AppArmor profile Unconfined"),
    ({"containers": [{"name": "c", "image": "i", "securityContext": {"procMount": "Unmasked"}}]}, "procMount Unmasked"),
    ({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}, "SELinux options"),
    ({"containers": [{"name": "c", "image": "i", "securityContext": {"seLinuxOptions": {"user": "system_u"}}}]},
     "SELinux options"),
    ({"securityContext": {"windowsOptions": {"hostProcess": True}}}, "HostProcess"),
    ({"ephemeralContainers": [{"name": "dbg", "image": "i", "securityContext": {"privileged": True}}]},
     "container 'dbg' is privileged"),
])
def test_unsafe_pods_are_refused_with_a_reason(patch: dict[str, Any], words: str) -> None:
    """The baseline Pod Security Standard's controls, each named in the refusal a tenant's user reads."""
    why = refusal(tenant_pod(**patch), "baseline")
    assert why is not None and words in why, why
    if "volumes" not in patch:  # volumes the compute cluster cannot give are refused at every level
        assert refusal(tenant_pod(**patch), "privileged") is None, "the platform may allow it"


def test_an_apparmor_annotation_beyond_runtime_default_or_localhost_is_refused() -> None:
    pod = tenant_pod()
    pod["metadata"]["annotations"]["container.apparmor.security.beta.kubernetes.io/main"] = "unconfined"
    assert "AppArmor profile 'unconfined' of container 'main'" in (refusal(pod, "baseline") or "")
    for fine in ("runtime/default", "localhost/my-profile"):
        pod["metadata"]["annotations"]["container.apparmor.security.beta.kubernetes.io/main"] = fine
        assert refusal(pod, "baseline") is None, fine


def test_what_baseline_allows_passes_and_restricted_asks_for_its_hardening() -> None:
    safe = {"sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}],
            "seccompProfile": {"type": "RuntimeDefault"}, "seLinuxOptions": {"type": "container_t"}}
    pod = tenant_pod(securityContext=safe)
    assert refusal(pod, "baseline") is None
    why = refusal(pod, "restricted")
    assert why is not None and "allowPrivilegeEscalation" in why
    hardened = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    pod["spec"]["containers"][0]["securityContext"] = hardened
    assert "runAsNonRoot" in (refusal(pod, "restricted") or "")
    pod["spec"]["securityContext"] = {**safe, "runAsNonRoot": True}
    assert refusal(pod, "restricted") is None, "hardened: the pod's seccomp and runAsNonRoot cover its container"
    pod["spec"]["containers"][0]["securityContext"] = {**hardened, "runAsUser": 0}
    assert "user 0" in (refusal(pod, "restricted") or "")
    pod["spec"]["containers"][0]["securityContext"] = {**hardened, "capabilities": {"drop": ["NET_RAW"]}}
    assert "drop capabilities ALL" in (refusal(pod, "restricted") or "")


def test_a_claim_is_mounted_as_its_compute_claim_only_where_the_vnode_provisions_a_storage_class() -> None:
    pod = tenant_pod(volumes=[{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt", "readOnly": True}}])
    pod["metadata"]["namespace"] = "ml"
    assert "provisions no storage class" in (refusal(pod, "baseline") or "")
    assert refusal(pod, "baseline", claims=True) is None
    [vol] = compute_pod(pod, B)["spec"]["volumes"]
    assert vol == {"name": "ckpt", "persistentVolumeClaim": {"claimName": naming.compute_name("tenant-1", "ml", "ckpt"),
                                                             "readOnly": True}}


def test_baseline_capabilities_pass_but_not_under_restricted() -> None:
    pod = tenant_pod(containers=[{"name": "c", "image": "i",
                                  "securityContext": {"capabilities": {"add": ["CHOWN"]}}}])
    assert refusal(pod, "baseline") is None
    assert refusal(pod, "restricted") is not None


def test_a_group_named_after_its_pods_were_bridged_is_told_by_their_phases() -> None:
    """Volcano's PodGroup controller names a plain pod's group after the vnode bound it: no compute gang
    stands for it, so its phase and counts come from its members."""
    assert members_status(["Running", "Pending"]) == {"phase": "Running", "running": 1, "succeeded": 0, "failed": 0}
    assert members_status(["Succeeded", "Succeeded"])["phase"] == "Succeeded"
    assert members_status(["Succeeded", "Failed"])["phase"] == "Failed"
    assert members_status(["Pending"])["phase"] == members_status([])["phase"] == "Pending"
    assert VOLCANO_PHASE[members_status(["Running"])["phase"]] == "Running"


def test_gang_markers_of_each_convention_and_roles() -> None:
    def pod(labels: dict[str, str], ann: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"namespace": "ml", "labels": labels, "annotations": ann}}

    assert gang_of(pod({}, {"scheduling.k8s.io/group-name": "j"})).kind == "volcano"  # type: ignore[union-attr]
    assert gang_of(pod({"scheduling.x-k8s.io/pod-group": "j"}, {})).kind == "scheduler-plugins"  # type: ignore[union-attr]
    kueue = gang_of(pod({"kueue.x-k8s.io/pod-group-name": "label"},
                        {"kueue.x-k8s.io/pod-group-name": "ann", "kueue.x-k8s.io/pod-group-total-count": "4"}))
    assert kueue is not None and kueue.name == "ann" and kueue.total == 4, "Kueue: the annotation wins"
    assert gang_of(pod({}, {"scheduling.volcano.sh/group-name": "j"})) is None, "not read by Volcano either"
    assert role_of(pod({"training.kubeflow.org/replica-type": "Worker"}, {})) == "worker"
    assert role_of(pod({}, {"volcano.sh/task-spec": "launcher"})) == "launcher"
    # a LeaderWorkerSet group's leader and workers: two tasks of its gang (the leader's terms are its own)
    lws = "leaderworkerset.sigs.k8s.io/worker-index"
    assert [role_of(pod({lws: i}, {})) for i in ("0", "1", "2")] == ["leader", "worker", "worker"]


def test_status_is_mirrored_and_a_terminal_phase_never_regresses() -> None:
    tenant = {"status": {"phase": "Pending"}}
    compute = {"status": {"phase": "Running", "podIP": "10.0.0.7", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "SomethingInternal", "status": "True"}]}}
    new = status.mirrored(compute, tenant, "127.0.0.1")
    assert new is not None and new["phase"] == "Running" and new["podIP"] == "10.0.0.7"
    types = {c["type"] for c in new["conditions"]}
    assert types == {"Ready", status.FORWARDED}
    settled = {"status": copy.deepcopy(new)}
    assert status.mirrored(compute, settled, "127.0.0.1") is None, "no write when nothing changed"
    done = {"status": {"phase": "Succeeded"}}
    assert status.mirrored({"status": {"phase": "Running"}}, done, "127.0.0.1") is None


def test_a_failed_status_names_the_reason_and_marks_preemption() -> None:
    tenant = {"status": {"phase": "Running", "containerStatuses": [
        {"name": "main", "ready": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}
    out = status.failed(tenant, "Preempted", "evicted by the scheduler", disruption=True)
    assert out["phase"] == "Failed" and out["reason"] == "Preempted"
    assert status.is_true(out, status.DISRUPTION)
    assert out["containerStatuses"][0]["state"]["terminated"]["reason"] == "Preempted"
    assert status.was_preempted({"status": {"conditions": [{"type": status.WILL_EVICT, "status": "True"}]}}, None)
    assert not status.was_preempted({"status": {}}, {"status": {}})

def test_a_victim_is_marked_as_kube_scheduler_marks_one_before_its_deletion() -> None:
    """Only the condition changes: a controller that saw the pod ``Failed`` now would count a failure."""
    tenant = {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": status.DISRUPTION, "status": "False"}]}}
    out = status.disrupted(tenant, "preempted")
    assert set(out) == {"conditions"}  # no phase, no container states
    assert status.is_true(out, status.DISRUPTION) and status.is_true(out, "Ready")
    assert [c["type"] for c in out["conditions"]].count(status.DISRUPTION) == 1


def test_capacity_is_capped_by_the_queue_and_never_negative() -> None:
    ready = [{"type": "Ready", "status": "True"}]
    nodes = [{"status": {"conditions": ready, "allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}}}
             for _ in range(3)]
    nodes.append({"status": {"conditions": [{"type": "Ready", "status": "False"}],
                             "allocatable": {"nvidia.com/gpu": "8"}}})
    assert capacity(nodes, None, 100)["nvidia.com/gpu"] == "24"
    assert capacity(nodes, {"spec": {"max": {"gpu": "10"}}}, 100)["nvidia.com/gpu"] == "10"
    assert capacity([], {"spec": {"max": {"gpu": "10"}}}, 100) == {"cpu": "0m", "memory": "0Mi",
                                                                   "nvidia.com/gpu": "0", "pods": "100"}


def test_the_virtual_node_carries_the_labels_every_gpu_node_shares() -> None:
    def gpu_node(ready: bool = True, gpus: str = "8", **labels: str) -> dict[str, Any]:
        return {"metadata": {"labels": labels}, "spec": {}, "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "allocatable": {"nvidia.com/gpu": gpus}}}

    keys = ("nvidia.com/gpu.", "kubeferry.io/gpu-model", "topology.kubernetes.io/")
    shared = {"nvidia.com/gpu.present": "true", "kubeferry.io/gpu-model": "H100", "kubernetes.io/os": "linux"}
    nodes = [gpu_node(**{**shared, "nvidia.com/gpu.product": p, "topology.kubernetes.io/zone": "a"})
             for p in ("H100-SXM", "H100-PCIe")]
    # the product differs, a key outside ``keys`` is not for the virtual node to say
    assert advertised(nodes, keys) == {"nvidia.com/gpu.present": "true", "kubeferry.io/gpu-model": "H100",
                                       "topology.kubernetes.io/zone": "a"}
    # a node that is not Ready, a CPU node and a cordoned one do not count; no GPU node: nothing
    cordoned = gpu_node(**{"kubeferry.io/gpu-model": "A100"})
    cordoned["spec"]["unschedulable"] = True
    others = [gpu_node(ready=False, **{"kubeferry.io/gpu-model": "A100"}), gpu_node(gpus="0"), cordoned]
    assert advertised(nodes + others, keys) == advertised(nodes, keys)
    assert advertised(others, keys) == {} and advertised(nodes, ()) == {}
    assert advertised(nodes, ("kubeferry.io/gpu",)) == {}, "a prefix ends in . or /; otherwise the key is whole"


def test_the_virtual_node_is_a_domain_of_its_own_for_the_racks_and_zones_it_stands_for_many_of() -> None:
    def gpu_node(**labels: str) -> dict[str, Any]:
        return {"metadata": {"labels": labels}, "spec": {}, "status": {
            "conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"nvidia.com/gpu": "8"}}}

    rack, zone = "kubeferry.io/topology-domain", "topology.kubernetes.io/zone"
    keys = (rack, "topology.kubernetes.io/")
    nodes = [gpu_node(**{rack: f"rack-{i // 2}", zone: "a", "kubeferry.io/gpu-model": f"m{i}"}) for i in range(4)]
    # several racks: its own domain value; one zone: advertised with its value instead; a key outside ``keys``:
    # nothing. The value is never its hostname: Kueue's topology-aware scheduling would take the rack for the host
    assert domains(nodes, keys, "ferry-t") == {rack: "ferry-t.virtual"} and domain_value("ferry-t") != "ferry-t"
    assert domains([*nodes, gpu_node(**{zone: "b"})], keys, "ferry-t") == {zone: "ferry-t.virtual"}, \
        "a key some GPU node lacks is no domain every one is in"
    assert domains(nodes, (), "ferry-t") == {} and domains([], keys, "ferry-t") == {}
    # a node name too long for a label value with the suffix is cut, with a digest that keeps names apart
    long_names = ("a." * 40 + "x", "a." * 40 + "y", "n" * 253)
    values = [domains(nodes, keys, name)[rack] for name in long_names]
    assert len(set(values)) == 3 and all(
        len(v) <= 63 and v.endswith(".virtual") and re.fullmatch(r"[a-z0-9]([-a-z0-9_.]*[a-z0-9])?", v)
        for v in values), values


def test_a_jobset_follower_in_its_leaders_domain_of_the_virtual_node_follows_its_leader_in_compute() -> None:
    rack = "kubeferry.io/topology-domain"
    follower = tenant_pod(nodeSelector={rack: domain_value("ferry-tenant-1"), "disk": "ssd"})
    follower["metadata"]["labels"]["jobset.sigs.k8s.io/job-key"] = "k1"
    follower["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] = rack
    spec = compute_pod(follower, B)["spec"]
    assert spec["nodeSelector"] == {"disk": "ssd"}, "the virtual node's own value means the virtual node"
    assert spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"labelSelector": {"matchExpressions": [
            {"key": "jobset.sigs.k8s.io/job-key", "operator": "In", "values": ["k1"]},
            {"key": naming.UPSTREAM_NS_LABEL, "operator": "In", "values": ["ml"]}]},
         "topologyKey": rack}]
    # a leader (no such selector), or a follower whose leader is in a real rack, keeps its spec as it is
    leader = {**follower, "spec": {**follower["spec"], "nodeSelector": {}}}
    assert "affinity" not in compute_pod(leader, B)["spec"]
    placed = {**follower, "spec": {**follower["spec"], "nodeSelector": {rack: "rack-3"}}}
    assert compute_pod(placed, B)["spec"]["nodeSelector"] == {rack: "rack-3"}
    assert "affinity" not in compute_pod(placed, B)["spec"]
    # a LeaderWorkerSet's worker follows its leader so too
    worker = tenant_pod(nodeSelector={rack: domain_value("ferry-tenant-1")}, affinity=None)
    worker["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-key"] = "g1"
    worker["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] = rack
    affinity = compute_pod(worker, B)["spec"]["affinity"]
    (near,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert near["labelSelector"]["matchExpressions"][0] == {
        "key": "leaderworkerset.sigs.k8s.io/group-key", "operator": "In", "values": ["g1"]}


def test_a_podset_kueue_requires_in_one_compute_domain_is_one_gang_kept_in_one_domain() -> None:
    """Kueue's topology-aware scheduling admitted a podset into one rack of the tenant's, the virtual node's, which
    stands for the compute cluster's racks: the Workload's pods become one compute gang whose podset keeps to
    one rack (where one has room, if Kueue only prefers it). A level of the virtual node's own labels asks
    nothing of the compute cluster."""
    rack = "kubeferry.io/topology-domain"
    pod = tenant_pod(nodeSelector={"kubernetes.io/hostname": "ferry-tenant-1"})
    pod["metadata"]["labels"] = {"kueue.x-k8s.io/podset": "main", "job-name": "ranked"}
    pod["metadata"]["annotations"] = {"kueue.x-k8s.io/workload": "job-ranked-3f2a1",
                                      "kueue.x-k8s.io/podset-required-topology": rack}
    gang = gang_of(pod)
    assert gang == GangRef("kueue-workload", "ml", "job-ranked-3f2a1") and not gang.bound_by_vnode
    made = compute_pod(pod, B)
    group = made["metadata"]["labels"]["kubeferry.io/pod-group"]
    assert group == naming.compute_name("tenant-1", "ml", "kueue-workload.job-ranked-3f2a1")
    assert not made["spec"].get("nodeSelector")
    assert made["metadata"]["labels"]["kubeferry.io/task"] == "main", "a podset is a task of the gang"
    assert made["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"labelSelector": {"matchLabels": {"kubeferry.io/pod-group": group, "kueue.x-k8s.io/podset": "main"}},
         "topologyKey": rack}]
    # the Workload's admitted count of each podset kept in a carried level makes the gang (its spec's before
    # admission), whatever the level: the Workload was admitted whole, and each podset keeps to its own level
    workload = {"spec": {"podSets": [
        {"name": "main", "count": 4, "topologyRequest": {"required": rack}},
        {"name": "aux", "count": 2, "topologyRequest": {"preferred": rack}},
        {"name": "driver", "count": 1},
        {"name": "os", "count": 5, "topologyRequest": {"required": "kubernetes.io/os"}},
        {"name": "hosted", "count": 3, "topologyRequest": {"required": "kubernetes.io/hostname"}}]}}
    assert kept_members(workload) == 9
    workload["status"] = {"admission": {"podSetAssignments": [{"name": "main", "count": 3},
                                                              {"name": "aux", "count": 2}]}}
    assert kept_members(workload) == 8
    # one host: the virtual node is one to the tenant and stands for many, so the copies keep to one compute node
    host = copy.deepcopy(pod)
    host["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] = "kubernetes.io/hostname"
    (term,) = compute_pod(host, B)["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname" and gang_of(host) == gang
    # a preferred rack: the same gang, its podset kept in one rack where one has room (a preferred term)
    preferred = copy.deepcopy(pod)
    annotations = preferred["metadata"]["annotations"]
    annotations["kueue.x-k8s.io/podset-preferred-topology"] = annotations.pop("kueue.x-k8s.io/podset-required-topology")
    assert gang_of(preferred) == gang and kept_together(preferred) == KueueLevel(rack, required=False)
    near = compute_pod(preferred, B)["spec"]["affinity"]["podAffinity"]
    assert near == {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {"kubeferry.io/pod-group": group, "kueue.x-k8s.io/podset": "main"}},
        "topologyKey": rack}}]}
    # a plain pod group (Kueue's pod integration), or a Volcano gang (an MPIJob whose operator gang-schedules
    # with Volcano), is one gang already: its podset keeps to one rack so too
    for marker, kind in (({"kueue.x-k8s.io/pod-group-name": "g", "kueue.x-k8s.io/pod-group-total-count": "2"},
                          "kueue"), ({"scheduling.k8s.io/group-name": "g"}, "volcano")):
        grouped = copy.deepcopy(pod)
        grouped["metadata"]["annotations"] |= marker
        (term,) = compute_pod(grouped, B)["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["labelSelector"]["matchLabels"] == {
            "kubeferry.io/pod-group": naming.compute_name("tenant-1", "ml", f"{kind}.g"),
            "kueue.x-k8s.io/podset": "main"}
    # podsets of one podset group (a LeaderWorkerSet's leader and workers) share one domain: the term selects
    # the group by a label of the copies' own, valid whatever the group's name
    for shared in ("lws-group", "g" * 200):
        member = copy.deepcopy(pod)
        member["metadata"]["annotations"]["kueue.x-k8s.io/podset-group-name"] = shared
        made = compute_pod(member, B)
        (term,) = made["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        value = made["metadata"]["labels"]["kubeferry.io/kueue-podset-group"]
        assert term["labelSelector"]["matchLabels"] == {"kubeferry.io/pod-group": group,
                                                        "kubeferry.io/kueue-podset-group": value}
        assert LABEL_VALUE.match(value) and (value == shared or len(value) == 63), value
        assert "kubeferry.io/kueue-podset-group" not in member["metadata"].get("labels", {})
    # not carried: a level of the virtual node's own labels (they describe it alone), required or preferred
    for ann in ({"kueue.x-k8s.io/workload": "w", "kueue.x-k8s.io/podset-required-topology": "kubernetes.io/os"},
                {"kueue.x-k8s.io/workload": "w", "kueue.x-k8s.io/podset-preferred-topology": "kubernetes.io/os"}):
        pod["metadata"]["annotations"] = ann
        assert gang_of(pod) is None and kept_together(pod) is None
        assert "affinity" not in compute_pod(pod, B)["spec"]


def test_a_sliced_kueue_podset_keeps_each_slice_of_consecutive_ranks_in_one_compute_domain() -> None:
    """Kueue's slices (``podset-slice-required-topology``, ``-slice-size``): each slice of a podset's pods by rank
    keeps to one domain. The pods are one compute gang whose copies carry their slice, a task per slice (a task's
    pods state the same rules), and a required pod affinity with their slice's copies over the slice's level.
    Ranks are read as Kueue's topology ungater reads them, from what the Workload's podset names."""
    host = "kubernetes.io/hostname"
    pod = tenant_pod()
    pod["metadata"]["labels"] = {"kueue.x-k8s.io/podset": "main", "batch.kubernetes.io/job-completion-index": "5"}
    pod["metadata"]["annotations"] = {"kueue.x-k8s.io/workload": "job-sliced-1",
                                      "kueue.x-k8s.io/podset-slice-required-topology": host,
                                      "kueue.x-k8s.io/podset-slice-size": "2"}
    assert gang_of(pod) == GangRef("kueue-workload", "ml", "job-sliced-1") and kept_together(pod) is None
    assert sliced(pod) == (host, 2)
    job = {"podIndexLabel": "batch.kubernetes.io/job-completion-index"}
    assert pod_rank(pod, job, 8) == 5
    assert pod_rank(pod, job, 5) is None, "a rank past the podset's size is no rank"
    assert pod_rank(pod, {}, 8) is None, "a podset that names no index label gives no rank"
    offset = copy.deepcopy(pod)
    offset["metadata"]["annotations"]["kueue.x-k8s.io/pod-index-offset"] = "4"
    assert pod_rank(offset, job, 8) == 1
    # a JobSet's podset of 3 replicated Jobs of 4 pods: Job 2's pod 1 is rank 9
    jobset = {**job, "subGroupIndexLabel": "jobset.sigs.k8s.io/job-index", "subGroupCount": 3}
    replicated = copy.deepcopy(pod)
    replicated["metadata"]["labels"] |= {"batch.kubernetes.io/job-completion-index": "1",
                                         "jobset.sigs.k8s.io/job-index": "2"}
    assert pod_rank(replicated, jobset, 12) == 9
    replicated["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"] = "3"
    assert pod_rank(replicated, jobset, 12) is None, "no fourth Job"

    made = compute_pod(pod, B, slice_index=5 // 2)
    group = made["metadata"]["labels"]["kubeferry.io/pod-group"]
    assert made["metadata"]["labels"]["kubeferry.io/kueue-slice"] == "2"
    assert made["metadata"]["labels"]["kubeferry.io/task"] == "main-slice-2"
    assert made["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"labelSelector": {"matchLabels": {"kubeferry.io/pod-group": group, "kubeferry.io/kueue-slice": "2",
                                           "kueue.x-k8s.io/podset": "main"}}, "topologyKey": host}]
    # a podset kept in one rack and sliced by host states both; without a rank, the gang without the slice
    both = copy.deepcopy(pod)
    both["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] = "kubeferry.io/topology-domain"
    terms = compute_pod(both, B, 2)["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in terms] == ["kubeferry.io/topology-domain", host]
    unranked = compute_pod(pod, B)
    assert "kubeferry.io/kueue-slice" not in unranked["metadata"]["labels"] and "affinity" not in unranked["spec"]
    assert unranked["metadata"]["labels"]["kubeferry.io/pod-group"] == group
    # the Workload's sliced podsets make the gang, as many as admitted; a slice level not carried makes none
    workload = {"spec": {"podSets": [
        {"name": "main", "count": 8, "topologyRequest": {**job, "podSetSliceRequiredTopology": host,
                                                         "podSetSliceSize": 2}},
        {"name": "os", "count": 2, "topologyRequest": {"podSetSliceRequiredTopology": "kubernetes.io/os",
                                                       "podSetSliceSize": 1}}]},
        "status": {"admission": {"podSetAssignments": [{"name": "main", "count": 6}]}}}
    assert kept_members(workload) == 6
    assert podset_of(workload, "main") == (workload["spec"]["podSets"][0], 6) and podset_of(workload, "x") is None
    for size in ("0", "two", ""):
        pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-slice-size"] = size
        assert sliced(pod) is None and gang_of(pod) is None


async def test_work_queue_deduplicates_and_never_runs_a_key_twice_at_once() -> None:
    q = WorkQueue("t", base_delay=0.01)
    running: set[str] = set()
    seen: list[str] = []
    overlap = False
    release, started, twice = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def handler(key: str) -> None:
        nonlocal overlap
        overlap = overlap or key in running
        running.add(key)
        seen.append(key)
        started.set()
        if len(seen) == 1:
            await release.wait()
        running.discard(key)
        if len(seen) == 2:
            twice.set()

    for _ in range(5):
        q.add("a")
    worker = asyncio.create_task(q.run(handler, workers=4))
    async with asyncio.timeout(5):
        await started.wait()
        q.add("a")  # while "a" is held: processed once more afterwards, not concurrently
        q.add("a")
        release.set()
        await twice.wait()
    worker.cancel()
    assert seen == ["a", "a"] and not overlap and len(q) == 0


class Flaky:
    """A reconcile that fails its first ``failures`` calls, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls, self.succeeded = failures, 0, asyncio.Event()

    async def __call__(self, _: str) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("transient")
        self.succeeded.set()


async def test_work_queue_retries_failures_with_backoff() -> None:
    q, flaky = WorkQueue("t", base_delay=0.01), Flaky(failures=2)
    q.add("k")
    worker = asyncio.create_task(q.run(flaky, workers=1))
    async with asyncio.timeout(5):
        await flaky.succeeded.wait()
    worker.cancel()
    assert flaky.calls == 3


async def test_a_retry_is_not_held_behind_a_later_planned_refresh() -> None:
    """Seen with Volcano's restarted pods: a pod's token refresh was planned minutes ahead under the same
    key, a failed create's retry in 0.05 s was dropped, and the pod waited for the periodic resync."""
    q, flaky = WorkQueue("t", base_delay=0.01), Flaky(failures=1)
    q.add_after("k", 600.0)  # a refresh planned far ahead
    q.add("k")
    worker = asyncio.create_task(q.run(flaky, workers=1))
    async with asyncio.timeout(5):
        await flaky.succeeded.wait()
    q.add_after("k", 600.0)
    q.add_after("k", 900.0)  # a later timer does not replace an earlier one
    assert q._timers["k"].when() - asyncio.get_running_loop().time() < 601
    worker.cancel()
    assert flaky.calls == 2


# ------------------------------------------------------------------ streams (exec / attach / port-forward)
def test_kubelet_stream_query_becomes_the_api_query_in_order() -> None:
    got = streams.compute_query([("command", "sh"), ("command", "-c"), ("command", "echo a b"), ("input", "1"),
                                 ("output", "1"), ("error", "1"), ("tty", "0"), ("unknown", "x")], "main")
    assert got == [("container", "main"), ("command", "sh"), ("command", "-c"), ("command", "echo a b"),
                   ("stdin", "1"), ("stdout", "1"), ("stderr", "1"), ("tty", "0")]
    assert streams.compute_query([("port", "8080"), ("port", "9090")], None) == [("ports", "8080"), ("ports", "9090")]


def test_stream_headers_carry_negotiation_but_never_credentials() -> None:
    sent = streams.negotiation_headers([("Authorization", "Bearer secret"), ("Connection", "Upgrade"),
                                        ("Upgrade", "SPDY/3.1"), ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
                                        ("X-Stream-Protocol-Version", "v3.channel.k8s.io"), ("Cookie", "c")])
    assert sent == [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
                    ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
                    ("X-Stream-Protocol-Version", "v3.channel.k8s.io")]
    head = streams.switching_protocols([("Upgrade", "websocket"), ("Content-Length", "0"),
                                        ("Sec-WebSocket-Accept", "abc")])
    assert head == b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: abc\r\n\r\n"


# ------------------------------------------------------------------ kubectl ferry views (pure parts)
def test_views_align_columns_and_pick_the_first_fitting_hint() -> None:
    from ferry.status import queue_rows, table
    from ferry.whypending import hint_for

    rows = queue_rows([{"metadata": {"name": "b"}, "spec": {"guaranteed": {"gpu": "8"}},
                        "status": {"allocated": {"gpu": "12"}, "borrowed": {"gpu": "4"}, "runningJobs": 3,
                                   "recentUsage": {"gpuSeconds": 45000, "time": "2026-12-02T10:00:00Z"}}},
                       {"metadata": {"name": "a"}, "spec": {}}])
    assert [r["NAME"] for r in rows] == ["a", "b"] and rows[1]["BORROWED"] == "4" and rows[0]["MAX"] == "-"
    assert rows[1]["RECENT-GPU-H"] == "12.5" and rows[0]["RECENT-GPU-H"] == "-"
    lines = table(rows, ("NAME", "ALLOCATED", "RUNNING")).splitlines()
    assert lines == ["NAME   ALLOCATED   RUNNING", "a      -           0", "b      12          3"]
    assert "spec.max" in hint_for("Unschedulable", "queue q would exceed its maximum of 1 GPUs")
    behind = "waiting for capacity: an earlier job of queue q with the same request does not fit yet"
    assert hint_for("Unschedulable", behind).startswith("GPUs must free up")  # not its queue's maximum
    assert "received the least GPU time" in hint_for("Unschedulable", f"{behind}; least attained service: it "
                                                     "received 16.0 GPU-hours (level 2), so jobs of queue q ...")
    assert "used fewer GPUs recently" in hint_for("Unschedulable", f"{behind}; fair-over-time: queues borrow idle "
                                                  "GPUs least recent usage first (half-life 24 h; ...)")
    assert "ask for less" in hint_for("Unschedulable", "cannot be scheduled: no node has 16 GPUs")
    assert "ask the admin for a GPU pool" in hint_for("NoVirtualNodeSelected", "2 of the shared cluster's ...")
    assert "preferred terms instead" in hint_for(
        "Unschedulable", f"{behind}; its pod affinity and anti-affinity rule out 5 of 5 node(s) (pods it keeps away "
        "from, or that keep away from it, run there; or none it keeps beside does); no running job may be ...")
    assert "virtual node included" in hint_for("Unschedulable", "0/1 nodes: 1 Insufficient nvidia.com/gpu.")
    assert "ran on loan" in hint_for("Preempting", "recalling 1 job(s) on loan on its held node(s): t/loan")
    assert hint_for("Something", "unheard of") == ""
    # Kube-Ferry's own PodGroup condition says Unschedulable too: its words decide, not that reason
    held = "waited 3600 s: holding node(s) node-1 until they drain; backfill continues elsewhere"
    assert "held for it" in hint_for("Unschedulable", held)
    assert "held for it" in hint_for("Unschedulable", f"{held}; it cannot start even if every job it may preempt "
                                                      "were evicted")
    assert "not succeeded yet" in hint_for("Unschedulable", "waiting for t/prep to succeed (it is Running)")
    assert "not been submitted" in hint_for("Unschedulable", "waiting for t/prep to start (it does not exist yet)")
    assert "failed or never appeared" in hint_for("Unschedulable", "can never start: it waits for t/prep to "
                                                                   "succeed, and t/prep failed")
    assert "tolerate the virtual node" in hint_for("Unschedulable", "0/3 nodes are available: 3 node(s) had "
                                                                    "untolerated taint {virtual-kubelet.io/provider: "
                                                                    "kube-ferry}.")


def test_usage_counts_only_the_part_of_each_run_inside_the_range() -> None:
    from datetime import UTC, datetime

    from ferry.usage import runs, summarise, when

    rec = {"metadata": {"name": "ns.j-0"}, "spec": {"namespace": "ns", "job": "j", "queue": "q", "pods": {
        "u1": {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "gpuMilli": 2000},
        "u2": {"start": "2026-01-01T00:30:00Z", "end": "2026-01-01T00:40:00Z", "gpuMilli": 500}}}}
    live = [{"namespace": "ns", "job": "j", "queue": "q", "uid": "u1", "start": "x", "end": "x", "gpuMilli": 1},
            {"namespace": "ns", "job": "k", "queue": "q", "uid": "u3", "start": "2026-01-01T00:50:00Z",
             "end": "2026-01-01T02:00:00Z", "gpuMilli": 1000}]
    all_runs = runs([rec], live)
    assert sorted(r["uid"] for r in all_runs) == ["u1", "u2", "u3"], "a recorded pod is not counted live again"
    now = datetime(2026, 1, 1, 2, tzinfo=UTC)
    (q,) = summarise(all_runs, None, now, "queue")
    assert q["GPU-SECONDS"] == 2 * 3600 + 0.5 * 600 + 70 * 60 and q["JOBS"] == 2 and q["PODS"] == 3
    window = summarise(all_runs, when("2026-01-01T00:45:00Z", now), when("2026-01-01T01:00:00Z", now), "job")
    assert [(r["JOB"], r["GPU-SECONDS"]) for r in window] == [("j", 2 * 900), ("k", 600)]
    assert summarise(all_runs, when("3h", now), when("2h30m", now) or now, "queue") == []


def test_a_tenant_groups_minimums_are_copied_only_when_they_make_sense() -> None:
    assert min_resources("g", {"nvidia.com/gpu": 8, "cpu": "500m"}) == {"nvidia.com/gpu": "8", "cpu": "500m"}
    assert min_task_member("g", {"Master": "1", "worker": 3}) == {"master": 1, "worker": 3}
    for bad in ({"nvidia.com/gpu": "-1"}, {"cpu": "abc"}, {"cpu": []}, ["cpu"]):
        with pytest.raises(InvalidGroup, match="PodGroup g: minResources"):
            min_resources("g", bad)
    for wrong in ({"worker": -1}, {"worker": "abc"}, {"worker": 10 ** 9}, ["worker"]):
        with pytest.raises(InvalidGroup, match="PodGroup g: minTaskMember"):
            min_task_member("g", wrong)


def test_a_tenant_groups_dependencies_are_parsed_or_refused_with_the_reason() -> None:
    assert depends_on("g", "prep, server:Running ,") == [("prep", "Succeeded"), ("server", "Running")]
    assert depends_on("g", None) == []
    for bad in ("Prep", "prep:Failed", "a b", "prep:"):
        with pytest.raises(InvalidGroup, match=r"PodGroup g: kubeferry\.io/depends-on item"):
            depends_on("g", bad)
    with pytest.raises(InvalidGroup, match="names 33 PodGroups, at most 32"):
        depends_on("g", ",".join(f"p{i}" for i in range(33)))


def test_the_event_backlog_keeps_the_newest_version_and_drops_the_oldest_past_its_bound() -> None:
    from vnode import metrics
    from vnode.events import Backlog

    def ev(name: str, count: int, pod: str = "p") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(count)}, "count": count,
                "involvedObject": {"kind": "Pod", "namespace": "ns", "name": pod}}

    backlog = Backlog(limit=2)
    dropped = metrics.EVENT_BACKLOG_DROPPED._value.get()
    assert backlog.put("ns/a", ev("a", 1), replayed=True, since=0) == "Pod/ns/p"
    backlog.put("ns/b", ev("b", 1, pod="q"), replayed=True, since=0)
    backlog.put("ns/a", ev("a", 2), replayed=False, since=5)  # a watched change: newest, not a replay, now youngest
    backlog.put("ns/c", ev("c", 1), replayed=False, since=6)  # over the bound: the oldest waiting (b) goes
    assert len(backlog) == 2
    assert metrics.EVENT_BACKLOG_DROPPED._value.get() == dropped + 1
    assert backlog.take("Pod/ns/q") == []
    # one object's Events come together, in compute order; a re-put keeps when it first waited
    assert backlog.take("Pod/ns/p") == [("ns/c", ev("c", 1), False, 6), ("ns/a", ev("a", 2), False, 0)]
    assert backlog.take("Pod/ns/p") == []  # mirrored once
    backlog.put("ns/d", ev("d", 2), replayed=False, since=7)
    backlog.put_back("ns/d", ev("d", 1), replayed=False, since=1)  # taken before d's newer version came
    assert backlog.take("Pod/ns/p") == [("ns/d", ev("d", 2), False, 7)]
    backlog.put_back("ns/d", ev("d", 2), replayed=False, since=7)
    backlog.discard("ns/d")
    assert len(backlog) == 0 and backlog.take("Pod/ns/p") == []


def test_the_event_backlog_orders_one_objects_events_as_the_compute_side_wrote_them() -> None:
    """Two Events of one second (a gang's "Waiting", then its verdict) reach the tenant in that order,
    whichever arrived first; a later second wins over a higher resourceVersion."""
    from vnode.events import Backlog

    def ev(name: str, rv: int, last: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}, "lastTimestamp": last,
                "involvedObject": {"kind": "Pod", "namespace": "ns", "name": "p"}}

    backlog = Backlog()
    backlog.put("ns/verdict", ev("verdict", 12, "2026-12-01T10:00:01Z"), replayed=False, since=0)
    backlog.put("ns/waiting", ev("waiting", 11, "2026-12-01T10:00:01Z"), replayed=False, since=0)
    backlog.put("ns/bumped", ev("bumped", 9, "2026-12-01T10:00:02Z"), replayed=False, since=0)
    assert [k for k, *_ in backlog.take("Pod/ns/p")] == ["ns/waiting", "ns/verdict", "ns/bumped"]


def test_a_refusal_is_told_from_an_outage_and_counts_only_once_it_lasts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tenant informer's words for a 403 (list or watch, or the client's exception) read as a refusal;
    a 500 or a dropped connection does not. A failure is reported only after the grace."""
    assert forbidden('tenant-endpointslices: HTTP 403: endpointslices.discovery.k8s.io is forbidden: User "x"')
    assert forbidden("tenant-pods: (401)\nReason: Unauthorized")
    assert not forbidden("tenant-pods: HTTP 500: etcdserver: request timed out")
    assert not forbidden("tenant-pods: Cannot connect to host 127.0.0.1:6443 (port 4030)")
    clock = [100.0]
    monkeypatch.setattr("vnode.node.time.monotonic", lambda: clock[0])
    outage = Outage(grace_s=10)
    assert outage.check("HTTP 403") == (True, "HTTP 403")
    clock[0] += 9
    assert outage.check("HTTP 403")[0]
    clock[0] += 2
    assert outage.check("HTTP 403") == (False, "HTTP 403")
    assert outage.check(None) == (True, None)
    assert outage.check("HTTP 403")[0], "a new failure starts its own grace"


def test_a_copy_follows_the_tenants_own_labels_and_annotations_and_keeps_what_the_compute_side_added() -> None:
    """Labels and annotations the tenant adds, changes or removes on a live pod reach the copy; Kube-Ferry's
    own keys are read once, at creation; a key the copy never followed (a compute-side webhook's) stays."""
    b = Bridge(tenant="t", node="vn", namespace="t", queue="t")
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                        "labels": {"app": "db"}, "annotations": {"note": "a", PREFIX + "movable": "true"}},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    cp = compute_pod(pod, b)
    assert metadata_patch(pod, cp) is None, "a fresh copy agrees"
    cp["metadata"]["labels"]["mesh.example/injected"] = "true"  # the compute cluster's admission
    later = copy.deepcopy(pod)
    later["metadata"]["labels"] = {"role": "leader"}
    later["metadata"]["annotations"] = {"note": "b", PREFIX + "movable": "false", PREFIX + "tier": "x"}
    patch = metadata_patch(later, cp)
    assert patch is not None
    meta = patch["metadata"]
    assert meta["labels"] == {"role": "leader", "app": None}
    assert meta["annotations"]["note"] == "b"
    assert not any(k.startswith(PREFIX) for k in meta["annotations"] if k != FOLLOWED_ANNOTATION)
    for field in ("labels", "annotations"):  # the patch applied as a merge patch would be
        for k, v in meta.get(field, {}).items():
            if v is None:
                cp["metadata"][field].pop(k, None)
            else:
                cp["metadata"][field][k] = v
    assert cp["metadata"]["labels"]["mesh.example/injected"] == "true"
    assert cp["metadata"]["annotations"][PREFIX + "movable"] == "true", "read once, at creation"
    assert metadata_patch(later, cp) is None, "applied, it agrees"
    legacy = compute_pod(pod, b)  # a copy made before copies recorded what they follow: nothing removed
    del legacy["metadata"]["annotations"][FOLLOWED_ANNOTATION]
    patch = metadata_patch(later, legacy)
    assert patch is not None and patch["metadata"]["labels"] == {"role": "leader"}


def test_the_tenant_api_as_a_service_copy_needs_an_address_a_slice_may_hold() -> None:
    """`kubernetes.default.svc` for compute pods: 443 to the tenant API's address and port, copied as a
    Service without a selector and its slice; no copy for an address the EndpointSlice API refuses."""
    b = Bridge(tenant="t", node="vn", namespace="t", queue="t")
    assert api_service("127.0.0.1", 6443) is None
    assert api_service("::1", 6443) is None and api_service("0.0.0.0", 6443) is None
    assert api_service("169.254.1.1", 6443) is None and api_service("tenant-control-plane", 6443) is None
    made = api_service("10.1.2.3", 6443)
    assert made is not None
    svc, es = compute_service(made[0], b), compute_endpoint_slice(made[1], b)
    assert "selector" not in svc["spec"] and svc["spec"]["ports"][0]["port"] == 443
    assert svc["spec"]["ports"][0]["targetPort"] == 6443 and svc["metadata"]["name"] == naming.compute_name(
        "t", "default", "kubernetes")
    assert es["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
    assert es["endpoints"][0]["addresses"] == ["10.1.2.3"] and es["ports"][0]["port"] == 6443
    v6 = api_service("fd00::2", 443)
    assert v6 is not None and v6[1]["addressType"] == "IPv6"


async def test_the_tenant_api_host_is_looked_up_once_an_ipv4_address_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name (kind's `<cluster>-control-plane`) that resolves to both families gives the IPv4 address (a
    compute Service is single-stack IPv4 unless set up otherwise); one that does not resolve gives no copy."""
    def resolves(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "tenant-control-plane":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::9", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("172.18.0.3", port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolves)
    made = await api_endpoint("tenant-control-plane", 6443)
    assert made is not None and made[1]["endpoints"][0]["addresses"] == ["172.18.0.3"]
    assert made[1]["addressType"] == "IPv4"
    assert await api_endpoint("nowhere", 6443) is None
