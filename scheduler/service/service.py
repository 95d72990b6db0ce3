"""The compute-cluster scheduler service: informer caches → scheduling core → bounded concurrent writes.

One model for the service's life (:mod:`scheduler.service.mirror`), fed by the informers' deltas (with
this replica's in-flight bindings assumed, so nothing is placed twice); each cycle applies what changed,
runs one core cycle and writes its decisions: bindings (GPU devices recorded on the
pod first), pending reasons as Events and PodGroup conditions, PodGroup phases. Writes for one job
run concurrently, bounded across jobs by a limit each namespace gets its turn at (:mod:`ferry.fairshare`);
the API server, not the core, is the limit.
Bindings run in the background once assumed, so a cycle never waits for them; a cycle runs when
something it reads changed (not on every pod status update), or after at most one period.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.aio import wait_event
from ferry.fairshare import FairLimiter
from ferry.keys import DEVICES_ANNOTATION, EARLIER_RUN_ANNOTATION, SCHEDULER_NAME, WILL_EVICT_AT, WILL_EVICT_BY
from ferry.kube import timestamps
from ferry.kube.events import event_body, event_name
from ferry.kube.informer import Informer, Obj, key_of
from ferry.kube.rest import Rest, message_of, path, status_of
from scheduler.core.balance import node_imbalance
from scheduler.core.decisions import Bind, CancelEviction, CycleResult, Evict, JobStatus, NotifyWillEvict, Shrink
from scheduler.core.model import Queue, ReplicaPhase
from scheduler.core.scheduler import CYCLE_PERIOD_S, Scheduler, SchedulerConfig
from scheduler.service import metrics
from scheduler.service.accounting import Accountant
from scheduler.service.mirror import Mirror
from scheduler.service.runs import EarlierRun, evicted_status
from scheduler.service.settings import SettingsFile
from scheduler.service.snapshot import (
    HELD_NODES_STATUS,
    ON_LOAN_STATUS,
    RECENT_USAGE_STATUS,
    GangCounts,
    Snapshot,
    held_status,
    namespace_conflicts,
    queue_problems,
    usage_status,
)

GROUP, VERSION = "scheduling.kubeferry.io", "v1alpha1"
IDLE_PERIODS = 5  # with nothing new, a cycle every this many periods
# Why jobs wait is written as Events and PodGroup conditions: a reason whose numbers alone changed is
# written again at most this often, and at most this many jobs are explained per cycle (the rest next
# cycle; kube_ferry_explanations_deferred_total counts them), so a flood of waiting jobs costs the API
# server a bounded number of writes. They are written in the background, at most this many at once and
# one cycle's batch at a time (kube-scheduler's asynchronous API calls: a status write never holds up a
# binding), so a flood of waiting jobs neither delays the next cycle nor queues ahead of another
# tenant's bindings.
REEXPLAIN_AFTER_S = 30.0
# ... and said again on its pods' Event at most this often (the Event counts up): kube-scheduler retries an
# unschedulable pod, and records its FailedScheduling Event again, at least every five minutes. A condition
# is one write per job; an Event is one per pod.
REEVENT_AFTER_S = 300.0
EXPLANATIONS_PER_CYCLE = 200
EXPLANATION_WRITERS = 8
# Queue status (and the gauges) are recounted and written at most this often: in a flood the pending
# numbers move every cycle, each write is a watch event for every vnode and client watching Queues, and
# the recount reads every job and node. The next one carries the latest numbers (a cycle runs at least
# every IDLE_PERIODS periods).
QUEUE_STATUS_EVERY_S = 1.0
USAGE_RECORD_EVERY_S = 60.0  # a Queue's recorded usage changes every cycle but matters over hours
# The notes of evicted bare jobs not yet taken (runs.py) are saved at most this often; a leader reads its
# predecessor's at up to this many cycles (which do not wait for it) before it saves its own over them.
SAVE_RUNS_EVERY_S = 1.0
RESTORE_RUNS_TRIES = 3
RUNS_KEY = "notes.json"
_NUMBER = re.compile(r"\d+(\.\d+)?")
SELECTED_NODE = "volume.kubernetes.io/selected-node"  # where a WaitForFirstConsumer claim is to be provisioned
log = structlog.get_logger("ferry.scheduler")


@dataclass
class ServiceConfig:
    period_s: float = CYCLE_PERIOD_S  # at most this long between cycles; changes wake it sooner
    write_concurrency: int = 64
    # Growing elastic jobs means binding more of their existing pods, which allocation already does;
    # the core's growth step adds replicas, which only simulators can create.
    core: SchedulerConfig = field(default_factory=lambda: SchedulerConfig.preset("ferry").without_actions("grow"))
    settings: SettingsFile | None = None  # re-read before every cycle; replaces core and period_s
    config_object: tuple[str, str] = ("kube-ferry-system", "kube-ferry-scheduler")  # the ConfigMap Events name
    # where the leader keeps the notes of evicted bare jobs not yet taken (runs.py); None: in memory only
    runs_object: tuple[str, str] | None = ("kube-ferry-system", "kube-ferry-scheduler-runs")


class SchedulerService:
    def __init__(self, api: client.ApiClient, config: ServiceConfig | None = None) -> None:
        self.api = api
        self.config = config or ServiceConfig()
        self.core_api = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.wake = asyncio.Event()
        self._pod_seen: dict[str, tuple[Any, ...]] = {}  # what a cycle reads of each pod, last seen
        self.nodes = Informer("nodes", self.core_api.list_node, self._node_changed)
        self.pods = Informer("pods", self.core_api.list_pod_for_all_namespaces, self._pod_changed)
        self.groups = Informer("podgroups", partial(self.custom.list_cluster_custom_object, GROUP, VERSION,
                                                    "podgroups"), self._group_changed)
        self.queues = Informer("queues", partial(self.custom.list_cluster_custom_object, GROUP, VERSION, "queues"),
                               self._queue_changed)
        # the one model, fed by the informers' deltas
        self.mirror = Mirror(self.config.core, lambda: self.pods.store, lambda: self.nodes.store,
                             lambda: self.groups.store, lambda: self.queues.store)
        self.informers = (self.nodes, self.pods, self.groups, self.queues)
        self.rest = Rest(api)
        self.accountant = Accountant(self.rest, lambda: self.groups.store, lambda: self.queues.store)
        # pod -> (node, devices, bound at; inf while the binding is in flight): a backlog of bindings can
        # take longer than the expiry, and an expired assumption would be scheduled and bound twice
        self.assumed: dict[str, tuple[str, tuple[int, ...], float]] = {}
        self._said: dict[str, Said] = {}  # job -> what was last written of why it waits: Events are not repeated
        self._event_counts: dict[str, dict[str, int]] = {}  # job -> its pods' repeated Events -> count written
        self._queue_status: dict[str, dict[str, Any]] = {}  # Queue UID -> the status last written
        self._usage_recorded: dict[str, tuple[float, Obj]] = {}  # Queue UID -> (when, the usage put in its status)
        self._reported_at = -math.inf  # when Queue status and the gauges were last recounted
        # shared by every write, handed out in turn by namespace (each belongs to one tenant's Queue): a
        # tenant whose 400 bindings are queued does not hold up another tenant's one
        self._writes = FairLimiter(self.config.write_concurrency)
        self._explaining = asyncio.Semaphore(EXPLANATION_WRITERS)  # of the writes above, explanations
        self._explained: dict[str, asyncio.Task[None]] = {}  # job -> its explanation, written in the background
        self._reporting: dict[str, asyncio.Task[None]] = {}  # object -> its status report being written
        self._holding: set[str] = set()  # jobs whose PodGroup status keeps (or kept) a hold or a loan
        self._holds_model: Scheduler | None = None  # the model _holding was last checked against
        self.cycles = 0
        self._runs_restored, self._runs_tries = False, 0  # this leader read its predecessor's notes (or gave up)
        self._runs_saved = -1  # the notes' generation last saved
        self._runs_dirty = asyncio.Event()
        self._binder: asyncio.TaskGroup | None = None  # where bindings run while the service runs
        self.leading = asyncio.Event()
        self.leading.set()

    def _node_changed(self, kind: str, obj: Obj) -> None:
        self.mirror.node_changed(key_of(obj))
        self.wake.set()

    def _group_changed(self, kind: str, obj: Obj) -> None:
        self.mirror.group_changed(key_of(obj))
        self.wake.set()

    def _queue_changed(self, kind: str, obj: Obj) -> None:
        self.mirror.queue_changed(key_of(obj))
        self.wake.set()

    def _pod_changed(self, kind: str, obj: Obj) -> None:
        """File the change in the model; wake the loop only for what a cycle reads. A pod's status changes
        (Pending → Running, conditions) several times in its life; a change missed here waits at most
        one period."""
        key = key_of(obj)
        self.accountant.pod_changed(kind, obj)
        if kind == "DELETED":
            self.mirror.pod_changed(key, None)
            self._pod_seen.pop(key, None)
            self.wake.set()
            return
        meta, spec = obj.get("metadata", {}), obj.get("spec", {})
        seen = (spec.get("nodeName"), obj.get("status", {}).get("phase") in ("Succeeded", "Failed"),
                meta.get("deletionTimestamp") is not None, meta.get("generation"), meta.get("labels"),
                meta.get("annotations"))
        before = self._pod_seen.get(key)
        self._pod_seen[key] = seen
        if before != seen:
            self.mirror.pod_changed(key, obj)
        assumed = self.assumed.get(key)
        ours = (assumed is not None and before is not None and seen[0] == assumed[0]
                and seen[1:] == before[1:])  # only our own binding arriving: nothing new to decide
        if before != seen and not ours:
            self.wake.set()

    async def synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))

    def ready(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._binder = tg
            for inf in self.informers:
                tg.create_task(inf.run())
            await self.synced()
            log.info("caches synced", nodes=len(self.nodes.store), pods=len(self.pods.store))
            tg.create_task(self._loop())
            tg.create_task(self.accountant.run(self.leading))
            tg.create_task(self._save_runs())

    async def _loop(self) -> None:
        quiet_since = 0.0  # when a cycle last decided nothing (0: the last one decided something)
        while True:
            if not self.leading.is_set():
                self.mirror.invalidate()  # another replica decides meanwhile: build afresh when leading again
                self._runs_restored, self._runs_tries = False, 0  # and its notes are the ones to go on with
                await self.leading.wait()
            woken = await wait_event(self.wake, self.config.period_s)
            self.wake.clear()
            if not self.leading.is_set():
                continue
            await self._reload()
            # Nothing changed and the last cycle decided nothing: only the clock moves (grace deadlines,
            # holds), which a cycle every few periods sees in time.
            if not woken and quiet_since and time.monotonic() - quiet_since < IDLE_PERIODS * self.config.period_s:
                continue
            if not self._runs_restored:
                await self._restore_runs()
            try:
                result = await self.cycle_once()
                quiet_since = 0.0 if result.decisions else time.monotonic()
                if self._runs_restored and self.mirror.runs.generation != self._runs_saved:
                    self._runs_dirty.set()
            except Exception:  # one bad cycle must not stop scheduling; the next starts afresh
                log.exception("scheduling cycle failed")
                self.mirror.invalidate()
                quiet_since = 0.0

    async def _reload(self) -> None:
        """Apply a changed configuration file; refuse a bad one where the admin looks (log and Event)."""
        settings = self.config.settings
        if settings is None:
            return
        applied, error = settings.refresh()
        if applied:
            before = self.config.core
            self.config.core, self.config.period_s = settings.current.core, settings.current.period_s
            self.mirror.config = self.config.core  # the model's scheduler reconfigures at the next cycle
            changed = {k: v for k, v in vars(self.config.core).items() if vars(before).get(k) != v}
            log.info("configuration applied", file=str(settings.path), period_s=self.config.period_s, **changed)
        if error:
            log.error("configuration refused", reason=error)
            ns, name = self.config.config_object
            await self._event({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}},
                              "Warning", "InvalidConfiguration", error)

    async def _restore_runs(self) -> None:
        """Before a leader's first cycle: the notes of evicted bare jobs its predecessor saved (runs.py).
        Cycles do not wait on a failed read (a next pod seen before the notes are read is a new job), and
        none is saved before they are read, so that the predecessor's are not overwritten; after
        RESTORE_RUNS_TRIES failed reads this leader saves its own."""
        if self.config.runs_object is None:
            self._runs_restored = True
            return
        ns, name = self.config.runs_object
        self._runs_tries += 1
        try:
            saved = await self.rest.get_or_none(path("", "v1", "configmaps", ns, name))
        except Exception as exc:
            given_up = self._runs_tries >= RESTORE_RUNS_TRIES
            log.warning("earlier runs not read" + (", saving this leader's own" if given_up else ", will retry"),
                        object=f"{ns}/{name}", status=status_of(exc), error=message_of(exc)[:200])
            self._runs_restored = given_up
            return
        self._runs_restored = True
        text = ((saved or {}).get("data") or {}).get(RUNS_KEY)
        if not text:
            return
        try:
            notes = self.mirror.runs.restore(text, self.pods.store.values(), time.time())
        except ValueError as exc:
            log.error("earlier runs not restored: not what the scheduler saves", object=f"{ns}/{name}",
                      error=str(exc)[:200])
            return
        log.info("earlier runs restored", object=f"{ns}/{name}", notes=notes)

    async def _save_runs(self) -> None:
        """The leader keeps the notes not taken in a ConfigMap whenever they change, at most once every
        SAVE_RUNS_EVERY_S: what a scheduler that restarts, or the next leader, restores."""
        if self.config.runs_object is None:
            return
        while True:
            await self._runs_dirty.wait()
            self._runs_dirty.clear()
            if not await self.save_runs():
                self._runs_dirty.set()
            await asyncio.sleep(SAVE_RUNS_EVERY_S)

    async def save_runs(self) -> bool:
        """Save the notes not taken if they changed since the last save and this replica leads (and has
        read its predecessor's); also called once on a clean stop, before the Lease is released. False: the
        write failed (logged), to be tried again."""
        runs = self.mirror.runs
        if (self.config.runs_object is None or not (self.leading.is_set() and self._runs_restored)
                or runs.generation == self._runs_saved):
            return True
        ns, name = self.config.runs_object
        url = path("", "v1", "configmaps", ns)
        generation = runs.generation
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns,
                             "annotations": {"kubeferry.io/what": "evicted bare jobs' runs, for their next pods"}},
                "data": {RUNS_KEY: runs.saved(time.time())}}
        try:
            try:
                await self.rest.put(f"{url}/{name}", body)
            except Exception as exc:
                if status_of(exc) != 404:
                    raise
                await self.rest.create(url, body)
        except Exception as exc:
            log.warning("earlier runs not saved", object=f"{ns}/{name}", status=status_of(exc),
                        error=message_of(exc)[:200])
            return False
        self._runs_saved = generation
        metrics.RUNS_SAVED.set(runs.notes())
        return True

    def _expire_assumed(self) -> None:
        """Forget bindings the cache now shows, or that never showed within a minute (the model re-derives
        those pods' jobs from the cache)."""
        pods = self.pods.store
        now = time.monotonic()
        for key, (_, _, since) in list(self.assumed.items()):
            pod = pods.get(key)
            if pod is None or pod.get("spec", {}).get("nodeName"):
                del self.assumed[key]
            elif now - since > 60:
                del self.assumed[key]
                self.mirror.job_changed(key)

    def _unassume(self, key: str) -> None:
        """A binding that did not happen: the pod is to be placed again."""
        self.assumed.pop(key, None)
        self.mirror.job_changed(key)
        self.wake.set()

    async def cycle_once(self) -> CycleResult:
        t0 = time.monotonic()
        now = time.time()
        self._expire_assumed()
        sched, snap = self.mirror.sync(now, self.assumed)
        result = sched.cycle(now)
        result.pending_reasons = sched.reasons(result)  # every waiting job is told why, not only the first like it
        metrics.CYCLE_SECONDS.observe(time.monotonic() - t0)
        self.cycles += 1
        await self._apply(snap, result, t0)
        kept = [*self._sync_holds(sched, snap), *self._keep_earlier_runs()]  # what later schedulers read back
        if kept:
            await asyncio.gather(*kept)
        now_m = time.monotonic()
        if now_m - self._reported_at >= QUEUE_STATUS_EVERY_S:
            self._reported_at = now_m
            await self._report_queues(sched, snap)
        return result

    def _keep_earlier_runs(self) -> list[Awaitable[Any]]:
        """Each pod that took an evicted run's note (runs.py) keeps it, so that a scheduler that restarts or
        changes leader while the pod waits or runs reads it back. Written off the cycle's path once (a
        failed write leaves that pod a new job to a later scheduler, as before); returns what the caller
        awaits itself (outside the running service)."""
        writes: list[Awaitable[Any]] = []
        for pod, run in self.mirror.runs.taken():
            metrics.CONTINUED_RUNS.inc()
            meta = pod["metadata"]
            ns = meta["namespace"]
            body = {"metadata": {"uid": meta["uid"], "annotations": {EARLIER_RUN_ANNOTATION: run.annotation()}}}
            write = self._guard("earlier run", self.core_api.patch_namespaced_pod(meta["name"], ns, body), ns)
            if self._binder is not None:
                self._binder.create_task(_logged("earlier run", write))
            else:
                writes.append(write)
        return writes

    def _sync_holds(self, sched: Scheduler, snap: Snapshot) -> list[Awaitable[Any]]:
        """Level-triggered: each PodGroup's status keeps the model's holds and loans as they are now
        (:func:`held_status`), so that a scheduler built after a restart, or a new leader, goes on with them.
        Looks only at the jobs that hold or borrow, and those whose status still says so."""
        if self._holds_model is not sched:  # a model built afresh: whatever the statuses say is to be checked
            self._holds_model = sched
            self._holding = {job for job, group in snap.group_of.items() if any(
                ((group or {}).get("status") or {}).get(k) for k in (HELD_NODES_STATUS, ON_LOAN_STATUS))}
        writes: list[Awaitable[Any]] = []
        jobs, holding = snap.cluster.jobs, self._holding
        self._holding = set()
        for name in {*sched.reserved, *sched.on_loan, *holding}:
            group = snap.group_of.get(name)
            if group is None:
                continue
            want, have = held_status(jobs.get(name)), group.get("status") or {}
            same = all(have.get(k) == v for k, v in want.items())
            if not same or any(v is not None for v in want.values()):
                self._holding.add(name)  # looked at again until its status says nothing
            if not same:
                writes += self._report(f"holds {_uid(group)}", partial(self._patch_group_status, group, want))
        return writes

    async def _report_queues(self, sched: Scheduler, snap: Snapshot) -> None:
        """Queue status and the gauges, recounted from the whole model: at most once per
        QUEUE_STATUS_EVERY_S, since in a flood a cycle runs for every few pods, and this recount (every job
        and node) cost as much CPU as the cycle itself."""
        pending: dict[str, int] = {}
        for j in sched.pending_jobs():
            pending[j.queue] = pending.get(j.queue, 0) + 1
        running: dict[str, int] = {}
        for j in snap.cluster.jobs.values():
            if j.phase.holds_resources:
                running[j.queue] = running.get(j.queue, 0) + 1
        metrics.NODE_IMBALANCE.set(node_imbalance(snap.cluster.nodes.values()))
        borrowed_total = sum(max(0, q.allocated_gpu - q.guaranteed_gpu) for q in snap.cluster.queues.values())
        writes = []
        conflicts = namespace_conflicts(self.queues.store)
        tree = queue_problems(self.queues.store)
        for q in snap.cluster.queues.values():
            metrics.ALLOCATED_GPUS.labels(q.name).set(q.allocated_gpu / 1000)
            metrics.PENDING_JOBS.labels(q.name).set(pending.get(q.name, 0))
            if q.usage_at is not None:
                metrics.RECENT_GPU_SECONDS.labels(q.name).set(q.recent_usage / 1000)
            obj = self.queues.store.get(q.name)
            if obj is None:
                continue
            idle_guarantee = max(0, q.guaranteed_gpu - q.allocated_gpu)
            status = {
                "allocated": {"gpu": f"{q.allocated_gpu / 1000:g}"},
                "pending": {"gpu": f"{sched.pending_gpu.get(q.name, 0) / 1000:g}"},
                "borrowed": {"gpu": f"{max(0, q.allocated_gpu - q.guaranteed_gpu) / 1000:g}"},
                "lent": {"gpu": f"{min(idle_guarantee, borrowed_total) / 1000:g}"},
                "runningJobs": running.get(q.name, 0),
                "pendingJobs": pending.get(q.name, 0),
                "conditions": namespace_condition(conflicts.get(q.name, {})) + parent_condition(
                    (obj.get("spec") or {}).get("parent"), tree.get(q.name)),
            }
            uid = str(obj["metadata"].get("uid", ""))  # a Queue deleted and made again is a new object
            usage = self._usage_to_record(uid, q)
            if usage is not None:
                status[RECENT_USAGE_STATUS] = usage
            if self._queue_status.get(uid) != status:
                writes += self._report(f"queue {uid}", partial(self._write_queue_status, q.name, uid, status))
        live = {str(o["metadata"].get("uid", "")) for o in self.queues.store.values()}
        for gone in [u for u in self._queue_status if u not in live]:
            del self._queue_status[gone]
        for gone in [u for u in self._usage_recorded if u not in live]:
            del self._usage_recorded[gone]
        if writes:
            await asyncio.gather(*writes)

    def _usage_to_record(self, uid: str, queue: Queue) -> Obj | None:
        """The queue's usage for its status, refreshed every USAGE_RECORD_EVERY_S only (a scheduler built
        after a restart continues from it; a minute's drift is nothing beside a half-life of hours)."""
        had = self._usage_recorded.get(uid)
        now_m = time.monotonic()
        if had is not None and now_m - had[0] < USAGE_RECORD_EVERY_S:
            return had[1]
        fresh = usage_status(queue)
        if fresh is not None:
            self._usage_recorded[uid] = (now_m, fresh)
        return fresh

    async def _write_queue_status(self, name: str, uid: str, status: dict[str, Any]) -> None:
        """Remember a status only once written: one lost to an outage is written again next cycle."""
        if await self._guard("queue status", self.custom.patch_cluster_custom_object_status(
                GROUP, VERSION, "queues", name, {"metadata": {"uid": uid}, "status": status},
                _content_type="application/merge-patch+json")):
            self._queue_status[uid] = status

    async def _guard(self, what: str, coro: Awaitable[Any], namespace: str = "") -> bool:
        async with self._writes.slot(namespace):
            try:
                result = await coro
            except ApiException as exc:
                log.warning("write failed", what=what, status=exc.status, reason=exc.reason)
                return False
            if not isinstance(result, aiohttp.ClientResponse):
                return True
            # Unread (``_preload_content=False``) answers are neither checked by the client nor returned
            # to its pool: a refused binding or eviction would count as done.
            try:
                if 200 <= result.status <= 299:
                    return True
                body = await result.text()
                log.warning("write failed", what=what, status=result.status, reason=body[:300])
                return False
            finally:
                result.release()

    async def _apply(self, snap: Snapshot, result: CycleResult, t0: float) -> None:
        binds: dict[str, list[Bind]] = {}
        for d in result.decisions:
            if isinstance(d, Bind):
                binds.setdefault(d.job, []).append(d)
        writes: list[Awaitable[Any]] = []
        # Victims leave first: a job placed on what this cycle's evictions free is bound only once those
        # evictions were accepted (a kubelet refuses newcomers while its pods still hold the devices; the
        # snapshot charges leaving pods to their nodes until they are gone).
        draining: dict[str, list[asyncio.Future[bool]]] = {}
        for d in result.decisions:
            if isinstance(d, Evict | Shrink):
                only: set[tuple[str, int]] | None = None
                kept: Obj | None = None  # what the PodGroup keeps of an evicted job for its next run
                noted: EarlierRun | None = None
                if isinstance(d, Evict):
                    metrics.EVICTIONS.inc()
                    now = time.time()
                    kept = evicted_status(d.attained_gpu_s, now, d.moved_at)
                    if snap.group_of.get(d.job) is None and (victim := snap.cluster.jobs.get(d.job)) is not None:
                        # no PodGroup keeps it: the next pod its controller makes takes it (runs.py)
                        noted = EarlierRun(victim.submit_time, d.attained_gpu_s, now, d.moved_at)
                        self.mirror.runs.evicted(snap.pods_of.get(d.job, {}).values(), noted, now)
                else:
                    only = {(t, i) for t, i, _ in d.replicas}
                eviction = asyncio.ensure_future(self._evict(snap, d.job, only, d.reason, kept))
                if noted is not None:
                    victims = list(snap.pods_of.get(d.job, {}).values())
                    eviction.add_done_callback(partial(self._withdraw_if_refused, victims, noted))
                writes.append(eviction)
                for _, _, node in d.replicas:
                    draining.setdefault(node, []).append(eviction)
        for job, ds in binds.items():
            # Assumed now, bound in the background: the next cycle need not wait for the API server
            # (kube-scheduler's binding cycle), and cannot place the same pod or GPU twice.
            targets = self._assume(snap, job, ds)
            first = {id(e): e for d in ds for e in draining.get(d.node, ())}
            bind = (self._bind_after(list(first.values()), job, targets, t0) if first
                    else self._bind_job(job, targets, t0))
            if self._binder is not None:
                self._binder.create_task(bind)
            else:
                writes.append(bind)
        for d in result.decisions:
            # a job's new status lands after any explanation of why it waited still being written
            if isinstance(d, JobStatus) and d.phase == "Privileged":  # waiting for its victims to leave
                writes.append(self._after_explained(d.job, self._job_status(
                    snap, d.job, d.phase, "Scheduled", "False", "Preempting", d.reason)))
            elif isinstance(d, JobStatus):
                writes.append(self._after_explained(d.job, self._job_status(
                    snap, d.job, d.phase, "Scheduled", "True", "Scheduled", d.reason)))
            elif isinstance(d, NotifyWillEvict):
                victim = snap.cluster.jobs.get(d.job)
                metrics.PREEMPTIONS.labels(rule=d.rule, queue=victim.queue if victim is not None else "").inc()
                writes.append(self._notify(snap, d))
            elif isinstance(d, CancelEviction):
                writes.append(self._cancel(snap, d))
        reasons = {**{j: ("Unschedulable", r) for j, r in result.pending_reasons.items()},
                   **{j: ("Waiting", r) for j, r in snap.waiting.items()},
                   **{j: ("InvalidSpec", r) for j, r in snap.problems.items()}}
        self._explained = {j: t for j, t in self._explained.items() if not t.done()}
        self._reporting = {k: t for k, t in self._reporting.items() if not t.done()}
        budget, now_m = 0 if self._explained else EXPLANATIONS_PER_CYCLE, time.monotonic()  # one batch at a time
        for job, (reason, message) in reasons.items():
            incarnation = _uid(snap.group_of.get(job))
            said = self._said.get(job)
            if said is not None and said.incarnation != incarnation:  # a new PodGroup of the same name
                said = None
            event = explanation_due(said, reason, message, now_m)
            if event is None:
                continue
            if budget == 0:
                metrics.EXPLANATIONS_DEFERRED.inc()  # said in a later cycle
                continue
            budget -= 1
            self._said[job] = Said(incarnation, reason, message, now_m,
                                   now_m if event or said is None else said.evented_at)
            metrics.ATTEMPTS.labels("unschedulable").inc()
            if self._binder is not None:
                self._explained[job] = self._binder.create_task(
                    _logged("explanation", self._explain(snap, job, reason, message, event)))
            else:
                writes.append(self._explain(snap, job, reason, message, event))
        for job in [j for j in self._said if j not in snap.pods_of]:  # gone, or ended
            del self._said[job]
        for job in [j for j in self._event_counts if j not in snap.pods_of]:
            del self._event_counts[job]
        written = {d.job for d in result.decisions
                   if isinstance(d, JobStatus | NotifyWillEvict | CancelEviction | Evict)} | set(reasons)
        writes += self._sync_groups(snap, written)
        if writes:
            await asyncio.gather(*writes)

    def _sync_groups(self, snap: Snapshot, written: set[str]) -> list[Awaitable[Any]]:
        """Level-triggered PodGroup counts, the terminal phase once every member has ended, and Running for
        a group made after all its members were bound (its vnode made it again; no decision of the cycle
        speaks of it, so it has no condition): the decisions only speak of jobs that still have members to
        schedule."""
        writes: list[Awaitable[Any]] = []
        for job, counts in snap.counts.items():
            group = snap.group_of.get(job)
            if group is None or job in written:
                continue
            have = group.get("status") or {}
            want: dict[str, Any] = dict(counts.status())
            phase = counts.terminal_phase()
            if phase is None and counts.running and not counts.pending and not have.get("conditions"):
                want["phase"] = "Running"  # nothing the cycle said of it: no condition is written over
            if all(have.get(k, 0) == v for k, v in want.items()) and phase in (None, have.get("phase")):
                continue
            if phase is not None:
                want["phase"] = phase
                want["conditions"] = [{
                    "type": "Scheduled", "status": "True", "reason": "Finished",
                    "message": f"every member ended: {counts.succeeded} succeeded, {counts.failed} failed",
                    "lastTransitionTime": timestamps.now()}]
            writes += self._report(f"group {_uid(group)}", partial(self._patch_group_status, group, want))
        return writes

    def _report(self, key: str, write: Callable[[], Awaitable[Any]]) -> list[Awaitable[Any]]:
        """A level-triggered status report (a Queue's, a PodGroup's counts) is written off the cycle's path,
        one per object at a time: the next cycle writes whatever still differs. Returns what the caller
        awaits itself (all of it outside the running service, whose tests drive cycles one by one)."""
        if self._binder is None:
            return [write()]
        running = self._reporting.get(key)
        if running is None or running.done():
            self._reporting[key] = self._binder.create_task(_logged(key, write()))
        return []

    def _assume(self, snap: Snapshot, job: str, decisions: list[Bind]) -> list[tuple[Obj, Bind]]:
        pods = snap.pods_of[job]
        targets = [(pods[(d.task, d.index)], d) for d in decisions if (d.task, d.index) in pods]
        for pod, d in targets:
            self.assumed[key_of(pod)] = (d.node, d.devices, math.inf)  # in flight: never expires
        return targets

    async def _bind_job(self, job: str, targets: list[tuple[Obj, Bind]], t0: float) -> None:
        results: list[bool] = [False] * len(targets)
        try:
            await self._claims_follow(targets)
            results = list(await asyncio.gather(*(self._bind(pod, d) for pod, d in targets)))
        except Exception:  # a connection error: the next cycle decides again
            log.exception("binding failed", job=job)
        finally:
            now = time.monotonic()
            for (pod, d), ok in zip(targets, results, strict=True):
                if not ok:
                    self._unassume(key_of(pod))
                elif key_of(pod) in self.assumed:  # bound: kept until the cache shows it (or a minute)
                    self.assumed[key_of(pod)] = (d.node, d.devices, now)
        metrics.ATTEMPTS.labels("scheduled" if all(results) else "error").inc()
        metrics.ATTEMPT_SECONDS.observe(time.monotonic() - t0)
        self._said.pop(job, None)

    async def _bind_after(self, evictions: list[asyncio.Future[bool]], job: str, targets: list[tuple[Obj, Bind]],
                          t0: float) -> None:
        if all(await asyncio.gather(*evictions)):
            await self._bind_job(job, targets, t0)
            return
        for pod, _ in targets:  # a victim stays: place the job again in a later cycle
            self._unassume(key_of(pod))

    async def _bind(self, pod: Obj, d: Bind) -> bool:
        """One write per pod: the apiserver copies a Binding's annotations onto the pod with its node, so
        the chosen devices arrive with the binding (never a pod on a node without its devices). Plain
        JSON through Rest: the generic client's walk over every request body cost more CPU than deciding."""
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        body: Obj = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "uid": meta.get("uid")},
                     "target": {"apiVersion": "v1", "kind": "Node", "name": d.node}}
        if d.devices:
            body["metadata"]["annotations"] = {DEVICES_ANNOTATION: ",".join(map(str, d.devices))}
        ok = await self._guard(f"bind {ns}/{name}", self.rest.raw("POST", path("", "v1", "pods", ns, name, "binding"),
                                                                  body), ns)
        metrics.BINDINGS.labels("ok" if ok else "error").inc()
        return ok

    async def _claims_follow(self, targets: list[tuple[Obj, Bind]]) -> None:
        """The part of kube-scheduler's volume binding a scheduler must do: a claim of a WaitForFirstConsumer
        class that is not bound yet is provisioned where its first pod goes, and its provisioner waits for
        the claim to name that node. Once per claim a job mounts (its pods may share one), read on demand
        (few pods mount claims), before its pods are bound; their kubelets mount the volume once it is
        provisioned. Any failure is logged, and the pods are bound all the same."""
        first: dict[tuple[str, str], str] = {}  # (namespace, claim) -> the node of the first pod mounting it
        for pod, d in targets:
            for vol in pod.get("spec", {}).get("volumes") or ():
                if name := (vol.get("persistentVolumeClaim") or {}).get("claimName"):
                    first.setdefault((pod["metadata"]["namespace"], name), d.node)
        for (ns, name), node in first.items():
            url = path("", "v1", "persistentvolumeclaims", ns, name)
            try:
                claim = await self.rest.get_or_none(url)
                spec = (claim or {}).get("spec") or {}
                if (claim is None or spec.get("volumeName") or not spec.get("storageClassName")
                        or SELECTED_NODE in (claim["metadata"].get("annotations") or {})):
                    continue
                sc = await self.rest.get_or_none(path("storage.k8s.io", "v1", "storageclasses",
                                                      name=spec["storageClassName"]))
                if sc is None or sc.get("volumeBindingMode") != "WaitForFirstConsumer":
                    continue
                await self._guard(f"claim {ns}/{name}", self.rest.patch(
                    url, {"metadata": {"annotations": {SELECTED_NODE: node}}}), ns)
            except Exception as exc:
                log.warning("claim not followed", claim=f"{ns}/{name}", error=str(exc)[:200])

    def _bound_pods(self, snap: Snapshot, job: str) -> list[Obj]:
        return [p for p in snap.pods_of.get(job, {}).values() if p.get("spec", {}).get("nodeName")]

    async def _notify(self, snap: Snapshot, d: NotifyWillEvict) -> None:
        """Tell a victim's pods when they will be evicted, so the workload can checkpoint first."""
        at = timestamps.rfc3339(d.deadline)
        writes: list[Awaitable[Any]] = []
        for pod in self._bound_pods(snap, d.job):
            meta = pod["metadata"]
            writes.append(self._guard("notice", self.core_api.patch_namespaced_pod(
                meta["name"], meta["namespace"],
                {"metadata": {"annotations": {WILL_EVICT_AT: at, WILL_EVICT_BY: d.preemptor}}}), meta["namespace"]))
            writes.append(self._will_evict_condition(pod, "True", "Preempting", d.reason))
            writes.append(self._event(pod, "Warning", "Preempting", d.reason))
        writes.append(self._job_status(snap, d.job, "WillEvict", "Evicting", "True", "Preempting", d.reason))
        await asyncio.gather(*writes)

    def _will_evict_condition(self, pod: Obj, status: str, reason: str, message: str) -> Awaitable[bool]:
        meta = pod["metadata"]
        return self._guard("will-evict condition", self.core_api.patch_namespaced_pod_status(
            meta["name"], meta["namespace"], {"status": {"conditions": [{
                "type": "kubeferry.io/WillEvict", "status": status, "reason": reason,
                "message": message[:1024], "lastTransitionTime": timestamps.now()}]}}), meta["namespace"])

    async def _cancel(self, snap: Snapshot, d: CancelEviction) -> None:
        writes: list[Awaitable[Any]] = []
        for pod in self._bound_pods(snap, d.job):
            meta = pod["metadata"]
            writes.append(self._guard("cancel notice", self.core_api.patch_namespaced_pod(
                meta["name"], meta["namespace"], {"metadata": {"annotations": {WILL_EVICT_AT: None,
                                                                               WILL_EVICT_BY: None}}}),
                                      meta["namespace"]))
            writes.append(self._will_evict_condition(pod, "False", "EvictionCancelled", d.reason))
            writes.append(self._event(pod, "Normal", "EvictionCancelled", d.reason))
        writes.append(self._job_status(snap, d.job, "Running", "Evicting", "False", "EvictionCancelled", d.reason))
        await asyncio.gather(*writes)

    def _withdraw_if_refused(self, pods: list[Obj], run: EarlierRun, eviction: asyncio.Future[bool]) -> None:
        """An eviction refused while its pod runs on (a disruption budget) leaves no note for a later pod."""
        if eviction.cancelled() or eviction.exception() is not None or eviction.result():
            return
        store = self.pods.store
        running_on = [p for p in pods if (live := store.get(key_of(p))) is not None
                      and live["metadata"].get("uid") == p["metadata"].get("uid")
                      and not live["metadata"].get("deletionTimestamp")]
        if self.mirror.runs.withdraw(running_on, run):
            log.info("eviction refused, its note withdrawn", pods=[key_of(p) for p in running_on])

    async def _evict(self, snap: Snapshot, job: str, only: set[tuple[str, int]] | None, reason: str,
                     kept: Obj | None) -> bool:
        """Evict through the Eviction API (honouring the pods' grace periods): the whole job, or some replicas.
        A whole job's PodGroup status keeps ``kept`` (the GPU-seconds it received, and when), for its next run
        under a scheduler that may have restarted meanwhile. True when every eviction was accepted."""
        writes: list[Awaitable[Any]] = []
        evictions: list[Awaitable[bool]] = []
        for (task, index), pod in snap.pods_of.get(job, {}).items():
            if only is not None and (task, index) not in only:
                continue
            meta = pod["metadata"]
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
            writes.append(self._event(pod, "Warning", "Preempted", reason))
            evictions.append(self._guard("evict", self.core_api.create_namespaced_pod_eviction(
                meta["name"], meta["namespace"], body, _preload_content=False), meta["namespace"]))
        if only is None:
            writes.append(self._job_status(snap, job, "Evicted", "Evicting", "True", "Preempted", reason, kept))
        accepted: list[bool] = list(await asyncio.gather(*evictions))
        await asyncio.gather(*writes)
        return all(accepted)

    async def _explain(self, snap: Snapshot, job: str, reason: str, message: str, event: bool) -> None:
        async with self._explaining:
            await self._write_explanation(snap, job, reason, message, event)

    async def _after_explained(self, job: str, write: Awaitable[Any]) -> None:
        explanation = self._explained.get(job)
        if explanation is not None:
            await asyncio.wait([explanation])
        await write

    async def _write_explanation(self, snap: Snapshot, job: str, reason: str, message: str, event: bool) -> None:
        """Why a job waits, on its pods that wait (an Event each) and on its PodGroup. A gang that runs with
        more members than its minimum (Volcano's ``minAvailable`` below its replicas) keeps its phase: only
        its unbound members wait, and only they are told so."""
        writes: list[Awaitable[Any]] = []
        model = snap.cluster.jobs.get(job)
        started = model is not None and model.phase.holds_resources
        placed = {(r.task, r.index) for r in model.replicas if r.phase is not ReplicaPhase.PENDING} \
            if model is not None and started else set()  # the model's word: a binding may still be in flight
        if event:
            for replica, pod in snap.pods_of.get(job, {}).items():
                if replica in placed:
                    continue
                writes.append(self._repeated_event(job, pod, "FailedScheduling" if reason != "Waiting" else "Waiting",
                                                   message))
        if not started:
            writes.append(self._job_status(snap, job, "Pending", "Scheduled", "False", reason, message))
        await asyncio.gather(*writes)

    async def _event(self, obj: Obj, etype: str, reason: str, message: str) -> None:
        ns = obj["metadata"]["namespace"]
        body = event_body(obj, etype, reason, message, component=SCHEDULER_NAME, host=SCHEDULER_NAME)
        await self._guard("event", self.core_api.create_namespaced_event(ns, body), ns)

    async def _repeated_event(self, job: str, pod: Obj, reason: str, message: str) -> None:
        """A waiting pod's reason, said again (its numbers aside, or after it said something else), counts up
        on the Event that first said it, as client-go's recorder does for kube-scheduler: ``kubectl describe``
        shows "(x12 over 6m)" with the latest numbers, not a screen of near-copies, and a long wait does not
        leave one more Event every half minute. The name is derived from what it says, so a new leader (with
        no memory of the counts) finds the same Event."""
        ns = pod["metadata"]["namespace"]
        name = event_name(pod, f"{reason}/{_gist(message)}")
        body = event_body(pod, "Warning", reason, message, component=SCHEDULER_NAME, host=SCHEDULER_NAME, name=name)
        counts = self._event_counts.setdefault(job, {})
        again = {"count": 0, "lastTimestamp": body["lastTimestamp"], "message": body["message"]}
        async with self._writes.slot(ns):
            try:
                if name in counts:
                    again["count"] = counts[name] + 1
                    try:
                        await self.core_api.patch_namespaced_event(
                            name, ns, again, _content_type="application/merge-patch+json")
                        counts[name] = again["count"]
                        return
                    except ApiException as exc:
                        if exc.status != 404:  # gone: expired (the apiserver's --event-ttl); say it afresh
                            raise
                try:
                    await self.core_api.create_namespaced_event(ns, body)
                    counts[name] = 1
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    had = await self.core_api.read_namespaced_event(name, ns)  # said before this leader's time
                    again["count"] = (had.count or 1) + 1
                    await self.core_api.patch_namespaced_event(name, ns, again,
                                                               _content_type="application/merge-patch+json")
                    counts[name] = again["count"]
            except ApiException as exc:
                log.warning("write failed", what="event", status=exc.status, reason=exc.reason)

    async def _job_status(self, snap: Snapshot, job: str, phase: str, ctype: str, status: str, reason: str,
                          message: str, extra: Mapping[str, Any] | None = None) -> None:
        group = snap.group_of.get(job)
        if group is None:
            return
        counts = snap.counts.get(job, GangCounts())
        st: dict[str, Any] = {"phase": phase, **counts.status(), **(extra or {}),
                              "conditions": [{"type": ctype, "status": status, "reason": reason,
                                              "message": message[:1024], "lastTransitionTime": timestamps.now()}]}
        if phase == "Running":  # its members were just assumed bound; the snapshot predates that
            st["running"] = counts.live
            st["scheduledTime"] = timestamps.now()
            if (group.get("status") or {}).get("phase") in (None, "", "Pending", "Privileged"):
                await self._event({**group, "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup"}, "Normal",
                                  "Scheduled",
                                  f"gang scheduled: all {counts.live + counts.ended} members present, "
                                  f"{counts.live} bound now")
        await self._patch_group_status(group, st)

    def _patch_group_status(self, group: Obj, status: dict[str, Any]) -> Awaitable[bool]:
        meta = group["metadata"]
        return self._guard("podgroup status", self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, meta["namespace"], "podgroups", meta["name"], {"status": status},
            _content_type="application/merge-patch+json"), meta["namespace"])


