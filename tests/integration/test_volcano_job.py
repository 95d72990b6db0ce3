"""Unmodified Volcano job controller and admission webhooks (v1.10.0, built from its Go module) in a tenant
cluster whose Volcano scheduler is the virtual node, as a tenant admin installs Volcano beside Kube-Ferry
(its controllers and webhooks, not its scheduler). The test creates no Volcano Queue: the vnode makes the
``default`` Queue that Volcano's scheduler would have made, or the webhooks refuse every vcjob.

- A vcjob of a master and two GPU workers, with Volcano's ``ssh``, ``svc`` and ``env`` plugins, runs as one
  gang through the virtual node. Its workers resolve by the names of the ``svc`` plugin's hostfile (through
  ``ferry dns``). The job completes when its master does (``CompleteJob``), and the workers it then kills
  leave the compute cluster.
- Preempted whole for another queue's guarantee, a vcjob restarts whole (``PodEvicted: RestartJob``): its
  new pods wait as one gang while the node is taken, and run once it is free.
- A plain Deployment whose pods name the ``volcano`` scheduler gets its PodGroup from Volcano's PodGroup
  controller and runs through the virtual node; scaled to nothing, it leaves nothing in the compute cluster.
- A vcjob of ``minSuccess`` 2 completes when two workers have succeeded; the worker still running is
  killed and leaves the compute cluster.

The webhooks are served by the process and called by URL with a certificate the test issues (local planes
have no cluster network); the release's webhook configurations are reproduced below with that change."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from ferry import certs
from ferry.binaries import Binaries
from ferry.binaries.clients import VOLCANO_JOBS, ensure_operator
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import (
    eventually,
    free_port,
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
BATCH = ("batch.volcano.sh", "v1alpha1")
ADMISSIONS = ("/jobs/mutate", "/jobs/validate")


def webhook_configurations(port: int, ca: bytes) -> list[dict[str, Any]]:
    """The release's vcjob webhooks (installer/helm/chart/volcano/templates/webhooks.yaml), each called by
    URL. Named as the chart names them: the webhook manager looks them up by these names to add its CA."""
    bundle = base64.b64encode(ca).decode()
    rule = {"apiGroups": [BATCH[0]], "apiVersions": [BATCH[1]], "resources": ["jobs"], "scope": "*"}

    def config(kind: str, name: str, url_path: str, operations: list[str]) -> dict[str, Any]:
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                "metadata": {"name": "volcano-admission-service" + url_path.replace("/", "-")},
                "webhooks": [{"name": name, "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
                              "matchPolicy": "Equivalent", "sideEffects": "NoneOnDryRun", "timeoutSeconds": 10,
                              "clientConfig": {"url": f"https://127.0.0.1:{port}{url_path}", "caBundle": bundle},
                              "rules": [{**rule, "operations": operations}]}]}

    return [config("MutatingWebhookConfiguration", "mutatejob.volcano.sh", "/jobs/mutate", ["CREATE"]),
            config("ValidatingWebhookConfiguration", "validatejob.volcano.sh", "/jobs/validate",
                   ["CREATE", "UPDATE"])]


@pytest.fixture(scope="module")
def volcano_jobs(planes: ControlPlanes, binaries: Binaries, vnodes: dict[str, Component],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """Volcano's job, queue and PodGroup controllers watching tenant-2, its vcjob webhooks registered while
    they run.
    The PodGroup CRD stays the one the tenant planes install (Volcano's fields, unknown ones kept)."""
    op = ensure_operator(VOLCANO_JOBS)
    kubeconfig = planes.kubeconfig(TENANT)
    kubectl = [str(binaries.path("kubectl")), f"--kubeconfig={kubeconfig}"]
    for crd, name in (("batch.volcano.sh_jobs.yaml", "jobs.batch.volcano.sh"),
                      ("bus.volcano.sh_commands.yaml", "commands.bus.volcano.sh"),
                      ("scheduling.volcano.sh_queues.yaml", "queues.scheduling.volcano.sh")):
        install_crd(kubectl, op.crds / crd, name)
    work = tmp_path_factory.mktemp("volcano")
    ca = certs.new_ca("volcano-webhook-ca")
    serving = certs.issue(ca, "127.0.0.1", ips=("127.0.0.1",), server=True)
    for file, pem in (("ca.crt", certs.cert_pem(ca.cert)), ("tls.crt", certs.cert_pem(serving.cert)),
                      ("tls.key", certs.key_pem(serving.key))):
        (work / file).write_bytes(pem)
    port = free_port()
    manifests = yaml.safe_dump_all(webhook_configurations(port, certs.cert_pem(ca.cert)))
    subprocess.run([*kubectl, "apply", "-f", "-"], input=manifests.encode(), check=True, capture_output=True)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    hooks_log, controllers_log = work / "webhook-manager.log", work / "controller-manager.log"
    try:
        hooks_cmd = [str(op.path("vc-webhook-manager")), f"--kubeconfig={kubeconfig}", "--listen-address=127.0.0.1",
                     f"--port={port}", f"--webhook-url=https://127.0.0.1:{port}", f"--ca-cert-file={work / 'ca.crt'}",
                     f"--tls-cert-file={work / 'tls.crt'}", f"--tls-private-key-file={work / 'tls.key'}",
                     f"--enabled-admission={','.join(ADMISSIONS)}"]
        with logged_process(hooks_cmd, env, hooks_log) as hooks, \
             logged_process([str(op.binary), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
                             "--controllers=job-controller,queue-controller,pg-controller"], env,
                            controllers_log) as controllers:
            wait_sync(lambda: b"JobController is running" in controllers_log.read_bytes()
                      or controllers.poll() is not None, 60, f"Volcano's job controller to start ({controllers_log})")
            assert controllers.poll() is None, controllers_log.read_text()[-3000:]
            wait_sync(lambda: _listening(port) or hooks.poll() is not None, 60,
                      f"Volcano's webhooks served ({hooks_log})")
            assert hooks.poll() is None, hooks_log.read_text()[-3000:]
            # made by the vnode (nothing here creates it), opened by Volcano's queue controller
            wait_sync(lambda: subprocess.run([*kubectl, "get", "queues.scheduling.volcano.sh", "default", "-o",
                                              "jsonpath={.status.state}"], capture_output=True, text=True,
                                             check=False).stdout == "Open", 60, "Volcano's default Queue Open")
            yield controllers
    finally:  # a vcjob webhook nobody serves would refuse every later vcjob
        subprocess.run([*kubectl, "delete", "-f", "-", "--ignore-not-found"], input=manifests.encode(), check=False,
                       capture_output=True)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def vcjob(name: str, workers: int, gpus: int = 1, master_runs: str = "10s",
          node_selector: dict[str, str] | None = None, on_evicted: str | None = None) -> dict[str, Any]:
    """A vcjob as Volcano's MPI example writes one (its webhook fills in the queue, scheduler and
    ``minAvailable``): a master without GPUs that ends after ``master_runs`` and completes the job, and
    workers of ``gpus`` GPUs each that run until the job ends."""
    def task(task_name: str, replicas: int, duration: str, limits: dict[str, str]) -> dict[str, Any]:
        spec: dict[str, Any] = {"restartPolicy": "OnFailure", "containers": [
            {"name": task_name, "image": "volcanosh/example-mpi:0.0.3", "resources": {"limits": limits}}]}
        if node_selector:
            spec["nodeSelector"] = node_selector
        out: dict[str, Any] = {"name": task_name, "replicas": replicas, "template": {
            "metadata": {"annotations": {"kubeferry.io/sim-duration": duration}}, "spec": spec}}
        if task_name == "master":
            out["policies"] = [{"event": "TaskCompleted", "action": "CompleteJob"}]
        return out

    spec: dict[str, Any] = {"plugins": {"ssh": [], "svc": [], "env": []}, "tasks": [
        task("master", 1, master_runs, {"cpu": "1", "memory": "1Gi"}),
        task("worker", workers, "600s", {"nvidia.com/gpu": str(gpus)})]}
    if on_evicted:
        spec["policies"] = [{"event": "PodEvicted", "action": on_evicted}]
    return {"apiVersion": "/".join(BATCH), "kind": "Job", "metadata": {"name": name}, "spec": spec}



async def _job(jobs: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    job: dict[str, Any] = await jobs.get_namespaced_custom_object(*BATCH, ns, "jobs", name)
    return job


@pytest.mark.usefixtures("volcano_jobs")
async def test_a_vcjob_runs_as_one_gang_its_workers_resolve_by_the_hostfile_and_it_completes(
        tenant2_api: client.ApiClient, compute_api: client.ApiClient, tenant2_ns: str, peer_dns: PeerDNS) -> None:
    jobs = client.CustomObjectsApi(tenant2_api)
    await jobs.create_namespaced_custom_object(*BATCH, tenant2_ns, "jobs", vcjob("pi", 2))
    job = await _job(jobs, tenant2_ns, "pi")  # what its webhook filled in
    filled = (job["spec"]["queue"], job["spec"]["schedulerName"], job["spec"]["minAvailable"])
    assert filled == ("default", "volcano", 3), job["spec"]

    async def started() -> list[Any] | None:
        pods = await live_copies(compute_api, tenant2_ns)
        return pods if len(pods) == 3 and all(p.status.phase in ("Running", "Succeeded") for p in pods) else None

    pods = await eventually(started, timeout=90, what="the master and 2 workers started in the compute cluster")
    by_name = {p.metadata.annotations[UPSTREAM_NAME_ANNOTATION]: p for p in pods}
    assert sorted(by_name) == ["pi-master-0", "pi-worker-0", "pi-worker-1"], sorted(by_name)
    assert len({p.metadata.labels["kubeferry.io/pod-group"] for p in pods}) == 1  # one gang
    # The svc plugin's hostfile (<job>-<task>-<index>.<job>) names each worker's compute pod.
    hosts = (await client.CoreV1Api(tenant2_api).read_namespaced_config_map("pi-svc", tenant2_ns)).data
    workers = hosts["worker.host"].split()
    assert [h.split(".")[0] for h in workers] == ["pi-worker-0", "pi-worker-1"], workers

    async def resolved() -> list[tuple[str, list[str] | None]] | None:
        got = [(h, await resolve(peer_dns, by_name["pi-master-0"], h)) for h in workers]
        return got if all(ips == [by_name[h.split(".")[0]].status.pod_ip] for h, ips in got) else None

    await eventually(resolved, timeout=10, what="the hostfile's names resolved to the workers' compute pods")

    async def completed() -> bool:
        return ((await _job(jobs, tenant2_ns, "pi")).get("status") or {}).get("state", {}).get("phase") == "Completed"

    await eventually(completed, timeout=120, what="the vcjob's phase Completed")

    async def workers_gone() -> bool:
        return not any(p.metadata.annotations[UPSTREAM_NAME_ANNOTATION].startswith("pi-worker-")
                       for p in await live_copies(compute_api, tenant2_ns))

    await eventually(workers_gone, timeout=60, what="the killed workers gone from the compute cluster")


@pytest.mark.usefixtures("volcano_jobs")
async def test_a_preempted_vcjob_restarts_whole_and_runs_again(
        tenant2_api: client.ApiClient, compute_api: client.ApiClient, tenant2_ns: str, compute_ns: str) -> None:
    """A vcjob borrowing a node is preempted whole for another queue's guarantee: Volcano's job controller
    restarts it (``PodEvicted: RestartJob``); the new pods wait as one gang while the node is taken, and run
    once it is free."""
    tcore, jobs = client.CoreV1Api(tenant2_api), client.CustomObjectsApi(tenant2_api)
    async with reserved_node(compute_api, tenant2_ns):
        await jobs.create_namespaced_custom_object(*BATCH, tenant2_ns, "jobs", vcjob(
            "pi", 2, gpus=4, master_runs="600s", node_selector={"ferry-test": tenant2_ns}, on_evicted="RestartJob"))
        first = await eventually(lambda: running_pods(tcore, tenant2_ns, 3), timeout=90,
                                 what="the master and 2 workers Running")
        await preempted_whole_then_freed(compute_api, compute_ns, tcore, tenant2_ns, first, "tenant-2")
        async def restarted() -> dict[str, Any] | None:  # as the job controller records it on its next sync
            status = (await _job(jobs, tenant2_ns, "pi")).get("status") or {}
            return status if status.get("retryCount", 0) >= 1 and status.get("state", {}).get("phase") == "Running" \
                else None

        await eventually(restarted, timeout=30, what="the vcjob restarted once and Running")
        await jobs.delete_namespaced_custom_object(*BATCH, tenant2_ns, "jobs", "pi")


@pytest.mark.usefixtures("volcano_jobs")
async def test_a_vcjob_whose_minimum_is_below_its_replicas_runs_its_minimum_and_the_rest_wait(
        tenant2_api: client.ApiClient, compute_api: client.ApiClient, tenant2_ns: str) -> None:
    """``minAvailable`` below the replicas (a master and 3 workers of 4 GPUs, minimum 3, on a node of 8):
    the gang starts with its minimum, the job and its PodGroup run, and only the worker left over waits,
    told why; the running pods are not told they wait once they run."""
    tcore, jobs = client.CoreV1Api(tenant2_api), client.CustomObjectsApi(tenant2_api)
    async with reserved_node(compute_api, tenant2_ns):
        body = vcjob("part", 3, gpus=4, master_runs="600s", node_selector={"ferry-test": tenant2_ns})
        body["spec"]["minAvailable"] = 3
        await jobs.create_namespaced_custom_object(*BATCH, tenant2_ns, "jobs", body)

        async def split() -> tuple[list[str], list[str]] | None:
            pods = (await tcore.list_namespaced_pod(tenant2_ns)).items
            running = sorted(p.metadata.name for p in pods if p.status.phase == "Running")
            waiting = sorted(p.metadata.name for p in pods if p.status.phase == "Pending")
            return (running, waiting) if len(running) == 3 and len(waiting) == 1 else None

        running, waiting = await eventually(split, timeout=90, what="3 pods Running and 1 waiting")
        assert "part-master-0" in running and waiting[0].startswith("part-worker-"), (running, waiting)

        async def told(name: str) -> list[str]:
            evs = (await tcore.list_namespaced_event(
                tenant2_ns, field_selector=f"involvedObject.name={name},reason=FailedScheduling")).items
            return [e.message for e in evs]

        await eventually(lambda: told(waiting[0]), timeout=30, what="the waiting worker told why")

        async def group_running() -> bool:
            groups = await jobs.list_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", tenant2_ns,
                                                                "podgroups")
            return [g.get("status", {}).get("phase") for g in groups["items"]] == ["Running"]

        await eventually(group_running, timeout=30, what="the PodGroup Running")
        async def job_running() -> bool:  # Volcano's job controller follows its PodGroup on its next sync
            return ((await _job(jobs, tenant2_ns, "part")).get("status") or {}).get("state", {}).get("phase") \
                == "Running"

        await eventually(job_running, timeout=30, what="the vcjob Running")
        for pod in (await tcore.list_namespaced_pod(tenant2_ns)).items:
            if pod.metadata.name in running:  # told, if at all, only before it started
                evs = (await tcore.list_namespaced_event(tenant2_ns, field_selector=(
                    f"involvedObject.name={pod.metadata.name},reason=FailedScheduling"))).items
                late = [e.message for e in evs if e.last_timestamp and e.last_timestamp > pod.status.start_time]
                assert late == [], (pod.metadata.name, pod.status.start_time, late)
        await jobs.delete_namespaced_custom_object(*BATCH, tenant2_ns, "jobs", "part")


@pytest.mark.usefixtures("volcano_jobs")
async def test_a_deployment_for_volcanos_scheduler_gets_its_podgroup_from_volcano_and_runs(
        tenant2_api: client.ApiClient, compute_api: client.ApiClient, tenant2_ns: str) -> None:
    """Pods of no vcjob that name the ``volcano`` scheduler: Volcano's PodGroup controller gives their
    ReplicaSet a PodGroup (minimum 1), the virtual node runs both replicas and reports the group Running;
    scaled to zero, their compute copies go."""
    apps, jobs = client.AppsV1Api(tenant2_api), client.CustomObjectsApi(tenant2_api)
    await apps.create_namespaced_deployment(tenant2_ns, {
        "metadata": {"name": "serve"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "serve"}}, "template": {
            "metadata": {"labels": {"app": "serve"}},
            "spec": {"schedulerName": "volcano", "automountServiceAccountToken": False, "containers": [
                {"name": "model", "image": "server:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    core = client.CoreV1Api(tenant2_api)
    await eventually(lambda: running_pods(core, tenant2_ns, 2), timeout=90, what="both replicas Running")

    async def named() -> set[str | None] | None:
        # Volcano's PodGroup controller names the group on the pods, which may come after the vnode bound them
        pods = await running_pods(core, tenant2_ns, 2)
        found = {(p.metadata.annotations or {}).get("scheduling.k8s.io/group-name") for p in pods or []}
        return found if pods and None not in found else None

    groups = await eventually(named, timeout=30, what="both replicas named by Volcano's PodGroup controller")
    assert len(groups) == 1, groups  # one group for the ReplicaSet

    async def group_running() -> dict[str, Any] | None:
        found = (await jobs.list_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", tenant2_ns,
                                                          "podgroups"))["items"]
        return found[0] if [g.get("status", {}).get("phase") for g in found] == ["Running"] else None

    group = await eventually(group_running, timeout=30, what="its PodGroup Running")
    assert group["metadata"]["name"] in groups and group["spec"]["minMember"] == 1, group["spec"]
    assert len(await live_copies(compute_api, tenant2_ns)) == 2
    await apps.patch_namespaced_deployment_scale("serve", tenant2_ns, {"spec": {"replicas": 0}})

    async def copies_gone() -> bool:
        return not await live_copies(compute_api, tenant2_ns)

    await eventually(copies_gone, timeout=60, what="the compute copies gone")
    await apps.delete_namespaced_deployment("serve", tenant2_ns)


@pytest.mark.usefixtures("volcano_jobs")
async def test_a_vcjob_completes_at_its_min_success_and_the_rest_leave_the_compute_cluster(
        tenant2_api: client.ApiClient, compute_api: client.ApiClient, tenant2_ns: str) -> None:
    """``minSuccess`` 2 of 3 workers (no master policy): once two workers have succeeded, Volcano's job
    controller completes the job and kills the third, still running; its compute copy goes too."""
    jobs = client.CustomObjectsApi(tenant2_api)
    body = vcjob("most", 3, master_runs="600s")
    body["spec"]["tasks"] = [t for t in body["spec"]["tasks"] if t["name"] == "worker"]
    worker = body["spec"]["tasks"][0]
    worker["template"]["metadata"]["annotations"]["kubeferry.io/sim-duration"] = "8s"
    slow = {**worker, "name": "slow", "replicas": 1,
            "template": {**worker["template"], "metadata": {"annotations": {"kubeferry.io/sim-duration": "600s"}}}}
    worker["replicas"] = 2
    body["spec"]["tasks"].append(slow)
    body["spec"]["minSuccess"] = 2
    await jobs.create_namespaced_custom_object(*BATCH, tenant2_ns, "jobs", body)

    async def slow_running() -> bool:
        return any(p.metadata.annotations[UPSTREAM_NAME_ANNOTATION] == "most-slow-0" and p.status.phase == "Running"
                   for p in await live_copies(compute_api, tenant2_ns))

    await eventually(slow_running, timeout=90, what="the slow worker running in the compute cluster")

    async def completed() -> bool:
        return ((await _job(jobs, tenant2_ns, "most")).get("status") or {}).get("state", {}).get("phase") == "Completed"

    await eventually(completed, timeout=120, what="the vcjob Completed at its minSuccess")

    async def slow_gone() -> bool:
        return not any(p.metadata.annotations[UPSTREAM_NAME_ANNOTATION].startswith("most-slow-")
                       for p in await live_copies(compute_api, tenant2_ns))

    await eventually(slow_gone, timeout=60, what="the killed worker gone from the compute cluster")
    await jobs.delete_namespaced_custom_object(*BATCH, tenant2_ns, "jobs", "most")
