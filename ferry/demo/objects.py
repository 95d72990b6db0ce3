"""The tenant-side objects the demo submits, written as the operators and users they stand for write them.

Gangs are Volcano-style: a ``scheduling.volcano.sh`` PodGroup plus pods annotated with its name and
addressed to the ``volcano`` scheduler (what Volcano's job controller and MPI-Operator produce); the
virtual node binds them itself. Single pods tolerate the virtual node, as a user adds to run on it.
Every pod carries ``app: <job>`` and ``tier`` labels so the demo and ``kubectl get -l`` find them.
"""

from __future__ import annotations

from typing import Any

from ferry.keys import GPU, GPU_MILLI_ANNOTATION, TIER_ANNOTATION

Obj = dict[str, Any]
NAMESPACE = "demo"
VOLCANO = ("scheduling.volcano.sh", "v1beta1")
SIM_DURATION = "kubeferry.io/sim-duration"
VNODE_TOLERATION = {"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}


def volcano_group(name: str, min_member: int, *, elastic: bool = False) -> Obj:
    """A Volcano PodGroup; ``kubeferry.io/tier: Elastic`` marks a job that soaks up idle GPUs and may be
    preempted (as a whole, after a notice) when a guaranteed job needs them back."""
    annotations = {TIER_ANNOTATION: "Elastic"} if elastic else {}
    return {"apiVersion": "/".join(VOLCANO), "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
            "spec": {"minMember": min_member}}


def _pod(name: str, job: str, tier: str, container: Obj, *, annotations: Obj, scheduler: str | None,
         tolerate: bool, volumes: list[Obj] | None = None) -> Obj:
    spec: Obj = {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [container]}
    if scheduler:
        spec["schedulerName"] = scheduler
    if tolerate:
        spec["tolerations"] = [VNODE_TOLERATION]
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": job, "tier": tier},
                         "annotations": annotations},
            "spec": spec}


def gang_members(job: str, members: int, gpus: int, *, elastic: bool = False, duration: str = "1h") -> list[Obj]:
    """``members`` pods of ``gpus`` whole GPUs each, in the Volcano gang ``job``."""
    tier = "elastic" if elastic else "guaranteed"
    return [_pod(f"{job}-{i}", job, tier,
                 {"name": "worker", "image": "trainer:1", "resources": {"limits": {GPU: str(gpus)}}},
                 annotations={"scheduling.k8s.io/group-name": job, SIM_DURATION: duration},
                 scheduler="volcano", tolerate=False)
            for i in range(members)]


def batch_job(job: str, members: int, gpus: int, *, elastic: bool = False, duration: str = "1h") -> Obj:
    """A ``batch/v1`` Job whose ``members`` pods of ``gpus`` whole GPUs run as the Volcano gang ``job``. As
    preemptible Jobs are written, a pod that failed because its gang was preempted (condition
    ``DisruptionTarget``) is replaced without counting against the backoff limit; any other failure fails
    the Job (``backoffLimit: 0``)."""
    template = gang_members(job, 1, gpus, elastic=elastic, duration=duration)[0]
    meta = {k: v for k, v in template["metadata"].items() if k not in ("name", "namespace")}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job, "namespace": NAMESPACE, "labels": {"app": job}},
            "spec": {"parallelism": members, "completions": members, "backoffLimit": 0,
                     "podFailurePolicy": {"rules": [{"action": "Ignore",
                                                     "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                     "template": {"metadata": meta, "spec": template["spec"]}}}


def gpu_pod(job: str, gpus: int, duration: str = "1h") -> Obj:
    """One pod of ``gpus`` whole GPUs that tolerates the virtual node (placed by the tenant's scheduler)."""
    return _pod(job, job, "guaranteed",
                {"name": "main", "image": "trainer:1", "resources": {"limits": {GPU: str(gpus)}}},
                annotations={SIM_DURATION: duration}, scheduler=None, tolerate=True)


def shared_gpu_pods(job: str, count: int, milli: int, duration: str = "1h") -> list[Obj]:
    """Pods that each ask for a share of one GPU (``kubeferry.io/gpu-milli``), e.g. notebooks."""
    return [_pod(f"{job}-{i}", job, "guaranteed", {"name": "notebook", "image": "jupyter:1"},
                 annotations={GPU_MILLI_ANNOTATION: str(milli), SIM_DURATION: duration},
                 scheduler=None, tolerate=True)
            for i in range(count)]


def unsafe_pod(job: str) -> Obj:
    """A pod that mounts a directory of the node it lands on: not allowed on a shared cluster."""
    return _pod(job, job, "guaranteed",
                {"name": "debug", "image": "busybox:1", "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                 "resources": {"limits": {GPU: "1"}}},
                annotations={SIM_DURATION: "1h"}, scheduler=None, tolerate=True,
                volumes=[{"name": "host", "hostPath": {"path": "/"}}])
