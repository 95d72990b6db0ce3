"""The Queue checks the API server cannot make alone: whether a parent exists, whether links form a loop,
whether children are guaranteed more than their parent. Each needs the other Queues, so CRD validation
(one object at a time) cannot; a validating admission webhook can. Pure: AdmissionReview in, verdict out.

A change is refused only for a problem it introduces: a tree that is already wrong (written while the
webhook was down, or by two racing writes each fine alone) can still be repaired step by step, and the
scheduler keeps ignoring the links that cannot stand (condition ``ParentAccepted=False``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferry.kube.informer import Obj
from scheduler.service.snapshot import queue_problems


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _children(queues: Mapping[str, Obj], parent: str) -> list[str]:
    return sorted(n for n, q in queues.items() if (q.get("spec") or {}).get("parent") == parent)


def queue_verdict(request: Mapping[str, Any], queues: Mapping[str, Obj]) -> str | None:
    """Why the Queue change in an AdmissionReview ``request`` must be refused, or None to admit it.
    ``queues`` are the Queues as stored now, by name."""
    operation = request.get("operation")
    if operation == "DELETE":
        name = str(request.get("name") or _name(request["oldObject"]))
        if kids := _children(queues, name):
            return f"queue {name!r} is the parent of {', '.join(kids)}: move or delete those first"
        return None
    if operation not in ("CREATE", "UPDATE"):
        return None
    obj: Obj = request["object"]
    name = _name(obj)
    before = queue_problems(queues)
    after = queue_problems({**queues, name: obj})
    introduced = {q: why for q, why in after.items() if q not in before}
    if not introduced:
        return None
    if name in introduced:
        return introduced[name]
    other = min(introduced)
    return f"this change would break queue {other!r}: {introduced[other]}"


def review_response(review: Mapping[str, Any], queues: Mapping[str, Obj]) -> dict[str, Any]:
    """The AdmissionReview answer (admission.k8s.io/v1) to ``review``."""
    request = review.get("request") or {}
    why = queue_verdict(request, queues)
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": why is None}
    if why is not None:
        response["status"] = {"code": 422, "reason": "Invalid", "message": why}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
