"""Prometheus metrics of the scheduler service (names follow kube-scheduler's where they overlap)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()
_BUCKETS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192)

ATTEMPTS = Counter("kube_ferry_schedule_attempts_total", "Jobs the scheduler tried to place, by result",
                   ["result"], registry=REGISTRY)
CYCLE_SECONDS = Histogram("kube_ferry_scheduling_cycle_duration_seconds", "Wall time of one scheduling cycle",
                          buckets=_BUCKETS, registry=REGISTRY)
ATTEMPT_SECONDS = Histogram("kube_ferry_scheduling_attempt_duration_seconds",
                            "Time from a cycle's start to all of a placed gang's bindings written",
                            buckets=_BUCKETS, registry=REGISTRY)
PENDING_JOBS = Gauge("kube_ferry_pending_jobs", "Jobs waiting to be placed", ["queue"], registry=REGISTRY)
ALLOCATED_GPUS = Gauge("kube_ferry_queue_allocated_gpus", "GPUs allocated to each queue", ["queue"],
                       registry=REGISTRY)
RECENT_GPU_SECONDS = Gauge("kube_ferry_queue_recent_gpu_seconds", "GPU-seconds each queue received, decayed with "
                           "the half-life (fair-over-time; absent while it is off)", ["queue"], registry=REGISTRY)
PREEMPTIONS = Counter("kube_ferry_preemption_notices_total", "Jobs told they will be evicted, by the rule that "
                      "chose them and their queue", ["rule", "queue"], registry=REGISTRY)
EVICTIONS = Counter("kube_ferry_evictions_total", "Jobs evicted (whole jobs)", registry=REGISTRY)
CONTINUED_RUNS = Counter("kube_ferry_continued_runs_total", "Pods of no PodGroup that continue an evicted job of "
                         "their controller (its arrival and history: scheduler/service/runs.py)", registry=REGISTRY)
RUNS_SAVED = Gauge("kube_ferry_earlier_runs_saved", "Notes of evicted jobs of no PodGroup not yet taken by their "
                   "controller's next pod, as the leader last saved them (scheduler/service/runs.py)",
                   registry=REGISTRY)
BINDINGS = Counter("kube_ferry_bindings_total", "Pod bindings written, by result", ["result"], registry=REGISTRY)
IS_LEADER = Gauge("kube_ferry_leader", "1 while this replica holds the scheduling lease", registry=REGISTRY)
NODE_IMBALANCE = Gauge("kube_ferry_node_imbalance_percent",
                       "Coefficient of variation of GPU utilisation over the GPU nodes in use (README: node balance)",
                       registry=REGISTRY)
EXPLANATIONS_DEFERRED = Counter("kube_ferry_explanations_deferred_total", "Pending reasons left for a later cycle "
                                "(at most a bounded number are written per cycle)", registry=REGISTRY)
MEMORY_GIVEN_BACK = Counter("kube_ferry_memory_given_back_bytes_total", "Freed heap memory handed back to the OS "
                            "(ferry.memory)", registry=REGISTRY)
