"""An unmodified Kueue (v0.17.0, built from its Go module) in a tenant cluster, installed after the virtual
node started (as an admin adds it to a running cluster): the tenant's own quota decides which of its jobs
may start, and the admitted ones run through the virtual node.

- Batch Jobs: Kueue suspends each Job of a LocalQueue until its ClusterQueue admits it, then lets it
  go with its ResourceFlavor's node labels and tolerations (here: a GPU model's, which the virtual node
  carries, since its compute GPU nodes share them, and the virtual node's own). With a quota of
  one job's GPUs, the second Job gets no pod until the first ends, and both complete.
- Plain pods (Kueue's pod integration): Kueue's webhook gates each pod (``kueue.x-k8s.io/admission``) and
  lifts the gate on admission. For pods of a scheduler the vnode serves, the vnode binds them, and lifts
  Kueue's gates only where no Kueue runs: it must see that Kueue runs now, though it did not when the vnode
  started, or the second pod would start beside the first, past the tenant's quota. A pod group is
  admitted whole, and the vnode makes its pods one compute gang.
- JobSets and TrainJobs (over Trainer's released runtime): admitted whole, suspended until then.

Kueue's admission webhooks are served by the process and called by URL (test_jobset.py's way); the pod and
Job webhooks see only objects of a LocalQueue, so the other tests' pods never wait for them. Kueue's CRDs
are removed after the module (the vnode lifts Kueue's gates where no Kueue runs: test_vnode.py). Kueue
reads a metrics certificate at a fixed path under /etc: it is given one in a mount namespace of its own."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.binaries import Binaries
from ferry.binaries.clients import KUEUE, ensure_operator
from ferry.cluster.gpunodes import DEFAULT_MODEL, DOMAIN_LABEL, MODEL_LABEL
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from ferry.keys import POD_GROUP_LABEL
from tests.helpers import (
    accepted_once_cached,
    controller_with_webhooks,
    eventually,
    install_crd,
    live_copies,
    running_copies,
    url_webhook,
)
from tests.integration.test_gpu_pools import POOL_KEY, copies_gone, pooled_vnode
from tests.integration.test_jobset import jobset, jobset_controller  # noqa: F401 (a fixture: Kueue admits JobSets)
from tests.integration.test_trainer import API as TRAINER_API
from tests.integration.test_trainer import (
    created,
    install_trainer_crds,
    train_job,
    trainer_controller,  # noqa: F401 (a fixture: Kueue admits TrainJobs)
    trainjob_complete,
)
from tests.integration.test_vnode import compute_pod_of
from vnode.naming import UPSTREAM_NAME_ANNOTATION, UPSTREAM_NS_LABEL
from vnode.translate import KUEUE_PODSET, PODSET_GROUP_LABEL, SLICE_LABEL

T = TypeVar("T")
TENANT = "tenant-1"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"  # a label of a JobSet's pods
KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
NODE = f"ferry-{TENANT}"
HOSTNAME = "kubernetes.io/hostname"
VNODE_ROLE = "kube-ferry-vnode"  # manifests/tenant/rbac-vnode.yaml
TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}
# Topology-aware Jobs write the virtual node's toleration into their pod template, as README (*Kueue*) advises
# for Kueue v0.17.0-v0.17.2: their TAS node controller checks a node's taints against the Workload's templates
# only, not the flavor's tolerations (kueue#11152, fixed in v0.17.3), and terminated a pod ungated onto the
# virtual node but not yet bound (a CI failure: `PodTerminatedByKueue`, the Job failed). The other tests leave
# the toleration to the flavor.
WEBHOOKS = ("kueue-ferry-test-mutating", "kueue-ferry-test-validating")
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")  # read at its start unless it makes its own certificates
CLUSTER_QUEUE, FLAVOR = "ferry-test-gpus", "ferry-test-shared"
# a flavor of one GPU model, as admins write them (GPU feature discovery's and Kube-Ferry's labels), met by the
# virtual node, which carries the labels its compute GPU nodes share
FLAVOR_LABELS = {"kubeferry.io/role": "virtual-node", "nvidia.com/gpu.present": "true", MODEL_LABEL: DEFAULT_MODEL}


def webhook_configurations(port: int, ca: bytes) -> list[dict[str, Any]]:
    """The release's webhooks (config/components/webhook) for Jobs, pods and Kueue's own objects, by URL;
    Jobs' and pods' only for objects of a LocalQueue."""
    hook = partial(url_webhook, port, ca)
    queued = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}

    def rule(group: str, resources: list[str], *operations: str) -> dict[str, Any]:
        version = {"": "v1", "batch": "v1", "jobset.x-k8s.io": "v1alpha2", TRAINER_API[0]: TRAINER_API[1]}.get(
            group, VERSION)
        return {"apiGroups": [group], "apiVersions": [version],
                "resources": resources, "operations": list(operations)}

    mine = f"{GROUP.replace('.', '-')}-{VERSION}"
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": WEBHOOKS[0]},
         "webhooks": [hook("mpod.kb.io", "/mutate--v1-pod", rule("", ["pods"], "CREATE"), queued),
                      hook("mjob.kb.io", "/mutate-batch-v1-job", rule("batch", ["jobs"], "CREATE"), queued),
                      hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                           rule("jobset.x-k8s.io", ["jobsets"], "CREATE"), queued),
                      hook("mtrainjob.kb.io", "/mutate-trainer-kubeflow-org-v1alpha1-trainjob",
                           rule(TRAINER_API[0], ["trainjobs"], "CREATE"), queued),
                      *(hook(f"m{kind}.kb.io", f"/mutate-{mine}-{kind}", rule(GROUP, [f"{kind}s"], "CREATE"))
                        for kind in ("clusterqueue", "resourceflavor", "workload"))]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": WEBHOOKS[1]},
         "webhooks": [hook("vpod.kb.io", "/validate--v1-pod", rule("", ["pods"], "CREATE", "UPDATE"), queued),
                      hook("vjob.kb.io", "/validate-batch-v1-job", rule("batch", ["jobs"], "CREATE", "UPDATE"),
                           queued),
                      hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset",
                           rule("jobset.x-k8s.io", ["jobsets"], "CREATE", "UPDATE"), queued),
                      hook("vtrainjob.kb.io", "/validate-trainer-kubeflow-org-v1alpha1-trainjob",
                           rule(TRAINER_API[0], ["trainjobs"], "CREATE", "UPDATE"), queued),
                      hook("vclusterqueue.kb.io", f"/validate-{mine}-clusterqueue",
                           rule(GROUP, ["clusterqueues"], "CREATE", "UPDATE")),
                      hook("vresourceflavor.kb.io", f"/validate-{mine}-resourceflavor",
                           rule(GROUP, ["resourceflavors"], "CREATE", "UPDATE")),
                      hook("vworkload.kb.io", f"/validate-{mine}-workload",
                           rule(GROUP, ["workloads", "workloads/status"], "CREATE", "UPDATE"))]},
    ]


@pytest.fixture(scope="module")
def kueue(planes: ControlPlanes, binaries: Binaries, vnodes: dict[str, Component],
          jobset_controller: subprocess.Popen[bytes],  # noqa: F811 (the fixture imported above)
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Kueue's CRDs in tenant-1 and its controller running (batch Jobs, plain pods, JobSets, whose
    controller runs first, and Trainer's TrainJobs, whose API is there first: Kueue sets an integration up
    at its start, or later when it polls, backing off), a ResourceFlavor for the virtual node and a
    ClusterQueue of 8 GPUs; yields the kubectl command for tenant-1."""
    op = ensure_operator(KUEUE)
    kubeconfig = planes.kubeconfig(TENANT)
    kubectl = [str(binaries.path("kubectl")), f"--kubeconfig={kubeconfig}"]
    crds = sorted(op.crds.glob("*.yaml"))
    install_trainer_crds(kubectl)
    for crd in crds:
        install_crd(kubectl, crd, _resource(crd))
    subprocess.run([*kubectl, "create", "namespace", "kueue-system"], check=False, capture_output=True)
    settings = {"namespace": "kueue-system", "manageJobsWithoutQueueName": False,
                "integrations": {"frameworks": ["batch/job", "pod", "jobset.x-k8s.io/jobset",
                                                "trainer.kubeflow.org/trainjob"]}}
    try:
        with controller_with_webhooks(op.binary, f"config.{GROUP}/{VERSION}", settings, kubeconfig, kubectl,
                                      tmp_path_factory.mktemp("kueue"), webhook_configurations,
                                      args=("--feature-gates=VisibilityOnDemand=false",),
                                      fixed_cert_dirs=(METRICS_CERT_DIR,)):
            objects = [
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
                 "spec": {"nodeLabels": FLAVOR_LABELS, "tolerations": [TOLERATION]}},
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
                 "spec": {"namespaceSelector": {}, "resourceGroups": [{
                     "coveredResources": ["nvidia.com/gpu"],
                     "flavors": [{"name": FLAVOR, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}},
            ]
            subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(objects).encode(), check=True,
                           capture_output=True)
            yield kubectl
    finally:
        # Kueue's objects carry its finalizers, which nobody removes once it is stopped: the CRDs would never go.
        for crd in crds:
            plural = _resource(crd)
            listed = subprocess.run([*kubectl, "get", plural, "-A", "-o", "json"], capture_output=True, text=True,
                                    check=False)
            for item in (yaml.safe_load(listed.stdout) or {}).get("items", []) if listed.returncode == 0 else []:
                meta = item["metadata"]
                subprocess.run([*kubectl, "patch", plural, meta["name"], "--type=merge",
                                "-p", '{"metadata":{"finalizers":null}}',
                                *(["-n", meta["namespace"]] if meta.get("namespace") else [])],
                               check=False, capture_output=True)
        for crd in crds:
            subprocess.run([*kubectl, "delete", "-f", str(crd), "--ignore-not-found", "--wait=true", "--timeout=60s"],
                           check=False, capture_output=True)
        subprocess.run([*kubectl, "delete", "namespace", "kueue-system", "--ignore-not-found", "--wait=false"],
                       check=False, capture_output=True)


async def _waited(tenant_api: client.ApiClient, ns: str, check: Callable[[], Awaitable[T | None]],
                  **waiting: Any) -> T:
    """``eventually(check, **waiting)``; failing, it says where Kueue's objects and the pods stand."""
    try:
        return await eventually(check, **waiting)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {await _state(tenant_api, ns)}") from None


def _resource(crd: Path) -> str:
    """A CRD file's resource name, as the release names its files (``kueue.x-k8s.io_workloads.yaml``)."""
    return crd.stem.split("_", 1)[1] + "." + GROUP


async def _state(api: client.ApiClient, ns: str) -> str:
    """Where Kueue's objects and the pods stand, for a failure message."""
    jobs = (await client.BatchV1Api(api).list_namespaced_job(ns)).items
    pods = (await client.CoreV1Api(api).list_namespaced_pod(ns)).items
    custom = client.CustomObjectsApi(api)
    workloads = (await custom.list_namespaced_custom_object(GROUP, VERSION, ns, "workloads"))["items"]
    cq = await custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", CLUSTER_QUEUE)
    lqs = (await custom.list_namespaced_custom_object(GROUP, VERSION, ns, "localqueues"))["items"]
    events = (await client.CoreV1Api(api).list_namespaced_event(ns)).items

    def conds(obj: dict[str, Any]) -> list[tuple[str, str, str]]:
        return [(c["type"], c["status"], c.get("message", "")[:150])
                for c in (obj.get("status") or {}).get("conditions") or []]

    return (f"jobs {[(j.metadata.name, j.spec.suspend, j.status.active) for j in jobs]}; "
            f"pods {[(p.metadata.name, p.status.phase, p.spec.node_name, p.spec.scheduling_gates) for p in pods]}; "
            f"workloads {[(w['metadata']['name'], conds(w)) for w in workloads]}; cluster queue {conds(cq)}; "
            f"local queues {[(q['metadata']['name'], conds(q)) for q in lqs]}; events "
            f"{[(e.involved_object.name, e.reason, e.message[:200]) for e in events]}; pod conditions "
            f"{[(p.metadata.name, [(c.type, c.status, c.reason) for c in p.status.conditions or []]) for p in pods]}")


async def _local_queue(api: client.ApiClient, ns: str) -> None:
    """LocalQueue ``team`` in ``ns``, once Kueue's webhooks know ``ns``: they read namespaces from Kueue's
    cache, and refuse a pod of a namespace it has not seen yet ("Namespace ... not found"), as a loaded
    machine showed."""
    await client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, "localqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue", "metadata": {"name": "team"},
        "spec": {"clusterQueue": CLUSTER_QUEUE}})
    core = client.CoreV1Api(api)
    await accepted_once_cached(lambda: core.create_namespaced_pod(ns, gated_pod("probe", 1), dry_run="All"), 404,
                               "Namespace", f"Kueue's webhooks to know namespace {ns}", timeout=60)


