"""``kubectl ferry status``: what the shared cluster gives each tenant, read from the objects the
scheduler and the virtual nodes keep current — Queue status in the compute cluster (guaranteed, maximum,
allocated, borrowed, lent, pending, jobs), the virtual node and its pods in a tenant cluster."""

from __future__ import annotations

from typing import Any

from ferry.keys import API_GROUP, API_VERSION, GPU
from ferry.kube.rest import Rest, path, status_of
from scheduler.service.snapshot import BadSpec, pod_request

Obj = dict[str, Any]
QUEUE_COLUMNS = ("NAME", "GUARANTEED", "MAX", "ALLOCATED", "BORROWED", "LENT", "PENDING-GPU", "RUNNING", "PENDING")
# RECENT-GPU-H: the usage fair-over-time orders borrowers by (GPU-hours decayed with its half-life), as of
# the scheduler's last record of it
WIDE_QUEUE_COLUMNS = (*QUEUE_COLUMNS, "WEIGHT", "RECENT-GPU-H", "NAMESPACES")
NODE_COLUMNS = ("NODE", "TENANT", "GPUS", "GPUS-IN-USE", "RUNNING", "PENDING", "COMPUTE-REACHABLE",
                "TENANT-ACCESS")


def _gpu(section: Obj | None) -> str:
    return str((section or {}).get("gpu", "-"))


def tree_order(queues: list[Obj]) -> list[tuple[int, Obj]]:
    """Queues depth first under their parents (children by name), each with its depth. A queue whose
    parent is unknown, or that sits in a loop, is shown at the top (the scheduler ignores such links)."""
    by_name = {q["metadata"]["name"]: q for q in queues}
    children: dict[str, list[str]] = {}
    for name, q in by_name.items():
        parent = str((q.get("spec") or {}).get("parent") or "")
        if parent in by_name:
            children.setdefault(parent, []).append(name)
    out: list[tuple[int, Obj]] = []
    shown: set[str] = set()

    def walk(name: str, depth: int) -> None:
        if name in shown:
            return
        shown.add(name)
        out.append((depth, by_name[name]))
        for child in sorted(children.get(name, [])):
            walk(child, depth + 1)

    for name in sorted(by_name):
        if (by_name[name].get("spec") or {}).get("parent") not in by_name:
            walk(name, 0)
    for name in sorted(by_name):  # loops: nobody's root
        walk(name, 0)
    return out


def queue_rows(queues: list[Obj]) -> list[Obj]:
    rows = []
    for depth, q in tree_order(queues):
        spec, st = q.get("spec") or {}, q.get("status") or {}
        rows.append({"NAME": "  " * depth + q["metadata"]["name"], "GUARANTEED": _gpu(spec.get("guaranteed")),
                     "MAX": _gpu(spec.get("max")), "ALLOCATED": _gpu(st.get("allocated")),
                     "BORROWED": _gpu(st.get("borrowed")), "LENT": _gpu(st.get("lent")),
                     "PENDING-GPU": _gpu(st.get("pending")), "RUNNING": st.get("runningJobs", 0),
                     "PENDING": st.get("pendingJobs", 0), "WEIGHT": spec.get("weight", 1),
                     "RECENT-GPU-H": _recent_gpu_hours(st.get("recentUsage")),
                     "NAMESPACES": ",".join(spec.get("namespaces") or []) or "-"})
    return rows


def _recent_gpu_hours(usage: Obj | None) -> str:
    if not usage or usage.get("gpuSeconds") is None:
        return "-"  # the scheduler does not count usage over time (fair-over-time is off)
    return f"{float(usage['gpuSeconds']) / 3600:.1f}"


def gpus_of(pod: Obj) -> float:
    """GPUs a pod holds, read as the scheduler reads them (whole GPUs or a share)."""
    try:
        return pod_request(pod).gpu_total / 1000
    except BadSpec:
        return 0.0


def node_rows(nodes: list[Obj], pods: list[Obj]) -> list[Obj]:
    rows = []
    for n in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = n["metadata"]["name"]
        mine = [p for p in pods if p.get("spec", {}).get("nodeName") == name
                and p.get("status", {}).get("phase") in ("Pending", "Running")]
        conds = {c.get("type"): c for c in n.get("status", {}).get("conditions") or []}
        rows.append({"NODE": name, "TENANT": n["metadata"].get("labels", {}).get("kubeferry.io/tenant", "-"),
                     "GPUS": (n.get("status", {}).get("allocatable") or {}).get(GPU, "0"),
                     "GPUS-IN-USE": f"{sum(gpus_of(p) for p in mine):g}",
                     "RUNNING": sum(1 for p in mine if p["status"]["phase"] == "Running"),
                     "PENDING": sum(1 for p in mine if p["status"]["phase"] == "Pending"),
                     "COMPUTE-REACHABLE": conds.get("ComputeClusterReachable", {}).get("status", "Unknown"),
                     # the vnode's own rights here (its RBAC): False says why on the Node
                     "TENANT-ACCESS": conds.get("TenantClusterAccess", {}).get("status", "Unknown")})
    return rows


def table(rows: list[Obj], columns: tuple[str, ...]) -> str:
    cells = [list(columns)] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("   ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells)


async def collect(rest: Rest) -> Obj:
    """Queues (compute cluster) and virtual nodes (tenant cluster) — whichever this cluster has."""
    out: Obj = {}
    try:
        out["queues"] = queue_rows((await rest.get(path(API_GROUP, API_VERSION, "queues")))["items"])
    except Exception as exc:
        if status_of(exc) != 404:
            raise
    nodes = (await rest.get(path("", "v1", "nodes"), labelSelector="kubeferry.io/role=virtual-node"))["items"]
    if nodes:
        pods = (await rest.get(path("", "v1", "pods")))["items"]
        out["virtualNodes"] = node_rows(nodes, pods)
    return out


def render(view: Obj, wide: bool) -> str:
    parts = []
    if "queues" in view:
        parts.append(table(view["queues"], WIDE_QUEUE_COLUMNS if wide else QUEUE_COLUMNS))
    if "virtualNodes" in view:
        parts.append(table(view["virtualNodes"], NODE_COLUMNS))
    return "\n\n".join(parts) or "no Kube-Ferry Queues or virtual nodes in this cluster"
