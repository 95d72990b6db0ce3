"""Leader election's safety rule: a leader whose renewals hang steps down before its Lease expires, so a
standby taking the expired Lease never leads beside it (an apiserver without etcd holds calls, it does
not fail them). A stand-in for the coordination API: what is tested is the elector's timing."""

from __future__ import annotations

import asyncio
import datetime as dt
from types import SimpleNamespace
from typing import Any

from scheduler.service.leader import LeaderElector
from tests.helpers import eventually


class HangingLeases:
    """Answers like the API until ``hang`` is set, then never answers."""

    def __init__(self) -> None:
        self.hang = asyncio.Event()
        self.spec: Any = None

    async def _gate(self) -> None:
        if self.hang.is_set():
            await asyncio.Event().wait()

    async def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        await self._gate()
        if self.spec is None:
            from kubernetes_asyncio.client.exceptions import ApiException
            raise ApiException(status=404)
        return SimpleNamespace(spec=self.spec, metadata=SimpleNamespace(resource_version="1"))

    async def create_namespaced_lease(self, namespace: str, body: dict[str, Any]) -> None:
        await self._gate()
        self._store(body)

    async def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        await self._gate()
        self._store(body)

    def _store(self, body: dict[str, Any]) -> None:
        spec = body["spec"]
        renew = dt.datetime.strptime(spec["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
        self.spec = SimpleNamespace(holder_identity=spec["holderIdentity"], renew_time=renew, acquire_time=renew,
                                    lease_duration_seconds=spec["leaseDurationSeconds"],
                                    lease_transitions=spec["leaseTransitions"])


async def test_a_leader_whose_renewals_hang_steps_down_before_its_lease_expires() -> None:
    leases = HangingLeases()
    elector = LeaderElector(SimpleNamespace(), "primary", lease_s=1, renew_every_s=0.1, retry_s=0.05)  # type: ignore[arg-type]
    elector.coord = leases  # type: ignore[assignment]
    task = asyncio.create_task(elector.run())
    try:
        await asyncio.wait_for(elector.is_leader.wait(), 2)
        leases.hang.set()
        last_renewal = leases.spec.renew_time
        expires_in = elector.lease_s - (dt.datetime.now(dt.UTC) - last_renewal).total_seconds()
        # it must stop leading before its Lease expires (a standby may take it then)
        await eventually(lambda: not elector.is_leader.is_set(), timeout=expires_in, interval=0.01,
                         what="the hung leader stepping down before its Lease expires")
        age = (dt.datetime.now(dt.UTC) - last_renewal).total_seconds()
        assert elector.renew_deadline_s - 0.2 <= age < elector.lease_s, age
    finally:
        task.cancel()