def _container(gpus: int) -> dict[str, Any]:
    return {"name": "main", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}


def gpu_job(name: str, seconds: int) -> dict[str, Any]:
    """A one-pod Job of 8 GPUs in LocalQueue ``team``, written with no toleration: the flavor brings it."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {QUEUE_LABEL: "team"}},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"annotations": {"kubeferry.io/sim-duration": f"{seconds}s"}},
                "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                         "containers": [_container(8)]}}}}


def _finished(job: Any) -> datetime | None:
    for c in job.status.conditions or []:
        if c.type == "Complete" and c.status == "True":
            return job.status.completion_time or c.last_transition_time  # type: ignore[no-any-return]
    return None


async def test_kueue_admits_a_tenants_jobs_by_its_quota_and_they_run_through_the_virtual_node(
        kueue: list[str], tenant_api: client.ApiClient, tenant_ns: str) -> None:
    await _local_queue(tenant_api, tenant_ns)
    batch, core = client.BatchV1Api(tenant_api), client.CoreV1Api(tenant_api)
    for name in ("first", "second"):
        await batch.create_namespaced_job(tenant_ns, gpu_job(name, 10))

    async def one_running() -> list[Any] | None:
        pods = (await core.list_namespaced_pod(tenant_ns)).items
        running = [p for p in pods if p.status.phase == "Running"]
        return pods if len(running) == 1 and running[0].spec.node_name == NODE else None

    pods = await _waited(tenant_api, tenant_ns, one_running, timeout=90,
                         what="one admitted Job's pod Running on the virtual node")
    (pod,) = pods  # the other Job has no pod: it waits in Kueue, suspended
    assert pod.spec.node_selector == FLAVOR_LABELS  # the flavor's
    waiting = ({"first", "second"} - {pod.metadata.labels["job-name"]}).pop()
    assert (await batch.read_namespaced_job(waiting, tenant_ns)).spec.suspend is True

    async def both_complete() -> list[Any] | None:
        jobs = [await batch.read_namespaced_job(n, tenant_ns) for n in ("first", "second")]
        return jobs if all(_finished(j) for j in jobs) else None

    jobs = await eventually(both_complete, timeout=120, interval=1, what="both Jobs Complete")
    ran = sorted((j.status.start_time, _finished(j)) for j in jobs)
    assert ran[1][0] >= ran[0][1].replace(microsecond=0), f"the Jobs ran at once, past the quota: {ran}"


async def _one_admitted_whole(tenant_api: client.ApiClient, compute_api: client.ApiClient, ns: str, kind: str) -> str:
    """Of two JobSets (or objects Trainer makes one of) named ``first`` and ``second`` of two 4-GPU pods in
    a LocalQueue of 8 GPUs: once one's 2 pods run in the compute cluster, asserts that only that one has
    pods, each bound to the virtual node with the flavor's node labels; returns the other's name."""
    copies = await _waited(tenant_api, ns, lambda: running_copies(compute_api, ns, 2), timeout=90,
                           what=f"one admitted {kind}'s 2 pods Running")
    running = {c.metadata.labels[JOBSET_NAME] for c in copies}
    assert len(running) == 1, running  # whole, and one at a time
    for pod in (await client.CoreV1Api(tenant_api).list_namespaced_pod(ns)).items:
        assert pod.spec.node_name == NODE and pod.spec.node_selector == FLAVOR_LABELS, pod.spec
        assert pod.metadata.labels[JOBSET_NAME] in running, pod.metadata.name
    return ({"first", "second"} - running).pop()


async def test_kueue_admits_a_tenants_jobsets_whole_by_its_quota_and_they_run_through_the_virtual_node(
        kueue: list[str], tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Two JobSets of two 4-GPU pods each in a LocalQueue of 8 GPUs: Kueue admits one JobSet whole (its pods
    get the flavor's node labels and toleration, and their copies run in the compute cluster) and keeps
    the other suspended, with no pod, until the first completes; then it runs too."""
    await _local_queue(tenant_api, tenant_ns)
    custom = client.CustomObjectsApi(tenant_api)
    for name in ("first", "second"):
        body = jobset(name, pods=2, duration="10s")
        body["metadata"]["labels"] = {QUEUE_LABEL: "team"}
        pod = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        pod["spec"]["tolerations"] = []  # the flavor brings it
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"
        await custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", tenant_ns, "jobsets", body)

    waiting = await _one_admitted_whole(tenant_api, compute_api, tenant_ns, "JobSet")
    held = await custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", tenant_ns, "jobsets", waiting)
    assert held["spec"].get("suspend") is True, held["spec"]

    async def both_completed() -> list[dict[str, Any]] | None:
        done = []
        for name in ("first", "second"):
            js = await custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", tenant_ns, "jobsets", name)
            for c in (js.get("status") or {}).get("conditions") or []:
                if c["type"] == "Completed" and c["status"] == "True":
                    done.append(c)
        return done if len(done) == 2 else None

    await _waited(tenant_api, tenant_ns, both_completed, timeout=120, interval=1, what="both JobSets Completed")