async def _logged(what: str, write: Awaitable[Any]) -> None:
    """A write in the background: a failure (the API server unreachable) is logged, and the next cycle
    tries again; it must not end the task group the service runs in."""
    try:
        await write
    except Exception as exc:
        log.warning("write failed", what=what, error=str(exc)[:200])


def _uid(obj: Obj | None) -> str:
    return str((obj or {}).get("metadata", {}).get("uid", ""))


@dataclass(frozen=True)
class Said:
    """What was last written of why a job waits, and when: its condition, and its pods' Event."""

    incarnation: str  # the PodGroup's UID: a new PodGroup of the same name starts afresh
    reason: str
    message: str
    written_at: float
    evented_at: float


def explanation_due(said: Said | None, reason: str, message: str, now: float) -> bool | None:
    """Whether to write why a job waits now: None (not now), else whether its pods' Event is written too.
    A new situation (another reason, or other words) is written at once, with an Event, except that a gang
    still assembling says so once (its condition keeps the member count current). When only the numbers
    changed ("399 in use"), the condition is rewritten at most every REEXPLAIN_AFTER_S and the Event counted
    up at most every REEVENT_AFTER_S: thousands of waiting jobs must not storm the API server."""
    if said is None:
        return True
    if said.message == message:
        return None
    if said.reason != reason or _gist(said.message) != _gist(message):
        return reason != "Waiting" or said.reason != "Waiting"
    if now - said.written_at < REEXPLAIN_AFTER_S:
        return None
    return reason != "Waiting" and now - said.evented_at >= REEVENT_AFTER_S


