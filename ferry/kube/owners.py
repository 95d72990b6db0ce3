"""Owner references, read the same way by the vnode and the scheduler."""

from __future__ import annotations

from typing import Any


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The owner reference of the object's controller (a Job, a ReplicaSet, an operator's job), if any."""
    return next((o for o in obj["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