async def test_kueue_admits_a_tenants_trainjobs_whole_by_its_quota_and_they_run_through_the_virtual_node(
        kueue: list[str], trainer_controller: Path,  # noqa: F811 (the fixture imported above)
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Kubeflow's documented stack, Kueue over Trainer: two TrainJobs of two 4-GPU nodes on the release's torch
    runtime in a LocalQueue of 8 GPUs, naming no toleration. Kueue admits one whole: its runtime patch gives the
    nodes the flavor's node labels and toleration, the tenant's kube-scheduler binds them to the virtual node
    and their copies run; the other TrainJob stays suspended, with no pod, until the first completes."""
    await _local_queue(tenant_api, tenant_ns)
    objects = client.CustomObjectsApi(tenant_api)
    for name in ("first", "second"):
        job = train_job(name, "torch-distributed", "ClusterTrainingRuntime", nodes=2, gpus=4,
                        annotations={"kubeferry.io/sim-duration": "10s"}, tolerated=False)
        job["metadata"]["labels"] = {QUEUE_LABEL: "team"}
        await created(objects, tenant_ns, job)

    waiting = await _one_admitted_whole(tenant_api, compute_api, tenant_ns, "TrainJob")
    held = await objects.get_namespaced_custom_object(*TRAINER_API, tenant_ns, "trainjobs", waiting)
    assert held["spec"].get("suspend") is True, held["spec"]

    async def both_complete() -> bool:
        return all([await trainjob_complete(objects, tenant_ns, name) for name in ("first", "second")])

    await _waited(tenant_api, tenant_ns, both_complete, timeout=120, interval=1, what="both TrainJobs Complete")


def gated_pod(name: str, seconds: int) -> dict[str, Any]:
    """A plain pod of LocalQueue ``team`` for a scheduler the vnode serves (it binds such pods itself)."""
    return {"metadata": {"name": name, "labels": {QUEUE_LABEL: "team"},
                         "annotations": {"kubeferry.io/sim-duration": f"{seconds}s"}},
            "spec": {"schedulerName": "kube-ferry", "restartPolicy": "Never", "tolerations": [TOLERATION],
                     "automountServiceAccountToken": False, "containers": [_container(8)]}}


async def test_kueues_gates_on_plain_pods_are_left_to_kueue_once_it_runs(
        kueue: list[str], tenant_api: client.ApiClient, tenant_ns: str) -> None:
    await _local_queue(tenant_api, tenant_ns)
    core = client.CoreV1Api(tenant_api)
    await core.create_namespaced_pod(tenant_ns, gated_pod("first", 15))
    await core.create_namespaced_pod(tenant_ns, gated_pod("second", 5))

    async def ended(name: str) -> Any | None:
        try:
            pod = await core.read_namespaced_pod(name, tenant_ns)
        except ApiException as exc:
            if exc.status == 404:  # what Kueue does to a pod that starts without its admission
                raise AssertionError(f"pod {name} is gone: Kueue deleted it for running unadmitted, its gate "
                                     "lifted by someone other than Kueue") from None
            raise
        return pod if pod.status.phase == "Succeeded" else None

    pods = [await eventually(lambda n=n: ended(n), timeout=90, what=f"pod {n} Succeeded")  # type: ignore[misc]
            for n in ("first", "second")]
    assert {p.spec.node_name for p in pods} == {NODE}
    ran = sorted((p.status.container_statuses[0].state.terminated.started_at,
                  p.status.container_statuses[0].state.terminated.finished_at) for p in pods)
    assert ran[1][0] >= ran[0][1], f"the pods ran at once, past the quota: {ran}: a Kueue gate was lifted by " \
                                   "someone other than Kueue"


async def test_a_kueue_pod_group_is_admitted_whole_and_its_pods_run_as_one_compute_gang(
        kueue: list[str], tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Kueue's plain pod groups (pods labelled with one ``kueue.x-k8s.io/pod-group-name``, the group's size in
    an annotation), of a scheduler the vnode serves: two groups of two 4-GPU pods in a LocalQueue of 8 GPUs.
    Kueue admits one group whole and lifts its pods' gates; the vnode binds them and makes them one gang of
    the compute cluster (one compute PodGroup of 2). The other group keeps Kueue's gates, unbound, until the
    first has ended; then it runs too."""
    await _local_queue(tenant_api, tenant_ns)
    core = client.CoreV1Api(tenant_api)
    for group in ("first", "second"):
        for i in range(2):
            pod = gated_pod(f"{group}-{i}", 10)
            pod["metadata"]["labels"][KUEUE_POD_GROUP] = group
            pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] = "2"
            pod["spec"]["containers"] = [_container(4)]
            await core.create_namespaced_pod(tenant_ns, pod)

    copies = await _waited(tenant_api, tenant_ns, lambda: running_copies(compute_api, tenant_ns, 2), timeout=90,
                           what="one admitted pod group's 2 pods Running")
    running = {c.metadata.annotations[UPSTREAM_NAME_ANNOTATION].rsplit("-", 1)[0] for c in copies}
    assert len(running) == 1, running  # whole, and one group at a time
    groups = await _compute_groups(compute_api, tenant_ns)
    assert [g["spec"]["minMember"] for g in groups] == [2], groups  # one gang of the two
    waiting = ({"first", "second"} - running).pop()
    for i in range(2):
        pod = await core.read_namespaced_pod(f"{waiting}-{i}", tenant_ns)
        assert pod.spec.node_name is None and "kueue.x-k8s.io/admission" in {
            g.name for g in pod.spec.scheduling_gates or []}, (pod.spec.node_name, pod.spec.scheduling_gates)

    async def all_succeeded() -> list[Any] | None:
        pods = (await core.list_namespaced_pod(tenant_ns)).items
        return pods if len(pods) == 4 and all(p.status.phase == "Succeeded" for p in pods) else None

    pods = await _waited(tenant_api, tenant_ns, all_succeeded, timeout=120, interval=1, what="the 4 pods Succeeded")
    ran = {p.metadata.name: p.status.container_statuses[0].state.terminated for p in pods}
    first_ended = max(ran[f"{g}-{i}"].finished_at for g in running for i in range(2))
    assert all(ran[f"{waiting}-{i}"].started_at >= first_ended for i in range(2)), f"past the quota: {ran}"


