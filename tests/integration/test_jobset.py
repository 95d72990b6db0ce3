"""An unmodified JobSet controller (v0.11.0, built from its Go module; the base of Kubeflow Trainer v2) in a
tenant cluster: a JobSet's Indexed Jobs run through the virtual node, their pods find each other by the
names JobSet gives them (``<jobset>-<replicatedJob>-<job>-<index>.<jobset>``, answered by `ferry dns`),
and the JobSet completes when its Jobs do.

The controller's admission webhooks (its defaults are what the controller runs on) are served by the
process itself and called by URL with a certificate the test issues: local planes have no cluster network
(as envtest does). Its release's webhook configuration is reproduced below with that change."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.binaries import Binaries
from ferry.binaries.clients import JOBSET, ensure_operator
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from ferry.keys import DOMAIN_LABEL
from tests.helpers import (
    compute_copies,
    controller_with_webhooks,
    eventually,
    install_crd,
    live_copies,
    racks_of_groups,
    resolve,
    running_copies,
    url_webhook,
)
from vnode.dnsserver import PeerDNS
from vnode.naming import UPSTREAM_NAME_ANNOTATION

TENANT = "tenant-1"
TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}
WEBHOOKS = ("jobset-ferry-test-mutating", "jobset-ferry-test-validating")
REPLICATED_JOB, RESTART_ATTEMPT = "jobset.sigs.k8s.io/replicatedjob-name", "jobset.sigs.k8s.io/restart-attempt"


def webhook_configurations(port: int, ca: bytes) -> list[dict[str, Any]]:
    """The release's webhooks (config/components/webhook, with its patches), each called by URL."""
    jobsets = {"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"], "resources": ["jobsets"]}
    pods = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}
    of_jobsets = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}

    hook = partial(url_webhook, port, ca)

    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": WEBHOOKS[0]},
         "webhooks": [hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                           {**jobsets, "operations": ["CREATE"]}),
                      hook("mpod.kb.io", "/mutate--v1-pod", pods, of_jobsets)]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": WEBHOOKS[1]},
         "webhooks": [hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset",
                           {**jobsets, "operations": ["CREATE", "UPDATE"]}),
                      hook("vpod.kb.io", "/validate--v1-pod", pods, of_jobsets)]},
    ]


@pytest.fixture(scope="module")
def jobset_controller(planes: ControlPlanes, binaries: Binaries, vnodes: dict[str, Component],
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """The controller watching every namespace of tenant-1, its webhooks registered while it runs."""
    op = ensure_operator(JOBSET)
    kubeconfig = planes.kubeconfig(TENANT)
    kubectl = [str(binaries.path("kubectl")), f"--kubeconfig={kubeconfig}"]
    install_crd(kubectl, op.crds / "jobset.x-k8s.io_jobsets.yaml", "jobsets.jobset.x-k8s.io")
    with controller_with_webhooks(op.binary, "config.jobset.x-k8s.io/v1alpha1", {}, kubeconfig, kubectl,
                                  tmp_path_factory.mktemp("jobset"), webhook_configurations) as proc:
        yield proc


def jobset(name: str, pods: int, duration: str) -> dict[str, Any]:
    """A JobSet as its examples write one: one replicated Job of ``pods`` GPU pods (Indexed, as JobSet's
    defaults make it), which end after ``duration``."""
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
                "parallelism": pods, "completions": pods, "backoffLimit": 0,
                "template": {"metadata": {"annotations": {"kubeferry.io/sim-duration": duration}},
                             "spec": {"restartPolicy": "Never", "tolerations": [TOLERATION],
                                      "automountServiceAccountToken": False,
                                      "containers": [{"name": "main", "image": "trainer:1",
                                                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}}]}}


