"""Gangs across the boundary: a tenant operator's PodGroup (Volcano, scheduler-plugins) or Kueue pod
group becomes one Kube-Ferry PodGroup in the compute cluster, and its phase flows back.

Playing the tenant's gang scheduler also means admitting its PodGroups (Volcano's ``Inqueue``):
Training-Operator creates no pods before that.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any, Literal, cast

import structlog

from ferry.keys import DEPENDS_ON_ANNOTATION, POD_GROUP_LABEL, TIER_ANNOTATION
from ferry.kube import quantity
from ferry.kube.rest import Rest, message_of, path, status_of
from vnode import naming, status
from vnode.caches import FERRY_PG, PLUGINS_PG, VOLCANO_PG, Caches
from vnode.events import Recorder
from vnode.translate import (
    KUEUE_PODSET,
    Bridge,
    GangRef,
    carried_level,
    gang_of,
    kept_together,
    pod_rank,
    sliced,
)

Obj = dict[str, Any]
# compute phase -> tenant phase, per convention. Volcano's v1beta1 PodGroup has one terminal phase,
# Completed (its counts say how members ended); scheduler-plugins has Finished and Failed.
VOLCANO_PHASE = {"Pending": "Inqueue", "Privileged": "Inqueue", "Running": "Running", "WillEvict": "Running",
                 "Succeeded": "Completed", "Failed": "Completed", "Evicted": "Unknown"}
PLUGINS_PHASE = {"Pending": "Scheduling", "Privileged": "Scheduling", "Running": "Running",
                 "WillEvict": "Running", "Succeeded": "Finished", "Failed": "Failed", "Evicted": "Failed"}
ADMITTED = {"volcano": "Inqueue", "scheduler-plugins": "Scheduling"}
KUEUE_WORKLOAD_VERSIONS = ("v1beta2", "v1beta1")  # v1beta2 from Kueue v0.15; v1beta1 before
WORKLOADS_KEPT = 256  # Workloads read for their podsets (which Kueue never changes), the latest kept
log = structlog.get_logger("ferry.vnode.gangs")


class NotReady(Exception):
    """The gang's tenant PodGroup is not there yet."""


class InvalidGroup(ValueError):
    """The gang's tenant PodGroup asks for something no retry can give: its pods are refused."""


GroupKind = Literal["volcano", "scheduler-plugins"]  # the conventions whose gangs have a tenant object
MAX_MEMBERS = 100_000  # the compute PodGroup's own limit
MAX_DEPENDENCIES = 32  # the compute PodGroup's dependsOn limit
# The compute PodGroup's fields its tenant declares (and may change); queue and priority are the bridge's.
DECLARED = ("minMember", "tier", "minResources", "minTaskMember", "dependsOn")


def min_task_member(group: str, value: Any) -> dict[str, int]:
    """The tenant group's per-role minimums as the compute PodGroup takes them, or why they cannot be."""
    if not isinstance(value, dict):
        raise InvalidGroup(f"PodGroup {group}: minTaskMember must map task names to counts")
    out: dict[str, int] = {}
    for k, v in value.items():
        try:
            out[str(k).lower()] = n = int(v)
        except (TypeError, ValueError):
            n = -1
        if not 0 <= n <= MAX_MEMBERS:
            raise InvalidGroup(f"PodGroup {group}: minTaskMember[{k}] = {v!r} is not a count from 0 to {MAX_MEMBERS}")
    return out


def min_resources(group: str, value: Any) -> dict[str, str]:
    """The tenant group's minimum resources, each checked to be a quantity the scheduler can read."""
    if not isinstance(value, dict):
        raise InvalidGroup(f"PodGroup {group}: minResources must map resource names to quantities")
    out: dict[str, str] = {}
    for k, v in value.items():
        try:
            quantity.parse(v)
        except (TypeError, ValueError, ArithmeticError):
            raise InvalidGroup(f"PodGroup {group}: minResources[{k}] = {v!r} is not a quantity") from None
        out[str(k)] = str(v)
    return out