async def test_a_flavor_per_gpu_product_runs_each_admitted_job_on_its_products_virtual_node(
        kueue: list[str], vnodes: dict[str, Component], tenant_api: client.ApiClient,
        compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Where the compute cluster has two GPU products, the vnode gives each a GPU pool (here two compute nodes
    labelled with a product of their own) and the tenant admin a ResourceFlavor per product, as Kueue's
    documentation writes flavors: a ClusterQueue of 8 GPUs of each. Kueue admits the first Job to the first
    flavor and, that one full, the second to the other; the tenant's kube-scheduler binds each pod to its
    product's virtual node, and each copy runs on that product's compute nodes, both at once."""
    products = {"prod-a": f"a-{tenant_ns}", "prod-b": f"b-{tenant_ns}"}
    custom, batch = client.CustomObjectsApi(tenant_api), client.BatchV1Api(tenant_api)
    cluster_queue = f"ferry-test-products-{tenant_ns}"
    flavors = {pool: f"ferry-test-{pool}-{tenant_ns}" for pool in products}
    async with pooled_vnode(vnodes, compute_api, tenant_api, products) as members:
        for pool, value in products.items():
            await custom.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": flavors[pool]},
                "spec": {"nodeLabels": {POOL_KEY: value}, "tolerations": [TOLERATION]}})
        await custom.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [{"name": flavors[pool], "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}
                            for pool in products]}]}})
        await custom.create_namespaced_custom_object(GROUP, VERSION, tenant_ns, "localqueues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue", "metadata": {"name": "products"},
            "spec": {"clusterQueue": cluster_queue}})
        for name in ("first", "second"):
            job = gpu_job(name, 600)
            job["metadata"]["labels"][QUEUE_LABEL] = "products"
            await batch.create_namespaced_job(tenant_ns, job)
            await eventually(lambda n=name: _pod_bound(tenant_api, tenant_ns, n), timeout=60,  # type: ignore[misc]
                             what=f"Job {name}'s pod bound")  # in order: Kueue gives the first flavor first

        async def both_running() -> dict[str, tuple[str, str]] | None:
            out = {}
            for pod in (await client.CoreV1Api(tenant_api).list_namespaced_pod(tenant_ns)).items:
                copy = await compute_pod_of(compute_api, TENANT, pod.metadata.uid)
                if pod.status.phase != "Running" or copy is None:
                    return None
                out[pod.metadata.labels["job-name"]] = (pod.spec.node_name, copy.spec.node_name)
            return out if len(out) == 2 else None

        placed = await _waited(tenant_api, tenant_ns, both_running, timeout=90, what="both Jobs' pods Running")
        for job, pool in (("first", "prod-a"), ("second", "prod-b")):
            node, compute_node = placed[job]
            assert node == f"{NODE}-{pool}" and compute_node in members[pool], placed
        for name in ("first", "second"):
            await batch.delete_namespaced_job(name, tenant_ns, propagation_policy="Foreground")
        await eventually(lambda: copies_gone(compute_api, tenant_ns), timeout=60, what="the copies deleted")


async def _compute_groups(compute_api: client.ApiClient, tenant_ns: str) -> list[dict[str, Any]]:
    """The compute PodGroups the vnode made for tenant namespace ``tenant_ns``."""
    groups = await client.CustomObjectsApi(compute_api).list_namespaced_custom_object(
        "scheduling.kubeferry.io", "v1alpha1", TENANT, "podgroups", label_selector=f"{UPSTREAM_NS_LABEL}={tenant_ns}")
    items: list[dict[str, Any]] = groups["items"]
    return items


async def _topology_queue(api: client.ApiClient, ns: str, gpus: int = 24) -> None:
    """A Topology of racks (``kubeferry.io/topology-domain``) and hosts, a ResourceFlavor over it for the
    virtual node, a ClusterQueue of ``gpus`` GPUs of it and LocalQueue ``racks`` in ``ns``."""
    custom = client.CustomObjectsApi(api)
    topology, flavor, cluster_queue = (f"ferry-test-{kind}-{ns}" for kind in ("racks", "tas", "tas-cq"))
    await custom.create_cluster_custom_object(GROUP, VERSION, "topologies", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Topology", "metadata": {"name": topology},
        "spec": {"levels": [{"nodeLabel": DOMAIN_LABEL}, {"nodeLabel": HOSTNAME}]}})
    await custom.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": flavor},
        "spec": {"nodeLabels": FLAVOR_LABELS, "tolerations": [TOLERATION], "topologyName": topology}})
    await custom.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": flavor, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}})
    await custom.create_namespaced_custom_object(GROUP, VERSION, ns, "localqueues", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue", "metadata": {"name": "racks"},
        "spec": {"clusterQueue": cluster_queue}})


def _kept_job(name: str, level: str, gpus: int, how: str = "required") -> dict[str, Any]:
    """A Job of LocalQueue ``racks`` of two pods of ``gpus`` GPUs that requires (or prefers) one domain of
    ``level``."""
    job = gpu_job(name, 10)
    job["metadata"]["labels"][QUEUE_LABEL] = "racks"
    job["spec"] |= {"parallelism": 2, "completions": 2}
    template = job["spec"]["template"]
    template["metadata"]["annotations"][f"kueue.x-k8s.io/podset-{how}-topology"] = level
    template["spec"]["containers"] = [_container(gpus)]
    template["spec"]["tolerations"] = [TOLERATION]  # kueue#11152 (above)
    return job


async def test_kueues_topology_aware_scheduling_places_a_job_in_one_rack_which_the_virtual_node_stands_for(
        kueue: list[str], tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Kueue's topology-aware scheduling in the tenant cluster, over the racks (``kubeferry.io/topology-domain``)
    and hosts of a Topology: a Job of two 8-GPU pods that requires one rack, and one of two 4-GPU pods that
    requires one host. To the tenant the virtual node is one rack (it carries the key with a value of its own,
    not its hostname, which Kueue would take for the rack: "no topology domains at level") and one host, so
    Kueue admits both Jobs there and lifts their ``kueue.x-k8s.io/topology`` gates with a node selector of the
    virtual node's hostname. The rules hold in the compute cluster too: each Workload's pods are one compute
    gang (a PodGroup of 2, its size read from the Workload with the vnode's own rights) whose copies keep to
    one rack (on two whole nodes of it) or to one node; they run and the Jobs complete."""
    await _topology_queue(tenant_api, tenant_ns)
    batch = client.BatchV1Api(tenant_api)
    levels = {"ranked": (DOMAIN_LABEL, 8), "hosted": (HOSTNAME, 4)}
    for name, (level, gpus) in levels.items():
        await batch.create_namespaced_job(tenant_ns, _kept_job(name, level, gpus))

    copies = await _waited(tenant_api, tenant_ns, lambda: running_copies(compute_api, tenant_ns, 4), timeout=90,
                           what="the Jobs' 4 pods Running")
    for pod in (await client.CoreV1Api(tenant_api).list_namespaced_pod(tenant_ns)).items:
        assert pod.spec.node_name == NODE, pod.spec.node_name
        assert (pod.spec.node_selector or {}).get(HOSTNAME) == NODE, pod.spec.node_selector
    groups = await _compute_groups(compute_api, tenant_ns)
    assert [g["spec"]["minMember"] for g in groups] == [2, 2], groups  # one gang of each Workload's two pods
    by_job: dict[str, list[Any]] = {}
    for c in copies:
        by_job.setdefault(c.metadata.labels["job-name"], []).append(c)
    for name, (level, _) in levels.items():
        assert len({c.metadata.labels[POD_GROUP_LABEL] for c in by_job[name]}) == 1, name
        for c in by_job[name]:
            (term,) = c.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
            assert term.topology_key == level, term
    racked = [await client.CoreV1Api(compute_api).read_node(c.spec.node_name) for c in by_job["ranked"]]
    assert len({n.metadata.name for n in racked}) == 2, "two whole nodes"
    assert len({n.metadata.labels[DOMAIN_LABEL] for n in racked}) == 1, [n.metadata.labels for n in racked]
    assert len({c.spec.node_name for c in by_job["hosted"]}) == 1, [c.spec.node_name for c in by_job["hosted"]]

    async def complete() -> bool:
        return all([_finished(await batch.read_namespaced_job(name, tenant_ns)) is not None for name in levels])

    await _waited(tenant_api, tenant_ns, complete, timeout=90, interval=1, what="the Jobs Complete")


async def test_a_rack_kueue_prefers_holds_in_the_compute_cluster_where_one_has_room_and_a_host_too_small_does_not_block(
        kueue: list[str], tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Kueue's preferred topology (``podset-preferred-topology``): a Job of two 8-GPU pods that prefers one rack,
    and one of two 8-GPU pods that prefers one host. Kueue admits both on the virtual node (one rack and one
    host with every GPU, to the tenant). In the compute cluster each Workload is one gang whose copies carry a
    preferred pod affinity over the level: the rack Job runs in one rack, and the host Job, which no compute
    node holds whole (a required host would wait), runs on two nodes. Both Jobs complete."""
    await _topology_queue(tenant_api, tenant_ns, gpus=32)
    batch = client.BatchV1Api(tenant_api)
    levels = {"gathered": DOMAIN_LABEL, "spilled": HOSTNAME}
    for name, level in levels.items():
        await batch.create_namespaced_job(tenant_ns, _kept_job(name, level, 8, how="preferred"))

    copies = await _waited(tenant_api, tenant_ns, lambda: running_copies(compute_api, tenant_ns, 4), timeout=90,
                           what="the Jobs' 4 pods Running")
    groups = await _compute_groups(compute_api, tenant_ns)
    assert [g["spec"]["minMember"] for g in groups] == [2, 2], groups  # one gang of each Workload's two pods
    nodes: dict[str, list[Any]] = {}
    for c in copies:
        (weighted,) = c.spec.affinity.pod_affinity.preferred_during_scheduling_ignored_during_execution
        assert weighted.pod_affinity_term.topology_key == levels[c.metadata.labels["job-name"]], weighted
        assert not c.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
        nodes.setdefault(c.metadata.labels["job-name"], []).append(
            await client.CoreV1Api(compute_api).read_node(c.spec.node_name))
    assert len({n.metadata.labels[DOMAIN_LABEL] for n in nodes["gathered"]}) == 1, [
        n.metadata.labels for n in nodes["gathered"]]
    assert len({n.metadata.name for n in nodes["spilled"]}) == 2, "no node holds 16 GPUs"

    async def complete() -> bool:
        return all([_finished(await batch.read_namespaced_job(name, tenant_ns)) is not None for name in levels])

    await _waited(tenant_api, tenant_ns, complete, timeout=90, interval=1, what="the Jobs Complete")


async def _leader_and_workers(api: client.ApiClient, ns: str, name: str, gpus: tuple[int, int],
                              annotations: dict[str, str]) -> None:
    """Create a JobSet of LocalQueue ``racks``: a leader Job of one pod and a workers Job of two, with ``gpus``
    GPUs a pod (leader's, workers'), every pod template carrying Kueue's ``annotations``."""
    body = jobset(name, pods=2, duration="10s")
    body["metadata"]["labels"] = {QUEUE_LABEL: "racks"}
    workers = body["spec"]["replicatedJobs"][0]
    pod = workers["template"]["spec"]["template"]
    pod["spec"]["tolerations"] = [TOLERATION]  # written in, not left to the flavor: kueue#11152
    pod["metadata"]["annotations"] |= annotations
    leader = copy.deepcopy(workers)
    leader["name"] = "leader"
    leader["template"]["spec"] |= {"parallelism": 1, "completions": 1}
    for job, n in zip((leader, workers), gpus, strict=True):
        job["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(n)
    body["spec"]["replicatedJobs"].insert(0, leader)
    await client.CustomObjectsApi(api).create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets",
                                                                       body)


async def _jobset_completed(api: client.ApiClient, ns: str, name: str) -> None:
    async def completed() -> bool:
        js = await client.CustomObjectsApi(api).get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns,
                                                                             "jobsets", name)
        return any(c["type"] == "Completed" and c["status"] == "True"
                   for c in (js.get("status") or {}).get("conditions") or [])

    await _waited(api, ns, completed, timeout=90, interval=1, what="the JobSet Completed")


async def test_a_kueue_podset_group_shares_one_compute_host(
        kueue: list[str], tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A JobSet whose leader (one 2-GPU pod) and workers (two 2-GPU pods) form one podset group
    (``kueue.x-k8s.io/podset-group-name``) that requires one host, as Kueue's documentation pairs a leader with
    its workers. Kueue admits it on the virtual node; in the compute cluster the three copies are one gang, each
    with a required pod affinity over hostnames with the group's copies (selected by a label of the copies'
    own), so they share one node, and the JobSet completes."""
    await _topology_queue(tenant_api, tenant_ns)
    await _leader_and_workers(tenant_api, tenant_ns, "paired", (2, 2), {
        "kueue.x-k8s.io/podset-required-topology": HOSTNAME, "kueue.x-k8s.io/podset-group-name": "paired"})

    copies = await _waited(tenant_api, tenant_ns, lambda: running_copies(compute_api, tenant_ns, 3), timeout=90,
                           what="the JobSet's 3 pods Running")
    groups = await _compute_groups(compute_api, tenant_ns)
    assert [g["spec"]["minMember"] for g in groups] == [3], groups
    for c in copies:
        (term,) = c.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
        assert term.topology_key == HOSTNAME and term.label_selector.match_labels == {
            POD_GROUP_LABEL: c.metadata.labels[POD_GROUP_LABEL], PODSET_GROUP_LABEL: "paired"}, term
    assert len({c.spec.node_name for c in copies}) == 1, [c.spec.node_name for c in copies]
    await _jobset_completed(tenant_api, tenant_ns, "paired")


async def test_a_kueue_workload_of_two_podsets_each_required_in_one_rack_keeps_each_in_a_compute_rack(
        kueue: list[str], tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """A JobSet whose leader (one 8-GPU pod) and workers (two 4-GPU pods) are two podsets, each required in one
    rack (no podset group: each its own). Kueue admits the Workload whole on the virtual node; in the compute
    cluster the three copies are one gang with one required pod affinity per podset (selected by its podset
    label), which the scheduler places group after group, each in a rack of its own choosing, and the JobSet
    completes."""
    await _topology_queue(tenant_api, tenant_ns)
    await _leader_and_workers(tenant_api, tenant_ns, "podsets", (8, 4),
                              {"kueue.x-k8s.io/podset-required-topology": DOMAIN_LABEL})

    copies = await _waited(tenant_api, tenant_ns, lambda: running_copies(compute_api, tenant_ns, 3), timeout=90,
                           what="the JobSet's 3 pods Running")
    groups = await _compute_groups(compute_api, tenant_ns)
    assert [g["spec"]["minMember"] for g in groups] == [3], groups
    racks: dict[str, set[str]] = {}
    for c in copies:
        (term,) = c.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
        podset = c.metadata.labels[KUEUE_PODSET]
        assert term.topology_key == DOMAIN_LABEL and term.label_selector.match_labels == {
            POD_GROUP_LABEL: c.metadata.labels[POD_GROUP_LABEL], KUEUE_PODSET: podset}, term
        node = await client.CoreV1Api(compute_api).read_node(c.spec.node_name)
        racks.setdefault(podset, set()).add(node.metadata.labels[DOMAIN_LABEL])
    assert sorted(racks) == ["leader", "workers"] and all(len(r) == 1 for r in racks.values()), racks
    await _jobset_completed(tenant_api, tenant_ns, "podsets")


async def test_a_kueue_podset_sliced_by_host_keeps_each_slice_of_consecutive_ranks_on_one_compute_node(
        kueue: list[str], tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """Kueue's slices: two Indexed Jobs of four 4-GPU pods whose podset is cut into slices of two, each required
    on one host (``podset-slice-required-topology``, ``podset-slice-size``); "racked" also requires its whole
    podset in one rack. Kueue admits both on the virtual node (one rack and one host to the tenant); in the
    compute cluster each Job is one gang of four whose copies carry their slice (completion index over two, read
    as the Workload says) and a required pod affinity with their slice's copies over hostnames (after the rack
    term with the podset's copies, for "racked"), so pods 0 and 1 share a node, as do 2 and 3, "racked" in one
    rack; both Jobs complete."""
    await _topology_queue(tenant_api, tenant_ns, gpus=32)
    batch = client.BatchV1Api(tenant_api)
    slices = {"kueue.x-k8s.io/podset-slice-required-topology": HOSTNAME, "kueue.x-k8s.io/podset-slice-size": "2"}
    for name, podset_level in (("sliced", None), ("racked", DOMAIN_LABEL)):
        job = _kept_job(name, podset_level or HOSTNAME, 4)
        job["spec"] |= {"parallelism": 4, "completions": 4, "completionMode": "Indexed"}
        annotations = job["spec"]["template"]["metadata"]["annotations"]
        annotations["kubeferry.io/sim-duration"] = "45s"  # both Jobs' pods run at once while they are looked at
        if podset_level is None:
            del annotations["kueue.x-k8s.io/podset-required-topology"]
        annotations |= slices
        await batch.create_namespaced_job(tenant_ns, job)

    copies = await _waited(tenant_api, tenant_ns, lambda: running_copies(compute_api, tenant_ns, 8), timeout=120,
                           what="the Jobs' 8 pods Running")
    groups = await _compute_groups(compute_api, tenant_ns)
    assert [g["spec"]["minMember"] for g in groups] == [4, 4], groups
    nodes: dict[tuple[str, str], set[str]] = {}
    racks: set[str] = set()
    for c in copies:
        job_name, index = c.metadata.labels["job-name"], int(c.metadata.annotations[
            "batch.kubernetes.io/job-completion-index"])
        assert c.metadata.labels[SLICE_LABEL] == str(index // 2), (index, c.metadata.labels)
        *podset_terms, term = c.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
        assert term.topology_key == HOSTNAME and term.label_selector.match_labels == {
            POD_GROUP_LABEL: c.metadata.labels[POD_GROUP_LABEL], SLICE_LABEL: str(index // 2),
            KUEUE_PODSET: c.metadata.labels[KUEUE_PODSET]}, term
        assert [t.topology_key for t in podset_terms] == ([DOMAIN_LABEL] if job_name == "racked" else []), podset_terms
        nodes.setdefault((job_name, str(index // 2)), set()).add(c.spec.node_name)
        if job_name == "racked":
            racks.add((await client.CoreV1Api(compute_api).read_node(c.spec.node_name)).metadata.labels[DOMAIN_LABEL])
    assert len(nodes) == 4 and all(len(n) == 1 for n in nodes.values()), nodes
    assert len(racks) == 1, racks

    async def complete() -> bool:
        return all([_finished(await batch.read_namespaced_job(name, tenant_ns)) is not None
                    for name in ("sliced", "racked")])

    await _waited(tenant_api, tenant_ns, complete, timeout=120, interval=1, what="the Jobs Complete")


async def test_a_vnode_that_may_not_read_kueues_workloads_says_so_on_the_pod_and_runs_it_once_granted(
        kueue: list[str], tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The vnode's tenant ClusterRole of an earlier release, without ``get`` on Kueue's Workloads (an upgrade in
    the wrong order): a Job kept in one rack cannot be sized as a gang, and its pods say why in an Event (the
    rule to grant); none is copied. Once the rule is back the Job runs and completes."""
    rbac = client.RbacAuthorizationV1Api(tenant_api)
    role = await rbac.read_cluster_role(VNODE_ROLE)
    rules = role.rules
    role.rules = [r for r in rules if "workloads" not in (r.resources or [])]
    assert len(role.rules) == len(rules) - 1, rules
    await rbac.replace_cluster_role(VNODE_ROLE, role)
    try:
        await _topology_queue(tenant_api, tenant_ns)
        batch, core = client.BatchV1Api(tenant_api), client.CoreV1Api(tenant_api)
        await batch.create_namespaced_job(tenant_ns, _kept_job("sized", DOMAIN_LABEL, 4))

        async def told() -> list[Any] | None:
            events = (await core.list_namespaced_event(tenant_ns, field_selector="reason=GangNotReady")).items
            return [e for e in events if "get on workloads.kueue.x-k8s.io" in e.message] or None

        (event, *_) = await _waited(tenant_api, tenant_ns, told, timeout=60, what="the pod told what to grant")
        assert event.involved_object.kind == "Pod" and "may not read Kueue Workload" in event.message, event.message
        assert await live_copies(compute_api, tenant_ns) == []
    finally:
        now = await rbac.read_cluster_role(VNODE_ROLE)
        now.rules = rules
        await rbac.replace_cluster_role(VNODE_ROLE, now)

    async def complete() -> bool:
        return _finished(await batch.read_namespaced_job("sized", tenant_ns)) is not None

    await _waited(tenant_api, tenant_ns, complete, timeout=90, interval=1, what="the Job Complete once granted")


async def _pod_bound(api: client.ApiClient, ns: str, job: str) -> bool:
    pods = (await client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"job-name={job}")).items
    return any(p.spec.node_name for p in pods)