@pytest.mark.usefixtures("jobset_controller")
async def test_a_jobsets_pods_find_each_other_by_its_names_and_it_completes(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, peer_dns: PeerDNS) -> None:
    jobs = client.CustomObjectsApi(tenant_api)
    await jobs.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", tenant_ns, "jobsets",
                                               jobset("ring", pods=2, duration="30s"))

    pods = {p.spec.hostname: p for p in await eventually(lambda: running_copies(compute_api, tenant_ns, 2), timeout=90,
                                                         what="the JobSet's 2 pods Running in the compute cluster")}
    assert sorted(pods) == ["ring-workers-0-0", "ring-workers-0-1"], sorted(pods)
    assert all(p.metadata.annotations[UPSTREAM_NAME_ANNOTATION].startswith("ring-workers-0-") for p in pods.values())
    first, second = pods["ring-workers-0-0"], pods["ring-workers-0-1"]
    # JobSet's own names for its pods: the short form a process uses, and the full one.
    for name in ("ring-workers-0-1.ring", f"ring-workers-0-1.ring.{tenant_ns}.svc.cluster.local"):
        await eventually(lambda n=name: _resolves(peer_dns, first, n, [second.status.pod_ip]), timeout=10,
                         what=f"{name} from ring-workers-0-0")

    async def completed() -> bool:
        js = await jobs.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", tenant_ns, "jobsets", "ring")
        return any(c["type"] == "Completed" and c["status"] == "True"
                   for c in (js.get("status") or {}).get("conditions") or [])

    await eventually(completed, timeout=120, what="the JobSet's condition Completed")


