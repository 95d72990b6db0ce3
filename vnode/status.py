"""The tenant pod's status as the compute pod reports it (pure; the reconciler writes it).

A tenant pod is marked ``kubeferry.io/Forwarded`` once its compute pod exists: from then on a
missing compute pod means the pod was lost or preempted (the tenant pod fails with that reason),
never that it should be created again. A terminal tenant phase is final.
"""

from __future__ import annotations

from typing import Any

from ferry.keys import PREFIX, WILL_EVICT_CONDITION
from ferry.kube.timestamps import now, unix

Obj = dict[str, Any]
FORWARDED = PREFIX + "Forwarded"
WILL_EVICT = WILL_EVICT_CONDITION
DISRUPTION = "DisruptionTarget"
TERMINAL = ("Succeeded", "Failed")
MIRRORED_CONDITIONS = {"PodScheduled", "Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers",
                       DISRUPTION, WILL_EVICT}
MIRRORED_FIELDS = ("phase", "podIP", "podIPs", "startTime", "reason", "message", "containerStatuses",
                   "initContainerStatuses", "ephemeralContainerStatuses", "qosClass")


def epoch(stamp: str | None) -> float:
    """An API timestamp in seconds since the epoch (none: the epoch itself, older than anything)."""
    return unix(stamp) if stamp else 0.0


def conditions(status: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in status.get("conditions") or []}


def is_true(status: Obj, ctype: str) -> bool:
    return conditions(status).get(ctype, {}).get("status") == "True"


def terminal(pod: Obj | None) -> bool:
    return bool(pod) and (pod or {}).get("status", {}).get("phase") in TERMINAL


def forwarded(pod: Obj) -> bool:
    return is_true(pod.get("status", {}), FORWARDED)


def forwarded_condition(pod: Obj) -> Obj:
    """The Forwarded mark: written once the compute pod exists, before it may be scheduled."""
    return _forwarded_condition(pod.get("status", {}))


def unschedulable_condition(message: str) -> Obj:
    """What kube-scheduler writes on a pod it found no node for (``PodScheduled=False``, ``Unschedulable``): a
    pod the virtual node does not take says so where tools and ``kubectl describe`` look, not only in an Event."""
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastTransitionTime": now()}


def _forwarded_condition(old: Obj) -> Obj:
    prior = conditions(old).get(FORWARDED)
    if prior and prior.get("status") == "True":
        return prior
    return {"type": FORWARDED, "status": "True", "reason": "ComputePodCreated", "lastTransitionTime": now(),
            "message": "the pod runs in the shared compute cluster"}


def mirrored(compute: Obj, tenant: Obj, host_ip: str, refused: dict[str, tuple[str, str]] | None = None) -> Obj | None:
    """The status to write on the tenant pod, or None when nothing would change (or it is final). ``refused``:
    ephemeral containers the vnode did not add to the copy, by name, with why and when; each is shown
    terminated with that reason, so ``kubectl debug -it`` stops waiting for it."""
    old = tenant.get("status", {})
    if old.get("phase") in TERMINAL:
        return None
    src = compute.get("status", {})
    new: Obj = {k: src[k] for k in MIRRORED_FIELDS if k in src}
    if refused:
        images = {c.get("name"): c.get("image", "") for c in tenant.get("spec", {}).get("ephemeralContainers") or []}
        new["ephemeralContainerStatuses"] = [*new.get("ephemeralContainerStatuses", []), *(
            {"name": name, "image": images.get(name, ""), "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": 126, "reason": "Refused", "message": why, "startedAt": when,
                                      "finishedAt": when}}}
            for name, (why, when) in sorted(refused.items()))]
    new.setdefault("phase", "Pending")
    conds = _gated_ready([c for c in src.get("conditions") or [] if c.get("type") in MIRRORED_CONDITIONS], tenant)
    conds.append(_forwarded_condition(old))
    # what the tenant's own controllers set (a readiness gate's condition, for one) stays
    conds += [c for c in old.get("conditions") or [] if c.get("type") not in MIRRORED_CONDITIONS | {FORWARDED}]
    new["conditions"] = conds
    new["hostIP"] = host_ip
    new["hostIPs"] = [{"ip": host_ip}]
    if all(old.get(k) == v for k, v in new.items()) and all(k in new for k in MIRRORED_FIELDS if k in old):
        return None
    # Fields the compute pod no longer reports are cleared (merge patch: null deletes).
    for k in MIRRORED_FIELDS:
        if k in old and k not in new:
            new[k] = None
    return new


