"""Leader election on a coordination.k8s.io Lease: one replica schedules, the others wait warm."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = structlog.get_logger("ferry.leader")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _fmt(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api: client.ApiClient, identity: str, name: str = "kube-ferry-scheduler",
                 namespace: str = "kube-system", lease_s: int = 10, renew_every_s: float = 2.0,
                 on_change: Callable[[bool], None] | None = None, retry_s: float = 0.5) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.identity, self.name, self.namespace = identity, name, namespace
        self.lease_s, self.renew_every_s, self.retry_s = lease_s, renew_every_s, retry_s
        # A leader that has not renewed for this long stops leading, whatever its pending call does: a
        # standby takes an expired Lease after lease_s, and two leaders must never overlap (client-go's
        # renew deadline). An apiserver whose etcd is gone holds requests for a minute, not an error.
        self.renew_deadline_s = lease_s * 0.7
        self._renewed_at = 0.0  # monotonic start of the last renewal that succeeded
        self.is_leader = asyncio.Event()
        self.known = asyncio.Event()  # leadership known (either way) at least once
        self._on_change = on_change

    def _set(self, leader: bool) -> None:
        if leader != self.is_leader.is_set():
            log.info("leadership changed", leader=leader, identity=self.identity)
            if self._on_change:
                self._on_change(leader)
        (self.is_leader.set if leader else self.is_leader.clear)()
        self.known.set()

    async def _try(self) -> bool:
        now = _now()
        body: dict[str, dict[str, Any]] = {"metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_s,
                         "acquireTime": _fmt(now), "renewTime": _fmt(now), "leaseTransitions": 0}}
        try:
            lease = await self.coord.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                await self.coord.create_namespaced_lease(self.namespace, body)
                return True
            except ApiException as exc2:
                if exc2.status == 409:
                    return False
                raise
        spec = lease.spec
        holder = spec.holder_identity
        renew = spec.renew_time
        expired = renew is None or (now - renew).total_seconds() > (spec.lease_duration_seconds or self.lease_s)
        if holder not in (None, "", self.identity) and not expired:
            return False
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        body["metadata"]["resourceVersion"] = lease.metadata.resource_version
        body["spec"]["leaseTransitions"] = transitions
        if holder == self.identity and spec.acquire_time is not None:
            body["spec"]["acquireTime"] = _fmt(spec.acquire_time)
        try:
            await self.coord.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # someone else renewed first
                return False
            raise
        return True

    def _budget(self, started: float) -> float:
        """Seconds this attempt may take: a leader's end at its renew deadline."""
        if self.is_leader.is_set():
            return max(0.0, self._renewed_at + self.renew_deadline_s - started)
        return self.renew_deadline_s

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                async with asyncio.timeout(self._budget(started)):  # not wait_for: see ferry.aio
                    won = await self._try()
                if won:
                    self._renewed_at = started
                self._set(won)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                log.warning("lease not renewed within the renew deadline", deadline_s=self.renew_deadline_s)
                self._set(False)
            except Exception as exc:  # cannot reach the API: we cannot know we still lead
                log.warning("lease renewal failed", error=str(exc)[:200])
                self._set(False)
            # A leader renews at its pace; a standby looks more often, so a released Lease is taken at once.
            await asyncio.sleep(self.renew_every_s if self.is_leader.is_set() else self.retry_s)

    async def release(self) -> None:
        """Give the Lease up on a clean stop (client-go's ReleaseOnCancel): empty holder, 1 s duration."""
        if not self.is_leader.is_set():
            return
        self._set(False)
        for _ in range(3):  # a renewal sent just before the stop may land between our read and write: 409
            try:
                lease = await self.coord.read_namespaced_lease(self.name, self.namespace)
                if lease.spec.holder_identity != self.identity:
                    return
                now = _fmt(_now())
                await self.coord.patch_namespaced_lease(self.name, self.namespace, {
                    "metadata": {"resourceVersion": lease.metadata.resource_version},
                    "spec": {"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": now}},
                    _content_type="application/merge-patch+json")
                log.info("lease released", identity=self.identity)
                return
            except ApiException as exc:
                if exc.status != 409:
                    log.warning("lease not released", status=exc.status, reason=exc.reason)
                    return
        log.warning("lease not released: it kept changing", identity=self.identity)
