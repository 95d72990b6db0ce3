"""Manifests of simulated GPU nodes (kwok-managed), with a GPU model and topology description."""

from __future__ import annotations

import json
import re
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
MODEL_LABEL = "kubeferry.io/gpu-model"
DEFAULT_MODEL = "A100-SXM4-80GB"
DOMAIN_LABEL = "kubeferry.io/topology-domain"
TOPOLOGY_ANNOTATION = "kubeferry.io/gpu-topology"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
METRICS_PATH_ANNOTATION = "metrics.k8s.io/resource-metrics-path"  # where kwok serves a node's /metrics/resource
NODES_PER_DOMAIN = 8


def nvlink_groups(gpus: int) -> list[list[int]]:
    """GPUs linked in groups of four (two NVLink islands on an 8-GPU board); fewer GPUs form one group."""
    size = 4 if gpus >= 8 and gpus % 4 == 0 else gpus
    return [list(range(i, min(i + size, gpus))) for i in range(0, gpus, size)] if gpus else []


def pool_name(model: str) -> str:
    """A GPU product's name as a vnode's GPU pool is named after it (``--gpu-pool``: a short DNS label)."""
    return re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:22].strip("-") or "gpu"


def gpu_node(index: int, gpus: int, model: str = DEFAULT_MODEL, prefix: str = "gpu-node") -> dict[str, Any]:
    name = f"{prefix}-{index:04d}"
    resources = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(gpus),
    }
    topology = {"model": model, "devices": gpus, "nvlinkGroups": nvlink_groups(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                MODEL_LABEL: model,
                DOMAIN_LABEL: f"rack-{index // NODES_PER_DOMAIN:03d}",
            },
            "annotations": {
                KWOK_ANNOTATION: "fake",
                METRICS_PATH_ANNOTATION: f"/metrics/nodes/{name}/metrics/resource",
                "node.alpha.kubernetes.io/ttl": "0",
                TOPOLOGY_ANNOTATION: json.dumps(topology, separators=(",", ":")),
            },
        },
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
