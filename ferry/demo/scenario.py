"""The demo's scenario: what a platform admin and two tenants do, step by step, and what each step
must make true in the clusters.

Each :class:`Step` acts (creates objects as users would) and then checks, by reading the clusters the
way ``kubectl get`` does, that what it is about to print holds; it prints nothing it has not seen. The
sizes follow the compute cluster (``ferry up --gpu-nodes 32`` gives 256 GPUs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ferry.demo import objects
from ferry.demo.objects import NAMESPACE, VOLCANO
from ferry.demo.observe import will_evict
from ferry.keys import API_GROUP, API_VERSION, DEVICES_ANNOTATION
from ferry.kube.rest import Rest, path
from ferry.whypending import explain
from vnode.naming import UPSTREAM_NS_LABEL

Obj = dict[str, Any]
TENANT_A, TENANT_B = "tenant-1", "tenant-2"
MIN_NODES = 20
GANG = 8  # members of the guaranteed gangs
NOTEBOOKS, NOTEBOOK_MILLI = 4, 250
ELASTIC_JOBS = 3


class DemoError(Exception):
    """The scenario cannot go on; the message names what was expected and what the clusters showed."""


@dataclass
class Demo:
    """The clusters, their size, and what earlier steps found out."""

    compute: Rest
    tenants: dict[str, Rest]
    nodes: int
    gpus_per_node: int
    grace: int = 20
    victims: list[str] = field(default_factory=list)
    observed: str = ""  # the last thing a check saw that was not yet what it waits for

    @property
    def total(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def elastic_members(self) -> int:
        """Members per elastic job: together they fill what the gang and notebooks leave, but two nodes."""
        return (self.nodes - GANG - 1 - 2) // ELASTIC_JOBS

    async def pods(self, tenant: str, job: str) -> list[Obj]:
        items: list[Obj] = (await self.tenants[tenant].get(path("", "v1", "pods", NAMESPACE),
                                                           labelSelector=f"app={job}"))["items"]
        return items

    async def compute_pods(self, tenant: str, job: str) -> list[Obj]:
        items: list[Obj] = (await self.compute.get(path("", "v1", "pods", tenant),
                                                   labelSelector=f"app={job},{UPSTREAM_NS_LABEL}={NAMESPACE}"))["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    async def create(self, tenant: str, body: Obj) -> None:
        if body["kind"] == "PodGroup":
            url = path(*VOLCANO, "podgroups", NAMESPACE)
        else:
            url = path("", "v1", "pods", NAMESPACE)
        await self.tenants[tenant].create(url, body)

    async def all_in(self, tenant: str, job: str, phase: str, count: int) -> list[Obj] | None:
        pods = await self.pods(tenant, job)
        have = sorted(str(p.get("status", {}).get("phase")) for p in pods)
        if len(pods) == count and all(p == phase for p in have):
            return pods
        self.observed = f"{tenant}/{job}: {len(pods)} pods, phases {have}"
        return None


Check = Callable[[Demo], Awaitable[str | None]]


@dataclass
class Step:
    key: str
    title: str
    act: Callable[[Demo], Awaitable[None]]
    check: Check
    timeout: float
    state: str = "waiting"  # waiting, running, done, failed
    claim: str = ""
    started: float = 0.0
    finished: float = 0.0

    def as_dict(self) -> Obj:
        return {"key": self.key, "title": self.title, "state": self.state, "claim": self.claim,
                "seconds": round(self.finished - self.started, 1) if self.finished else None}


# ------------------------------------------------------------------ the steps
async def set_queues(d: Demo) -> None:
    spec = {"guaranteed": {"gpu": str(d.total // 2)}, "max": {"gpu": str(d.total)},
            "preemption": {"reclaim": True, "preemptOwnElastic": True, "victimGraceSeconds": d.grace}}
    for tenant in (TENANT_A, TENANT_B):
        await d.compute.patch(path(API_GROUP, API_VERSION, "queues", name=tenant), {"spec": spec})


async def queues_set(d: Demo) -> str | None:
    for tenant in (TENANT_A, TENANT_B):
        q = await d.compute.get(path(API_GROUP, API_VERSION, "queues", name=tenant))
        spec = q.get("spec", {})
        if (spec.get("guaranteed") or {}).get("gpu") != str(d.total // 2):
            d.observed = f"Queue {tenant} spec {spec}"
            return None
    return (f"Queues {TENANT_A} and {TENANT_B}: {d.total // 2} GPUs guaranteed each, up to {d.total} when the "
            f"other is idle; victims get {d.grace} s to checkpoint (kubectl get fq)")


async def submit_gang(d: Demo, tenant: str, job: str, members: int, gpus: int, elastic: bool = False) -> None:
    """A Volcano PodGroup, then its pods, as an operator creates them."""
    await d.create(tenant, objects.volcano_group(job, members, elastic=elastic))
    for body in objects.gang_members(job, members, gpus, elastic=elastic):
        await d.create(tenant, body)


async def submit_train(d: Demo) -> None:
    await submit_gang(d, TENANT_A, "train", GANG, d.gpus_per_node)


async def train_runs(d: Demo) -> str | None:
    if await d.all_in(TENANT_A, "train", "Running", GANG) is None:
        return None
    nodes = {p["spec"].get("nodeName") for p in await d.compute_pods(TENANT_A, "train")}
    group = await d.tenants[TENANT_A].get(path(*VOLCANO, "podgroups", NAMESPACE, "train"))
    phase = (group.get("status") or {}).get("phase")
    if len(nodes) != GANG or phase != "Running":
        d.observed = f"train on nodes {sorted(map(str, nodes))}, PodGroup phase {phase}"
        return None
    return (f"{TENANT_A}/train: all {GANG} pods × {d.gpus_per_node} GPUs started together on {GANG} whole nodes; "
            f"its Volcano PodGroup is Running")


async def submit_notebooks(d: Demo) -> None:
    for body in objects.shared_gpu_pods("notebooks", NOTEBOOKS, NOTEBOOK_MILLI):
        await d.create(TENANT_A, body)


async def notebooks_share(d: Demo) -> str | None:
    if await d.all_in(TENANT_A, "notebooks", "Running", NOTEBOOKS) is None:
        return None
    places = {(p["spec"].get("nodeName"), p["metadata"].get("annotations", {}).get(DEVICES_ANNOTATION))
              for p in await d.compute_pods(TENANT_A, "notebooks")}
    if len(places) != 1:
        d.observed = f"notebooks placed on {sorted(map(str, places))}"
        return None
    ((node, device),) = places
    return (f"{TENANT_A}/notebooks: {NOTEBOOKS} pods of {NOTEBOOK_MILLI} milli-GPU each share one GPU "
            f"(device {device} of {node})")


def elastic_names() -> list[str]:
    return [f"soak-{i}" for i in range(1, ELASTIC_JOBS + 1)]


async def submit_elastic(d: Demo) -> None:
    for job in elastic_names():
        await submit_gang(d, TENANT_A, job, d.elastic_members, d.gpus_per_node, elastic=True)


async def elastic_soak(d: Demo) -> str | None:
    for job in elastic_names():
        if await d.all_in(TENANT_A, job, "Running", d.elastic_members) is None:
            return None
    q = await d.compute.get(path(API_GROUP, API_VERSION, "queues", name=TENANT_A))
    borrowed = float(((q.get("status") or {}).get("borrowed") or {}).get("gpu", 0))
    allocated = float(((q.get("status") or {}).get("allocated") or {}).get("gpu", 0))
    if borrowed <= 0:
        d.observed = f"Queue {TENANT_A} status {q.get('status')}"
        return None
    return (f"{TENANT_A}: {ELASTIC_JOBS} elastic jobs ({d.elastic_members} × {d.gpus_per_node} GPUs each) soak up "
            f"idle GPUs; {TENANT_A} holds {allocated:g} GPUs, {borrowed:g} borrowed beyond its guarantee")


async def submit_eval(d: Demo) -> None:
    await submit_gang(d, TENANT_B, "eval", GANG, d.gpus_per_node)


async def notice_given(d: Demo) -> str | None:
    noticed = []
    for job in elastic_names():
        pods = await d.pods(TENANT_A, job)
        marked = [p for p in pods if will_evict(p)]
        if marked and len(marked) < len(pods):
            d.observed = f"{job}: {len(marked)} of {len(pods)} pods have the notice so far"
            return None
        if marked:
            noticed.append(job)
    if not noticed:
        d.observed = "no elastic job has an eviction notice yet"
        return None
    d.victims = noticed
    pending = await d.all_in(TENANT_B, "eval", "Pending", GANG)
    if pending is None:
        return None
    return (f"{TENANT_B}/eval ({GANG} × {d.gpus_per_node} GPUs, within its guarantee) finds the cluster full: "
            f"{', '.join(noticed)} of {TENANT_A} got an eviction notice (condition kubeferry.io/WillEvict on "
            f"every pod) and {d.grace} s to checkpoint; eval waits")


async def nothing(d: Demo) -> None:
    return None


async def reclaimed(d: Demo) -> str | None:
    for job in d.victims:
        pods = await d.pods(TENANT_A, job)
        reasons = {p.get("status", {}).get("reason") for p in pods}
        if not pods or any(p.get("status", {}).get("phase") != "Failed" for p in pods) or reasons != {"Preempted"}:
            d.observed = f"victim {job}: phases {[p.get('status', {}).get('phase') for p in pods]}, reasons {reasons}"
            return None
    if await d.all_in(TENANT_B, "eval", "Running", GANG) is None:
        return None
    kept = [job for job in elastic_names() if job not in d.victims]
    for job in kept:
        if await d.all_in(TENANT_A, job, "Running", d.elastic_members) is None:
            return None
    return (f"after the grace period {', '.join(d.victims)} was preempted as a whole (every pod Failed, reason "
            f"Preempted) and {TENANT_B}/eval runs on its guarantee"
            + (f"; {', '.join(kept)} keep running" if kept else ""))


async def submit_unsafe(d: Demo) -> None:
    await d.create(TENANT_B, objects.unsafe_pod("debug-host"))


async def unsafe_refused(d: Demo) -> str | None:
    pods = await d.pods(TENANT_B, "debug-host")
    st = pods[0].get("status", {}) if pods else {}
    if st.get("phase") != "Failed" or st.get("reason") != "Refused":
        d.observed = f"debug-host: phase {st.get('phase')}, reason {st.get('reason')}"
        return None
    compute = await d.compute_pods(TENANT_B, "debug-host")
    if compute:
        d.observed = "debug-host has a compute pod"
        return None
    return (f"{TENANT_B}/debug-host (hostPath /) is refused: {st.get('message', '')}; nothing reached the "
            "compute cluster")


async def submit_huge(d: Demo) -> None:
    await submit_gang(d, TENANT_B, "huge", 2, 2 * d.gpus_per_node)


async def huge_explained(d: Demo) -> str | None:
    if await d.all_in(TENANT_B, "huge", "Pending", 2) is None:
        return None
    verdict = await explain(d.tenants[TENANT_B], NAMESPACE, "podgroup/huge")
    if verdict.state != "Pending" or not verdict.reason or verdict.reason == "Waiting":
        d.observed = f"why-pending podgroup/huge: {verdict.text()}"
        return None
    return f"{TENANT_B}/huge ({2} × {2 * d.gpus_per_node} GPUs) waits — {verdict.message}. {verdict.hint}"


def steps(d: Demo) -> list[Step]:
    victims = "the elastic jobs get a notice"
    return [
        Step("queues", "Platform admin: Queues with guarantees and preemption rights", set_queues, queues_set, 30),
        Step("train", f"{TENANT_A}: an {GANG}-member guaranteed gang (Volcano PodGroup)", submit_train, train_runs, 90),
        Step("notebooks", f"{TENANT_A}: {NOTEBOOKS} notebooks share one GPU", submit_notebooks, notebooks_share, 60),
        Step("elastic", f"{TENANT_A}: elastic jobs soak up idle GPUs", submit_elastic, elastic_soak, 90),
        Step("eval", f"{TENANT_B}: a guaranteed gang reclaims GPUs; {victims}", submit_eval, notice_given, 120),
        Step("reclaim", f"after {d.grace} s the victims are preempted whole; {TENANT_B}'s gang runs", nothing,
             reclaimed, 120),
        Step("unsafe", f"{TENANT_B}: a pod mounting the node's disk is refused", submit_unsafe, unsafe_refused, 60),
        Step("pending", f"{TENANT_B}: a job that cannot fit says why", submit_huge, huge_explained, 60),
    ]