def _gist(message: str) -> str:
    """A reason without its numbers: what changed for the user, not by how much."""
    return _NUMBER.sub("#", message)


def parent_condition(parent: str | None, problem: str | None) -> list[dict[str, str]]:
    """The Queue condition an admin reads when it names a parent: taken, or ignored and why."""
    if not parent:
        return []
    if problem is None:
        return [{"type": "ParentAccepted", "status": "True", "reason": "InTree",
                 "message": f"part of queue {parent}"}]
    return [{"type": "ParentAccepted", "status": "False", "reason": "InvalidParent",
             "message": f"{problem}; scheduled as a top-level queue until this is fixed"[:1024]}]


def namespace_condition(taken: dict[str, str]) -> list[dict[str, str]]:
    """The Queue condition an admin reads when namespaces it lists belong to an older Queue."""
    if not taken:
        return [{"type": "NamespacesClaimed", "status": "True", "reason": "AllClaimed",
                 "message": "every namespace listed belongs to this queue"}]
    owners = ", ".join(f"{ns} (Queue {owner})" for ns, owner in sorted(taken.items()))
    return [{"type": "NamespacesClaimed", "status": "False", "reason": "ClaimedByAnotherQueue",
             "message": f"not this queue's, an older Queue lists them first: {owners}"[:1024]}]
