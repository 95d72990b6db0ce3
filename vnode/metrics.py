"""Prometheus metrics of a vnode."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

PODS_CREATED = Counter("kube_ferry_vnode_compute_pods_created_total", "Compute pods created", registry=REGISTRY)
PODS_DELETED = Counter("kube_ferry_vnode_compute_pods_deleted_total", "Compute pods deleted, by why",
                       ["reason"], registry=REGISTRY)
PODS_HANDED_BACK = Counter("kube_ferry_vnode_preempted_pods_handed_back_total", "Preempted tenant pods that a "
                           "controller owns, deleted so that it makes the next run", registry=REGISTRY)
PODS_REFUSED = Counter("kube_ferry_vnode_pods_refused_total", "Tenant pods refused as unsafe", registry=REGISTRY)
PODS_BOUND = Counter("kube_ferry_vnode_pods_bound_total", "Tenant pods bound to the virtual node",
                     registry=REGISTRY)
STATUS_UPDATES = Counter("kube_ferry_vnode_status_updates_total", "Tenant pod status writes", registry=REGISTRY)
RECONCILE_SECONDS = Histogram("kube_ferry_vnode_reconcile_duration_seconds", "Time to reconcile one pod",
                              buckets=(0.001, 0.004, 0.016, 0.064, 0.256, 1.024, 4.096), registry=REGISTRY)
QUEUE_DEPTH = Gauge("kube_ferry_vnode_workqueue_depth", "Keys waiting or in progress", ["queue"],
                    registry=REGISTRY)
COMPUTE_REACHABLE = Gauge("kube_ferry_vnode_compute_reachable", "1 while the compute API answers",
                          registry=REGISTRY)
TENANT_ACCESS = Gauge("kube_ferry_vnode_tenant_access", "1 while every list and watch of the tenant API answers "
                      "(0: see the Node's TenantClusterAccess condition)", registry=REGISTRY)
GC_DELETED = Counter("kube_ferry_vnode_copies_collected_total", "Copied objects deleted as unused", ["kind"],
                     registry=REGISTRY)
STREAMS = Counter("kube_ferry_vnode_streams_total", "exec / attach / port-forward streams relayed, by the protocol "
                  "the tenant apiserver asked for", ["kind", "protocol"], registry=REGISTRY)
EVENTS_DROPPED = Counter("kube_ferry_vnode_events_dropped_total", "Events the tenant API did not take (best effort: "
                         "an event never blocks the work it reports), by reason", ["reason"], registry=REGISTRY)
EVENT_BACKLOG_DROPPED = Counter("kube_ferry_vnode_event_backlog_dropped_total", "Compute Events not mirrored: more "
                                "were waiting than the backlog holds", registry=REGISTRY)
EVENT_BACKLOG = Gauge("kube_ferry_vnode_event_backlog", "Compute Events waiting to be mirrored", registry=REGISTRY)
CACHED_OBJECTS = Gauge("kube_ferry_vnode_cached_objects", "Objects held by each informer cache", ["cache"],
                       registry=REGISTRY)
MEMORY_GIVEN_BACK = Counter("kube_ferry_memory_given_back_bytes_total", "Freed heap memory handed back to the OS "
                            "(ferry.memory)", registry=REGISTRY)
