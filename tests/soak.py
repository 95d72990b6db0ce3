"""The chaos soak (`make soak`): two tenants, 64 kwok GPU nodes, a steady stream of jobs, a random fault
every 30–90 s; then nothing may be duplicated, lost, orphaned, half bound or miscounted.

Run with ``python -m tests.soak [--minutes 15]``. The stream is what tenants submit: single GPU pods,
Volcano gangs (as operators write them), elastic gangs that borrow idle GPUs and are preempted when the
other tenant reclaims its guarantee, and elastic batch Jobs, whose preempted pods the virtual node hands
back to the Job controller to make again (a Job that fails for anything else is counted); finished jobs
are deleted, some running ones too. The faults are
``kill -9`` of a vnode, of the scheduler leader (a standby takes over), of a tenant apiserver, of the
compute apiserver for up to 60 s and of etcd for 10 s; what dies as a consequence is restarted as a
kubelet would (counted). After each fault, a canary pod per tenant measures how long the bridge takes to
carry a new pod to Running again. When the stream stops, the :func:`audit` of both sides must come out
clean within the convergence deadline; memory of the vnodes and schedulers is sampled all along.
Exit status 0 only if the audit is clean and no long-lived process grew more than 10 % after warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from ferry.cluster.planes import COMPUTE, ControlPlanes
from ferry.cluster.process import Component
from ferry.cluster.supervisor import Supervisor
from ferry.demo import objects
from ferry.demo.run import fresh_namespace
from ferry.keys import API_GROUP, API_VERSION, GPU, POD_GROUP_LABEL, SCHEDULER_NAME
from ferry.kube import quantity
from ferry.kube.rest import Rest, api_client, path, status_of
from ferry.log import get as get_logger
from tests.helpers import eventually
from tests.long_runs import metrics_text, parser, samples, say, two_tenants, write_results
from vnode import naming

Obj = dict[str, Any]
NS = objects.NAMESPACE
TERMINAL = ("Succeeded", "Failed")
FAULTS = ("vnode", "scheduler-leader", "tenant-apiserver", "compute-apiserver", "etcd")
WARM_UP_S = 120.0  # memory is compared from this age of a segment on
LONG_LIVED_S = 300.0  # a segment (process incarnation in one role) judged for memory growth lasted this long
MAX_GROWTH = 0.10


# ------------------------------------------------------------------------------------------ the audit
@dataclass
class Audit:
    """Counts over both sides at one moment; clean when every one is zero."""

    duplicates: int = 0  # tenant pods with more than one live compute copy
    orphans: int = 0  # live compute copies whose tenant pod is gone
    lost: int = 0  # tenant pods the bridge lost (ComputePodLost, bound but without a copy, vanished)
    status_mismatches: int = 0  # tenant pods whose phase is not their copy's
    partial_gangs: int = 0  # gangs with some members bound and others waiting, below minMember
    accounting_off_gpus: float = 0.0  # |Queue status allocated − recount from bound pods|, summed
    unsettled: int = 0  # tenant pods neither terminal nor Running
    failed_jobs: int = 0  # batch Jobs that failed: their pods can fail only through the bridge
    examples: list[str] = field(default_factory=list)

    def clean(self) -> bool:
        return not any((self.duplicates, self.orphans, self.lost, self.status_mismatches, self.partial_gangs,
                        self.accounting_off_gpus, self.unsettled, self.failed_jobs))

    def note(self, what: str) -> None:
        if len(self.examples) < 8:
            self.examples.append(what)


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _gpus(pod: Obj) -> float:
    total = 0.0
    for c in pod.get("spec", {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU)
        total += float(quantity.parse(value)) if value is not None else 0.0
    return total


def audit(tenant_pods: dict[str, list[Obj]], compute_pods: list[Obj], groups: list[Obj], queues: list[Obj],
          vanished: int = 0, failed_jobs: AbstractSet[str] = frozenset()) -> Audit:
    """Judge one snapshot. ``tenant_pods`` by tenant (= its compute namespace); ``compute_pods`` of every
    tenant namespace; ``vanished``: pods the stream created and never deleted that the tenant API no
    longer has; ``failed_jobs``: batch Jobs seen failed (``tenant/name``)."""
    a = Audit(lost=vanished, failed_jobs=len(failed_jobs))
    for job in sorted(failed_jobs):
        a.note(f"batch Job {job} failed")
    live = [p for p in compute_pods if not p["metadata"].get("deletionTimestamp")]
    copies: dict[str, list[Obj]] = {}
    for p in live:
        uid = (p["metadata"].get("labels") or {}).get(naming.UPSTREAM_UID_LABEL)
        if uid:
            copies.setdefault(uid, []).append(p)
    uids = set()
    for tenant, pods in tenant_pods.items():
        for t in pods:
            meta, uid = t["metadata"], t["metadata"]["uid"]
            uids.add(uid)
            mine, phase = copies.get(uid, []), _phase(t)
            if len(mine) > 1:
                a.duplicates += len(mine) - 1
                a.note(f"duplicate copies of {tenant}/{meta['name']}")
            if (t.get("status") or {}).get("reason") == "ComputePodLost":
                a.lost += 1
                a.note(f"{tenant}/{meta['name']} failed with ComputePodLost")
            elif not mine and phase not in TERMINAL and t["spec"].get("nodeName", "").startswith("ferry-"):
                a.lost += 1
                a.note(f"{tenant}/{meta['name']} bound to the vnode, {phase}, without a compute copy")
            if len(mine) == 1 and _phase(mine[0]) != phase:
                a.status_mismatches += 1
                a.note(f"{tenant}/{meta['name']} is {phase}, its copy {_phase(mine[0])}")
            if phase not in (*TERMINAL, "Running"):
                a.unsettled += 1
                a.note(f"{tenant}/{meta['name']} still {phase} on {t['spec'].get('nodeName') or 'no node'}")
    for uid, mine in copies.items():
        if uid not in uids:
            a.orphans += len(mine)
            a.note(f"orphan copy {mine[0]['metadata']['name']}")
    minimum = {(g["metadata"]["namespace"], g["metadata"]["name"]): int(g.get("spec", {}).get("minMember") or 1)
               for g in groups}
    gangs: dict[tuple[str, str], Counter[bool]] = {}
    for p in live:
        group = (p["metadata"].get("labels") or {}).get(POD_GROUP_LABEL)
        if group and _phase(p) not in TERMINAL:
            gangs.setdefault((p["metadata"]["namespace"], group), Counter())[bool(p["spec"].get("nodeName"))] += 1
    for key, bound in gangs.items():
        if bound[True] and bound[False] and bound[True] < minimum.get(key, 1):
            a.partial_gangs += 1
            a.note(f"gang {key[0]}/{key[1]}: {bound[True]} bound, {bound[False]} waiting, min {minimum.get(key)}")
    for q in queues:
        spaces = set(q.get("spec", {}).get("namespaces") or [])
        recount = sum(_gpus(p) for p in live if p["metadata"]["namespace"] in spaces and p["spec"].get("nodeName")
                      and _phase(p) not in TERMINAL)
        said = float(quantity.parse(((q.get("status") or {}).get("allocated") or {}).get("gpu") or "0"))
        if abs(said - recount) > 1e-6:
            a.accounting_off_gpus += abs(said - recount)
            a.note(f"Queue {q['metadata']['name']} says {said:g} GPUs allocated, pods hold {recount:g}")
    return a


# ------------------------------------------------------------------------------------------ the stream
@dataclass
class Stream:
    """What the tenants submitted and deleted (the truth the audit's ``vanished`` is judged against)."""

    created: dict[str, set[str]] = field(default_factory=dict)
    deleted: dict[str, set[str]] = field(default_factory=dict)
    jobs: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # requests a down apiserver refused (retried later)
    preempted: set[str] = field(default_factory=set)  # jobs whose pods ended Failed/Preempted
    batch: dict[str, set[str]] = field(default_factory=dict)  # batch Jobs created, by tenant
    failed_jobs: set[str] = field(default_factory=set)  # tenant/name of batch Jobs seen failed

    def job(self, rng: random.Random, n: int) -> tuple[str, list[Obj], Obj | None]:
        """One job as tenants write it: its name, its pods (or its batch Job) and (gangs) its Volcano
        PodGroup."""
        kind = rng.choices(("single", "gang", "elastic", "batch"), weights=(5, 4, 1, 1))[0]
        name = f"{kind[0]}{n:05d}"
        if kind == "single":
            return name, [objects.gpu_pod(name, rng.choice((1, 1, 2, 4)), f"{rng.randint(20, 120)}s")], None
        if kind == "gang":
            members, gpus = rng.choice((2, 4, 8)), rng.choice((1, 2, 4, 8))
            duration = f"{rng.randint(30, 180)}s"
            return name, objects.gang_members(name, members, gpus, duration=duration), \
                objects.volcano_group(name, members)
        if kind == "batch":
            members = rng.choice((2, 4))
            return name, [objects.batch_job(name, members, 8, elastic=True, duration="240s")], \
                objects.volcano_group(name, members, elastic=True)
        return name, objects.gang_members(name, 4, 8, elastic=True, duration="240s"), \
            objects.volcano_group(name, 4, elastic=True)


async def submit(rest: Rest, tenant: str, stream: Stream, rng: random.Random, stop: asyncio.Event,
                 mean_gap: float) -> None:
    """Submit jobs at exponential gaps until ``stop``. A job a down apiserver interrupted is completed
    later, as an operator would (a gang left with some of its members would wait for the rest for
    ever); once the stream stops the faults have stopped too, and what is left is completed then."""
    unfinished: list[tuple[str, list[Obj], Obj | None]] = []

    async def all_made() -> bool:
        nonlocal unfinished
        unfinished = [job for job in unfinished if not await _create_job(rest, tenant, stream, job)]
        return not unfinished

    n = 0
    while not stop.is_set():
        await all_made()
        n += 1
        job = stream.job(rng, n)
        if not await _create_job(rest, tenant, stream, job):
            unfinished.append(job)
        await _pause(stop, rng.expovariate(1 / mean_gap))
    with contextlib.suppress(AssertionError):  # what is still not made shows in the audit, unsettled
        await eventually(all_made, timeout=120, interval=1.0, what=f"{tenant}'s interrupted jobs made")


async def _create_job(rest: Rest, tenant: str, stream: Stream, job: tuple[str, list[Obj], Obj | None]) -> bool:
    """Create what of the job does not exist yet (409: it does); False when a fault refused a request."""
    name, pods, group = job
    created = stream.created.setdefault(tenant, set())
    batch = stream.batch.setdefault(tenant, set())
    try:
        if group is not None:
            await _create(rest, path(*objects.VOLCANO, "podgroups", NS), group)
        for obj in pods:
            made, url = (batch, path("batch", "v1", "jobs", NS)) if obj["kind"] == "Job" else \
                (created, path("", "v1", "pods", NS))
            if obj["metadata"]["name"] not in made:
                await _create(rest, url, obj)
                made.add(obj["metadata"]["name"])
    except Exception as exc:
        stream.refused[type(exc).__name__ if not status_of(exc) else str(status_of(exc))] += 1
        return False
    stream.jobs[name[0]] += 1
    return True


async def _create(rest: Rest, url: str, obj: Obj) -> None:
    try:
        await rest.create(url, obj)
    except Exception as exc:
        if status_of(exc) != 409:  # 409: it went through before, its answer lost to the fault
            raise


async def reap(rest: Rest, tenant: str, stream: Stream, rng: random.Random, stop: asyncio.Event) -> None:
    """Delete finished jobs (a TTL controller) and, now and then, a running one (a user cancelling); note
    which jobs were preempted (by their pods' Events: a batch Job's preempted pods are soon deleted)."""
    deleted = stream.deleted.setdefault(tenant, set())
    while not stop.is_set():
        await _pause(stop, 10.0)
        try:
            pods = (await rest.get(path("", "v1", "pods", NS)))["items"]
            batch = (await rest.get(path("batch", "v1", "jobs", NS)))["items"]
            told = (await rest.get(path("", "v1", "events", NS), fieldSelector="reason=Preempted"))["items"]
        except Exception:
            continue
        stream.preempted |= {f"{tenant}/{e['involvedObject']['name'].rsplit('-', 1)[0]}" for e in told}
        await _reap_batch(rest, tenant, stream, rng, batch)
        by_job: dict[str, list[Obj]] = {}
        for p in pods:
            by_job.setdefault(p["metadata"].get("labels", {}).get("app", ""), []).append(p)
        for job, members in by_job.items():
            if any((p.get("status") or {}).get("reason") == "Preempted" for p in members):
                stream.preempted.add(f"{tenant}/{job}")
            done = all(_phase(p) in TERMINAL for p in members)
            if not job or job.startswith("canary") or job[0] == "b" or not (done or rng.random() < 0.01):
                continue  # a batch Job's pods go with their Job
            try:
                for p in members:
                    deleted.add(p["metadata"]["name"])  # before the call: its answer may be lost to a fault
                    await rest.delete(path("", "v1", "pods", NS, p["metadata"]["name"]))
                if job[0] in "ge":
                    await rest.delete(path(*objects.VOLCANO, "podgroups", NS, job))
            except Exception as exc:
                if status_of(exc) != 404:
                    stream.refused["reaper"] += 1


async def _reap_batch(rest: Rest, tenant: str, stream: Stream, rng: random.Random, jobs: list[Obj]) -> None:
    """Delete batch Jobs that completed or failed (noting the failed), and now and then a running one; their
    pods go with them (the garbage collector), then their PodGroup."""
    for job in jobs:
        name = job["metadata"]["name"]
        ended = {c["type"] for c in (job.get("status") or {}).get("conditions") or []
                 if c.get("status") == "True"} & {"Complete", "Failed"}
        if "Failed" in ended:
            stream.failed_jobs.add(f"{tenant}/{name}")
        if not (ended or rng.random() < 0.01):
            continue
        try:
            await rest.delete(path("batch", "v1", "jobs", NS, name), {"propagationPolicy": "Background"})
            await rest.delete(path(*objects.VOLCANO, "podgroups", NS, name))
        except Exception as exc:
            if status_of(exc) != 404:
                stream.refused["reaper"] += 1


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds`` or until ``stop``, whichever first (pacing, not synchronisation)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


# ------------------------------------------------------------------------------------------ the faults
@dataclass
class FaultRecord:
    kind: str
    target: str
    outage_s: float
    recovery_s: float | None  # restart → a new pod Running through every tenant's bridge
    slow_because: list[str] = field(default_factory=list)  # what a canary slower than 10 s was told


class Chaos:
    """The clusters, their keeper, and the faults done to them."""

    def __init__(self, planes: ControlPlanes, keeper: Supervisor, schedulers: dict[str, Component],
                 vnodes: dict[str, Component], rng: random.Random) -> None:
        self.planes, self.keeper, self.rng = planes, keeper, rng
        self.schedulers, self.vnodes = schedulers, vnodes
        self.records: list[FaultRecord] = []
        self.canaries = 0

    async def leader(self, compute: Rest) -> str:
        lease = await compute.get(path("coordination.k8s.io", "v1", "leases", "kube-system", "kube-ferry-scheduler"))
        return str(lease["spec"]["holderIdentity"])

    async def target(self, kind: str, compute: Rest) -> tuple[Component, float]:
        rng = self.rng
        if kind == "vnode":
            return self.vnodes[rng.choice(sorted(self.vnodes))], rng.uniform(1, 5)
        if kind == "scheduler-leader":
            try:
                holder = await self.leader(compute)
            except Exception:
                holder = rng.choice(sorted(self.schedulers))
            return self.schedulers.get(holder, self.schedulers[sorted(self.schedulers)[0]]), rng.uniform(1, 5)
        if kind == "tenant-apiserver":
            return self.planes.components[f"{rng.choice(self.planes.tenant_names)}-apiserver"], rng.uniform(1, 5)
        if kind == "compute-apiserver":
            return self.planes.components[f"{COMPUTE}-apiserver"], rng.uniform(10, 60)
        return self.planes.components["etcd"], 10.0

    async def strike(self, kind: str, compute: Rest, tenants: dict[str, Rest]) -> FaultRecord:
        comp, outage = await self.target(kind, compute)
        say(f"fault: kill -9 {comp.name}, down for {outage:.0f} s")
        self.keeper.hold(comp.name)
        try:
            comp.kill()
            await asyncio.sleep(outage)  # the outage itself
        finally:
            comp.start()
            await asyncio.to_thread(comp.wait_ready, time.monotonic() + 180)
            self.keeper.release(comp.name)
        t0 = time.monotonic()
        told: list[str] = []
        recovered = await self.canary(tenants, deadline=300.0, told=told)
        record = FaultRecord(kind, comp.name, round(outage, 1),
                             None if recovered is None else round(time.monotonic() - t0, 1), told)
        say(f"  {comp.name} back; a new pod Running through every bridge after "
            f"{record.recovery_s if record.recovery_s is not None else 'NEVER (300 s)'} s")
        self.records.append(record)
        return record

    async def canary(self, tenants: dict[str, Rest], deadline: float, told: list[str]) -> bool | None:
        """A pod per tenant, no GPU, bound by the vnode: True once every one is Running, None past deadline.
        A canary slower than 10 s leaves its Events (the vnode mirrors the scheduler's) in ``told``."""
        self.canaries += 1
        name = f"canary-{self.canaries}"
        body = {"metadata": {"name": name, "labels": {"app": name}}, "spec": {
            "schedulerName": SCHEDULER_NAME, "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "app:1", "resources": {"requests": {"cpu": "10m"}}}]}}
        end = time.monotonic() + deadline
        pending = dict(tenants)
        created: set[str] = set()
        while pending and time.monotonic() < end:
            for tenant, rest in list(pending.items()):
                url = path("", "v1", "pods", NS, name)
                try:
                    if tenant not in created:
                        await rest.create(path("", "v1", "pods", NS), body)
                        created.add(tenant)
                    if _phase(await rest.get(url)) == "Running":
                        del pending[tenant]
                        if time.monotonic() > end - deadline + 10:
                            events = (await rest.get(path("", "v1", "events", NS),
                                                     fieldSelector=f"involvedObject.name={name}"))["items"]
                            told += [f"{tenant}: {e.get('reason')}: {str(e.get('message'))[:160]}" for e in events]
                        await rest.delete(url)  # the reaper would not: it never ends
                except Exception as exc:
                    if status_of(exc) == 409:
                        created.add(tenant)
            await asyncio.sleep(0.2)  # polling the condition, with the deadline above
        return None if pending else True

    async def run(self, compute: Rest, tenants: dict[str, Rest], stop: asyncio.Event) -> None:
        kinds = list(FAULTS)
        while not stop.is_set():
            await _pause(stop, self.rng.uniform(30, 90))
            if stop.is_set():
                return
            if not kinds:
                kinds = list(FAULTS)
            kind = kinds.pop(self.rng.randrange(len(kinds)))  # every kind before any repeats
            await self.strike(kind, compute, tenants)


# ------------------------------------------------------------------------------------------ memory
@dataclass
class Memory:
    """RSS of the vnodes and schedulers, by segment: one incarnation (component, start count) in one role
    (a scheduler leads or stands by; taking the lead builds a model), aged from the segment's start."""

    samples: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # segment → (age s, KiB)
    born: dict[str, float] = field(default_factory=dict)
    _segment: dict[str, tuple[str, str]] = field(default_factory=dict)  # incarnation → (role, segment key)

    def sample(self, comp: Component, role: str, now: float) -> None:
        if not comp.alive() or comp.pid is None:
            return
        incarnation = f"{comp.name}#{comp.starts}"
        last_role, key = self._segment.get(incarnation, (None, ""))
        if role != last_role:
            key = f"{incarnation}{'/' + role if role else ''}@{len(self.born)}"
            self._segment[incarnation] = (role, key)
            self.born[key] = now
        try:
            status = Path(f"/proc/{comp.pid}/status").read_text()
        except OSError:
            return
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        self.samples.setdefault(key, []).append((now - self.born[key], rss))

    def growth(self) -> dict[str, dict[str, float]]:
        """Per long segment: RSS at warm-up's end, at its last sample, the largest, and the growth."""
        out = {}
        for key, points in self.samples.items():
            after = [kib for age, kib in points if age >= WARM_UP_S]
            if not points or points[-1][0] < LONG_LIVED_S or len(after) < 2:
                continue
            out[key] = {"warm_mib": after[0] / 1024, "end_mib": after[-1] / 1024, "max_mib": max(after) / 1024,
                        "growth": after[-1] / after[0] - 1, "minutes": points[-1][0] / 60}
        return out


async def held(comp: Component) -> dict[str, float]:
    """What a vnode holds at the end: objects per informer cache and Events waiting to be mirrored (what
    its memory would grow with), and the MiB of freed heap its incarnation handed back to the OS."""
    text = await metrics_text(comp.spec.ports[-1]) or ""
    out = {s.labels.get("cache", "event backlog"): s.value
           for s in samples(text, "kube_ferry_vnode_cached_objects", "kube_ferry_vnode_event_backlog")}
    for s in samples(text, "kube_ferry_memory_given_back_bytes_total"):
        out["MiB given back"] = s.value / (1 << 20)
    return out


async def role(comp: Component) -> str:
    """"leader" or "standby" for a scheduler (its own metric says), "" for anything else."""
    if "scheduler" not in comp.name or not comp.spec.ports:
        return ""
    text = await metrics_text(comp.spec.ports[0])
    if text is None:
        return "unknown"
    leading = any(s.value == 1 for s in samples(text, "kube_ferry_leader"))
    return "leader" if leading else "standby"


# ------------------------------------------------------------------------------------------ the run
async def snapshot(compute: Rest, tenants: dict[str, Rest], stream: Stream) -> Audit:
    tenant_pods = {t: (await r.get(path("", "v1", "pods", NS)))["items"] for t, r in tenants.items()}
    compute_pods = [p for t in tenants for p in (await compute.get(path("", "v1", "pods", t)))["items"]]
    groups = [g for t in tenants for g in (await compute.get(path(API_GROUP, API_VERSION, "podgroups", t)))["items"]]
    queues = [q for q in (await compute.get(path(API_GROUP, API_VERSION, "queues")))["items"]
              if q["metadata"]["name"] in tenants]
    vanished = 0
    for t, names in stream.created.items():
        have = {p["metadata"]["name"] for p in tenant_pods[t]}
        vanished += len(names - stream.deleted.get(t, set()) - have)
    failed = set(stream.failed_jobs)
    for t, r in tenants.items():
        failed |= {f"{t}/{j['metadata']['name']}" for j in (await r.get(path("batch", "v1", "jobs", NS)))["items"]
                   if any(c["type"] == "Failed" and c.get("status") == "True"
                          for c in (j.get("status") or {}).get("conditions") or [])}
    return audit(tenant_pods, compute_pods, groups, queues, vanished, failed)


async def converge(compute: Rest, tenants: dict[str, Rest], stream: Stream, deadline: float) -> tuple[Audit, float]:
    t0 = time.monotonic()
    last = Audit(examples=["no snapshot could be read"])
    while time.monotonic() - t0 < deadline:
        try:
            last = await snapshot(compute, tenants, stream)
        except Exception as exc:
            last.note(f"snapshot failed: {exc}")
        if last.clean():
            break
        await asyncio.sleep(1.0)  # polling the condition, with the deadline above
    return last, time.monotonic() - t0


async def soak(args: argparse.Namespace, planes: ControlPlanes, keeper: Supervisor,
               schedulers: dict[str, Component], vnodes: dict[str, Component]) -> int:
    rng = random.Random(args.seed)
    apis: list[ApiClient] = []

    async def rest_of(cluster: str) -> Rest:
        api = await api_client(planes.kubeconfig(cluster))
        apis.append(api)
        return Rest(api)

    compute = await rest_of(COMPUTE)
    tenants = {t: await rest_of(t) for t in planes.tenant_names}
    try:
        total = args.gpu_nodes * 8
        spec = {"guaranteed": {"gpu": str(total // 2)}, "max": {"gpu": str(total)}, "preemption": {
            "reclaim": True, "preemptOwnElastic": True, "victimGraceSeconds": 10}}
        for t in tenants:
            await compute.patch(path(API_GROUP, API_VERSION, "queues", name=t), {"spec": spec})
            await fresh_namespace(tenants[t], t)
        stream, memory = Stream(), Memory()
        chaos = Chaos(planes, keeper, schedulers, vnodes, rng)
        stop = asyncio.Event()
        watched = [*schedulers.values(), *vnodes.values()]
        t0 = time.monotonic()

        async def keep_and_sample() -> None:
            while not stop.is_set():
                keeper.tick(time.monotonic())
                for comp in watched:
                    memory.sample(comp, await role(comp), time.monotonic())
                await _pause(stop, 5.0)

        async def progress() -> None:
            while not stop.is_set():
                await _pause(stop, 60.0)
                say(f"{(time.monotonic() - t0) / 60:.0f} min: jobs {dict(stream.jobs)}, preempted "
                    f"{len(stream.preempted)}, faults "
                    f"{Counter(r.kind for r in chaos.records)}, refused requests {sum(stream.refused.values())}")

        async def timer() -> None:
            await _pause(stop, args.minutes * 60)
            say("time is up: the stream and the faults stop")
            stop.set()

        say(f"soak for {args.minutes} min: {len(tenants)} tenants, {args.gpu_nodes} GPU nodes, seed {args.seed}")
        async with asyncio.TaskGroup() as tg:
            tg.create_task(timer())
            tg.create_task(keep_and_sample())
            tg.create_task(progress())
            tg.create_task(chaos.run(compute, tenants, stop))
            for t, r in tenants.items():
                tg.create_task(submit(r, t, stream, random.Random(rng.random()), stop, args.mean_gap))
                tg.create_task(reap(r, t, stream, random.Random(rng.random()), stop))
        holding = {name: await held(comp) for name, comp in vnodes.items()}
        for c in planes.components.values():  # whatever died with the last fault is restarted
            if not c.alive():
                c.start()
            await asyncio.to_thread(c.wait_ready, time.monotonic() + 180)
        say("waiting for both sides to converge")
        result, took = await converge(compute, tenants, stream, args.converge_s)
        return report(args, result, took, stream, chaos, memory, keeper, holding)
    finally:
        for api in apis:
            await api.close()


def report(args: argparse.Namespace, result: Audit, took: float, stream: Stream, chaos: Chaos, memory: Memory,
           keeper: Supervisor, holding: dict[str, dict[str, float]]) -> int:
    recoveries = [r.recovery_s for r in chaos.records]
    worst = max((r for r in recoveries if r is not None), default=0.0)
    growth = memory.growth()
    grown = {k: g for k, g in growth.items() if g["growth"] > MAX_GROWTH}
    out = {
        "minutes": args.minutes, "gpu_nodes": args.gpu_nodes, "seed": args.seed,
        "jobs": dict(stream.jobs), "jobs_preempted": len(stream.preempted),
        "batch_jobs_preempted": sum(j.split("/", 1)[1].startswith("b") for j in stream.preempted),
        "pods_created": sum(len(v) for v in stream.created.values()),
        "pods_deleted": sum(len(v) for v in stream.deleted.values()), "refused_requests": dict(stream.refused),
        "faults": [asdict(r) for r in chaos.records], "collateral_restarts": keeper.restarts,
        "audit": asdict(result), "converged": result.clean(), "final_convergence_s": round(took, 1),
        "worst_recovery_s": worst, "unrecovered_faults": sum(r is None for r in recoveries),
        "memory": growth, "vnodes_holding_at_stop": holding, "memory_samples": memory.samples,
    }
    written = write_results(args, "soak", out)
    print("\n=== chaos soak ===")
    print(f"jobs {dict(stream.jobs)} (s: single pods, g: gangs, e: elastic gangs, b: elastic batch Jobs), "
          f"{len(stream.preempted)} preempted as whole jobs ({out['batch_jobs_preempted']} of them batch Jobs); "
          f"{out['pods_created']} pods created, {out['pods_deleted']} deleted")
    print(f"faults {len(chaos.records)}: {dict(Counter(r.kind for r in chaos.records))}; "
          f"restarts of other components: {keeper.restarts or 'none'}")
    print(f"duplicates {result.duplicates}, lost {result.lost}, orphans {result.orphans}, partially bound gangs "
          f"{result.partial_gangs}, status mismatches {result.status_mismatches}, queue accounting off by "
          f"{result.accounting_off_gpus:g} GPUs, unsettled {result.unsettled}, failed batch Jobs {result.failed_jobs}")
    print(f"worst recovery after a fault {worst:.1f} s ({out['unrecovered_faults']} never recovered); "
          f"converged {took:.1f} s after the stream stopped" if result.clean() else
          f"NOT converged within {args.converge_s:.0f} s: {result.examples}")
    for key, g in sorted(growth.items()):
        print(f"memory {key} ({g['minutes']:.0f} min): {g['warm_mib']:.0f} MiB after warm-up → {g['end_mib']:.0f} MiB "
              f"at the end "
              f"(max {g['max_mib']:.0f}, {g['growth']:+.1%})")
    for name, h in holding.items():
        print(f"{name} held when the stream stopped: " + ", ".join(f"{k} {v:.0f}" for k, v in h.items()))
    print(f"written to {written}")
    ok = result.clean() and not grown and not out["unrecovered_faults"]
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = parser("tests.soak", __doc__, gpu_nodes=64, workdir="/tmp/kube-ferry-soak")
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--mean-gap", type=float, default=6.0, help="mean seconds between a tenant's jobs")
    p.add_argument("--converge-s", type=float, default=600.0, help="deadline for the final convergence")
    args = p.parse_args(argv)
    planes = two_tenants(args)
    schedulers = {ident: planes.add_scheduler(name=f"kube-ferry-scheduler-{ident}", extra=(
        "--min-runtime=20", "--leader-elect", f"--identity={ident}")) for ident in ("primary", "standby")}
    vnodes = {t: planes.add_vnode(t, extra=("--heartbeat=5", "--gc-interval=5", "--gc-min-age=20"))
              for t in planes.tenant_names}
    say("starting the control planes, two schedulers and the vnodes")
    planes.start(progress=lambda line: say(f"  {line}"))
    keeper = Supervisor(planes, get_logger("soak"))
    try:
        return asyncio.run(soak(args, planes, keeper, schedulers, vnodes))
    finally:
        planes.stop()


if __name__ == "__main__":
    sys.exit(main())
