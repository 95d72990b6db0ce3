"""An unmodified Kubeflow Trainer (v2.0.0, built from its Go module) in a tenant cluster, over the unmodified
JobSet controller: a TrainJob names a training runtime, Trainer makes it a JobSet (and, when the runtime
asks for gang scheduling, a scheduler-plugins PodGroup), and its nodes run through the virtual node as one
gang, find the master by the name Trainer gives torchrun, and the TrainJob completes when they do.

Trainer manages its webhook certificate itself (open-policy-agent's cert-controller): it fills an empty
Secret with a CA and a certificate for its Service's name, injects the CA into its webhook configuration,
and serves what a kubelet would mount from that Secret. Local planes have neither a kubelet nor a cluster
network (as envtest), so the fixture plays the kubelet's part: it writes a serving certificate, issued by
Trainer's own CA for the address the webhooks are called at, where Trainer reads it. Its release's
webhook configuration is reproduced below, called by URL."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry import certs
from ferry.binaries import Binaries
from ferry.binaries.clients import TRAINER, ensure_operator
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import (
    compute_copies,
    eventually,
    free_port,
    install_crd,
    live_copies,
    logged_process,
    resolve,
    url_webhook,
    wait_sync,
)
from tests.integration.test_jobset import TOLERATION, jobset_controller  # noqa: F401 (a fixture: Trainer makes JobSets)
from vnode.dnsserver import PeerDNS
from vnode.naming import UPSTREAM_NAME_ANNOTATION, UPSTREAM_NS_LABEL, compute_name

TENANT = "tenant-1"
API = ("trainer.kubeflow.org", "v1alpha1")
NAMESPACE = "kubeflow-system"  # where Trainer keeps its certificate when it runs outside a pod
SECRET = "kubeflow-trainer-webhook-cert"
WEBHOOKS = "validator.trainer.kubeflow.org"  # the configuration Trainer injects its CA into
SERVICE_NAME = f"kubeflow-trainer-controller-manager.{NAMESPACE}.svc"
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in Trainer's source (pkg/util/cert)
CRDS = ("clustertrainingruntimes", "trainingruntimes", "trainjobs")


def webhook_configuration(port: int) -> dict[str, Any]:
    """The release's validating webhooks (manifests/base/webhook), each called by URL, with no CA yet."""
    def hook(kind: str, plural: str) -> dict[str, Any]:
        rule = {"apiGroups": [API[0]], "apiVersions": [API[1]], "operations": ["CREATE", "UPDATE"],
                "resources": [plural]}
        return url_webhook(port, b"", f"validator.{kind}.trainer.kubeflow.org",
                           f"/validate-trainer-kubeflow-org-v1alpha1-{kind}", rule)

    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOKS},
            "webhooks": [hook(plural[:-1], plural) for plural in CRDS]}


def _secret_data(kubectl: list[str]) -> dict[str, str] | None:
    res = subprocess.run([*kubectl, "-n", NAMESPACE, "get", "secret", SECRET, "-o", "json"], capture_output=True,
                         text=True, check=False)
    data: dict[str, str] = json.loads(res.stdout).get("data") or {} if res.returncode == 0 else {}
    return data if "ca.crt" in data and "ca.key" in data else None


def _mount_serving_certificate(data: dict[str, str]) -> None:
    """What the kubelet's mount of Trainer's Secret gives it, but for the address the webhooks are called at:
    a certificate issued by the CA Trainer made and injected (so the API server trusts it)."""
    with warnings.catch_warnings():  # cert-controller numbers its CA 0, which RFC 5280 disallows; Go accepts it
        warnings.simplefilter("ignore")
        ca_cert = x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"]))
    ca_key = serialization.load_pem_private_key(base64.b64decode(data["ca.key"]), password=None)
    assert isinstance(ca_key, certs.PrivateKey)
    serving = certs.issue(certs.Issued(ca_cert, ca_key), SERVICE_NAME, dns=(SERVICE_NAME,), ips=("127.0.0.1",),
                          server=True)
    CERT_DIR.mkdir(parents=True, exist_ok=True)
    (CERT_DIR / "tls.key").write_bytes(certs.key_pem(serving.key))
    (CERT_DIR / "tls.crt").write_bytes(certs.cert_pem(serving.cert))