_DEP = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)(:(Running|Succeeded))?$")


def depends_on(group: str, value: str | None) -> list[tuple[str, str]]:
    """The annotation's ``name[:Running|Succeeded]`` list as (tenant PodGroup name, phase)."""
    out: list[tuple[str, str]] = []
    for item in (value or "").split(","):
        if not (item := item.strip()):
            continue
        m = _DEP.match(item)
        if m is None:
            raise InvalidGroup(f"PodGroup {group}: {DEPENDS_ON_ANNOTATION} item {item!r} is not "
                               "<PodGroup name>[:Running|:Succeeded]")
        out.append((m.group(1), m.group(4) or "Succeeded"))
    if len(out) > MAX_DEPENDENCIES:
        raise InvalidGroup(f"PodGroup {group}: {DEPENDS_ON_ANNOTATION} names {len(out)} PodGroups, at most "
                           f"{MAX_DEPENDENCIES}")
    return out


def compute_group_name(b: Bridge, gang: GangRef) -> str:
    return naming.compute_name(b.tenant, gang.namespace, f"{gang.kind}.{gang.name}")


def incarnation(compute_group: Obj) -> str:
    """The UID of the tenant group a compute PodGroup was made for ("" for Kueue groups: no object)."""
    return str((compute_group["metadata"].get("labels") or {}).get(naming.UPSTREAM_UID_LABEL, ""))


def _gvr(kind: str) -> tuple[str, str, str]:
    return VOLCANO_PG if kind == "volcano" else PLUGINS_PG


def api_version(kind: str) -> str:
    return "/".join(_gvr(kind)[:2])


def as_object(kind: str, group: Obj) -> Obj:
    """A tenant PodGroup from the cache (which drops apiVersion and kind) as an Event can name it."""
    return {**group, "apiVersion": api_version(kind), "kind": "PodGroup"}


def members_status(phases: list[str | None]) -> Obj:
    """A gang's phase (in the compute PodGroup's terms) and counts, told by its members' phases: Running
    while one runs, Succeeded or Failed once all have ended, else Pending."""
    counts = {k: phases.count(phase) for k, phase in (("running", "Running"), ("succeeded", "Succeeded"),
                                                      ("failed", "Failed"))}
    ended = bool(phases) and counts["succeeded"] + counts["failed"] == len(phases)
    phase = "Running" if counts["running"] else ("Failed" if counts["failed"] else "Succeeded") if ended \
        else "Pending"
    return {"phase": phase, **counts}


def kept_members(workload: Obj) -> int:
    """How many pods make the gang of a Kueue Workload kept in one domain (``kept_together``): those of its
    podsets that require or prefer a level the compute cluster holds them to, as many as Kueue admitted of
    each (before: the spec's). One gang whatever each podset's level, as the Workload was admitted whole;
    each podset keeps to its own level."""
    admitted = _admitted(workload)
    return sum(int(admitted.get(str(podset.get("name"))) or podset.get("count") or 0)
               for podset in (workload.get("spec") or {}).get("podSets") or []
               if _carried(podset.get("topologyRequest") or {}))


def podset_of(workload: Obj, name: str) -> tuple[Obj, int] | None:
    """A Workload's podset ``name`` and how many pods Kueue admitted of it (before admission: the spec's)."""
    admitted = _admitted(workload)
    for podset in (workload.get("spec") or {}).get("podSets") or []:
        if str(podset.get("name")) == name:
            return podset, int(admitted.get(name) or podset.get("count") or 0)
    return None


def _admitted(workload: Obj) -> dict[str, Any]:
    """How many pods of each podset Kueue admitted (none before admission)."""
    return {str(a.get("name")): a.get("count") for a in
            ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []}


