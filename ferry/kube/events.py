"""core/v1 Events as the vnode and the scheduler write them: one body, and a name derived from what an
Event says, so that saying it again (or a restarted process, or a new leader, saying it) finds the same
object and counts up on it instead of adding a near-copy, as client-go's recorder does.

Pure: building the object is here; each component writes it with its own client."""

from __future__ import annotations

import hashlib
from typing import Any

from ferry.kube import timestamps

Obj = dict[str, Any]
MESSAGE_LIMIT = 1024  # the apiserver refuses longer Event messages


def event_name(obj: Obj, identity: str) -> str:
    """The name of the Event on ``obj`` that says ``identity``: the object's name (cut to leave room) and a
    digest of its UID with the identity, so another object of the same name gets its own Events."""
    meta = obj["metadata"]
    digest = hashlib.sha256(f"{meta.get('uid')}/{identity}".encode()).hexdigest()[:12]
    return f"{meta['name'][:200]}.{digest}"


def event_body(obj: Obj, etype: str, reason: str, message: str, *, component: str, host: str,
               name: str | None = None, count: int = 1) -> Obj:
    """An Event about ``obj`` from ``component`` on ``host``: named ``name``, or generated from the
    object's name when a repeat need not be found again."""
    meta = obj["metadata"]
    now = timestamps.now()
    naming = {"name": name} if name else {"generateName": f"{meta['name'][:200]}."}
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {**naming, "namespace": meta.get("namespace") or "default"},
        "involvedObject": {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Pod"),
                           "name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid")},
        "type": etype, "reason": reason, "message": message[:MESSAGE_LIMIT],
        "source": {"component": component, "host": host},
        "firstTimestamp": now, "lastTimestamp": now, "count": count,
        "reportingComponent": component, "reportingInstance": host,
    }
