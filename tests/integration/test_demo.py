"""`make demo`'s scenario, run headless on clusters of its own (`ferry demo --start`): every claim it
prints is checked again here, independently, in `kubectl get` output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ferry import binaries as ferry_binaries


def test_every_claim_the_demo_prints_holds_in_kubectl(tmp_path: Path, binaries: ferry_binaries.Binaries) -> None:
    d = tmp_path / "demo"
    try:
        res = subprocess.run([sys.executable, "-m", "ferry", "demo", "--dir", str(d), "--start", "--headless"],
                             capture_output=True, text=True, timeout=900, check=False)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
        report = json.loads((d / "demo-report.json").read_text())
        assert [s["state"] for s in report["steps"]] == ["done"] * 8, report
        for step in report["steps"]:
            assert f"✓ {step['claim']}" in res.stdout
        _claims_hold(d, binaries, report)
    finally:
        subprocess.run([sys.executable, "-m", "ferry", "down", "--dir", str(d)], capture_output=True, timeout=120,
                       check=False)


def _claims_hold(d: Path, binaries: ferry_binaries.Binaries, report: dict[str, Any]) -> None:
    def get(cluster: str, *args: str) -> Any:
        out = subprocess.run([str(binaries.path("kubectl")), f"--kubeconfig={d / f'{cluster}.kubeconfig'}", "get",
                              *args, "-o", "json"], capture_output=True, text=True, timeout=60, check=True).stdout
        return json.loads(out)

    def tenant_pods(tenant: str, job: str) -> list[Any]:
        items: list[Any] = get(tenant, "pods", "-n", "demo", "-l", f"app={job}")["items"]
        return items

    def compute_pods(tenant: str, job: str) -> list[Any]:
        items: list[Any] = get("compute", "pods", "-n", tenant, "-l", f"app={job}")["items"]
        return items

    def phases(pods: list[Any]) -> list[str]:
        return [p["status"].get("phase") for p in pods]

    queues = {q["metadata"]["name"]: q for q in get("compute", "queues.scheduling.kubeferry.io")["items"]}
    total = report["nodes"] * report["gpusPerNode"]
    for name in ("tenant-1", "tenant-2"):
        spec = queues[name]["spec"]
        assert spec["guaranteed"]["gpu"] == str(total // 2) and spec["max"]["gpu"] == str(total)
        assert spec["preemption"]["victimGraceSeconds"] == 20
    assert float(queues["tenant-1"]["status"]["borrowed"]["gpu"]) > 0  # the elastic jobs that were kept

    assert phases(tenant_pods("tenant-1", "train")) == ["Running"] * 8
    assert len({p["spec"]["nodeName"] for p in compute_pods("tenant-1", "train")}) == 8
    assert get("tenant-1", "podgroups.scheduling.volcano.sh", "-n", "demo", "train")["status"]["phase"] == "Running"

    assert phases(tenant_pods("tenant-1", "notebooks")) == ["Running"] * 4
    assert len({(p["spec"]["nodeName"], p["metadata"]["annotations"]["kubeferry.io/gpu-devices"])
                for p in compute_pods("tenant-1", "notebooks")}) == 1

    victims = report["victims"]
    assert victims
    for job in ("soak-1", "soak-2", "soak-3"):
        pods = tenant_pods("tenant-1", job)
        if job in victims:  # preempted whole, and the pods are gone from the compute cluster
            assert {(p["status"]["phase"], p["status"].get("reason")) for p in pods} == {("Failed", "Preempted")}
            assert compute_pods("tenant-1", job) == []
        else:
            assert set(phases(pods)) == {"Running"}
    assert phases(tenant_pods("tenant-2", "eval")) == ["Running"] * 8

    (refused,) = tenant_pods("tenant-2", "debug-host")
    assert (refused["status"]["phase"], refused["status"]["reason"]) == ("Failed", "Refused")
    assert compute_pods("tenant-2", "debug-host") == []

    assert phases(tenant_pods("tenant-2", "huge")) == ["Pending"] * 2
    why = subprocess.run([sys.executable, "-m", "ferry", "why-pending", "podgroup/huge", "-n", "demo",
                          f"--kubeconfig={d / 'tenant-2.kubeconfig'}"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert "no node has 16 GPUs" in why

    usage = {r["QUEUE"]: r["GPU-SECONDS"] for r in report["usage"]}
    assert usage["tenant-1"] > 0 and usage["tenant-2"] > 0
    assert Path(report["timeline"]).read_bytes().startswith(b"\x89PNG")
