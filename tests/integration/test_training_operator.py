"""An unmodified Kubeflow Training Operator (v1.8.1, built from its Go module) in a tenant cluster: its
PyTorchJobs, gang-scheduled through the Volcano PodGroups it writes, run on the compute cluster through
the virtual node and end Succeeded; a job deleted while it runs leaves nothing behind in the compute
cluster."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.binaries import Binaries
from ferry.binaries.clients import TRAINING_OPERATOR, ensure_operator
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import (
    CONTROLLER_RUNTIME_CERT_DIR,
    compute_copies,
    eventually,
    free_port,
    guarantee_claiming,
    logged_process,
    reserved_node,
    resolve,
    running_pods,
    wait_sync,
)
from vnode.dnsserver import PeerDNS
from vnode.naming import UPSTREAM_NAME_ANNOTATION, compute_name

TENANT = "tenant-1"
OPERATOR_NS = "kubeflow"
WEBHOOK_SECRET = "training-operator-webhook-cert"
IMAGE = "docker.io/kubeflowkatib/pytorch-mnist:v1beta1-45c5727"  # the operator's own example (kwok runs none)
# Where the operator reads its webhook certificate: in a Deployment, the kubelet mounts the Secret its cert
# rotator fills there; run as a process, the test writes the Secret's files there itself.
# What the operator's release installs besides its Deployment: its namespace, the Secret its cert rotator
# fills and the webhook configuration it injects the CA into (here without webhooks: the apiserver cannot
# reach a process outside the cluster by a Service name, and validation is not what is tested).
SETUP = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {OPERATOR_NS}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: {WEBHOOK_SECRET}, namespace: {OPERATOR_NS}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: validator.training-operator.kubeflow.org}}
webhooks: []
"""


@pytest.fixture(scope="module")
def training_operator(planes: ControlPlanes, binaries: Binaries, vnodes: dict[str, Component],
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """The operator watching every namespace of tenant-1, gang scheduler ``volcano``, PyTorchJobs and MPIJobs."""
    op = ensure_operator(TRAINING_OPERATOR)
    kubeconfig = planes.kubeconfig(TENANT)
    kubectl = [str(binaries.path("kubectl")), f"--kubeconfig={kubeconfig}"]
    for crd in ("kubeflow.org_pytorchjobs.yaml", "kubeflow.org_mpijobs.yaml"):
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(op.crds / crd)], check=True, capture_output=True)
    subprocess.run([*kubectl, "apply", "-f", "-"], input=SETUP.encode(), check=True, capture_output=True)
    log_path = tmp_path_factory.mktemp("training-operator") / "operator.log"
    with logged_process([str(op.binary), "--gang-scheduler-name=volcano", "--enable-scheme=pytorchjob",
                         "--enable-scheme=mpijob", "--metrics-bind-address=0", "--health-probe-bind-address=0",
                         f"--webhook-server-port={free_port()}"],
                        {**os.environ, "KUBECONFIG": str(kubeconfig), "MY_POD_NAMESPACE": OPERATOR_NS},
                        log_path) as proc:
        def certificate() -> dict[str, str] | None:
            out = subprocess.run([*kubectl, "-n", OPERATOR_NS, "get", "secret", WEBHOOK_SECRET, "-o", "json"],
                                 capture_output=True, check=True).stdout
            data: dict[str, str] = json.loads(out).get("data") or {}
            return data if {"ca.crt", "tls.crt", "tls.key"} <= data.keys() else None

        data = wait_sync(certificate, 60, "the operator's cert rotator to fill its Secret")
        CONTROLLER_RUNTIME_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for key in ("ca.crt", "tls.crt", "tls.key"):
            (CONTROLLER_RUNTIME_CERT_DIR / key).write_bytes(base64.b64decode(data[key]))
        markers = [f'"{kind}-controller", "worker count"'.encode() for kind in ("pytorchjob", "mpijob")]
        wait_sync(lambda: all(m in log_path.read_bytes() for m in markers), 60,
                  f"the job controllers to start (log: {log_path})")
        assert proc.poll() is None, log_path.read_text()[-2000:]
        yield proc


