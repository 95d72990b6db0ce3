"""Level-triggered reconciliation of one tenant pod with its compute pod.

Given only the two caches (and a little memory of the last compute object seen), each call drives
the pair one step towards: a tenant pod bound to this node has exactly one compute pod, created
with its dependencies; the compute pod's status shows upstream; deletion flows down and finishes
upstream; a compute pod nothing upstream owns is deleted. The same call is correct after a
restart, so a crashed vnode converges without duplicates, orphans or lost pods.
"""

from __future__ import annotations

import json
import time
from typing import Any

import structlog

from ferry.keys import POD_GROUP_LABEL
from ferry.kube.owners import controller_ref
from ferry.kube.rest import STRATEGIC, Rest, message_of, path, status_of
from ferry.kube.timestamps import now
from ferry.kube.workqueue import WorkQueue
from vnode import metrics, naming, status
from vnode.caches import Caches
from vnode.copies import Copies, MissingDependency
from vnode.events import Recorder
from vnode.gangs import Gangs, InvalidGroup, NotReady
from vnode.podsecurity import PodSecurity
from vnode.translate import (
    FORWARDING_GATE,
    Bridge,
    compute_ephemeral,
    compute_pod,
    gang_of,
    metadata_patch,
    refusal,
)
from vnode.volumes import ClaimNotReady, UnservableClaim, Volumes

Obj = dict[str, Any]
log = structlog.get_logger("ferry.vnode.pods")
PREEMPTED = "the Kube-Ferry scheduler preempted this pod's job in the compute cluster"
SETTLE_S = 3.0  # how long a fresh compute pod may wait for the scheduler before Pending is written upstream
SETTLE_BOUND_S = 10.0  # ... and, once bound to a node, for its containers to start
REPATCH_S = 60.0  # a label patch the compute side undid is sent again after this long, not at once


