"""An unmodified Kubeflow MPI Operator (v0.6.0, the v2 controller, built from its Go module) in a tenant
cluster with Volcano gang scheduling: an MPIJob's launcher (a batch Job, whose pod the tenant's own Job
controller makes) and its GPU workers start as one gang through the virtual node, the job succeeds when
the launcher ends, and the workers the operator then removes leave the compute cluster; the names of its
hostfile resolve to the workers' compute pods (`ferry dns`); preempted whole,
the job is made again by the operator and the Job controller and runs again as one gang.

It runs in tenant-2: its ``mpijobs.kubeflow.org`` CRD (v2beta1) is not the Training Operator's (v1), which
the tests of that operator install in tenant-1."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.binaries import Binaries
from ferry.binaries.clients import MPI_OPERATOR, ensure_operator
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import (
    eventually,
    install_crd,
    live_copies,
    logged_process,
    preempted_whole_then_freed,
    reserved_node,
    resolve,
    running_pods,
    wait_sync,
)
from vnode.dnsserver import PeerDNS
from vnode.naming import UPSTREAM_NAME_ANNOTATION

TENANT = "tenant-2"
LOCK_NS = "mpi-operator"  # where its leader election keeps its Lease (its release's namespace)
IMAGE = "mpioperator/mpi-pi:openmpi"  # its own example (kwok runs none)


@pytest.fixture(scope="module")
def mpi_operator(planes: ControlPlanes, binaries: Binaries, vnodes: dict[str, Component],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """The operator watching every namespace of tenant-2, gang scheduler ``volcano``."""
    op = ensure_operator(MPI_OPERATOR)
    kubeconfig = planes.kubeconfig(TENANT)
    kubectl = [str(binaries.path("kubectl")), f"--kubeconfig={kubeconfig}"]
    install_crd(kubectl, op.crds / "kubeflow.org_mpijobs.yaml", "mpijobs.kubeflow.org")  # else it exits at once
    subprocess.run([*kubectl, "create", "namespace", LOCK_NS], check=False, capture_output=True)
    log_path = tmp_path_factory.mktemp("mpi-operator") / "operator.log"
    with logged_process([str(op.binary), "--gang-scheduling=volcano", f"--kubeConfig={kubeconfig}",
                         f"--lock-namespace={LOCK_NS}", "--monitoring-port=0"],
                        {**os.environ, "KUBECONFIG": str(kubeconfig)}, log_path) as proc:
        wait_sync(lambda: b"Starting workers" in log_path.read_bytes(), 60,
                  f"the MPIJob controller to start (log: {log_path})")
        assert proc.poll() is None, log_path.read_text()[-2000:]
        yield proc


def mpijob(name: str, workers: int, gpus: int = 1, launcher_runs: str = "10s",
           node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """An MPIJob as the operator's examples write one: a launcher without GPUs that ends after
    ``launcher_runs``, and workers of ``gpus`` GPUs each that run until the operator removes them
    (``cleanPodPolicy: Running``)."""
    def replica(count: int, container: str, duration: str, limits: dict[str, str]) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": container, "image": IMAGE,
                                                "command": ["mpirun", "-n", str(workers), "/home/mpiuser/pi"],
                                                "resources": {"limits": limits}}]}
        if node_selector:
            spec["nodeSelector"] = node_selector
        return {"replicas": count, "template": {
            "metadata": {"annotations": {"kubeferry.io/sim-duration": duration}}, "spec": spec}}
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": name},
            "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running"}, "mpiReplicaSpecs": {
                "Launcher": replica(1, "mpi-launcher", launcher_runs, {"cpu": "1", "memory": "1Gi"}),
                "Worker": replica(workers, "mpi-worker", "600s", {"nvidia.com/gpu": str(gpus)})}}}



@pytest.mark.usefixtures("mpi_operator")
async def test_an_mpijob_runs_its_launcher_job_and_workers_as_one_gang_and_succeeds(
        tenant2_api: client.ApiClient, compute_api: client.ApiClient, tenant2_ns: str, peer_dns: PeerDNS) -> None:
    jobs = client.CustomObjectsApi(tenant2_api)
    await jobs.create_namespaced_custom_object("kubeflow.org", "v2beta1", tenant2_ns, "mpijobs", mpijob("pi", 2))

    async def started() -> list[Any] | None:
        pods = await live_copies(compute_api, tenant2_ns)
        return pods if len(pods) == 3 and all(p.status.phase in ("Running", "Succeeded") for p in pods) else None

    pods = await eventually(started, timeout=90, what="the launcher and 2 workers started in the compute cluster")
    names = sorted(p.metadata.annotations[UPSTREAM_NAME_ANNOTATION] for p in pods)
    assert names[1:] == ["pi-worker-0", "pi-worker-1"] and names[0].startswith("pi-launcher-"), names
    assert {p.metadata.labels["kubeferry.io/pod-group"] for p in pods} == {pods[0].metadata.labels[
        "kubeferry.io/pod-group"]}  # one gang: the launcher's Job pod and the workers
    # mpirun reaches the workers by the names of the operator's hostfile (<worker>.<job>.<namespace>.svc):
    # through `ferry dns`, each is the worker's compute pod, as a worker's own resolver would find it.
    hostfile = (await client.CoreV1Api(tenant2_api).read_namespaced_config_map("pi-config", tenant2_ns)).data
    hosts = [line.split()[0] for line in hostfile["hostfile"].splitlines() if line.strip()]
    by_name = {p.metadata.annotations[UPSTREAM_NAME_ANNOTATION]: p for p in pods}
    assert [h.split(".")[0] for h in hosts] == ["pi-worker-0", "pi-worker-1"], hosts

    answers: list[tuple[str, list[str] | None]] = []

    async def resolved() -> list[tuple[str, list[str] | None]] | None:
        answers[:] = [(h, await resolve(peer_dns, by_name["pi-worker-0"], h)) for h in hosts]
        return answers if all(ips == [by_name[h.split(".")[0]].status.pod_ip] for h, ips in answers) else None

    try:
        await eventually(resolved, timeout=30, what="the hostfile's names resolved to the workers' compute pods")
    except AssertionError as exc:  # say what was answered, and for which pods
        pods_seen = [(n, p.status.pod_ip, p.status.phase) for n, p in by_name.items()]
        raise AssertionError(f"{exc}; answers {answers}; pods {pods_seen}") from None

    async def succeeded() -> bool:
        job = await jobs.get_namespaced_custom_object("kubeflow.org", "v2beta1", tenant2_ns, "mpijobs", "pi")
        conditions = (job.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Succeeded" and c["status"] == "True" for c in conditions)

    await eventually(succeeded, timeout=120, what="the MPIJob's condition Succeeded")

    async def workers_gone() -> bool:
        return all(p.metadata.annotations[UPSTREAM_NAME_ANNOTATION].startswith("pi-launcher-")
                   for p in await live_copies(compute_api, tenant2_ns))

    await eventually(workers_gone, timeout=60, what="the removed workers gone from the compute cluster")


@pytest.mark.usefixtures("mpi_operator")
async def test_a_preempted_mpijob_is_replaced_by_its_operator_and_job_controller_and_runs_again(
        tenant2_api: client.ApiClient, compute_api: client.ApiClient, tenant2_ns: str, compute_ns: str) -> None:
    """An MPIJob borrowing a node is preempted whole for another queue's guarantee: the operator replaces
    its workers and the tenant's Job controller its launcher; the replacements wait as one gang while the
    node is taken, and run once it is free."""
    tcore, jobs = client.CoreV1Api(tenant2_api), client.CustomObjectsApi(tenant2_api)
    async with reserved_node(compute_api, tenant2_ns):
        await jobs.create_namespaced_custom_object("kubeflow.org", "v2beta1", tenant2_ns, "mpijobs", mpijob(
            "pi", 2, gpus=4, launcher_runs="600s", node_selector={"ferry-test": tenant2_ns}))
        first = await eventually(lambda: running_pods(tcore, tenant2_ns, 3), timeout=90,
                                 what="the launcher and 2 workers Running")
        await preempted_whole_then_freed(compute_api, compute_ns, tcore, tenant2_ns, first, "tenant-2")
        await jobs.delete_namespaced_custom_object("kubeflow.org", "v2beta1", tenant2_ns, "mpijobs", "pi")