def pytorchjob(name: str, workers: int, duration: str, gpus: int = 1, restart: str = "OnFailure",
               node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A PyTorchJob as a user writes it: one master and ``workers`` workers of ``gpus`` GPUs each."""
    def replicas(count: int) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": "pytorch", "image": IMAGE,
                                                "command": ["python3", "/opt/pytorch-mnist/mnist.py", "--epochs=1"],
                                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
        if node_selector:
            spec["nodeSelector"] = node_selector
        return {"replicas": count, "restartPolicy": restart, "template": {
            "metadata": {"annotations": {"kubeferry.io/sim-duration": duration}}, "spec": spec}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(workers)}}}


async def _succeeded(jobs: client.CustomObjectsApi, ns: str, plural: str, name: str) -> bool:
    """The job's own condition ``Succeeded`` is true (what the operator concluded from its pods)."""
    job = await jobs.get_namespaced_custom_object("kubeflow.org", "v1", ns, plural, name)
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Succeeded" and c["status"] == "True" for c in conditions)


@pytest.mark.usefixtures("training_operator")
async def test_a_pytorchjob_runs_through_the_virtual_node_and_succeeds(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    jobs = client.CustomObjectsApi(tenant_api)
    await jobs.create_namespaced_custom_object("kubeflow.org", "v1", tenant_ns, "pytorchjobs",
                                               pytorchjob("mnist", workers=3, duration="5s"))

    async def placed() -> list[Any] | None:
        pods = await compute_copies(compute_api, tenant_ns)
        return pods if len(pods) == 4 and all(p.spec.node_name for p in pods) else None

    for pod in await eventually(placed, timeout=90, what="the job's 4 pods bound in the compute cluster"):
        assert pod.spec.node_name.startswith("gpu-node-"), pod.spec.node_name

    await eventually(lambda: _succeeded(jobs, tenant_ns, "pytorchjobs", "mnist"), timeout=120,
                     what="the PyTorchJob's condition Succeeded")

    async def all_succeeded() -> list[Any] | None:  # the job succeeds with its master; workers end on their own
        pods = (await client.CoreV1Api(tenant_api).list_namespaced_pod(tenant_ns)).items
        return pods if {p.status.phase for p in pods} == {"Succeeded"} else None

    pods = await eventually(all_succeeded, timeout=60, what="every member Succeeded in the tenant cluster")
    assert sorted(p.metadata.name for p in pods) == ["mnist-master-0", "mnist-worker-0", "mnist-worker-1",
                                                     "mnist-worker-2"]
    assert {p.spec.node_name for p in pods} == {f"ferry-{TENANT}"}


@pytest.mark.usefixtures("training_operator")
async def test_a_pytorchjob_deleted_while_running_leaves_nothing_in_the_compute_cluster(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, peer_dns: PeerDNS) -> None:
    jobs = client.CustomObjectsApi(tenant_api)
    await jobs.create_namespaced_custom_object("kubeflow.org", "v1", tenant_ns, "pytorchjobs",
                                               pytorchjob("long", workers=2, duration="600s"))

    async def running() -> list[Any] | None:
        pods = await compute_copies(compute_api, tenant_ns)
        return pods if len(pods) == 3 and all(p.status.phase == "Running" for p in pods) else None

    pods = await eventually(running, timeout=90, what="the job's 3 pods Running in the compute cluster")
    # The workers reach the master at the operator's MASTER_ADDR, its Service: copied to the compute cluster,
    # the name resolves (`ferry dns`) to the master's compute pod, or to the copy's cluster IP.
    by_name = {p.metadata.annotations[UPSTREAM_NAME_ANNOTATION]: p for p in pods}
    worker, master = by_name["long-worker-0"], by_name["long-master-0"]
    addr = next(e.value for e in worker.spec.containers[0].env if e.name == "MASTER_ADDR")

    async def master_found() -> bool:
        try:
            svc = await client.CoreV1Api(compute_api).read_namespaced_service(
                compute_name(TENANT, tenant_ns, addr), TENANT)
        except ApiException:  # not copied yet
            return False
        want = [master.status.pod_ip] if svc.spec.cluster_ip in (None, "None") else [svc.spec.cluster_ip]
        return await resolve(peer_dns, worker, addr) == want

    await eventually(master_found, timeout=30, what=f"MASTER_ADDR {addr} resolved to the master")
    await jobs.delete_namespaced_custom_object("kubeflow.org", "v1", tenant_ns, "pytorchjobs", "long")

    async def gone() -> bool:
        return not await compute_copies(compute_api, tenant_ns)

    await eventually(gone, timeout=90, what="the deleted job's compute pods to be gone")


def mpijob(name: str, workers: int) -> dict[str, Any]:
    """An MPIJob as its examples write it: a launcher without GPUs that ends after 10 s, and workers of one
    GPU each that run until the operator removes them (``cleanPodPolicy: Running``)."""
    def pod(duration: str, limits: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"annotations": {"kubeferry.io/sim-duration": duration}},
                "spec": {"containers": [{"name": "mpi", "image": "horovod/horovod:0.28.1",
                                         "command": ["mpirun", "-np", str(workers), "python", "train.py"],
                                         "resources": {"limits": limits}}]}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "MPIJob", "metadata": {"name": name},
            "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"}, "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": pod("10s", {"cpu": "1", "memory": "1Gi"})},
                "Worker": {"replicas": workers, "template": pod("600s", {"nvidia.com/gpu": "1"})}}}}