def _gated_ready(conds: list[Obj], tenant: Obj) -> list[Obj]:
    """``Ready`` as a kubelet of the tenant cluster would say it: the compute pod's, but False while one of
    the tenant pod's readiness gates (conditions its own controllers set, e.g. a load balancer's) is not
    True. The compute copy has no gates (nothing there would ever set them)."""
    gates = [g.get("conditionType", "") for g in tenant.get("spec", {}).get("readinessGates") or []]
    have = conditions(tenant.get("status", {}))
    waiting = next((g for g in gates if have.get(g, {}).get("status") != "True"), None)
    if waiting is None:
        return conds
    message = (f'corresponding condition of pod readiness gate "{waiting}" does not exist.' if waiting not in have
               else f'the status of pod readiness gate "{waiting}" is not "True", but {have[waiting].get("status")}')
    out = []
    for c in conds:
        if c.get("type") == "Ready" and c.get("status") == "True":
            prior = have.get("Ready") or {}
            since = prior.get("lastTransitionTime") if prior.get("status") == "False" else None
            c = {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady", "message": message,
                 "lastTransitionTime": since or c.get("lastTransitionTime") or now()}
        out.append(c)
    return out


def failed(tenant: Obj, reason: str, message: str, disruption: bool = False) -> Obj:
    """A final Failed status (the tenant's operator reacts to it; the vnode never re-creates the pod)."""
    old = tenant.get("status", {})
    conds = [c for c in old.get("conditions") or [] if c.get("type") not in ("Ready", "ContainersReady", DISRUPTION)]
    stamp = now()
    conds += [{"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": stamp},
              {"type": "ContainersReady", "status": "False", "reason": "PodFailed", "lastTransitionTime": stamp}]
    if disruption:
        conds.append(_disruption(message, stamp))
    statuses = []
    for cs in old.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "terminated" not in state:
            cs = {**cs, "ready": False, "started": False,
                  "state": {"terminated": {"exitCode": 137, "reason": reason, "message": message,
                                           "startedAt": (state.get("running") or {}).get("startedAt"),
                                           "finishedAt": stamp}}}
        statuses.append(cs)
    out: Obj = {"phase": "Failed", "reason": reason, "message": message, "conditions": conds}
    if statuses:
        out["containerStatuses"] = statuses
    return out


def disrupted(tenant: Obj, message: str) -> Obj:
    """The ``DisruptionTarget`` condition kube-scheduler adds to a victim before it deletes it (the phase
    stays; the final ``Failed`` comes once the pod has terminated)."""
    conds = [c for c in tenant.get("status", {}).get("conditions") or [] if c.get("type") != DISRUPTION]
    conds.append(_disruption(message, now()))
    return {"conditions": conds}


def _disruption(message: str, stamp: str) -> Obj:
    return {"type": DISRUPTION, "status": "True", "reason": "PreemptionByScheduler", "message": message,
            "lastTransitionTime": stamp}


def was_preempted(tenant: Obj, last_compute: Obj | None) -> bool:
    """The scheduler noticed or evicted the pod (its notice or DisruptionTarget was seen on either side)."""
    for status in (tenant.get("status", {}), (last_compute or {}).get("status", {})):
        if is_true(status, WILL_EVICT) or is_true(status, DISRUPTION):
            return True
    return False
