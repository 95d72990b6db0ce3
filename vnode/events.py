"""Events in the tenant cluster: the vnode's own, and compute-side events about a pod mirrored up.

An Event's name is derived from what it reports, so a repeat (or a restarted vnode re-reading the
compute events) bumps ``count`` on the same object instead of creating another one.
"""

from __future__ import annotations

from typing import Any

import structlog

from ferry.kube.events import event_body, event_name
from ferry.kube.rest import Rest, path, status_of
from vnode import metrics

Obj = dict[str, Any]
log = structlog.get_logger("ferry.vnode.events")


class Recorder:
    def __init__(self, tenant: Rest, component: str, host: str) -> None:
        self.rest = tenant
        self.component, self.host = component, host

    async def emit(self, obj: Obj, etype: str, reason: str, message: str, key: str | None = None) -> None:
        """Record one of the vnode's own Events on ``obj``; a repeat (same ``key``, else same reason and
        message) bumps its count (best effort: an event never blocks the work it reports)."""
        name, body = self._event(obj, etype, reason, message, key or reason + message, 1)
        url = path("", "v1", "events", body["metadata"]["namespace"])
        if not await self._create(url, body, reason):
            await self._update(f"{url}/{name}", body, reason, count=None)

    async def mirror(self, obj: Obj, ev: Obj, only_if_absent: bool) -> None:
        """Mirror compute-side Event ``ev`` onto ``obj`` with the compute count and times, so replaying it
        is idempotent and the tenant's latest Event is the compute side's latest. ``only_if_absent``: a
        restarted vnode re-reading the compute events must not rewrite every one it mirrored before
        (three requests each, during its busiest seconds)."""
        reason = ev.get("reason", "")
        name, body = self._event(obj, ev.get("type", "Normal"), reason, ev.get("message", ""), ev["metadata"]["uid"],
                                 int(ev.get("count") or 1))
        last = _seconds(ev.get("lastTimestamp") or ev.get("eventTime"))
        if last:
            body["lastTimestamp"] = last
            body["firstTimestamp"] = _seconds(ev.get("firstTimestamp")) or last
        url = path("", "v1", "events", body["metadata"]["namespace"])
        if not await self._create(url, body, reason) and not only_if_absent:
            await self._update(f"{url}/{name}", body, reason, count=body["count"])

    async def _update(self, url: str, body: Obj, reason: str, count: int | None) -> None:
        """An existing Event gets ``count`` (None: one more than it had), the new time and message."""
        try:
            if count is None:
                count = int((await self.rest.get(url)).get("count") or 1) + 1
            await self.rest.patch(url, {"count": count, "lastTimestamp": body["lastTimestamp"],
                                        "message": body["message"]})
        except Exception as exc:
            log.warning("event not updated", reason=reason, error=str(exc)[:200])
            metrics.EVENTS_DROPPED.labels(reason).inc()

    def _event(self, obj: Obj, etype: str, reason: str, message: str, identity: str, count: int) -> tuple[str, Obj]:
        name = event_name(obj, identity)
        return name, event_body(obj, etype, reason, message, component=self.component, host=self.host,
                                name=name, count=count)

    async def _create(self, url: str, body: Obj, reason: str) -> bool:
        """Create the Event. False only if it exists already (the caller may update it); a failure that
        another attempt would not fix is logged and counts as done (True)."""
        try:
            await self.rest.create(url, body)
            return True
        except Exception as exc:
            if status_of(exc) != 409:
                if "because it is being terminated" in str(getattr(exc, "body", "")):  # its namespace is going
                    log.debug("event not recorded: namespace terminating", reason=reason)
                else:
                    log.warning("event not recorded", reason=reason, error=str(exc)[:200])
                metrics.EVENTS_DROPPED.labels(reason).inc()
                return True  # nothing more to try
            return False


def involved_key(ev: Obj) -> str:
    """The compute object an Event is about, as the events queue's key: one object's Events are
    mirrored by one worker at a time, in their compute order."""
    inv = ev.get("involvedObject") or {}
    return f"{inv.get('kind', '')}/{inv.get('namespace') or ev['metadata'].get('namespace', '')}/{inv.get('name', '')}"


def compute_order(ev: Obj) -> tuple[str, int]:
    """When the compute side last said it, then its write order (one etcd: resourceVersions of one
    namespace's Events grow), so the tenant's latest Event is the compute side's latest."""
    return (ev.get("lastTimestamp") or ev.get("eventTime") or "", int(ev["metadata"].get("resourceVersion") or 0))


def _seconds(stamp: str | None) -> str:
    """An API time (a MicroTime too) as an Event's ``lastTimestamp`` takes it: whole seconds, UTC."""
    return f"{stamp[:19]}Z" if stamp and len(stamp) >= 19 else ""


class Backlog:
    """Compute Events waiting to be mirrored, bounded, grouped by the object they are about. The
    compute apiserver keeps Events for its ``--event-ttl`` (an hour by default), so caching them all
    grows the vnode with every pod it ever ran; each is needed only until it is mirrored. Past ``limit``
    the oldest waiting one is dropped and counted (a burst of events must not grow the vnode without
    bound either)."""

    def __init__(self, limit: int = 5000) -> None:
        self.limit = limit
        self._waiting: dict[str, tuple[str, Obj, bool, float]] = {}  # event key -> (object key, event, replayed, since)
        self._of: dict[str, set[str]] = {}  # object key -> its waiting event keys

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, key: str, event: Obj, replayed: bool, since: float) -> str:
        """Keep ``event`` (``key``: its namespace/name) until its object's turn; returns the object's key.
        ``replayed``: read by a (re)list, so possibly mirrored by an earlier run; a watched change
        overrides that. ``since``: when it first waited (a put back keeps its first time)."""
        old = self._waiting.get(key)
        self.discard(key)  # the newest version goes to the back
        obj = involved_key(event)
        self._waiting[key] = (obj, event, replayed, old[3] if old else since)
        self._of.setdefault(obj, set()).add(key)
        while len(self._waiting) > self.limit:
            self.discard(next(iter(self._waiting)))
            metrics.EVENT_BACKLOG_DROPPED.inc()
        return obj

    def put_back(self, key: str, event: Obj, replayed: bool, since: float) -> None:
        """Return a taken Event to wait longer, unless a newer version of it arrived meanwhile."""
        if key not in self._waiting:
            self.put(key, event, replayed, since)

    def discard(self, key: str) -> None:
        found = self._waiting.pop(key, None)
        if found is not None:
            keys = self._of[found[0]]
            keys.discard(key)
            if not keys:
                del self._of[found[0]]

    def take(self, obj: str) -> list[tuple[str, Obj, bool, float]]:
        """Every Event waiting for object ``obj``, oldest first in compute order: (key, event, replayed, since)."""
        out = []
        for key in self._of.pop(obj, set()):
            _, ev, replayed, since = self._waiting.pop(key)
            out.append((key, ev, replayed, since))
        return sorted(out, key=lambda w: compute_order(w[1]))
