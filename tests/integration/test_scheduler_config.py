"""The scheduler's configuration file on the real control planes: applied while running, a bad one
refused with an Event where the admin looks and the previous configuration kept, a bad one at start an
exit with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from tests.helpers import eventually, swapped
from tests.integration.test_scheduler_service import _sa, pod


def _log_lines(comp: Component, event: str) -> list[dict[str, Any]]:
    out = []
    for line in comp.spec.log.read_text().splitlines():
        if f'"{event}"' in line:
            out.append(json.loads(line))
    return out


async def test_a_changed_file_applies_and_a_bad_one_is_refused_with_an_event(
        planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
        private_node: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    conf = tmp_path / "config.yaml"
    conf.write_text("minRuntimeSeconds: 0\nvictimCooldownSeconds: 60\n")
    schedulers = [c for n, c in planes.components.items() if n.startswith("kube-ferry-scheduler") and c.alive()]
    scheduler = swapped(ferry_scheduler, "kube-ferry-scheduler-config",
                        [f"--config={conf}", f"--config-object={compute_ns}/scheduler-config", "--identity=config"])
    for c in schedulers:
        c.stop()
    try:
        scheduler.start()
        scheduler.wait_ready()

        async def bound(name: str) -> bool:
            return bool((await core.read_namespaced_pod(name, compute_ns)).spec.node_name)

        await core.create_namespaced_pod(compute_ns, pod("before", compute_ns))
        await eventually(lambda: bound("before"), timeout=30, what="a pod bound under the file's configuration")

        conf.write_text("minRuntimeSeconds: -5\nvictimCooldown: 3\n")

        async def refused() -> Any:
            events = (await core.list_namespaced_event(
                compute_ns, field_selector="involvedObject.name=scheduler-config")).items
            return next((e for e in events if e.reason == "InvalidConfiguration"), None)

        event = await eventually(refused, timeout=30, what="an InvalidConfiguration Event on the ConfigMap")
        assert event.type == "Warning" and event.involved_object.kind == "ConfigMap"
        assert "minRuntimeSeconds" in event.message and "victimCooldown: Extra inputs" in event.message
        assert "keeping the previous configuration" in event.message
        assert _log_lines(scheduler, "configuration refused")
        await core.create_namespaced_pod(compute_ns, pod("during", compute_ns))
        await eventually(lambda: bound("during"), timeout=30, what="scheduling goes on with the previous settings")

        conf.write_text("minRuntimeSeconds: 0\nvictimCooldownSeconds: 5\nperiodSeconds: 0.3\n")
        applied = await eventually(lambda: _log_lines(scheduler, "configuration applied"), timeout=30,
                                   what="the changed file applied")
        assert applied[-1]["victim_cooldown_s"] == 5 and applied[-1]["period_s"] == 0.3
        assert scheduler.alive()
    finally:
        scheduler.stop()
        for c in schedulers:
            c.start()
        for c in schedulers:
            c.wait_ready()


def test_a_bad_file_at_start_is_an_exit_with_the_reason(planes: ControlPlanes, tmp_path: Path) -> None:
    conf = tmp_path / "config.yaml"
    conf.write_text("maxReservedFraction: 3\n")
    res = subprocess.run([sys.executable, "-m", "ferry", "scheduler", f"--kubeconfig={planes.kubeconfig('compute')}",
                          f"--config={conf}", "--metrics-port=0"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 1
    assert f"ferry: error: {conf}: maxReservedFraction: Input should be less than or equal to 1" in res.stderr
