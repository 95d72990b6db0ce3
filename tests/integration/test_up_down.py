"""`ferry up` / `ferry down` as a user runs them: detach, supervise, stop cleanly, fail clearly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.binaries import COMMANDS, Binaries
from ferry.cluster.process import pid_alive
from tests.helpers import kubectl, wait_sync

FERRY = [sys.executable, "-m", "ferry"]


def ferry(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FERRY, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)


def _state(directory: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((directory / "state.json").read_text())
    return data


def _pids(directory: Path) -> list[int]:
    comps = _state(directory)["components"]
    assert isinstance(comps, dict)
    return [int(c["pid"]) for c in comps.values()]


def _gone(pids: list[int]) -> bool:
    return not any(pid_alive(p) and not _zombie(p) for p in pids)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


@pytest.fixture
def small_up(tmp_path: Path, binaries: Binaries) -> Iterator[Path]:
    directory = tmp_path / "up"
    res = ferry("up", "--dir", str(directory), "--control-plane-only", "--tenants", "1", "--gpu-nodes", "2",
                "--detach")
    assert res.returncode == 0, res.stderr
    yield directory
    ferry("down", "--dir", str(directory))  # whatever the test left running


def test_up_detach_then_down_leaves_no_process(small_up: Path, binaries: Binaries) -> None:
    directory = small_up
    for name in ("compute", "tenant-1"):
        assert (directory / f"{name}.kubeconfig").exists()
        nodes = kubectl(binaries.path("kubectl"), directory / f"{name}.kubeconfig", "get", "nodes", "-o", "name")
        assert nodes.returncode == 0
    state = _state(directory)
    pids = [*_pids(directory), int(state["supervisor_pid"])]  # type: ignore[call-overload]
    assert len(pids) == 8  # etcd, 2 apiservers, 2 controller-managers, kube-scheduler, kwok + supervisor
    assert all(pid_alive(p) for p in pids)

    again = ferry("up", "--dir", str(directory), "--control-plane-only", "--detach")
    assert again.returncode == 1
    assert "is in use by a running `ferry up`" in again.stderr

    down = ferry("down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    wait_sync(lambda: _gone(pids), timeout=5, what="all recorded processes gone")
    assert not (directory / "state.json").exists()


def test_supervisor_restarts_a_dead_component(small_up: Path) -> None:
    directory = small_up
    try:
        before = _state(directory)["components"]["compute-kwok"]  # type: ignore[index]
        os.kill(before["pid"], signal.SIGKILL)
        after = wait_sync(
            lambda: (c := _state(directory)["components"]["compute-kwok"])["pid"] != before["pid"]  # type: ignore[index]
            and c["alive"] and c,
            timeout=20, what="kwok restarted")
        assert after["starts"] == before["starts"] + 1
        log = (directory / "logs" / "supervisor.log").read_text()
        assert '"component exited"' in log and '"component restarted"' in log
    finally:
        assert ferry("down", "--dir", str(directory)).returncode == 0


def test_killed_up_leaves_nothing_behind(small_up: Path, tmp_path: Path) -> None:
    directory = small_up
    pids = _pids(directory)
    os.kill(int(_state(directory)["supervisor_pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    wait_sync(lambda: _gone(pids), timeout=10, what="children die with their supervisor")
    fresh = tmp_path / "fresh"
    res = ferry("up", "--dir", str(fresh), "--control-plane-only", "--tenants", "0", "--gpu-nodes", "1", "--detach")
    assert res.returncode == 0, res.stderr
    assert ferry("down", "--dir", str(fresh)).returncode == 0
    # the stale DIR is reusable too: its supervisor is dead, so it is not "in use"
    res = ferry("up", "--dir", str(directory), "--control-plane-only", "--tenants", "0", "--gpu-nodes", "1", "--detach")
    assert res.returncode == 0, res.stderr
    assert ferry("down", "--dir", str(directory)).returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenants", "-1"], "--tenants must be between 0 and 50, got -1"),
        (["--gpu-nodes", "many"], "--gpu-nodes must be a whole number, got 'many'"),
        (["--gpus-per-node", "0"], "--gpus-per-node must be between 1 and 64, got 0"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--gpu-models", "A100,a100"], "--gpu-models must be at most 4 label values whose lower-case names differ"),
    ],
)
def test_bad_flags_are_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    res = ferry("up", "--dir", str(tmp_path / "x"), *args)
    assert res.returncode == 2
    assert message in res.stderr
    assert not (tmp_path / "x" / "state.json").exists()


def test_port_clash_names_the_port(tmp_path: Path, binaries: Binaries) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        res = ferry("up", "--dir", str(tmp_path / "d"), "--base-port", str(port), "--control-plane-only", "--detach")
    assert res.returncode == 1
    assert f"port {port} (for etcd client) is already in use" in res.stderr
    assert not (tmp_path / "d" / "state.json").exists()


def test_binary_that_fails_to_start_is_named(tmp_path: Path, binaries: Binaries) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    for cmd in COMMANDS:
        (fake / cmd).symlink_to(binaries.path(cmd))
    (fake / "etcd").unlink()
    (fake / "etcd").write_text("#!/bin/sh\necho 'etcdmain: broken data dir: simulated failure' >&2\nexit 3\n")
    (fake / "etcd").chmod(0o755)
    directory = tmp_path / "d"
    res = ferry("up", "--dir", str(directory), "--control-plane-only", "--detach", env={"FERRY_BIN_DIR": str(fake)})
    assert res.returncode == 1
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("ferry: error:")]
    assert len(errors) == 1
    assert "etcd exited at start-up" in errors[0] and "simulated failure" in errors[0]
    assert not (directory / "state.json").exists()


def test_full_up_runs_a_tenant_pod_in_the_compute_cluster(tmp_path: Path, binaries: Binaries) -> None:
    """The product as a user starts it: scheduler + one vnode per tenant; a plain kubectl pod runs. The
    compute GPU nodes are of two products, so the vnode has a GPU pool (a virtual node) per product: the pod
    selects one, runs on that product's compute node, and its logs come through its virtual node."""
    directory = tmp_path / "full"
    res = ferry("up", "--dir", str(directory), "--tenants", "1", "--gpu-nodes", "2", "--detach",
                "--gpu-models", "A100-SXM4-80GB,H100-SXM5-80GB")
    assert res.returncode == 0, res.stderr
    try:
        comps = _state(directory)["components"]
        assert isinstance(comps, dict) and {"kube-ferry-scheduler", "tenant-1-vnode"} <= set(comps)
        k, tenant = binaries.path("kubectl"), directory / "tenant-1.kubeconfig"
        wait_sync(lambda: kubectl(k, tenant, "get", "serviceaccount", "default", check=False).returncode == 0,
                  timeout=60, what="default ServiceAccount")
        overrides = json.dumps({"spec": {"tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
                                         "nodeSelector": {"kubeferry.io/gpu-model": "H100-SXM5-80GB"}}})
        kubectl(k, tenant, "run", "hello", "--image=x", f"--overrides={overrides}")
        wait_sync(lambda: kubectl(k, tenant, "get", "pod", "hello", "-o", "jsonpath={.status.phase}").stdout
                  == "Running", timeout=60, what="tenant pod Running")
        assert kubectl(k, tenant, "get", "pod", "hello", "-o", "jsonpath={.spec.nodeName}").stdout \
            == "ferry-tenant-1-h100-sxm5-80gb"
        assert "simulated workload" in kubectl(k, tenant, "logs", "hello").stdout
        compute = kubectl(k, directory / "compute.kubeconfig", "get", "pods", "-n", "tenant-1", "-o",
                          "jsonpath={.items[*].spec.nodeName}").stdout
        assert compute == "gpu-node-0001"  # the second block of nodes: H100s'
        nodes = kubectl(k, tenant, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
        assert set(nodes) == {"ferry-tenant-1", "ferry-tenant-1-a100-sxm4-80gb", "ferry-tenant-1-h100-sxm5-80gb"}
    finally:
        assert ferry("down", "--dir", str(directory)).returncode == 0


# starts in a row; a hunt for the race runs more (FERRY_UP_REPEAT=10), each start costs ~22 s of the suite
UP_REPEAT = int(os.environ.get("FERRY_UP_REPEAT", "2"))
REACHABLE = "jsonpath={.status.conditions[?(@.type=='ComputeClusterReachable')].status}"


def test_starting_clusters_raise_no_false_unreachable_alarm(tmp_path: Path, binaries: Binaries) -> None:
    """A compute apiserver still initialising its storage answers 429 for a moment: that is not an
    outage, and no virtual node may say so, of either cluster (several starts in a row, UP_REPEAT: the race is
    timing-dependent)."""
    k = binaries.path("kubectl")
    for attempt in range(UP_REPEAT):
        directory = tmp_path / f"up-{attempt}"
        res = ferry("up", "--dir", str(directory), "--tenants", "2", "--gpu-nodes", "1", "--detach")
        assert res.returncode == 0, res.stderr
        try:
            for tenant in ("tenant-1", "tenant-2"):
                cfg = directory / f"{tenant}.kubeconfig"
                node = f"ferry-{tenant}"
                wait_sync(lambda cfg=cfg, node=node: kubectl(  # type: ignore[misc]
                    k, cfg, "get", "node", node, "-o", REACHABLE, check=False).stdout == "True",
                    timeout=60, what=f"{tenant}: compute reachable")
                events = [e for reason in ("ComputeClusterUnreachable", "TenantAPIFailing", "TenantAccessDenied")
                          for e in kubectl(k, cfg, "get", "events", "-A", "--field-selector", f"reason={reason}",
                                           "-o", "name").stdout.split()]
                assert events == [], f"start {attempt + 1}: {tenant} raised a false alarm: {events}"
        finally:
            assert ferry("down", "--dir", str(directory)).returncode == 0