@pytest.mark.usefixtures("training_operator")
async def test_an_mpijob_runs_its_launcher_and_workers_as_one_gang_and_succeeds(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The launcher (with the hostfile ConfigMap and the ServiceAccount the operator makes for it) and the
    workers start together in the compute cluster; when the launcher ends, the job succeeds and the
    operator removes the running workers, here and there."""
    jobs = client.CustomObjectsApi(tenant_api)
    await jobs.create_namespaced_custom_object("kubeflow.org", "v1", tenant_ns, "mpijobs", mpijob("mpi", workers=2))

    async def started() -> list[Any] | None:
        pods = await compute_copies(compute_api, tenant_ns)
        return pods if len(pods) == 3 and all(p.status.phase in ("Running", "Succeeded") for p in pods) else None

    await eventually(started, timeout=90, what="the launcher and 2 workers started in the compute cluster")

    await eventually(lambda: _succeeded(jobs, tenant_ns, "mpijobs", "mpi"), timeout=120,
                     what="the MPIJob's condition Succeeded")

    async def workers_gone() -> bool:
        pods = await compute_copies(compute_api, tenant_ns)
        return [p.metadata.labels.get("training.kubeflow.org/replica-type") for p in pods] == ["launcher"]

    await eventually(workers_gone, timeout=90, what="the running workers removed, leaving the launcher")


@pytest.mark.usefixtures("training_operator")
async def test_a_preempted_pytorchjob_is_replaced_by_its_operator_and_runs_again_as_one_gang(
        tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str, compute_ns: str) -> None:
    """A PyTorchJob borrowing a node is preempted whole for another queue's guarantee: its pods are told
    ``Preempted`` (exit code 137, as an evicted container's) and then removed, as kube-scheduler and Volcano
    remove the pods they preempt; the operator makes new ones (or, seeing a failed pod first, restarts it
    under ``restartPolicy: ExitCode``), which wait as one gang and run once the node is free. The job never
    fails."""
    ccore = client.CoreV1Api(compute_api)
    jobs, tcore = client.CustomObjectsApi(tenant_api), client.CoreV1Api(tenant_api)
    async with reserved_node(compute_api, tenant_ns):
        await jobs.create_namespaced_custom_object("kubeflow.org", "v1", tenant_ns, "pytorchjobs", pytorchjob(
            "ckpt", workers=1, duration="600s", gpus=4, restart="ExitCode", node_selector={"ferry-test": tenant_ns}))
        first = await eventually(lambda: running_pods(tcore, tenant_ns, 2), timeout=90,
                                 what="the job's master and worker Running")

        async with guarantee_claiming(compute_api, compute_ns, tenant_ns) as urgent:
            async def replaced() -> list[Any] | None:
                pods = [p for p in (await tcore.list_namespaced_pod(tenant_ns)).items
                        if p.metadata.deletion_timestamp is None and p.status.phase != "Failed"]
                uids = {p.metadata.uid for p in first}
                return pods if len(pods) == 2 and not any(p.metadata.uid in uids for p in pods) else None

            await eventually(replaced, timeout=60, what="the operator's new master and worker")
            copies = await compute_copies(compute_api, tenant_ns)
            assert not any(p.spec.node_name and p.metadata.deletion_timestamp is None for p in copies), \
                [(p.metadata.name, p.spec.node_name, p.status.phase) for p in copies]  # the gang waits whole

            await ccore.delete_namespaced_pod(urgent, compute_ns, grace_period_seconds=0)
            again = await eventually(lambda: running_pods(tcore, tenant_ns, 2), timeout=90,
                                     what="the restarted job Running once the node is free")
        assert not {p.metadata.uid for p in again} & {p.metadata.uid for p in first}
        job = await jobs.get_namespaced_custom_object("kubeflow.org", "v1", tenant_ns, "pytorchjobs", "ckpt")
        assert not any(c["type"] == "Failed" and c["status"] == "True"
                       for c in (job.get("status") or {}).get("conditions") or []), job.get("status")
        await jobs.delete_namespaced_custom_object("kubeflow.org", "v1", tenant_ns, "pytorchjobs", "ckpt")
