"""Events in the tenant cluster: the vnode's own, and compute-side events about a pod mirrored up.

An Event's name is derived from what it reports, so a repeat (or a restarted vnode re-reading the
compute events) bumps ``count`` on the same object instead of creating another one.
"""

from __future__ import annotations

import hashlib
from typing import Any

import structlog

from ferry.kube.rest import Rest, path, status_of
from vnode.status import now

Obj = dict[str, Any]
log = structlog.get_logger("ferry.vnode.events")


class Recorder:
    def __init__(self, tenant: Rest, component: str, host: str) -> None:
        self.rest = tenant
        self.source = {"component": component, "host": host}

    async def emit(self, obj: Obj, etype: str, reason: str, message: str, key: str | None = None,
                   count: int = 1) -> None:
        """Record an Event on ``obj`` (best effort: an event never blocks the work it reports)."""
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        digest = hashlib.sha256(f"{meta.get('uid')}/{key or reason + message}".encode()).hexdigest()[:12]
        name = f"{meta['name'][:200]}.{digest}"
        stamp = now()
        body: Obj = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Pod"),
                               "name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": etype, "reason": reason, "message": message[:1024], "source": self.source,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": count,
            "reportingComponent": self.source["component"], "reportingInstance": self.source["host"],
        }
        url = path("", "v1", "events", ns)
        try:
            await self.rest.create(url, body)
        except Exception as exc:
            if status_of(exc) != 409:
                log.warning("event not recorded", reason=reason, error=str(exc)[:200])
                return
            try:
                old = await self.rest.get(f"{url}/{name}")
                await self.rest.patch(f"{url}/{name}", {"count": max(count, int(old.get("count") or 1) + 1),
                                                        "lastTimestamp": stamp, "message": message[:1024]})
            except Exception as exc2:
                log.warning("event not updated", reason=reason, error=str(exc2)[:200])
