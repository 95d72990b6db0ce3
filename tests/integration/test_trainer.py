"""An unmodified Kubeflow Trainer (v2.2.0, built from its Go module) in a tenant cluster, over the unmodified
JobSet controller: a TrainJob names a training runtime of the release, Trainer makes it a JobSet (and, when
the runtime asks for gang scheduling, a scheduler-plugins PodGroup), and its pods run through the virtual
node: as one gang, reaching each other by the names Trainer gives torchrun and mpirun, with the SSH keys
and hostfile it makes, on the claim JobSet makes for its initializers, suspended and resumed, and the
TrainJob completes when they do.

Trainer's admission webhooks (a defaulter and validators) are served by the process and called by URL with
a certificate the test issues (test_jobset.py's way); Trainer's configuration cannot say where that
certificate is, so the process finds it where controller-runtime reads one by default, in a mount namespace
of its own (nothing is written there on this machine)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.binaries import Binaries
from ferry.binaries.clients import TRAINER, Operator, ensure_operator
from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import (
    CONTROLLER_RUNTIME_CERT_DIR,
    accepted_once_cached,
    compute_copies,
    controller_with_webhooks,
    eventually,
    install_crd,
    live_copies,
    resolve,
    running_copies,
    url_webhook,
)
from tests.integration.test_jobset import TOLERATION, jobset_controller  # noqa: F401 (a fixture: Trainer makes JobSets)
from vnode.dnsserver import PeerDNS
from vnode.naming import UPSTREAM_NAME_ANNOTATION, UPSTREAM_NS_LABEL, compute_name

TENANT = "tenant-1"
API = ("trainer.kubeflow.org", "v1alpha1")
CRDS = ("clustertrainingruntimes", "trainingruntimes", "trainjobs")
WEBHOOKS = ("trainer-ferry-test-mutating", "trainer-ferry-test-validating")
PATCHER = "kubeferry.io/tenant"  # a runtime patch's manager: who adds the virtual node's toleration


def webhook_configurations(port: int, ca: bytes) -> list[dict[str, Any]]:
    """The release's webhooks (manifests/base/webhook), each called by URL."""
    hook = partial(url_webhook, port, ca)

    def rule(plural: str) -> dict[str, Any]:
        return {"apiGroups": [API[0]], "apiVersions": [API[1]], "operations": ["CREATE", "UPDATE"],
                "resources": [plural]}

    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": WEBHOOKS[0]},
         "webhooks": [hook("defaulter.trainjob.trainer.kubeflow.org",
                           "/mutate-trainer-kubeflow-org-v1alpha1-trainjob", rule("trainjobs"))]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": WEBHOOKS[1]},
         "webhooks": [hook(f"validator.{plural[:-1]}.trainer.kubeflow.org",
                           f"/validate-trainer-kubeflow-org-v1alpha1-{plural[:-1]}", rule(plural))
                      for plural in CRDS]},
    ]