def _carried(request: Obj) -> bool:
    """Whether a podset's topology request keeps it, or each of its slices, to a level the compute cluster holds."""
    return bool(carried_level(_level_of(request))
                or carried_level(str(request.get("podSetSliceRequiredTopology") or "")))


def _level_of(request: Obj) -> str:
    """A podset's level as Kueue read it from its annotations: required, else preferred (never both)."""
    return str(request.get("required") or request.get("preferred") or "")


class Gangs:
    def __init__(self, b: Bridge, tenant: Rest, compute: Rest, caches: Caches, recorder: Recorder) -> None:
        self.b = b
        self.tenant = tenant
        self.compute = compute
        self.caches = caches
        self.recorder = recorder
        self._workloads: dict[str, Obj] = {}  # namespace/name -> Workload, oldest read first

    def tenant_group(self, gang: GangRef) -> Obj | None:
        inf = self.caches.tenant_groups.get(gang.kind)
        return None if inf is None else inf.store.get(f"{gang.namespace}/{gang.name}")

    def compute_spec(self, gang: GangRef, pod: Obj) -> Obj:
        """Queue and priority from the bridge; the rest as the tenant declared it."""
        group = self.tenant_group(gang)
        if gang.kind in ("kueue", "kueue-workload"):
            if gang.total is None:
                raise NotReady(f"Kueue pod group {gang.name} has no kueue.x-k8s.io/pod-group-total-count")
            declared = self.declared(gang, pod, gang.total)
        elif group is None:
            raise NotReady(f"{gang.kind} PodGroup {gang.name} does not exist")
        else:
            declared = self.declared(gang, group)
        priority = min(int(pod.get("spec", {}).get("priority") or 0), self.b.max_priority)
        return {"queue": self.b.queue, "priority": priority, **declared}

    def declared(self, gang: GangRef, holder: Obj, size: int | None = None) -> Obj:
        """What a tenant declares of its gang (the ``DECLARED`` fields) on its PodGroup ``holder``, or, for
        a Kueue group of ``size`` pods, on a member pod. Raises InvalidGroup for what no retry can serve."""
        spec = holder.get("spec", {}) if size is None else {}
        if size is None:
            try:
                size = int(spec.get("minMember") or 1)
            except (TypeError, ValueError):
                size = -1
            if not 1 <= size <= MAX_MEMBERS:
                raise InvalidGroup(f"PodGroup {gang.name}: minMember {spec.get('minMember')!r} is not a count "
                                   f"from 1 to {MAX_MEMBERS}")
        annotations = holder["metadata"].get("annotations") or {}
        out: Obj = {"minMember": size,
                    "tier": "Elastic" if annotations.get(TIER_ANNOTATION) == "Elastic" else "Guaranteed"}
        if spec.get("minResources"):
            out["minResources"] = min_resources(gang.name, spec["minResources"])
        if spec.get("minTaskMember"):
            out["minTaskMember"] = min_task_member(gang.name, spec["minTaskMember"])
        deps = depends_on(gang.name, annotations.get(DEPENDS_ON_ANNOTATION))
        if deps:  # the compute names of the same namespace's PodGroups of the same kind
            out["dependsOn"] = [{"name": compute_group_name(self.b, GangRef(gang.kind, gang.namespace, name)),
                                 "phase": phase} for name, phase in deps]
        return out

    async def follow(self, kind: str, group: Obj) -> None:
        """A tenant PodGroup changed after its compute PodGroup was made (KubeRay resizes its gang with its
        worker groups; a user corrects a minimum): the compute PodGroup takes what it declares now. What no
        retry can serve is told on the tenant group, and the gang keeps what it had."""
        meta = group["metadata"]
        gang = GangRef(cast(GroupKind, kind), meta["namespace"], meta["name"])  # kind: a key of tenant_groups
        name = compute_group_name(self.b, gang)
        have = self.caches.compute_groups.store.get(f"{self.b.namespace}/{name}")
        if have is None:
            return  # not made yet: it will be made from the group as it is then
        if incarnation(have) not in ("", meta.get("uid")):
            # An earlier incarnation's, which members of this one may have joined while the vnode still saw the
            # old tenant group: deleted, its waiting members make this one's (PodReconciler -> restore).
            await self._delete_stale(have)
            return
        try:
            want = self.declared(gang, group)
        except InvalidGroup as exc:
            await self.recorder.emit(as_object(kind, group), "Warning", "InvalidPodGroup",
                                     f"{exc}; the running gang keeps what it was given", key=str(exc))
            return
        spec = have.get("spec") or {}
        change = {k: want.get(k) for k in DECLARED if spec.get(k) != want.get(k)}  # None removes a field
        if not change:
            return
        try:
            patched = await self.compute.patch(path(*FERRY_PG[:2], "podgroups", self.b.namespace, name),
                                               {"metadata": {"uid": have["metadata"]["uid"]}, "spec": change})
        except Exception as exc:
            if status_of(exc) in (404, 409):
                return  # gone or made again (the UID differs): made from the group as it is then
            if status_of(exc) != 422:
                raise
            await self.recorder.emit(as_object(kind, group), "Warning", "InvalidPodGroup",
                                     f"the compute cluster refused the change of PodGroup {gang.name}: "
                                     f"{message_of(exc)}", key=message_of(exc))
            return
        self.caches.compute_groups.remember(patched)
        log.info("compute PodGroup follows its tenant group", group=gang.name, namespace=gang.namespace,
                 changed=sorted(change))

    async def workload_members(self, gang: GangRef, pod: Obj) -> int:
        """The size of a Kueue Workload's gang (``kept_members``), read from the Workload."""
        workload = await self._workload(gang)
        if (total := kept_members(workload)) < 1:
            raise NotReady(f"Kueue Workload {gang.name} has no podset kept in one {kept_together(pod) or sliced(pod)}")
        return total

    async def slice_of(self, pod: Obj) -> int | None:
        """The slice of its podset a pod of a sliced podset (``sliced``) belongs to: its rank (``pod_rank``, read
        as the Workload says) over the slice size. A pod without a rank is told why its slice is not kept, and
        runs with its gang as if its podset were not sliced."""
        cut, gang = sliced(pod), gang_of(pod)
        if cut is None or gang is None or gang.kind != "kueue-workload":
            return None
        key = f"{gang.namespace}/{gang.name}"
        workload = self._workloads.get(key) or await self._workload(gang)
        podset = str((pod["metadata"].get("labels") or {}).get(KUEUE_PODSET) or "")
        found = podset_of(workload, podset)
        rank = None if found is None else pod_rank(pod, found[0].get("topologyRequest") or {}, found[1])
        if rank is None:
            await self.recorder.emit(pod, "Warning", "KueueSliceNotKept",
                                     f"podset {podset!r} of Kueue Workload {gang.name} is cut into slices of "
                                     f"{cut.size} in one {cut.key}, but this pod's rank in it cannot be read (the "
                                     "label the Workload names): it runs with its gang, its slice not kept together",
                                     key="KueueSliceNotKept")
            return None
        return rank // cut.size

    async def _workload(self, gang: GangRef) -> Obj:
        """A Kueue Workload as it is now (kept for ``slice_of``: its podsets never change)."""
        for version in KUEUE_WORKLOAD_VERSIONS:
            try:
                workload = await self.tenant.get(path("kueue.x-k8s.io", version, "workloads", gang.namespace,
                                                      gang.name))
                break
            except Exception as exc:
                if status_of(exc) == 403:  # a ClusterRole older than the vnode: said on the pod, retried
                    raise NotReady(f"the vnode may not read Kueue Workload {gang.name}, which sizes its gang: "
                                   "grant its tenant ClusterRole get on workloads.kueue.x-k8s.io") from exc
                if status_of(exc) != 404:
                    raise
        else:
            raise NotReady(f"Kueue Workload {gang.name} does not exist")
        key = f"{gang.namespace}/{gang.name}"
        self._workloads.pop(key, None)
        self._workloads[key] = workload
        while len(self._workloads) > WORKLOADS_KEPT:
            del self._workloads[next(iter(self._workloads))]
        return workload

    async def ensure(self, pod: Obj) -> None:
        """Create the compute PodGroup of ``pod``'s gang before the pod (the scheduler waits for it).

        The compute group records the tenant group's UID: a tenant group deleted and created again
        under the same name is a new gang, and the earlier incarnation's compute group (its status,
        conditions and counts) is deleted, never adopted. So a pod whose tenant group the vnode has not
        seen yet waits (NotReady, retried): the compute group of that name may be an earlier one's."""
        gang = gang_of(pod)
        if gang is None:
            return
        name = compute_group_name(self.b, gang)
        url = path(*FERRY_PG[:2], "podgroups", self.b.namespace)
        group = self.tenant_group(gang)
        if group is None and gang.kind in ADMITTED:
            raise NotReady(f"{gang.kind} PodGroup {gang.name} does not exist")
        uid = str((group or {}).get("metadata", {}).get("uid", ""))
        have = self.caches.compute_groups.store.get(f"{self.b.namespace}/{name}")
        if have is not None:
            if not uid or incarnation(have) in ("", uid):  # "": made before groups recorded it
                return
            await self._delete_stale(have)
        if gang.kind == "kueue-workload":
            gang = replace(gang, total=await self.workload_members(gang, pod))
        body: Obj = {
            "apiVersion": "scheduling.kubeferry.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": self.b.namespace,
                         "labels": {**naming.owner_labels(self.b.tenant, self.b.node, gang.namespace, uid or None),
                                    naming.KIND_LABEL: gang.kind},
                         "annotations": {naming.UPSTREAM_NAME_ANNOTATION: gang.name}},
            "spec": self.compute_spec(gang, pod),
        }
        try:
            created = await self.compute.create(url, body)
            self.caches.compute_groups.remember(created)
        except Exception as exc:
            if status_of(exc) == 422:
                raise InvalidGroup(f"the compute cluster rejected PodGroup {gang.name}: {message_of(exc)}") from exc
            if status_of(exc) != 409:
                raise
            live = await self.compute.get(f"{url}/{name}")
            if uid and incarnation(live) != uid:  # an earlier incarnation the cache had not shown yet
                await self._delete_stale(live)
                raise NotReady(f"the compute PodGroup of an earlier {gang.kind} PodGroup {gang.name} "
                               "is being replaced") from exc
        else:
            if (now := self.tenant_group(gang)) is not None and now is not group:
                await self.follow(gang.kind, now)  # changed while it was being made: its change was not applied

    async def _delete_stale(self, group: Obj) -> None:
        meta = group["metadata"]
        try:
            await self.compute.delete(path(*FERRY_PG[:2], "podgroups", self.b.namespace, meta["name"]),
                                      {"preconditions": {"uid": meta["uid"]}})
        except Exception as exc:
            if status_of(exc) not in (404, 409):
                raise
        if self.caches.compute_groups.store.get(f"{self.b.namespace}/{meta['name']}") is group:
            del self.caches.compute_groups.store[f"{self.b.namespace}/{meta['name']}"]
        log.info("compute PodGroup of an earlier incarnation deleted", podgroup=meta["name"])

    async def admit(self, kind: str, group: Obj) -> None:
        """Set a fresh tenant PodGroup's phase as its own scheduler would on admission."""
        if kind not in ADMITTED or (group.get("status") or {}).get("phase") not in (None, "", "Pending"):
            return
        await self._write_status(kind, group, {"phase": ADMITTED[kind]})

    def tenant_group_of(self, compute_group: Obj) -> tuple[str, Obj] | None:
        """The tenant PodGroup (and its convention) this compute PodGroup stands for, if it is the same
        incarnation."""
        meta = compute_group["metadata"]
        kind = (meta.get("labels") or {}).get(naming.KIND_LABEL, "")
        ns = (meta.get("labels") or {}).get(naming.UPSTREAM_NS_LABEL)
        name = (meta.get("annotations") or {}).get(naming.UPSTREAM_NAME_ANNOTATION)
        if kind not in ADMITTED or not ns or not name:
            return None
        group = self.tenant_group(GangRef(kind, ns, name))
        if group is None or incarnation(compute_group) not in ("", group["metadata"].get("uid")):
            return None  # an earlier incarnation's status never reaches the new group
        return kind, group

    async def reflect(self, compute_group: Obj) -> None:
        """Copy a compute PodGroup's phase and counts to the tenant PodGroup it stands for."""
        found = self.tenant_group_of(compute_group)
        if found is None:
            return
        kind, group = found
        await self._reflect_status(kind, group, compute_group.get("status") or {})

    async def reflect_from_pods(self, gang: GangRef) -> None:
        """A tenant PodGroup named by pods that were bridged before they named it (Volcano's PodGroup
        controller gives a plain pod of its scheduler a group only after the pod is bound): no compute
        PodGroup stands for it, so its phase and counts come from those pods, as they would from a gang."""
        group = self.tenant_group(gang) if gang.kind in ADMITTED else None
        if group is None:
            return
        phases = [p.get("status", {}).get("phase") for p in list(self.caches.tenant_pods.store.values())
                  if p["metadata"]["namespace"] == gang.namespace and gang_of(p) == gang]
        await self._reflect_status(gang.kind, group, members_status(phases))

    async def _reflect_status(self, kind: str, group: Obj, cstat: Obj) -> None:
        """The tenant group's status for a compute group's (or its pods') phase and counts, if it changed."""
        table = VOLCANO_PHASE if kind == "volcano" else PLUGINS_PHASE
        want: Obj = {"phase": table.get(cstat.get("phase", "Pending"), ADMITTED[kind])}
        for k in ("running", "succeeded", "failed"):
            if k in cstat:
                want[k] = cstat[k]
        have = group.get("status") or {}
        if all(have.get(k) == v for k, v in want.items()):
            return
        await self._write_status(kind, group, want)

    async def _write_status(self, kind: str, group: Obj, fields: Obj) -> None:
        meta = group["metadata"]
        url = path(*_gvr(kind), meta["namespace"], meta["name"])
        try:
            await self.tenant.patch(url + "/status", {"status": fields})
        except Exception as exc:
            if status_of(exc) != 404:
                raise
            await self.tenant.patch(url, {"status": fields})  # a CRD without the status subresource

    def stale_groups(self, min_age_s: float) -> list[Obj]:
        """Compute PodGroups none of whose owned pods remain, older than ``min_age_s`` (a group is made
        before its pods: a sweep between the two, or while a compute outage holds the pods back, must
        not take it)."""
        used = {p["metadata"].get("labels", {}).get(POD_GROUP_LABEL) for p in self.caches.compute_pods.store.values()}
        born_before = time.time() - min_age_s
        return [g for g in self.caches.compute_groups.store.values() if g["metadata"]["name"] not in used
                and status.epoch(g["metadata"].get("creationTimestamp")) <= born_before]

    async def restore(self, pod: Obj) -> None:
        """A member whose compute PodGroup is gone gets it back: one still waiting (its group deleted by hand,
        or collected by an older vnode before its pods arrived) would be held by the scheduler forever, and
        one already running (it joined an earlier incarnation's group, deleted since) would mirror no phase
        to its tenant group."""
        gang = gang_of(pod)
        if gang is not None and f"{self.b.namespace}/{compute_group_name(self.b, gang)}" not in \
                self.caches.compute_groups.store:
            log.info("compute PodGroup missing: created again", group=gang.name, namespace=gang.namespace)
            await self.ensure(pod)
