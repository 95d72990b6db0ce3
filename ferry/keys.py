"""Names Kube-Ferry's components agree on: the scheduler name, labels, annotations, condition types.

One place, because the scheduler writes what the vnode reads (and the other way round).
"""

from __future__ import annotations

SCHEDULER_NAME = "kube-ferry"
API_GROUP, API_VERSION = "scheduling.kubeferry.io", "v1alpha1"  # Queue, PodGroup, UsageRecord
GPU = "nvidia.com/gpu"
PREFIX = "kubeferry.io/"
POD_GROUP_LABEL = PREFIX + "pod-group"
TASK_LABEL = PREFIX + "task"
QUEUE_ANNOTATION = PREFIX + "queue"
GPU_MILLI_ANNOTATION = PREFIX + "gpu-milli"
DEVICES_ANNOTATION = PREFIX + "gpu-devices"
WILL_EVICT_AT = PREFIX + "will-evict-at"  # RFC 3339: the job is evicted then unless the notice is cancelled
WILL_EVICT_BY = PREFIX + "will-evict-by"
EARLIER_RUN_ANNOTATION = PREFIX + "earlier-run"  # on a bare job's pod: the evicted run it continues (JSON)
WILL_EVICT_CONDITION = PREFIX + "WillEvict"
TOPOLOGY_ANNOTATION = PREFIX + "gpu-topology"
MODEL_LABEL = PREFIX + "gpu-model"
DOMAIN_LABEL = PREFIX + "topology-domain"
TIER_ANNOTATION = PREFIX + "tier"
# on a tenant PodGroup (or a Kueue group's pods): "prep, server:Running" — PodGroups of the same namespace
# and kind that must have succeeded (default) or started before this gang starts
DEPENDS_ON_ANNOTATION = PREFIX + "depends-on"
# "true" on a gang's pods (or its compute PodGroup): it can checkpoint, and consolidation may move it
MOVABLE_ANNOTATION = PREFIX + "movable"
# on a vnode's copy of a pod a controller owns: that controller's UID in the tenant cluster (the scheduler
# gives the controller's next pod the place and history of a pod it evicted; scheduler/service/runs.py)
UPSTREAM_CONTROLLER_LABEL = PREFIX + "upstream-controller-uid"