@pytest.fixture(scope="module")
def trainer_controller(planes: ControlPlanes, binaries: Binaries, vnodes: dict[str, Component],
                       jobset_controller: subprocess.Popen[bytes],  # noqa: F811 (the fixture imported above)
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Trainer's controller manager watching every namespace of tenant-1, its webhooks registered, and the
    release's torch runtime applied through them. Yields the release's runtimes (kept from its module)."""
    kubeconfig = planes.kubeconfig(TENANT)
    kubectl = [str(binaries.path("kubectl")), f"--kubeconfig={kubeconfig}"]
    op = install_trainer_crds(kubectl)
    with controller_with_webhooks(op.binary, "config.trainer.kubeflow.org/v1alpha1", {}, kubeconfig, kubectl,
                                  tmp_path_factory.mktemp("trainer"), webhook_configurations,
                                  cert_management="certManagement", names_cert_dir=False,
                                  fixed_cert_dirs=(CONTROLLER_RUNTIME_CERT_DIR,)):
        subprocess.run([*kubectl, "apply", "-f", str(op.manifests / "torch_distributed.yaml")], check=True,
                       capture_output=True)
        yield op.manifests


def install_trainer_crds(kubectl: list[str]) -> Operator:
    """Trainer's CRDs in the cluster ``kubectl`` reaches (left there: installing is idempotent); its build."""
    op = ensure_operator(TRAINER)
    for plural in CRDS:
        install_crd(kubectl, op.crds / f"trainer.kubeflow.org_{plural}.yaml", f"{plural}.trainer.kubeflow.org")
    return op


def gang_runtime(shipped: Path, name: str, durations: dict[str, str]) -> dict[str, Any]:
    """A release's runtime as a tenant admin adapts it for gangs: a TrainingRuntime of the namespace with
    scheduler-plugins' coscheduling (its pods go to ``scheduler-plugins-scheduler``, the name
    scheduler-plugins' chart gives its scheduler, which the virtual node plays); the pods of each Job
    ``durations`` names end after that long (simulated nodes run no image; the others never end)."""
    runtime = as_training_runtime(shipped, name)
    runtime["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 120}}
    for replicated in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = replicated["template"]["spec"]["template"]
        pod["spec"]["schedulerName"] = "scheduler-plugins-scheduler"
        if duration := durations.get(replicated["name"]):
            pod.setdefault("metadata", {})["annotations"] = {"kubeferry.io/sim-duration": duration}
    return runtime


def as_training_runtime(shipped: Path, name: str) -> dict[str, Any]:
    """A release's ClusterTrainingRuntime as a TrainingRuntime ``name`` of a namespace."""
    runtime: dict[str, Any] = yaml.safe_load(shipped.read_text())
    runtime["kind"], runtime["metadata"] = "TrainingRuntime", {"name": name}
    return runtime


def train_job(name: str, runtime: str, kind: str, nodes: int, gpus: int, jobs: tuple[str, ...] = ("node",),
              annotations: dict[str, str] | None = None, tolerated: bool = True) -> dict[str, Any]:
    """A TrainJob as Trainer's examples write one, and a runtime patch of the tenant's giving the pods of
    ``jobs`` the virtual node's toleration (unless ``tolerated`` is False: a Kueue flavor brings it) and
    ``annotations``."""
    pod: dict[str, Any] = {"spec": {"tolerations": [TOLERATION]}} if tolerated else {}
    if annotations:
        pod["metadata"] = {"annotations": annotations}
    patch = {"manager": PATCHER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": job, "template": {"spec": {"template": pod}}} for job in jobs]}}}}
    return {"apiVersion": "/".join(API), "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": runtime, "kind": kind, "apiGroup": API[0]},
                     "trainer": {"numNodes": nodes, "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}}},
                     "runtimePatches": [patch]}}


async def test_a_trainjob_runs_as_one_gang_its_nodes_find_the_master_and_it_completes(
        trainer_controller: Path, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str,
        peer_dns: PeerDNS) -> None:
    objects = client.CustomObjectsApi(tenant_api)
    await objects.create_namespaced_custom_object(
        *API, tenant_ns, "trainingruntimes",
        gang_runtime(trainer_controller / "torch_distributed.yaml", "torch-gang", {"node": "15s"}))
    await created(objects, tenant_ns, train_job("llm", "torch-gang", "TrainingRuntime", nodes=2, gpus=2))

    pods = {p.spec.hostname: p for p in await eventually(lambda: running_copies(compute_api, tenant_ns, 2), timeout=120,
                                                         what="the TrainJob's 2 nodes Running in the compute cluster")}
    assert sorted(pods) == ["llm-node-0-0", "llm-node-0-1"], sorted(pods)
    # Trainer's gang (minMember from the runtime's pods) is one gang of the compute cluster.
    group = await objects.get_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", tenant_ns, "podgroups", "llm")
    assert group["spec"]["minMember"] == 2, group["spec"]
    compute_groups = await client.CustomObjectsApi(compute_api).list_namespaced_custom_object(
        "scheduling.kubeferry.io", "v1alpha1", TENANT, "podgroups")
    mine = [g for g in compute_groups["items"] if g["metadata"]["labels"].get(UPSTREAM_NS_LABEL) == tenant_ns]
    assert len(mine) == 1 and mine[0]["spec"]["minMember"] == 2, mine
    # torchrun's rendezvous: the master's name as Trainer gives it, answered with the master's address.
    env = {e.name: e.value for e in (await client.CoreV1Api(tenant_api).read_namespaced_pod(
        pods["llm-node-0-1"].metadata.annotations[UPSTREAM_NAME_ANNOTATION], tenant_ns)).spec.containers[0].env}
    assert env["PET_MASTER_ADDR"] == "llm-node-0-0.llm" and env["PET_NNODES"] == "2", env
    await eventually(lambda: _resolves(peer_dns, pods["llm-node-0-1"], "llm-node-0-0.llm",
                                       [pods["llm-node-0-0"].status.pod_ip]), timeout=10,
                     what="llm-node-0-0.llm from llm-node-0-1")
    await eventually(lambda: trainjob_complete(objects, tenant_ns, "llm"), timeout=120,
                     what="the TrainJob's condition Complete")


async def test_an_mpi_trainjob_reaches_its_nodes_by_trainers_hostfile_with_the_ssh_keys_it_made(
        trainer_controller: Path, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str,
        peer_dns: PeerDNS) -> None:
    """The release's DeepSpeed runtime (MPI: OpenMPI, the launcher a node too), as a gang: Trainer makes an
    SSH key Secret and a hostfile ConfigMap and mounts the keys in every pod, the hostfile in the launcher.
    The compute copies mount copies holding the same keys and hostfile, each hostfile name reaches its pod's
    copy through `ferry dns`, and the TrainJob completes when its launcher does (the nodes run sshd until
    then, and then leave the compute cluster)."""
    objects, core = client.CustomObjectsApi(tenant_api), client.CoreV1Api(tenant_api)
    await objects.create_namespaced_custom_object(  # mpirun ends; sshd does not
        *API, tenant_ns, "trainingruntimes",
        gang_runtime(trainer_controller / "deepspeed_distributed.yaml", "ds", {"launcher": "20s"}))
    await created(objects, tenant_ns, train_job("pi", "ds", "TrainingRuntime", nodes=3, gpus=1,
                                                jobs=("launcher", "node")))

    pods = {p.metadata.annotations[UPSTREAM_NAME_ANNOTATION]: p for p in await eventually(
        lambda: running_copies(compute_api, tenant_ns, 3), timeout=120,
        what="the launcher and 2 nodes Running in the compute cluster")}
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
    await eventually(lambda: trainjob_complete(objects, tenant_ns, "pi"), timeout=120,
                     what="the TrainJob's condition Complete once its launcher ended")

    async def nodes_stopped() -> bool:  # JobSet deletes the Jobs still running once it is done
        return not [p for p in await live_copies(compute_api, tenant_ns) if p.status.phase == "Running"]

    await eventually(nodes_stopped, timeout=60, what="the nodes' copies gone from the compute cluster")


async def test_a_torchtune_trainjobs_initializers_then_its_node_run_on_one_claim_in_the_compute_cluster(
        trainer_controller: Path, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The release's torchtune runtime (Llama 3.2 1B): a dataset and a model initializer, then the trainer
    node, a Job JobSet creates once both are Complete, all on the claim JobSet makes from the runtime's
    claim template (given the virtual node's StorageClass by the tenant admin: the release's names none,
    which would take the tenant cluster's default). The node starts in the compute cluster only after both
    initializers succeeded (the vnode mirrors their end up, which is what lets JobSet go on), every stage
    mounts the one compute claim, and the TrainJob completes."""
    core, objects = client.CoreV1Api(tenant_api), client.CustomObjectsApi(tenant_api)
    shipped = trainer_controller / "torchtune" / "llama3_2" / "llama3_2_1B.yaml"
    name = yaml.safe_load(shipped.read_text())["metadata"]["name"]  # Trainer checks the model by this name
    runtime = as_training_runtime(shipped, name)
    (policy,) = runtime["spec"]["template"]["spec"]["volumeClaimPolicies"]
    (template,) = policy["templates"]
    template["spec"]["storageClassName"] = "kube-ferry"
    stages = [r["name"] for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]]
    assert stages == ["dataset-initializer", "model-initializer", "node"], stages
    await objects.create_namespaced_custom_object(*API, tenant_ns, "trainingruntimes", runtime)
    await created(objects, tenant_ns, train_job("tune", name, "TrainingRuntime", nodes=1, gpus=2, jobs=tuple(stages),
                                                annotations={"kubeferry.io/sim-duration": "5s"}))

    seen: dict[str, Any] = {}  # stage -> its compute copy, as first seen

    async def staged() -> dict[str, Any] | None:
        for copy in await compute_copies(compute_api, tenant_ns):
            stage = copy.metadata.labels.get("jobset.sigs.k8s.io/replicatedjob-name", "")
            if stage == "node" and stage not in seen:
                for earlier in stages[:2]:  # both initializers have ended well, upstream
                    pods = (await core.list_namespaced_pod(
                        tenant_ns, label_selector=f"jobset.sigs.k8s.io/replicatedjob-name={earlier}")).items
                    assert pods and all(p.status.phase == "Succeeded" for p in pods), (
                        f"the node started while {earlier} was {[p.status.phase for p in pods]}")
            seen.setdefault(stage, copy)
        return seen if len(seen) == len(stages) else None

    await eventually(staged, timeout=120, interval=0.2, what="the initializers, then the node, started")
    compute_claim = compute_name(TENANT, tenant_ns, f"{template['metadata']['name']}-tune")  # JobSet's claim name
    for stage, copy in seen.items():
        assert [v.persistent_volume_claim.claim_name for v in copy.spec.volumes if v.persistent_volume_claim] == [
            compute_claim], stage
    await eventually(lambda: trainjob_complete(objects, tenant_ns, "tune"), timeout=120,
                     what="the TrainJob's condition Complete")


async def test_a_trainjob_on_the_releases_runtime_is_validated_suspended_resumed_and_deleted_without_orphans(
        trainer_controller: Path, tenant_api: client.ApiClient, compute_api: client.ApiClient, tenant_ns: str) -> None:
    """The release's ClusterTrainingRuntime as it ships (its pods never end here): Trainer's webhook refuses
    a TrainJob that sets what the runtime sets (torchrun's variables), with its own message; a valid one runs
    through the virtual node; suspended (as Kueue suspends it), its nodes leave the compute cluster, resumed
    they run again, and deleting it leaves nothing there."""
    objects = client.CustomObjectsApi(tenant_api)
    bad = train_job("bad", "torch-distributed", "ClusterTrainingRuntime", nodes=2, gpus=1)
    bad["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "3"}]
    with pytest.raises(ApiException) as refused:
        await objects.create_namespaced_custom_object(*API, tenant_ns, "trainjobs", bad)
    assert refused.value.status == 403 and "must not have reserved envs" in str(refused.value.body), refused.value
    await created(objects, tenant_ns, train_job("ft", "torch-distributed", "ClusterTrainingRuntime", nodes=2, gpus=1))

    await eventually(lambda: running_copies(compute_api, tenant_ns, 2), timeout=90,
                     what="the TrainJob's 2 nodes Running in the compute cluster")
    await objects.patch_namespaced_custom_object(*API, tenant_ns, "trainjobs", "ft",
                                                 [{"op": "add", "path": "/spec/suspend", "value": True}])
    await eventually(lambda: _nothing_left(compute_api, tenant_ns), timeout=60,
                     what="the suspended TrainJob's nodes gone from the compute cluster")
    await objects.patch_namespaced_custom_object(*API, tenant_ns, "trainjobs", "ft",
                                                 [{"op": "replace", "path": "/spec/suspend", "value": False}])
    await eventually(lambda: running_copies(compute_api, tenant_ns, 2), timeout=90,
                     what="the resumed TrainJob's 2 nodes Running again")
    await objects.delete_namespaced_custom_object(*API, tenant_ns, "trainjobs", "ft",
                                                  body={"propagationPolicy": "Foreground"})
    await eventually(lambda: _nothing_left(compute_api, tenant_ns), timeout=60,
                     what="nothing of the deleted TrainJob left in the compute cluster")


async def created(objects: client.CustomObjectsApi, ns: str, job: dict[str, Any]) -> None:
    """Create ``job``, again while Trainer's webhook has not yet seen its runtime (it looks runtimes up in its
    cache, which sees a new one a moment later)."""
    await accepted_once_cached(lambda: objects.create_namespaced_custom_object(*API, ns, "trainjobs", job), 403,
                               "must be created before the TrainJob", f"TrainJob {job['metadata']['name']} accepted")


async def trainjob_complete(objects: client.CustomObjectsApi, ns: str, name: str) -> bool:
    job = await objects.get_namespaced_custom_object(*API, ns, "trainjobs", name)
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


async def _nothing_left(compute_api: client.ApiClient, tenant_ns: str) -> bool:
    return not await compute_copies(compute_api, tenant_ns)


async def _resolves(dns: PeerDNS, pod: Any, name: str, want: list[str]) -> bool:
    return await resolve(dns, pod, name) == want