class PodReconciler:
    def __init__(self, b: Bridge, tenant: Rest, compute: Rest, caches: Caches, recorder: Recorder,
                 host_ip: str, pod_security: PodSecurity, token_refresh_at: float = 0.8,
                 volumes: Volumes | None = None) -> None:
        self.b = b
        self.tenant = tenant
        self.compute = compute
        self.caches = caches
        self.events = recorder
        self.host_ip = host_ip
        self.pod_security = pod_security
        self.copies = Copies(b, tenant, compute, caches, token_refresh_at)
        self.gangs = Gangs(b, tenant, compute, caches, recorder)
        self.volumes = volumes  # claims the pods mount, when the vnode provisions a storage class
        # Retries are capped low: after an outage every failed key must come back within seconds.
        self.queue = WorkQueue("pods", max_delay=2.0)
        self.last_compute: dict[str, Obj] = {}  # tenant key -> last compute pod seen (for preemption)
        self.metadata_sent: dict[str, tuple[str, float]] = {}  # tenant key -> last label patch, when
        self.created = 0  # compute pods this process created (progress log)
        self.status_writes = 0
        # tenant key -> (tenant UID, when) this process created its compute pod, until its first status write
        self.created_at: dict[str, tuple[str, float]] = {}
        # tenant key -> (tenant UID, {ephemeral container: (why, when)}) the vnode refused to add to the copy
        self.refused_debug: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {}

    # ------------------------------------------------------------------ keys
    def compute_key(self, ns: str, name: str) -> str:
        return f"{self.b.namespace}/{naming.compute_name(self.b.tenant, ns, name)}"

    @staticmethod
    def tenant_key_of(compute: Obj) -> str | None:
        meta = compute["metadata"]
        ns = (meta.get("labels") or {}).get(naming.UPSTREAM_NS_LABEL)
        name = (meta.get("annotations") or {}).get(naming.UPSTREAM_NAME_ANNOTATION)
        return f"{ns}/{name}" if ns and name else None

    def on_tenant_pod(self, _kind: str, pod: Obj) -> None:
        if self.b.serves(pod):
            self.queue.add(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")

    def on_compute_pod(self, kind: str, pod: Obj) -> None:
        key = self.tenant_key_of(pod)
        if key is None:
            return
        if kind != "DELETED":
            self.last_compute[key] = _slim(pod)
        self.queue.add(key)

    def enqueue_all(self) -> None:
        """Every pair either side knows about (start-up, after an outage, periodic resync); pods with no
        compute pod yet go first, so a restart forwards what is missing before refreshing statuses."""
        mine = [p for p in list(self.caches.tenant_pods.store.values()) if self.b.serves(p)]
        mine.sort(key=lambda p: self.compute_key(p["metadata"]["namespace"], p["metadata"]["name"])
                  in self.caches.compute_pods.store)
        for pod in mine:
            self.on_tenant_pod("SYNC", pod)
        for pod in list(self.caches.compute_pods.store.values()):
            if (key := self.tenant_key_of(pod)) is not None:
                self.queue.add(key)

    # ------------------------------------------------------------- reconcile
    async def reconcile(self, key: str) -> None:
        start = time.perf_counter()
        try:
            await self._reconcile(key)
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - start)

    async def _reconcile(self, key: str) -> None:
        if not self.caches.synced():
            self.queue.add_after(key, 0.5)
            return
        ns, name = key.split("/", 1)
        tp = self.caches.tenant_pods.store.get(key)
        ckey = self.compute_key(ns, name)
        cp = self.caches.compute_pods.store.get(ckey)
        mine = tp is not None and self.b.serves(tp)
        if cp is not None and cp["metadata"].get("deletionTimestamp") and _held(cp):
            await self._deleted_while_held(tp if mine else None, cp)
            return
        if tp is None or not mine:
            if cp is not None:
                await self._delete_compute(cp, "orphan")
            self.last_compute.pop(key, None)
            self.metadata_sent.pop(key, None)
            self.created_at.pop(key, None)
            self.refused_debug.pop(key, None)
            return
        assert tp is not None
        uid = tp["metadata"]["uid"]
        if cp is not None and cp["metadata"].get("labels", {}).get(naming.UPSTREAM_UID_LABEL) != uid:
            await self._delete_compute(cp, "stale-incarnation")  # same name, earlier tenant pod
            return
        if tp["metadata"].get("deletionTimestamp"):
            await self._deleting(tp, cp)
            return
        if status.terminal(tp):
            if cp is not None and not status.terminal(cp) and not cp["metadata"].get("deletionTimestamp"):
                await self._delete_compute(cp, "tenant-terminal")
            elif cp is None and _preempted(tp) and (owner := controller_ref(tp)) is not None:
                await self._hand_back(tp, owner)
            return
        if cp is None and status.forwarded(tp):
            await self._lost(key, tp)  # never re-created silently
            return
        if cp is None:
            await self._create(key, tp)
            return
        if _gated(cp) and not cp["metadata"].get("deletionTimestamp"):
            await self._release(tp, cp)
            return
        if cp["metadata"].get("deletionTimestamp") and status.is_true(cp.get("status", {}), status.DISRUPTION):
            await self._preempted(tp)
            return
        refresh = await self.copies.ensure(tp)
        if refresh is not None:
            self.queue.add_after(key, max(refresh, 1.0))
        if not status.terminal(cp):
            try:
                await self.gangs.restore(tp)
            except NotReady as exc:
                if not cp.get("spec", {}).get("nodeName"):
                    raise
                # running without a group whose tenant group is not seen: it needs none to run, and gets it
                # back when the tenant group is seen (Vnode._tenant_group_changed)
                await self.events.emit(tp, "Warning", "PodGroupMissing",
                                       f"{exc}: the pod runs on, and its PodGroup's status follows once it exists",
                                       key=str(exc))
        cp = await self._follow_metadata(key, tp, cp)
        cp = await self._add_ephemeral(key, tp, cp)
        await self._mirror(key, tp, cp)
        if (gang := gang_of(tp)) is not None and POD_GROUP_LABEL not in (cp["metadata"].get("labels") or {}):
            await self.gangs.reflect_from_pods(gang)  # a group named after the pod was bridged

    async def _create(self, key: str, tp: Obj) -> None:
        why = refusal(tp, self.pod_security, claims=self.volumes is not None)
        if why is not None:
            await self._refuse(tp, why)
            return
        try:
            if self.volumes is not None:
                await self.volumes.ensure(tp)
            await self.gangs.ensure(tp)
            slice_index = await self.gangs.slice_of(tp)
            refresh = await self.copies.ensure(tp)
        except (InvalidGroup, UnservableClaim) as exc:
            await self._refuse(tp, str(exc))
            return
        except (MissingDependency, ClaimNotReady, NotReady) as exc:
            await self.events.emit(tp, "Warning", "GangNotReady" if isinstance(exc, NotReady) else "FailedMount",
                                   f"waiting before creating the pod: {exc}", key=str(exc))
            raise
        body = compute_pod(tp, self.b, slice_index)
        url = path("", "v1", "pods", self.b.namespace)
        try:
            created = await self.compute.create(url, body)
            metrics.PODS_CREATED.inc()
            self.created += 1
        except Exception as exc:
            if _unfixable(exc):
                await self._refuse(tp, f"the compute cluster rejected its copy: {message_of(exc)}")
                return
            if status_of(exc) != 409:
                raise
            created = await self.compute.get(f"{url}/{body['metadata']['name']}")  # ours from before a restart?
            if created["metadata"].get("labels", {}).get(naming.UPSTREAM_UID_LABEL) != tp["metadata"]["uid"]:
                await self._delete_compute(created, "stale-incarnation")
                raise RuntimeError("a compute pod of an earlier pod with this name is being removed") from exc
        # Remember it now: the watch may deliver it after the next reconcile of this key.
        self.caches.compute_pods.remember(created)
        self.last_compute[key] = _slim(created)
        self.created_at[key] = (tp["metadata"]["uid"], time.monotonic())
        if refresh is not None:
            self.queue.add_after(key, max(refresh, 1.0))
        if _gated(created):  # released on the key's next pass: after a restart, creating the backlog comes first
            self.queue.add(key)

    async def _release(self, tp: Obj, cp: Obj) -> None:
        """Mark the tenant pod Forwarded, then lift the compute pod's hold (gate and finalizer) so it may
        be scheduled. Both memories of 'created here' live in the clusters, not in this process: before
        the mark, a deletion leaves the held copy Terminating until the vnode sees it; after, the mark
        says a vanished copy was lost. Either way the tenant pod fails -- even if the vnode was down --
        and nothing is made twice."""
        meta = tp["metadata"]
        if not status.forwarded(tp):
            updated = await self.tenant.patch(
                path("", "v1", "pods", meta["namespace"], meta["name"], "status"),
                {"metadata": {"uid": meta["uid"]}, "status": {"conditions": [status.forwarded_condition(tp)]}},
                content_type=STRATEGIC)
            self.caches.tenant_pods.remember(updated, replaces=tp)
            self.status_writes += 1
            metrics.STATUS_UPDATES.inc()
        cmeta = cp["metadata"]
        gates = [g for g in cp.get("spec", {}).get("schedulingGates") or [] if g.get("name") != FORWARDING_GATE]
        finalizers = [f for f in cmeta.get("finalizers") or [] if f != FORWARDING_GATE]
        released = await self.compute.patch(path("", "v1", "pods", self.b.namespace, cmeta["name"]),
                                            {"metadata": {"uid": cmeta["uid"], "finalizers": finalizers or None},
                                             "spec": {"schedulingGates": gates or None}})
        self.caches.compute_pods.remember(released, replaces=cp)

    async def _follow_metadata(self, key: str, tp: Obj, cp: Obj) -> Obj:
        """A label or annotation the tenant changes on a live pod reaches its copy, where the compute
        cluster's Services, ``ferry dns`` and the downward API read it (translate.py ``followed``). The
        same patch is sent again only after ``REPATCH_S``: a compute-side webhook that undoes it on every
        update would otherwise make each patch's own watch event the cause of the next."""
        patch = metadata_patch(tp, cp)
        if patch is None or cp["metadata"].get("deletionTimestamp"):
            return cp
        patch["metadata"]["uid"] = cp["metadata"]["uid"]  # this copy, not a later one of the same name
        sent, at = self.metadata_sent.get(key, ("", 0.0))
        body, now_s = json.dumps(patch, sort_keys=True), time.monotonic()
        if body == sent and now_s - at < REPATCH_S:
            return cp
        self.metadata_sent[key] = (body, now_s)
        updated = await self.compute.patch(path("", "v1", "pods", self.b.namespace, cp["metadata"]["name"]), patch)
        self.caches.compute_pods.remember(updated, replaces=cp)
        return updated

    async def _add_ephemeral(self, key: str, tp: Obj, cp: Obj) -> Obj:
        """``kubectl debug``: an ephemeral container added to the tenant pod joins its compute copy, once, if
        the pod-security rules the pod passed allow it; one they refuse is told so where its user looks (an
        Event, and a terminated status that says why). Returns the compute pod as it now is."""
        uid = tp["metadata"]["uid"]
        if self.refused_debug.get(key, (uid,))[0] != uid:
            self.refused_debug.pop(key, None)  # an earlier pod of this name
        refused = self.refused_debug.get(key, (uid, {}))[1]
        have = {c.get("name") for c in cp.get("spec", {}).get("ephemeralContainers") or []}
        new = [c for c in tp.get("spec", {}).get("ephemeralContainers") or []
               if c.get("name") not in have and c.get("name") not in refused]
        if not new or cp["metadata"].get("deletionTimestamp") or status.terminal(cp):
            return cp
        allowed = []
        for c in new:
            why = refusal({"spec": {"ephemeralContainers": [c]}}, self.pod_security)
            if why is None:
                allowed.append(c["name"])
                continue
            refused[c["name"]] = (why, now())
            self.refused_debug[key] = (uid, refused)
            await self.events.emit(tp, "Warning", "Refused", f"Kube-Ferry refused ephemeral container "
                                                             f"{c['name']!r}: {why}")
        if not allowed:
            return cp
        url = path("", "v1", "pods", self.b.namespace, cp["metadata"]["name"], "ephemeralcontainers")
        order = [c["name"] for c in tp["spec"]["ephemeralContainers"] if c["name"] in have or c["name"] in allowed]
        body = {"metadata": {"uid": cp["metadata"]["uid"]},
                "spec": {"$setElementOrder/ephemeralContainers": [{"name": n} for n in order],  # the tenant's
                         "ephemeralContainers": compute_ephemeral(tp, allowed, self.b)}}
        try:
            updated = await self.compute.patch(url, body, content_type=STRATEGIC)
        except Exception as exc:
            if not _unfixable(exc):
                raise
            for name in allowed:
                refused[name] = (f"the compute cluster rejected it: {message_of(exc)}", now())
            self.refused_debug[key] = (uid, refused)
            await self.events.emit(tp, "Warning", "Refused", f"Kube-Ferry refused ephemeral container(s) "
                                                             f"{', '.join(allowed)}: {message_of(exc)}")
            return cp
        self.caches.compute_pods.remember(updated, replaces=cp)
        return updated

    async def _mirror(self, key: str, tp: Obj, cp: Obj) -> None:
        created = self.created_at.get(key)
        if created is not None and cp.get("status", {}).get("phase", "Pending") == "Pending":
            settle = SETTLE_BOUND_S if cp.get("spec", {}).get("nodeName") else SETTLE_S
            wait = created[1] + settle - time.monotonic()
            if wait > 0:  # usually Running within a moment: write once, not Pending then Running
                self.queue.add_after(key, wait)
                return
        self.created_at.pop(key, None)
        new = status.mirrored(cp, tp, self.host_ip, self.refused_debug.get(key, ("", {}))[1])
        if new is None:
            return
        meta = tp["metadata"]
        updated = await self.tenant.patch(path("", "v1", "pods", meta["namespace"], meta["name"], "status"),
                                          {"metadata": {"uid": meta["uid"]}, "status": new})
        self.caches.tenant_pods.remember(updated, replaces=tp)
        metrics.STATUS_UPDATES.inc()
        self.status_writes += 1
        old_conds = status.conditions(tp.get("status", {}))
        if status.is_true(new, status.WILL_EVICT) and not status.is_true({"conditions": list(old_conds.values())},
                                                                          status.WILL_EVICT):
            msg = status.conditions(new).get(status.WILL_EVICT, {}).get("message", "")
            await self.events.emit(tp, "Warning", "WillEvict", msg or "the pod's job will be preempted")

    async def _lost(self, key: str, tp: Obj) -> None:
        """The compute pod of a forwarded pod is gone: confirm on the API, then fail the tenant pod."""
        meta = tp["metadata"]
        cname = naming.compute_name(self.b.tenant, meta["namespace"], meta["name"])
        live = await self.compute.get_or_none(path("", "v1", "pods", self.b.namespace, cname))
        if live is not None:  # the cache lags: nothing is lost
            self.caches.compute_pods.remember(live)
            self.queue.add(key)
            return
        if status.was_preempted(tp, self.last_compute.get(key)):
            await self._preempted(tp)
        else:
            await self._fail(tp, "ComputePodLost", "the pod's copy in the compute cluster was deleted")
        self.last_compute.pop(key, None)
        self.created_at.pop(key, None)

    async def _preempted(self, tp: Obj) -> None:
        """The pod's job was preempted. A pod that a controller owns goes as kube-scheduler's victims go:
        ``DisruptionTarget`` first, then a graceful deletion, and its final ``Failed`` status only while it
        is terminating (``_deleting``), so that no controller mistakes it for a pod that failed on its own.
        Volcano's job controller, for one, fails the whole job when it sees every pod ``Failed`` before
        it sees them deleted, and never applies its ``PodEvicted`` policy. A pod of nobody's is failed at
        once and stays, for its user to resubmit."""
        if controller_ref(tp) is None:
            await self._fail(tp, "Preempted", PREEMPTED, disruption=True)
            return
        meta = tp["metadata"]
        if not status.is_true(tp.get("status", {}), status.DISRUPTION):
            body = {"metadata": {"uid": meta["uid"]}, "status": status.disrupted(tp, PREEMPTED)}
            updated = await self.tenant.patch(path("", "v1", "pods", meta["namespace"], meta["name"], "status"),
                                              body)
            self.caches.tenant_pods.remember(updated, replaces=tp)
            metrics.STATUS_UPDATES.inc()
            self.status_writes += 1
        try:  # the pod's own grace: the vnode finishes it as soon as its compute copy is gone
            await self.tenant.delete(path("", "v1", "pods", meta["namespace"], meta["name"]),
                                     {"preconditions": {"uid": meta["uid"]}})
        except Exception as exc:
            if status_of(exc) not in (404, 409):
                raise

    async def _refuse(self, tp: Obj, why: str) -> None:
        """A pod that cannot run here, told where its user looks (an Event and its status)."""
        metrics.PODS_REFUSED.inc()
        await self.events.emit(tp, "Warning", "Refused", f"Kube-Ferry refused this pod: {why}")
        await self._fail(tp, "Refused", f"Kube-Ferry refused this pod: {why}")

    async def _fail(self, tp: Obj, reason: str, message: str, disruption: bool = False) -> None:
        meta = tp["metadata"]
        body = {"metadata": {"uid": meta["uid"]}, "status": status.failed(tp, reason, message, disruption)}
        updated = await self.tenant.patch(path("", "v1", "pods", meta["namespace"], meta["name"], "status"), body)
        self.caches.tenant_pods.remember(updated, replaces=tp)
        metrics.STATUS_UPDATES.inc()
        self.status_writes += 1
        if reason == "Preempted":
            await self.events.emit(tp, "Warning", "Preempted", message)

    async def _deleted_while_held(self, tp: Obj | None, cp: Obj) -> None:
        """A held copy is being deleted. If the vnode did not ask for it (its tenant pod is alive, the same
        incarnation, not terminal), someone removed the copy after it was created: the tenant pod fails as
        it would for any lost copy. Then the hold goes and the copy with it."""
        if (tp is not None and not tp["metadata"].get("deletionTimestamp") and not status.terminal(tp)
                and cp["metadata"].get("labels", {}).get(naming.UPSTREAM_UID_LABEL) == tp["metadata"]["uid"]):
            await self._fail(tp, "ComputePodLost", "the pod's copy in the compute cluster was deleted")
        await self._drop_hold(cp)

    async def _drop_hold(self, cp: Obj) -> None:
        meta = cp["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != FORWARDING_GATE]
        try:
            await self.compute.patch(path("", "v1", "pods", self.b.namespace, meta["name"]),
                                     {"metadata": {"uid": meta["uid"], "finalizers": finalizers or None}})
        except Exception as exc:
            if status_of(exc) not in (404, 409):
                raise

    async def _deleting(self, tp: Obj, cp: Obj | None) -> None:
        """Tenant deletion: delete the compute pod with the same grace, then finish the tenant pod."""
        meta = tp["metadata"]
        if cp is not None:
            if not cp["metadata"].get("deletionTimestamp"):
                grace = meta.get("deletionGracePeriodSeconds")
                await self._delete_compute(cp, "tenant-deleted", grace)
            return
        if meta.get("deletionGracePeriodSeconds") == 0:
            return  # finished already; others' finalizers (a Job's tracking) keep it a moment
        owner = controller_ref(tp)
        if owner is not None and status.is_true(tp.get("status", {}), status.DISRUPTION):
            if not status.terminal(tp):  # the final status a kubelet writes for a preempted pod
                await self._fail(tp, "Preempted", PREEMPTED, disruption=True)
            await self._hand_back(tp, owner)
            return
        await self._delete_tenant(tp)

    async def _delete_tenant(self, tp: Obj) -> bool:
        """Finish the tenant pod (this incarnation only): nothing of it runs here any more. False when it was
        gone already."""
        meta = tp["metadata"]
        try:
            await self.tenant.delete(path("", "v1", "pods", meta["namespace"], meta["name"]),
                                     {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except Exception as exc:
            if status_of(exc) not in (404, 409):
                raise
            return False
        return True

    async def _hand_back(self, tp: Obj, owner: Obj) -> None:
        """A preempted pod that a controller owns is deleted once it shows ``Preempted`` (its Event stays), as
        kube-scheduler and Volcano delete the pods they preempt: its controller makes the next run. Left
        ``Failed``, some wait for nothing (MPI Operator v2 replaces only missing workers, so the new launcher
        its Job makes waits for a gang that never forms). A pod without a controller keeps the record.
        Reached from ``_deleting`` (the deletion ``_preempted`` began), or for a pod failed ``Preempted``
        before that order (by an earlier vnode).
        ``owner``: the controller's reference, whose object gets an Event, since that is where its user looks
        once the pod is gone (``kubectl describe job``)."""
        if not await self._delete_tenant(tp):
            return
        metrics.PODS_HANDED_BACK.inc()
        meta = tp["metadata"]
        log.info("preempted pod handed back to its controller", pod=f"{meta['namespace']}/{meta['name']}")
        controller = {"apiVersion": owner.get("apiVersion"), "kind": owner.get("kind"),
                      "metadata": {"name": owner.get("name"), "namespace": meta["namespace"], "uid": owner.get("uid")}}
        await self.events.emit(controller, "Warning", "Preempted", "the Kube-Ferry scheduler preempted its pods in the "
                               f"compute cluster; each preempted pod (last: {meta['name']}) was deleted so that this "
                               f"{owner.get('kind')} makes it again", key="Preempted")

    async def _delete_compute(self, cp: Obj, why: str, grace: int | None = None) -> None:
        meta = cp["metadata"]
        body: Obj = {"preconditions": {"uid": meta["uid"]}}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        try:
            await self.compute.delete(path("", "v1", "pods", self.b.namespace, meta["name"]), body)
            metrics.PODS_DELETED.labels(why).inc()
        except Exception as exc:
            if status_of(exc) not in (404, 409):
                raise
        if _held(cp):
            await self._drop_hold(cp)
        log.info("compute pod deleted", pod=meta["name"], why=why)


def _unfixable(exc: Exception) -> bool:
    """The compute API finds a copy invalid, or beyond its namespace's Pod Security level: no retry can
    help, and the tenant's user is told the API's words."""
    return status_of(exc) == 422 or (status_of(exc) == 403 and "PodSecurity" in message_of(exc))


def _preempted(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("reason") == "Preempted"


def _gated(pod: Obj) -> bool:
    return any(g.get("name") == FORWARDING_GATE for g in pod.get("spec", {}).get("schedulingGates") or [])


def _held(pod: Obj) -> bool:
    """Still carries the forwarding finalizer (created, tenant pod not yet marked Forwarded)."""
    return FORWARDING_GATE in (pod["metadata"].get("finalizers") or [])


def _slim(pod: Obj) -> Obj:
    """What preemption detection needs of the last compute pod seen: its conditions."""
    return {"status": {"conditions": pod.get("status", {}).get("conditions") or []}}