@pytest.mark.usefixtures("jobset_controller")
async def test_a_jobsets_exclusive_placement_gives_each_job_a_rack_of_its_own_in_the_compute_cluster(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """JobSet's exclusive placement (one Job per rack) of the tenant's own kube-scheduler: JobSet's webhook gives
    each Job's leader a pod affinity with its Job and an anti-affinity with other Jobs over the rack key, and
    its followers a nodeSelector of the leader's node's rack. The virtual node carries the key with a value of
    its own (it stands for several racks): the first Job's leader goes there, the vnode binds the second's (kept
    off only by a rule per rack) and the followers the other Job's leader keeps off; the copies keep the rules
    (a follower's selector becomes an affinity with its Job), so each Job runs in a rack of its own."""
    vnode_rack = await eventually(lambda: _rack_of_the_virtual_node(tenant_api), timeout=30,
                                  what="the virtual node carrying the rack key")
    assert vnode_rack == "ferry-tenant-1.virtual"  # a domain of its own, named after it but not its hostname
    body = jobset("excl", pods=2, duration="60s")
    body["metadata"]["annotations"] = {"alpha.jobset.sigs.k8s.io/exclusive-topology": DOMAIN_LABEL}
    body["spec"]["replicatedJobs"][0]["replicas"] = 2
    await client.CustomObjectsApi(tenant_api).create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", tenant_ns, "jobsets", body)
    by_job = await eventually(lambda: racks_of_groups(compute_api, tenant_ns, "jobset.sigs.k8s.io/job-index", 4),
                              timeout=180, what="the JobSet's 4 pods Running in the compute cluster")
    assert sorted(by_job) == ["0", "1"] and all(len(r) == 1 for r in by_job.values()), by_job  # a Job, a rack
    assert by_job["0"] != by_job["1"], by_job  # and no rack holds two Jobs
    for copy in await compute_copies(compute_api, tenant_ns):  # a follower is near its Job, whatever the binpack
        if copy.metadata.annotations.get("batch.kubernetes.io/job-completion-index") != "0":
            job_key = copy.metadata.labels["jobset.sigs.k8s.io/job-key"]
            assert DOMAIN_LABEL not in (copy.spec.node_selector or {}), copy.spec.node_selector
            (near,) = copy.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
            assert near.topology_key == DOMAIN_LABEL and near.label_selector.match_expressions[0].values == [job_key]
    told = (await client.CoreV1Api(tenant_api).list_namespaced_event(
        tenant_ns, field_selector="reason=BoundByVirtualNode")).items
    assert told, "the vnode bound the pods the other Job's rule kept off the virtual node"


@pytest.mark.usefixtures("jobset_controller")
async def test_a_failing_jobset_is_recreated_whole_in_order_and_leaves_no_copy_of_an_earlier_attempt(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, peer_dns: PeerDNS) -> None:
    """JobSet's failure policy and in-order startup through the virtual node: a leader Job, then (once the
    leader is Ready upstream, which the vnode mirrors) a workers Job whose pods fail. A failed Job makes
    JobSet recreate every Job under the same names (restart attempt 1); the compute cluster then holds the
    new attempt's copies only, the leader's name reaches its new copy, and once the second attempt fails
    too the JobSet is Failed for reaching its restarts, with nothing left running in the compute cluster."""
    body = jobset("flaky", pods=2, duration="5s")
    workers = body["spec"]["replicatedJobs"][0]
    workers["template"]["spec"]["template"]["metadata"]["annotations"]["kubeferry.io/sim-exit-code"] = "1"
    (leader,) = jobset("flaky", pods=1, duration="1h")["spec"]["replicatedJobs"]  # runs until JobSet stops it
    leader["name"] = "leader"
    body["spec"] |= {"replicatedJobs": [leader, workers], "startupPolicy": {"startupPolicyOrder": "InOrder"},
                     "failurePolicy": {"maxRestarts": 1}}
    jobs, core = client.CustomObjectsApi(tenant_api), client.CoreV1Api(tenant_api)
    await jobs.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", tenant_ns, "jobsets", body)
    attempts: dict[str, set[str]] = {}  # restart attempt -> the replicated Jobs whose copies were seen

    async def watched() -> bool:
        for c in await compute_copies(compute_api, tenant_ns):
            attempt, job = c.metadata.labels[RESTART_ATTEMPT], c.metadata.labels[REPLICATED_JOB]
            if job == "workers" and job not in attempts.get(attempt, set()):  # in order: the leader is Ready
                leads = (await core.list_namespaced_pod(tenant_ns, label_selector=(
                    f"{REPLICATED_JOB}=leader,{RESTART_ATTEMPT}={attempt}"))).items  # none: restarted since
                assert all(any(k.type == "Ready" and k.status == "True" for k in lead.status.conditions or [])
                           for lead in leads), f"attempt {attempt}'s workers started before its leader was Ready"
            attempts.setdefault(attempt, set()).add(job)
        return attempts.get("1") == {"leader", "workers"}

    await eventually(watched, timeout=120, interval=0.2, what="the second attempt's leader and workers")
    assert attempts["0"] == {"leader", "workers"}, attempts

    async def only_the_new_attempt() -> list[Any] | None:
        live = await live_copies(compute_api, tenant_ns)
        return live if live and {c.metadata.labels[RESTART_ATTEMPT] for c in live} == {"1"} else None

    live = await eventually(only_the_new_attempt, timeout=30, what="no copy of the first attempt left")
    (lead_copy,) = [c for c in live if c.metadata.labels[REPLICATED_JOB] == "leader"]
    await eventually(lambda: _resolves(peer_dns, lead_copy, "flaky-leader-0-0.flaky", [lead_copy.status.pod_ip]),
                     timeout=10, what="the leader's name answered with its new copy")

    async def failed() -> dict[str, Any] | None:
        js = await jobs.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", tenant_ns, "jobsets", "flaky")
        status = js.get("status") or {}
        return status if any(c["type"] == "Failed" and c["status"] == "True"
                             for c in status.get("conditions") or []) else None

    status = await eventually(failed, timeout=90, what="the JobSet Failed")
    (cond,) = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert status["restarts"] == 1 and cond["reason"] == "ReachedMaxRestarts", status

    async def nothing_running() -> bool:
        return not [c for c in await live_copies(compute_api, tenant_ns) if c.status.phase == "Running"]

    await eventually(nothing_running, timeout=60, what="nothing of the failed JobSet running in the compute cluster")


async def _rack_of_the_virtual_node(tenant_api: client.ApiClient) -> str | None:
    node = await client.CoreV1Api(tenant_api).read_node("ferry-tenant-1")
    return (node.metadata.labels or {}).get(DOMAIN_LABEL)


async def _resolves(dns: PeerDNS, pod: Any, name: str, want: list[str]) -> bool:
    return await resolve(dns, pod, name) == want
