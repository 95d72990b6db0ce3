"""kubectl, as the end-to-end tests use it: JSON in and out, waits on conditions with deadlines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
Obj = dict[str, Any]
IMAGE = os.environ.get("FERRY_E2E_IMAGE", "busybox:1.36")
# The virtual node's taint, and its preference for the tenant's own nodes (tolerated: always the shared cluster).
VNODE_TOLERATIONS = [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"},
                     {"key": "kubeferry.io/overflow", "operator": "Exists"}]


@dataclass
class Cluster:
    name: str
    kubeconfig: Path
    kubectl_path: str

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([self.kubectl_path, f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                             capture_output=True, text=True, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} on {self.name}: {res.stderr.strip()}")
        return res

    def ferry(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``kubectl ferry ...`` against this cluster."""
        return subprocess.run([sys.executable, "-m", "ferry", *args, f"--kubeconfig={self.kubeconfig}"],
                              capture_output=True, text=True, timeout=60, check=False)

    def create(self, namespace: str, *objs: Obj) -> None:
        self.kubectl("create", "-n", namespace, "-f", "-",
                     stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def get_or_none(self, *args: str) -> Any:
        res = self.kubectl("get", *args, "-o", "json", check=False)
        if res.returncode != 0:
            if "NotFound" in res.stderr:
                return None
            raise AssertionError(res.stderr)
        return json.loads(res.stdout)

    @staticmethod
    def wait(check: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll ``check`` until it returns something truthy; fail naming ``what`` and the last value."""
        end = time.monotonic() + timeout
        last: object = None
        while True:
            got = check()
            if got:
                return got
            last = got
            if time.monotonic() > end:
                raise AssertionError(f"{what} not reached within {timeout:.0f} s (last: {last!r})")
            time.sleep(0.5)  # between polls of the API


@dataclass
class Clusters:
    compute: Cluster
    tenants: dict[str, Cluster]

    def compute_pods(self, tenant: str, tenant_uid: str) -> list[Obj]:
        """The compute cluster's copies of one tenant pod (there must never be two)."""
        items: list[Obj] = self.compute.get("pods", "-n", tenant,
                                             "-l", f"kubeferry.io/upstream-uid={tenant_uid}")["items"]
        return items

    def gpus_per_node(self) -> int:
        nodes = self.compute.get("nodes")["items"]
        return max(int(float((n["status"].get("allocatable") or {}).get("nvidia.com/gpu", 0))) for n in nodes)


def pod(name: str, *, gpus: int = 1, seconds: int = 3, annotations: Obj | None = None, tolerate: bool = True,
        scheduler: str | None = None, **spec: Any) -> Obj:
    """A pod that prints a line and exits after ``seconds`` (kwok nodes follow kubeferry.io/sim-duration)."""
    body: Obj = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"kubeferry.io/sim-duration": f"{seconds}s", **(annotations or {})}},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                 "containers": [{"name": "main", "image": IMAGE,
                                 "command": ["sh", "-c", f"echo e2e {name}; sleep {seconds}"],
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}],
                 **spec},
    }
    if tolerate:
        body["spec"]["tolerations"] = VNODE_TOLERATIONS
    if scheduler:
        body["spec"]["schedulerName"] = scheduler
    return body


def phase(obj: Obj | None) -> str | None:
    return None if obj is None else (obj.get("status") or {}).get("phase")