@pytest.fixture(scope="module")
def trainer_controller(planes: ControlPlanes, binaries: Binaries, vnodes: dict[str, Component],
                       jobset_controller: subprocess.Popen[bytes],  # noqa: F811 (the fixture imported above)
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Trainer's controller manager watching every namespace of tenant-1, its webhooks registered, and its
    release's ClusterTrainingRuntimes (kept from its module) applied through them. Yields the runtimes' folder."""
    op = ensure_operator(TRAINER)
    kubeconfig = planes.kubeconfig(TENANT)
    kubectl = [str(binaries.path("kubectl")), f"--kubeconfig={kubeconfig}"]
    for plural in CRDS:
        install_crd(kubectl, op.crds / f"trainer.kubeflow.org_{plural}.yaml", f"{plural}.trainer.kubeflow.org")
    port = free_port()
    objects = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
               {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE}},
               webhook_configuration(port)]
    subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(objects).encode(), check=True,
                   capture_output=True)
    for stale in CERT_DIR.glob("tls.*"):  # another run's: Trainer would serve it before this one's is written
        stale.unlink()
    log_path = tmp_path_factory.mktemp("trainer") / "controller.log"
    cmd = [str(op.binary), f"--webhook-server-port={port}", "--health-probe-bind-address=0",
           "--metrics-bind-address=0"]
    try:
        with logged_process(cmd, {**os.environ, "KUBECONFIG": str(kubeconfig)}, log_path) as proc:
            data = wait_sync(lambda: _secret_data(kubectl) if proc.poll() is None else {"exited": ""}, 90,
                             f"Trainer to fill its certificate Secret (log: {log_path})")
            assert proc.poll() is None, log_path.read_text()[-3000:]
            _mount_serving_certificate(data)
            wait_sync(lambda: b"Starting workers" in log_path.read_bytes() or proc.poll() is not None, 120,
                      f"Trainer's controllers to start (log: {log_path})")
            assert proc.poll() is None, log_path.read_text()[-3000:]
            # The release's runtimes, through its webhook (which Trainer serves only once its certificate is read).
            wait_sync(lambda: subprocess.run([*kubectl, "apply", "-f", str(op.manifests / "torch_distributed.yaml")],
                                             capture_output=True, check=False).returncode == 0, 60,
                      "the release's torch-distributed runtime accepted by Trainer's webhook")
            yield op.manifests
    finally:
        subprocess.run([*kubectl, "delete", "validatingwebhookconfiguration", WEBHOOKS, "--ignore-not-found"],
                       check=False, capture_output=True)
        for served in CERT_DIR.glob("tls.*"):
            served.unlink()


def gang_runtime(shipped: Path, duration: str, name: str = "torch-gang") -> dict[str, Any]:
    """A release's runtime as a tenant admin adapts it for gangs: a TrainingRuntime of the namespace with
    scheduler-plugins' coscheduling (its pods go to ``scheduler-plugins-scheduler``, the name
    scheduler-plugins' chart gives its scheduler, which the virtual node plays), and pods that end after
    ``duration`` (simulated nodes run no image; "" for never)."""
    runtime: dict[str, Any] = yaml.safe_load(shipped.read_text())
    runtime["kind"], runtime["metadata"] = "TrainingRuntime", {"name": name}
    runtime["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 120}}
    for replicated in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = replicated["template"]["spec"]["template"]
        pod.setdefault("metadata", {})["annotations"] = {"kubeferry.io/sim-duration": duration} if duration else {}
        pod["spec"]["schedulerName"] = "scheduler-plugins-scheduler"
    return runtime


def train_job(name: str, runtime: str, kind: str, nodes: int, gpus: int) -> dict[str, Any]:
    """A TrainJob as Trainer's examples write one, with the virtual node's toleration (a tenant's override)."""
    return {"apiVersion": "/".join(API), "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": runtime, "kind": kind, "apiGroup": API[0]},
                     "trainer": {"numNodes": nodes, "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}}},
                     "podSpecOverrides": [{"targetJobs": [{"name": "node"}], "tolerations": [TOLERATION]}]}}


async def test_a_trainjob_runs_as_one_gang_its_nodes_find_the_master_and_it_completes(
        trainer_controller: Path, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str,
        peer_dns: PeerDNS) -> None:
    objects = client.CustomObjectsApi(tenant_api)
    await objects.create_namespaced_custom_object(*API, tenant_ns, "trainingruntimes",
                                                  gang_runtime(trainer_controller / "torch_distributed.yaml", "15s"))
    # Trainer's webhook looks the runtime up in its cache, which sees the new one a moment later.
    await eventually(lambda: _created(objects, tenant_ns, train_job("llm", "torch-gang", "TrainingRuntime", nodes=2,
                                                                    gpus=2)),
                     timeout=30, what="the TrainJob accepted once Trainer knows its runtime")

    async def running() -> dict[str, Any] | None:
        pods = [p for p in await compute_copies(compute_api, tenant_ns)
                if p.status.phase == "Running" and p.status.pod_ip]
        return {p.spec.hostname: p for p in pods} if len(pods) == 2 else None

    pods = await eventually(running, timeout=120, what="the TrainJob's 2 nodes Running in the compute cluster")
    assert sorted(pods) == ["llm-node-0-0", "llm-node-0-1"], sorted(pods)
    # Trainer's gang (minMember from the runtime's pods) is one gang of the compute cluster.
    group = await objects.get_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", tenant_ns, "podgroups", "llm")
    assert group["spec"]["minMember"] == 2, group["spec"]
    compute_groups = await client.CustomObjectsApi(compute_api).list_namespaced_custom_object(
        "scheduling.kubeferry.io", "v1alpha1", TENANT, "podgroups")
    mine = [g for g in compute_groups["items"]
            if g["metadata"]["labels"].get(UPSTREAM_NS_LABEL) == tenant_ns]
    assert len(mine) == 1 and mine[0]["spec"]["minMember"] == 2, mine
    # torchrun's rendezvous: the master's name as Trainer gives it, answered with the master's address.
    env = {e.name: e.value for e in (await client.CoreV1Api(tenant_api).read_namespaced_pod(
        pods["llm-node-0-1"].metadata.annotations[UPSTREAM_NAME_ANNOTATION], tenant_ns)).spec.containers[0].env}
    assert env["PET_MASTER_ADDR"] == "llm-node-0-0.llm" and env["PET_NNODES"] == "2", env
    await eventually(lambda: _resolves(peer_dns, pods["llm-node-0-1"], "llm-node-0-0.llm",
                                       [pods["llm-node-0-0"].status.pod_ip]), timeout=10,
                     what="llm-node-0-0.llm from llm-node-0-1")

    await eventually(lambda: _complete(objects, tenant_ns, "llm"), timeout=120,
                     what="the TrainJob's condition Complete")


async def test_an_mpi_trainjob_reaches_its_nodes_by_trainers_hostfile_with_the_ssh_keys_it_made(
        trainer_controller: Path, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str,
        peer_dns: PeerDNS) -> None:
    """The release's `mpi-distributed` runtime (OpenMPI; the launcher is a node too), as a gang: Trainer makes
    an SSH key Secret and a hostfile ConfigMap and mounts both in every pod. The compute copies mount copies
    holding the same keys and hostfile, each hostfile name reaches its pod's copy through `ferry dns`, and the
    TrainJob completes when its launcher does (the nodes run sshd until then, and then leave the compute
    cluster)."""
    objects, core = client.CustomObjectsApi(tenant_api), client.CoreV1Api(tenant_api)
    runtime = gang_runtime(trainer_controller / "mpi_distributed.yaml", "", name="mpi-gang")
    launcher = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    launcher["metadata"]["annotations"] = {"kubeferry.io/sim-duration": "20s"}  # mpirun ends; sshd does not
    await objects.create_namespaced_custom_object(*API, tenant_ns, "trainingruntimes", runtime)
    job = train_job("pi", "mpi-gang", "TrainingRuntime", nodes=3, gpus=1)
    job["spec"]["podSpecOverrides"][0]["targetJobs"].append({"name": "launcher"})
    await eventually(lambda: _created(objects, tenant_ns, job), timeout=30,
                     what="the TrainJob accepted once Trainer knows its runtime")

    async def running() -> dict[str, Any] | None:
        pods = [p for p in await live_copies(compute_api, tenant_ns) if p.status.phase == "Running" and p.status.pod_ip]
        return {p.metadata.annotations[UPSTREAM_NAME_ANNOTATION]: p for p in pods} if len(pods) == 3 else None

    pods = await eventually(running, timeout=120, what="the launcher and 2 nodes Running in the compute cluster")
    assert len({p.metadata.labels["kubeferry.io/pod-group"] for p in pods.values()}) == 1, "one gang"
    # What Trainer made for mpirun reaches every copy as it is upstream.
    keys = (await core.read_namespaced_secret("pi-mpi-ssh-auth", tenant_ns)).data
    hostfile = (await core.read_namespaced_config_map("pi-mpi-hostfile", tenant_ns)).data["hostfile"]
    ccore = client.CoreV1Api(compute_api)
    launcher_copy = next(p for p in pods.values() if "launcher" in p.spec.hostname)
    for copy in pods.values():  # every pod has the keys; the launcher, the hostfile too
        volumes = {v.name: v for v in copy.spec.volumes}
        secret = await ccore.read_namespaced_secret(volumes["mpi-ssh-auth"].secret.secret_name,
                                                    copy.metadata.namespace)
        assert secret.data == keys, copy.metadata.name
    config = await ccore.read_namespaced_config_map(
        next(v for v in launcher_copy.spec.volumes if v.name == "mpi-hostfile").config_map.name,
        launcher_copy.metadata.namespace)
    assert config.data["hostfile"] == hostfile, (config.data, hostfile)
    hosts = [line.split()[0] for line in hostfile.splitlines() if line.strip()]
    by_host = {p.spec.hostname: p for p in pods.values()}
    assert sorted(h.split(".")[0] for h in hosts) == sorted(by_host), (hosts, sorted(by_host))
    for host in hosts:
        await eventually(lambda h=host: _resolves(peer_dns, launcher_copy, h, [by_host[h.split(".")[0]].status.pod_ip]),
                         timeout=10, what=f"{host} from the launcher")
    await eventually(lambda: _complete(objects, tenant_ns, "pi"), timeout=120,
                     what="the TrainJob's condition Complete once its launcher ended")

    async def nodes_stopped() -> bool:  # JobSet deletes the Jobs still running once it is done
        return not [p for p in await live_copies(compute_api, tenant_ns) if p.status.phase == "Running"]

    await eventually(nodes_stopped, timeout=60, what="the nodes' copies gone from the compute cluster")


async def test_a_torchtune_trainjobs_stages_run_in_order_on_one_claim_in_the_compute_cluster(
        trainer_controller: Path, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The release's torchtune runtime (Llama 3.2 1B): a dataset initializer, then a model initializer, then
    the trainer node, each a Job JobSet creates once the one before is Complete, all three on the claim the
    runtime names (made by the tenant admin of the virtual node's StorageClass). Each stage starts in the
    compute cluster only after the stage before it succeeded there (the vnode mirrors its end up, which is
    what lets JobSet go on), every stage mounts the one compute claim, and the TrainJob completes."""
    core, objects = client.CoreV1Api(tenant_api), client.CustomObjectsApi(tenant_api)
    shipped = trainer_controller / "torchtune" / "llama3_2" / "llama3_2_1B.yaml"
    runtime: dict[str, Any] = yaml.safe_load(shipped.read_text())
    name = runtime["metadata"]["name"]  # Trainer checks the model by the runtime's name
    runtime["kind"], runtime["metadata"] = "TrainingRuntime", {"name": name}
    stages = [r["name"] for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]]
    assert stages == ["dataset-initializer", "model-initializer", "node"], stages
    for replicated in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        replicated["template"]["spec"]["template"].setdefault("metadata", {})["annotations"] = {
            "kubeferry.io/sim-duration": "5s"}  # simulated nodes run no image
    (claim,) = {v["persistentVolumeClaim"]["claimName"] for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                for v in r["template"]["spec"]["template"]["spec"]["volumes"]}
    await core.create_namespaced_persistent_volume_claim(tenant_ns, {
        "metadata": {"name": claim}, "spec": {"storageClassName": "kube-ferry", "accessModes": ["ReadWriteOnce"],
                                              "resources": {"requests": {"storage": "20Gi"}}}})
    await objects.create_namespaced_custom_object(*API, tenant_ns, "trainingruntimes", runtime)
    job = train_job("tune", name, "TrainingRuntime", nodes=1, gpus=2)
    job["spec"]["podSpecOverrides"][0]["targetJobs"] = [{"name": stage} for stage in stages]
    await eventually(lambda: _created(objects, tenant_ns, job), timeout=30,
                     what="the TrainJob accepted once Trainer knows its runtime")

    seen: dict[str, Any] = {}  # stage -> its compute copy, as first seen

    async def staged() -> dict[str, Any] | None:
        for copy in await compute_copies(compute_api, tenant_ns):
            stage = copy.metadata.labels.get("jobset.sigs.k8s.io/replicatedjob-name", "")
            if stage in stages and stage not in seen:
                before = stages[:stages.index(stage)]
                for earlier in before:  # what came before has ended well, upstream
                    pods = (await core.list_namespaced_pod(
                        tenant_ns, label_selector=f"jobset.sigs.k8s.io/replicatedjob-name={earlier}")).items
                    assert pods and all(p.status.phase == "Succeeded" for p in pods), (
                        f"{stage} started while {earlier} was {[p.status.phase for p in pods]}")
                seen[stage] = copy
        return seen if len(seen) == len(stages) else None

    await eventually(staged, timeout=120, interval=0.2, what="the three stages started one after the other")
    compute_claim = compute_name(TENANT, tenant_ns, claim)
    for stage, copy in seen.items():
        assert [v.persistent_volume_claim.claim_name for v in copy.spec.volumes if v.persistent_volume_claim] == [
            compute_claim], stage
    await eventually(lambda: _complete(objects, tenant_ns, "tune"), timeout=120,
                     what="the TrainJob's condition Complete")


async def test_a_trainjob_on_the_releases_runtime_is_validated_suspended_resumed_and_deleted_without_orphans(
        trainer_controller: Path, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The release's ClusterTrainingRuntime as it ships (its pods never end here): Trainer's webhook refuses
    a TrainJob that sets what the runtime sets (torchrun's variables), with its own message; a valid one runs
    through the virtual node; suspended (as Kueue suspends it), its nodes leave the compute cluster, resumed
    they run again, and deleting it leaves nothing there."""
    objects = client.CustomObjectsApi(tenant_api)
    bad = train_job("bad", "torch-distributed", "ClusterTrainingRuntime", nodes=2, gpus=1)
    bad["spec"]["trainer"] |= {"numProcPerNode": "auto", "env": [{"name": "PET_NNODES", "value": "3"}]}
    with pytest.raises(ApiException) as refused:
        await objects.create_namespaced_custom_object(*API, tenant_ns, "trainjobs", bad)
    assert refused.value.status == 403 and "must not have reserved envs" in str(refused.value.body), refused.value
    await objects.create_namespaced_custom_object(*API, tenant_ns, "trainjobs",
                                                  train_job("ft", "torch-distributed", "ClusterTrainingRuntime",
                                                            nodes=2, gpus=1))

    async def running(count: int) -> bool:
        pods = await live_copies(compute_api, tenant_ns)
        return len(pods) == count and all(p.status.phase == "Running" for p in pods)

    await eventually(lambda: running(2), timeout=90, what="the TrainJob's 2 nodes Running in the compute cluster")
    await objects.patch_namespaced_custom_object(*API, tenant_ns, "trainjobs", "ft",
                                                 [{"op": "add", "path": "/spec/suspend", "value": True}])
    await eventually(lambda: _nothing_left(compute_api, tenant_ns), timeout=60,
                     what="the suspended TrainJob's nodes gone from the compute cluster")
    await objects.patch_namespaced_custom_object(*API, tenant_ns, "trainjobs", "ft",
                                                 [{"op": "replace", "path": "/spec/suspend", "value": False}])
    await eventually(lambda: running(2), timeout=90, what="the resumed TrainJob's 2 nodes Running again")
    await objects.delete_namespaced_custom_object(*API, tenant_ns, "trainjobs", "ft",
                                                  body={"propagationPolicy": "Foreground"})
    await eventually(lambda: _nothing_left(compute_api, tenant_ns), timeout=60,
                     what="nothing of the deleted TrainJob left in the compute cluster")


async def _created(objects: client.CustomObjectsApi, ns: str, job: dict[str, Any]) -> bool:
    try:
        await objects.create_namespaced_custom_object(*API, ns, "trainjobs", job)
    except ApiException as exc:
        if exc.status == 403 and "must be created before the TrainJob" in str(exc.body):
            return False
        raise
    return True


async def _complete(objects: client.CustomObjectsApi, ns: str, name: str) -> bool:
    job = await objects.get_namespaced_custom_object(*API, ns, "trainjobs", name)
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


async def _nothing_left(compute_api: client.ApiClient, tenant_ns: str) -> bool:
    return not await compute_copies(compute_api, tenant_ns)


async def _resolves(dns: PeerDNS, pod: Any, name: str, want: list[str]) -> bool:
    return await resolve(dns, pod, name) == want
