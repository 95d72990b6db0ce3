"""The scheduler's configuration file on the real control planes: applied while running, a bad one
refused with an Event where the admin looks and the previous configuration kept, a bad one at start an
exit with the reason."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from ferry.cluster.planes import ControlPlanes
from ferry.cluster.process import Component
from ferry.keys import EARLIER_RUN_ANNOTATION, UPSTREAM_CONTROLLER_LABEL
from tests.helpers import eventually, kubectl, swapped
from tests.integration.test_scheduler_service import (
    GROUP,
    VERSION,
    _make_group,
    _make_queue,
    _running,
    _sa,
    pod,
    scheduler_metric,
)


def _swap(path: Path, text: str) -> None:
    """Change the file in one step, as the kubelet updates a ConfigMap volume (never seen half-written)."""
    staged = path.with_suffix(".staged")
    staged.write_text(text)
    staged.replace(path)


def _log_lines(comp: Component, event: str) -> list[dict[str, Any]]:
    out = []
    for line in comp.spec.log.read_text().splitlines():
        if f'"{event}"' in line:
            out.append(json.loads(line))
    return out


@contextlib.contextmanager
def configured_scheduler(planes: ControlPlanes, ferry_scheduler: Component, conf: Path,
                         config_object: str) -> Iterator[Component]:
    """The session's schedulers stopped, one reading ``conf`` in their place, then the session's back."""
    schedulers = [c for n, c in planes.components.items() if n.startswith("kube-ferry-scheduler") and c.alive()]
    scheduler = swapped(ferry_scheduler, "kube-ferry-scheduler-config",
                        [f"--config={conf}", f"--config-object={config_object}", "--identity=config"])
    for c in schedulers:
        c.stop()
    try:
        scheduler.start()
        scheduler.wait_ready()
        yield scheduler
    finally:
        scheduler.stop()
        for c in schedulers:
            c.start()
        for c in schedulers:
            c.wait_ready()


async def test_a_changed_file_applies_and_a_bad_one_is_refused_with_an_event(
        planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
        private_node: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    conf = tmp_path / "config.yaml"
    conf.write_text("minRuntimeSeconds: 0\nvictimCooldownSeconds: 60\n")
    with configured_scheduler(planes, ferry_scheduler, conf, f"{compute_ns}/scheduler-config") as scheduler:

        async def bound(name: str) -> bool:
            return bool((await core.read_namespaced_pod(name, compute_ns)).spec.node_name)

        await core.create_namespaced_pod(compute_ns, pod("before", compute_ns))
        await eventually(lambda: bound("before"), timeout=30, what="a pod bound under the file's configuration")

        _swap(conf, "minRuntimeSeconds: -5\nvictimCooldown: 3\n")

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

        _swap(conf, "minRuntimeSeconds: 0\nvictimCooldownSeconds: 5\nperiodSeconds: 0.3\n")
        applied = await eventually(lambda: _log_lines(scheduler, "configuration applied"), timeout=30,
                                   what="the changed file applied")
        assert applied[-1]["victim_cooldown_s"] == 5 and applied[-1]["period_s"] == 0.3
        assert len(applied) == 1, "one change, one application"
        assert scheduler.alive()


async def test_a_young_job_is_not_a_victim_until_its_minimum_runtime(
        planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
        private_node: str, tmp_path: Path) -> None:
    """Victim protection: the preemptor arrives right after the elastic job started, and the notice comes
    only once the elastic job has run ``minRuntimeSeconds`` (its start read back from the cluster)."""
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    conf = tmp_path / "config.yaml"
    conf.write_text("minRuntimeSeconds: 12\n")
    queue = f"p-{compute_ns}"
    await _make_queue(custom, queue, compute_ns, victimGraceSeconds=2)
    try:
        with configured_scheduler(planes, ferry_scheduler, conf, f"{compute_ns}/scheduler-config"):
            await _make_group(core, custom, compute_ns, "el", 8, "Elastic", queue)
            await eventually(lambda: _running(core, compute_ns, "el", 8), timeout=30, what="elastic job running")
            await _make_group(core, custom, compute_ns, "g", 4, "Guaranteed", queue)

            async def notice() -> str | None:
                p = await core.read_namespaced_pod("el-0", compute_ns)
                return (p.metadata.annotations or {}).get("kubeferry.io/will-evict-at")

            deadline = _ts(await eventually(notice, timeout=60, what="eviction notice after the minimum runtime"))
            group = await custom.get_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", "el")
            started = _ts(group["status"]["scheduledTime"])
            noticed = deadline - 2  # the deadline is the notice plus the grace (times in whole seconds)
            assert noticed >= started + 12 - 1, (started, noticed)
            await eventually(lambda: _running(core, compute_ns, "g", 4), timeout=40, what="preemptor running")
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def _one_pod_group(core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str, queue: str, name: str,
                         gpus: int) -> None:
    await custom.create_namespaced_custom_object(GROUP, VERSION, ns, "podgroups", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
        "spec": {"minMember": 1, "queue": queue}})
    await core.create_namespaced_pod(ns, pod(f"{name}-0", ns, gpus=gpus, group=name))


async def _group_status(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    got = await custom.get_namespaced_custom_object(GROUP, VERSION, ns, "podgroups", name)
    return dict(got.get("status") or {})


async def _passed_over_gang(core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str, queue: str) -> None:
    """A 4-GPU occupant on the private node, then an 8-GPU gang ``big`` that a 2-GPU job ``small`` passes, so
    that big starves (and, after reservationAfterSeconds, holds the node)."""
    await _one_pod_group(core, custom, ns, queue, "occupant", 4)
    await eventually(lambda: _running(core, ns, "occupant", 1), timeout=30, what="occupant running")
    await _one_pod_group(core, custom, ns, queue, "big", 8)
    await _one_pod_group(core, custom, ns, queue, "small", 2)
    await eventually(lambda: _running(core, ns, "small", 1), timeout=30, what="small running")


async def _notice(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    p = await core.read_namespaced_pod(name, ns)
    return (p.metadata.annotations or {}).get("kubeferry.io/will-evict-at")


def test_a_bad_file_at_start_is_an_exit_with_the_reason(planes: ControlPlanes, tmp_path: Path) -> None:
    conf = tmp_path / "config.yaml"
    conf.write_text("maxReservedFraction: 3\n")
    res = subprocess.run([sys.executable, "-m", "ferry", "scheduler", f"--kubeconfig={planes.kubeconfig('compute')}",
                          f"--config={conf}", "--metrics-port=0"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 1
    assert f"ferry: error: {conf}: maxReservedFraction: Input should be less than or equal to 1" in res.stderr


async def test_a_held_node_runs_a_job_on_loan_and_recalls_it_when_the_holder_could_start(
        planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
        private_node: str, tmp_path: Path) -> None:
    """lend-holds on the real control plane: an 8-GPU job passed by a smaller one holds the one node its
    selector allows (not the empty nodes it could never use); a 2-GPU job that fits nowhere else starts
    there on loan and is told so; once the holder's own occupants are gone the loan gets its notice,
    leaves after its grace, and the holder runs."""
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    conf = tmp_path / "config.yaml"
    conf.write_text("reservationAfterSeconds: 2\nmaxHoldDoublings: 0\n")
    queue = f"l-{compute_ns}"
    await _make_queue(custom, queue, compute_ns, victimGraceSeconds=3)

    async def condition(name: str) -> str:
        status = await _group_status(custom, compute_ns, name)
        return " ".join(c.get("message", "") for c in status.get("conditions") or [])

    try:
        with configured_scheduler(planes, ferry_scheduler, conf, f"{compute_ns}/scheduler-config"):
            await _passed_over_gang(core, custom, compute_ns, queue)

            async def holding() -> bool:
                return f"holding node(s) {private_node} until they drain" in await condition("big")

            await eventually(holding, timeout=30, what="big holding the private node")
            await _one_pod_group(core, custom, compute_ns, queue, "loan", 2)  # fits only on the held node
            await eventually(lambda: _running(core, compute_ns, "loan", 1), timeout=30, what="loan running")

            async def told_on_loan() -> bool:  # the condition follows the bind: the pod may run first
                return "on loan on node(s) held for" in await condition("loan")

            await eventually(told_on_loan, timeout=30, what="the loan's Scheduled condition")
            for name in ("occupant-0", "small-0"):
                await core.delete_namespaced_pod(name, compute_ns, grace_period_seconds=0)
            await eventually(lambda: _notice(core, compute_ns, "loan-0"), timeout=30, what="the loan's notice")

            async def told_to_leave() -> bool:  # written beside the notice, not after it
                events = await core.list_namespaced_event(compute_ns, field_selector="involvedObject.name=loan-0")
                return any(e.reason == "Preempting" and "on loan on node(s) held for" in (e.message or "")
                           for e in events.items)

            await eventually(told_to_leave, timeout=30, what="the loan's Preempting Event")
            await eventually(lambda: _running(core, compute_ns, "big", 1), timeout=40, what="the holder running")
            assert not await _running(core, compute_ns, "loan", 1)  # evicted: the holder has the whole node
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def test_a_hold_and_its_loan_survive_a_scheduler_restart(
        planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
        private_node: str, tmp_path: Path) -> None:
    """reserve and lend-holds across a restart: the gang's PodGroup keeps the nodes held for it and the
    loan's keeps its holder; the restarted scheduler still holds the node and recalls the loan once the
    holder's own occupants are gone. Had it forgotten them, the loan would be an ordinary occupant, and the
    8-GPU gang would wait for it to end (here: never)."""
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    conf = tmp_path / "config.yaml"
    conf.write_text("reservationAfterSeconds: 2\nmaxHoldDoublings: 0\n")
    queue = f"r-{compute_ns}"
    await _make_queue(custom, queue, compute_ns, victimGraceSeconds=3)

    async def kept(name: str, field: str, value: list[str] | None) -> bool:
        return (await _group_status(custom, compute_ns, name)).get(field) == value

    try:
        with configured_scheduler(planes, ferry_scheduler, conf, f"{compute_ns}/scheduler-config") as scheduler:
            await _passed_over_gang(core, custom, compute_ns, queue)
            await eventually(lambda: kept("big", "heldNodes", [private_node]), timeout=30,
                             what="the hold kept in big's PodGroup")
            await _one_pod_group(core, custom, compute_ns, queue, "loan", 2)  # fits only on the held node
            await eventually(lambda: kept("loan", "onLoanFrom", [f"{compute_ns}/big"]), timeout=30,
                             what="the loan kept in its PodGroup")
            wide = kubectl(planes.bin.path("kubectl"), planes.kubeconfig("compute"), "get", "podgroups", "-n",
                           compute_ns, "-o", "wide").stdout  # where the admin looks
            rows = {line.split()[0]: line for line in wide.splitlines()[1:]}
            assert f'["{private_node}"]' in rows["big"] and f'["{compute_ns}/big"]' in rows["loan"], wide
            scheduler.stop()
            scheduler.start()
            scheduler.wait_ready()
            for name in ("occupant-0", "small-0"):
                await core.delete_namespaced_pod(name, compute_ns, grace_period_seconds=0)
            await eventually(lambda: _notice(core, compute_ns, "loan-0"), timeout=30,
                             what="the loan's notice from the restarted scheduler")
            await eventually(lambda: _running(core, compute_ns, "big", 1), timeout=40, what="the holder running")
            await eventually(lambda: kept("big", "heldNodes", None), timeout=30,
                             what="the hold gone from big's PodGroup once it runs")
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def test_a_scheduler_that_starts_continues_the_usage_its_queues_recorded(
        planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
        private_node: str, tmp_path: Path) -> None:
    """fair-over-time: a Queue's status keeps its decayed usage, and a scheduler that starts (a restart, a
    new leader) continues from it, decayed over the time since, rather than from nothing."""
    from scheduler.core.scheduler import PRESETS

    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    plugins = ", ".join("fair-over-time" if p == "guarantee" else p for p in PRESETS["ferry"]["plugins"])
    conf = tmp_path / "config.yaml"
    conf.write_text(f"plugins: [{plugins}]\nusageHalfLifeSeconds: 86400\n")
    queue = f"u-{compute_ns}"
    await _make_queue(custom, queue, compute_ns)
    an_hour_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await custom.patch_cluster_custom_object_status(GROUP, VERSION, "queues", queue, {"status": {
        "recentUsage": {"gpuSeconds": 100_000, "time": an_hour_ago}}}, _content_type="application/merge-patch+json")
    try:
        with configured_scheduler(planes, ferry_scheduler, conf, f"{compute_ns}/scheduler-config") as scheduler:
            await core.create_namespaced_pod(compute_ns, pod("user", compute_ns, queue=queue))

            async def recorded() -> dict[str, Any] | None:
                q = await custom.get_cluster_custom_object(GROUP, VERSION, "queues", queue)
                usage = (q.get("status") or {}).get("recentUsage") or {}
                return usage if usage.get("time") not in (None, an_hour_ago) else None

            usage = await eventually(recorded, timeout=30, what="the queue's usage recorded by the scheduler")
            # an hour of a one-day half-life: x 0.9715 (plus at most a minute of one GPU); from nothing: ~0
            assert 96_500 <= usage["gpuSeconds"] <= 97_500, usage
            exported = await eventually(
                lambda: scheduler_metric(scheduler, "kube_ferry_queue_recent_gpu_seconds", queue),
                timeout=10, what="the queue's recent usage exported")
            assert 96_500 <= exported <= 97_600, exported
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def _least_attained_first(core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str, tmp_path: Path,
                                queue: str, grace_s: int) -> tuple[Path, str]:
    """A scheduler configuration with least attained service at one level per GPU-second (8 GPUs cross it at
    once; no promotion, protection or cooldown within a test) and a queue of it for ``ns``."""
    from scheduler.core.scheduler import PRESETS

    await eventually(lambda: _sa(core, ns), timeout=30, what="default ServiceAccount")
    conf = tmp_path / "config.yaml"
    conf.write_text(f"plugins: [{', '.join((*PRESETS['ferry']['plugins'], 'las'))}]\n"
                    "lasThresholdsGpuSeconds: [1]\nlasPromoteKnob: 1000\nminRuntimeSeconds: 0\n"
                    "victimCooldownSeconds: 0\n")
    await _make_queue(custom, queue, ns, victimGraceSeconds=grace_s, preemptorDelaySeconds=0,
                      leastAttainedService=True)
    return conf, queue


@pytest.mark.parametrize("kept_by", ["podgroup", "pod", "note"])
async def test_a_restarted_scheduler_still_orders_an_evicted_long_runner_behind_a_newcomer(
        planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
        private_node: str, tmp_path: Path, kept_by: str) -> None:
    """Least attained service across a restart, end to end: a newcomer evicts a movable long runner; its
    operator makes its pod again; the scheduler restarts; when the GPUs free, a job that arrived after
    the restart (level 0) goes before the long runner's new run, whose GPU-seconds the restarted scheduler
    read back: from its PodGroup (a gang), or from the new pod itself (a pod of no gang, whose controller
    made it under a new name: it took the evicted run's note and keeps it, scheduler/service/runs.py), or,
    when the scheduler restarts before the controller makes that pod, from the note the scheduler saved in
    its ConfigMap, which the new pod then takes. Had it forgotten them, the long runner (the older job)
    would go first."""

    gang = kept_by == "podgroup"
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    conf, queue = await _least_attained_first(core, custom, compute_ns, tmp_path, f"las-{compute_ns}", grace_s=2)

    async def job(name: str, movable: bool = False) -> None:
        if gang:
            await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
                "spec": {"minMember": 1, "queue": queue}})
        await make_pod(f"{name}-0", name, movable)

    async def make_pod(pod_name: str, job_name: str, movable: bool) -> None:
        p = pod(pod_name, compute_ns, gpus=8, group=job_name if gang else None)
        if not gang:  # the job's controller, as a vnode's copy names its tenant Job
            p["metadata"]["labels"][UPSTREAM_CONTROLLER_LABEL] = f"controller-of-{job_name}"
        if movable:
            p["metadata"]["annotations"]["kubeferry.io/movable"] = "true"
        await core.create_namespaced_pod(compute_ns, p)

    async def running(name: str) -> bool:
        p = await core.read_namespaced_pod(name, compute_ns)
        return bool(p.spec.node_name) and p.metadata.deletion_timestamp is None

    async def gone(name: str) -> bool:
        return not [p for p in (await core.list_namespaced_pod(compute_ns)).items if p.metadata.name == name]

    try:
        with configured_scheduler(planes, ferry_scheduler, conf, f"{compute_ns}/scheduler-config") as scheduler:
            await job("long", movable=True)
            await eventually(lambda: running("long-0"), timeout=30, what="the long runner")
            await job("short")
            await eventually(lambda: running("short-0"), timeout=40,
                             what="the newcomer running after evicting the long runner")
            await eventually(lambda: gone("long-0"), timeout=30, what="the long runner's pod gone")
            again = "long-0" if gang else "long-1"  # a gang's operator names it again; a Job's pods are new names
            if kept_by == "note":  # restarted before the controller makes its next pod: the note was saved
                async def saved() -> bool:
                    cm = await core.read_namespaced_config_map("kube-ferry-scheduler-runs", "kube-ferry-system")
                    return f"{compute_ns}/controller-of-long" in json.loads(cm.data["notes.json"])

                await eventually(saved, timeout=20, what="the note saved in the scheduler's ConfigMap")
                assert (scheduler_metric(scheduler, "kube_ferry_earlier_runs_saved") or 0) >= 1
                scheduler.stop()
                scheduler.start()
                scheduler.wait_ready()
            await make_pod(again, "long", movable=True)  # it waits (short holds the node)
            if not gang:
                async def kept() -> str | None:
                    return ((await core.read_namespaced_pod(again, compute_ns)).metadata.annotations
                            or {}).get(EARLIER_RUN_ANNOTATION)

                earlier = json.loads(await eventually(kept, timeout=20, what="the next pod keeping the run"))
                assert earlier["attainedGpuSeconds"] >= 8, earlier
                assert scheduler_metric(scheduler, "kube_ferry_continued_runs_total") == 1
            if kept_by != "note":
                scheduler.stop()
                scheduler.start()
                scheduler.wait_ready()
            await job("fresh")
            await core.delete_namespaced_pod("short-0", compute_ns, grace_period_seconds=0)
            await eventually(lambda: running("fresh-0"), timeout=30,
                             what="the job that arrived after the restart running first")
            assert not (await core.read_namespaced_pod(again, compute_ns)).spec.node_name
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def test_an_eviction_a_disruption_budget_refuses_leaves_no_note_for_a_later_pod(
        planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
        private_node: str, tmp_path: Path) -> None:
    """A movable long runner of no PodGroup that a PodDisruptionBudget protects is chosen as a newcomer's victim;
    the API server refuses its eviction and it runs on. The note the eviction left for the job's next pod is
    withdrawn (scheduler/service/runs.py), so the notes the scheduler saves hold none for its controller: a
    next pod after an ordinary end would otherwise be taken for a continuation of a run never stopped."""

    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    policy = client.PolicyV1Api(compute_api)
    conf, queue = await _least_attained_first(core, custom, compute_ns, tmp_path, f"pdb-{compute_ns}", grace_s=1)
    controller = f"controller-of-guarded-{compute_ns}"
    long_runner = pod("guarded-0", compute_ns, gpus=8)
    long_runner["metadata"]["labels"] |= {UPSTREAM_CONTROLLER_LABEL: controller, "app": "guarded"}
    long_runner["metadata"]["annotations"]["kubeferry.io/movable"] = "true"
    await policy.create_namespaced_pod_disruption_budget(compute_ns, {
        "metadata": {"name": "guarded"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})

    def withdrawn(scheduler: Component) -> list[dict[str, Any]]:
        return [ln for ln in _log_lines(scheduler, "eviction refused, its note withdrawn")
                if f"{compute_ns}/guarded-0" in ln["pods"]]

    async def bound() -> bool:
        p = await core.read_namespaced_pod("guarded-0", compute_ns)
        return bool(p.spec.node_name)

    async def none_saved() -> bool:  # the notes the scheduler saved hold none for the guarded job's controller
        cm = await core.read_namespaced_config_map("kube-ferry-scheduler-runs", "kube-ferry-system")
        return f"{compute_ns}/{controller}" not in json.loads((cm.data or {}).get("notes.json") or "{}")

    try:
        with configured_scheduler(planes, ferry_scheduler, conf, f"{compute_ns}/scheduler-config") as scheduler:
            await core.create_namespaced_pod(compute_ns, long_runner)
            await eventually(bound, timeout=30, what="the long runner")
            await core.create_namespaced_pod(compute_ns, pod("newcomer-0", compute_ns, gpus=8))
            await eventually(lambda: withdrawn(scheduler), timeout=40,
                             what="its eviction refused and its note withdrawn")
            refused = [ln for ln in scheduler.spec.log.read_text().splitlines()
                       if '"what": "evict"' in ln and '"status": 429' in ln]
            assert refused, "the API server refused the eviction (the disruption budget)"
            await core.delete_namespaced_pod("newcomer-0", compute_ns, grace_period_seconds=0)  # no more tries
            await eventually(none_saved, timeout=20, what="no note saved for the guarded job")
            live = await core.read_namespaced_pod("guarded-0", compute_ns)
            assert live.metadata.deletion_timestamp is None and live.spec.node_name  # it ran on
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def test_drain_holds_moves_a_movable_job_off_the_node_held_for_a_passed_over_gang(
        planes: ControlPlanes, ferry_scheduler: Component, compute_api: client.ApiClient, compute_ns: str,
        private_node: str, tmp_path: Path) -> None:
    """drain-holds on the real control plane. Two private nodes: one (S) runs a job that stays, the other
    (M) a younger movable job. An 8-GPU gang fits in their free GPUs in total, on neither; a 1-GPU job passes
    it, so it holds the node that should drain first, M. The movable job is told why, leaves after its
    grace, and the gang runs on M; made again by its operator, the moved job runs on S. Without the action
    the gang would wait for the movable job to end (here: never)."""
    core, custom = client.CoreV1Api(compute_api), client.CustomObjectsApi(compute_api)
    await eventually(lambda: _sa(core, compute_ns), timeout=30, what="default ServiceAccount")
    spare = sorted(n.metadata.name for n in (await core.list_node(label_selector="type=kwok,!ferry-test")).items)[-1]
    await core.patch_node(spare, {"metadata": {"labels": {"ferry-test": compute_ns}}})
    await core.patch_node(private_node, {"metadata": {"labels": {"ferry-stay": compute_ns}}})
    conf = tmp_path / "config.yaml"
    conf.write_text("actions: [allocate, reserve, preempt, drain-holds]\nreservationAfterSeconds: 2\n"
                    "maxHoldDoublings: 0\nminRuntimeSeconds: 0\n")
    queue = f"d-{compute_ns}"
    await _make_queue(custom, queue, compute_ns, victimGraceSeconds=3)

    async def job(name: str, gpus: int, *, on_s: bool = False, movable: bool = False, group: bool = True) -> None:
        if group:
            await custom.create_namespaced_custom_object(GROUP, VERSION, compute_ns, "podgroups", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
                "spec": {"minMember": 1, "queue": queue}})
        p = pod(f"{name}-0", compute_ns, gpus=gpus, group=name)
        if on_s:
            p["spec"]["nodeSelector"]["ferry-stay"] = compute_ns
        if movable:
            p["metadata"]["annotations"]["kubeferry.io/movable"] = "true"
        await core.create_namespaced_pod(compute_ns, p)

    async def node_of(name: str) -> str | None:
        got = await core.read_namespaced_pod(name, compute_ns)
        return got.spec.node_name if got.spec.node_name and not got.metadata.deletion_timestamp else None

    try:
        with configured_scheduler(planes, ferry_scheduler, conf, f"{compute_ns}/scheduler-config"):
            await job("stay", 4, on_s=True)
            await job("temp", 2, on_s=True)
            await eventually(lambda: _running(core, compute_ns, "temp", 1), timeout=30, what="S filled to 6 GPUs")
            await job("mover", 3, movable=True)  # 2 GPUs free on S: it lands on M
            assert await eventually(lambda: node_of("mover-0"), timeout=30, what="mover running") == spare
            await core.delete_namespaced_pod("temp-0", compute_ns, grace_period_seconds=0)  # S: 4 free, M: 5
            await job("big", 8)
            await job("small", 1, on_s=True)  # passes big
            await eventually(lambda: _running(core, compute_ns, "small", 1), timeout=30, what="small running")
            await eventually(lambda: _notice(core, compute_ns, "mover-0"), timeout=30, what="the mover's notice")

            async def told_to_move() -> bool:  # written beside the notice, not after it
                events = await core.list_namespaced_event(compute_ns, field_selector="involvedObject.name=mover-0")
                return any("draining the nodes held for" in (e.message or "") for e in events.items)

            await eventually(told_to_move, timeout=30, what="the mover's Preempting Event")
            for staying in ("stay-0", "small-0"):
                assert not await _notice(core, compute_ns, staying)
            assert await eventually(lambda: node_of("big-0"), timeout=40, what="big running") == spare
            await eventually(lambda: gone(core, compute_ns, "mover-0"), timeout=30, what="the mover's pod gone")
            await job("mover", 3, movable=True, group=False)  # its operator makes it again
            moved = await eventually(lambda: node_of("mover-0"), timeout=30, what="the moved job running")
            assert moved == private_node
    finally:
        await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


async def gone(core: client.CoreV1Api, ns: str, name: str) -> bool:
    return not [p for p in (await core.list_namespaced_pod(ns)).items if p.metadata.name == name]
