"""The schedulers ``make bench`` compares, each as its users run it on the same compute control plane.

A :class:`Contender` knows how to start its scheduler as a supervised process next to the control
planes, what its pods and gangs look like (schedulerName, the group link its users write, its own
PodGroup kind) and what it needs installed first. Client rate limits are the same for all: Volcano's
default (2,000 QPS, burst 2,000) is given to kube-scheduler too; Kube-Ferry's client has no
client-side limiter.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.cluster.planes import COMPUTE, ControlPlanes
from ferry.cluster.ports import PortAllocator
from ferry.cluster.process import Component, ComponentSpec, http_probe, insecure_https_probe
from ferry.kube.rest import Rest, path

Obj = dict[str, Any]
QPS, BURST = 2000, 2000
VOLCANO_CONF = """\
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: binpack
"""


def _free_port(what: str) -> int:
    ports = PortAllocator(None)
    port = ports.take(what)
    ports.release()
    return port


def _meta(name: str, labels: dict[str, str], annotations: dict[str, str] | None) -> Obj:
    return {"name": name, "labels": labels, "annotations": dict(annotations or {})}


def _gpu_container(gpus: int = 1) -> Obj:
    return {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}


@dataclass
class Contender:
    name: str
    version: str
    settings: str
    gangs: bool = True
    args: tuple[str, ...] = ()  # more command-line flags (later flags win)

    def with_args(self, *args: str) -> Contender:
        """The same scheduler started with more flags; the settings text says which."""
        clone = copy.copy(self)
        clone.args = (*self.args, *args)
        clone.settings = f"{self.settings}; {' '.join(args)}"
        return clone

    def spec(self, planes: ControlPlanes) -> ComponentSpec:
        raise NotImplementedError

    async def prepare(self, planes: ControlPlanes, rest: Rest) -> None:
        """What must exist before the scheduler starts."""

    async def ready(self, rest: Rest) -> None:
        """What must be true after it started, before pods come."""

    def pod(self, name: str, group: str | None, gpus: int = 1, annotations: dict[str, str] | None = None) -> Obj:
        raise NotImplementedError

    def group(self, name: str, members: int, queue: str | None = None) -> tuple[str, Obj] | None:
        """(collection URL path pieces, body) of the PodGroup a pod of ``name`` needs, if any."""
        return None

    def queue(self, name: str, namespace: str, guaranteed_gpus: int, weight: int, grace_s: int,
              preemptor_delay_s: int) -> tuple[str, Obj]:
        """(collection URL path pieces, body) of a tenant's queue, as its users declare one."""
        raise NotImplementedError(f"{self.name} has no queues")

    async def open_queue(self, rest: Rest, url: str) -> None:
        """What makes a new queue (at ``url``) usable, where something else would do it in a real install."""

    def compressed(self, workdir: Path, factor: float) -> Contender:
        """The same scheduler for a workload whose times are divided by ``factor`` (a trace replay)."""
        return self

    def start(self, planes: ControlPlanes) -> Component:
        comp = planes.add_component(self.spec(planes))
        comp.start()
        comp.wait_ready()
        return comp


class KubeFerry(Contender):
    def __init__(self) -> None:
        from ferry import __version__

        super().__init__("kube-ferry", __version__, "ferry scheduler --period=0.2 (preset ferry)")

    def spec(self, planes: ControlPlanes) -> ComponentSpec:
        import sys

        port = _free_port("kube-ferry metrics")
        return ComponentSpec(name="bench-kube-ferry",
                             argv=[sys.executable, "-m", "ferry", "scheduler",
                                   f"--kubeconfig={planes.kubeconfig(COMPUTE)}", f"--metrics-port={port}",
                                   "--period=0.2", *self.args],
                             log=planes.dir / "logs" / "bench-kube-ferry.log",
                             probe=http_probe("127.0.0.1", port, "/readyz"), ports=(port,))

    async def prepare(self, planes: ControlPlanes, rest: Rest) -> None:
        await asyncio.to_thread(planes.install_crds)

    def pod(self, name: str, group: str | None, gpus: int = 1, annotations: dict[str, str] | None = None) -> Obj:
        return {"metadata": _meta(name, {"kubeferry.io/pod-group": group} if group else {}, annotations),
                "spec": {"schedulerName": "kube-ferry", "restartPolicy": "Never",
                         "containers": [_gpu_container(gpus)]}}

    def group(self, name: str, members: int, queue: str | None = None) -> tuple[str, Obj] | None:
        if members == 1:
            return None  # a single pod is a job of its own (its namespace names its queue)
        return ("scheduling.kubeferry.io/v1alpha1/podgroups",
                {"apiVersion": "scheduling.kubeferry.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": name},
                 "spec": {"minMember": members, **({"queue": queue} if queue else {})}})

    def compressed(self, workdir: Path, factor: float) -> Contender:
        """Its time constants (the ferry preset's, for real time) divided by ``factor``, in its configuration
        file."""
        from scheduler.core.scheduler import SchedulerConfig

        cfg = SchedulerConfig()
        values = {"minRuntimeSeconds": cfg.min_runtime_s, "victimCooldownSeconds": cfg.victim_cooldown_s,
                  "preemptionRetrySeconds": cfg.preemption_retry_s,
                  "reservationAfterSeconds": cfg.reservation_after_s,
                  "starvationPreemptAfterSeconds": cfg.starvation_preempt_after_s}
        path = workdir / "compressed-config.yaml"
        path.write_text("".join(f"{k}: {v / factor:.3f}\n" for k, v in values.items() if v is not None))
        return self.with_args(f"--config={path}")

    def queue(self, name: str, namespace: str, guaranteed_gpus: int, weight: int, grace_s: int,
              preemptor_delay_s: int) -> tuple[str, Obj]:
        return ("scheduling.kubeferry.io/v1alpha1/queues",
                {"apiVersion": "scheduling.kubeferry.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
                 "spec": {"namespaces": [namespace], "guaranteed": {"gpu": str(guaranteed_gpus)}, "weight": weight,
                          "preemption": {"reclaim": True, "victimGraceSeconds": grace_s,
                                         "preemptorDelaySeconds": preemptor_delay_s}}})


class KubeScheduler(Contender):
    def __init__(self, version: str) -> None:
        super().__init__("kube-scheduler", version, f"default profile, --kube-api-qps={QPS} --kube-api-burst={BURST}",
                         gangs=False)

    def spec(self, planes: ControlPlanes) -> ComponentSpec:
        port = _free_port("kube-scheduler")
        kc = planes.kubeconfig(COMPUTE)
        return ComponentSpec(
            name="bench-kube-scheduler",
            argv=[str(planes.bin.path("kube-scheduler")), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                  f"--authorization-kubeconfig={kc}", "--leader-elect=false", "--bind-address=127.0.0.1",
                  f"--secure-port={port}", f"--cert-dir={planes.dir / 'bench-kube-scheduler'}",
                  f"--kube-api-qps={QPS}", f"--kube-api-burst={BURST}", *self.args],
            log=planes.dir / "logs" / "bench-kube-scheduler.log",
            probe=insecure_https_probe("127.0.0.1", port, "/healthz"), ports=(port,))

    def pod(self, name: str, group: str | None, gpus: int = 1, annotations: dict[str, str] | None = None) -> Obj:
        return {"metadata": _meta(name, {}, annotations),
                "spec": {"schedulerName": "default-scheduler", "restartPolicy": "Never",
                         "containers": [_gpu_container(gpus)]}}


class Volcano(Contender):
    """vc-scheduler with the issue's configuration. It ignores pods without a PodGroup, so a single pod
    gets one of its own (as Volcano's pg-controller would create); its ``default`` Queue must be Open
    (Volcano's queue controller does that; here the benchmark does)."""

    def __init__(self, scheduler: Path, crds: Path, version: str) -> None:
        super().__init__("volcano", version, f"{VOLCANO_CONF.splitlines()[0]}; plugins priority, gang, conformance | "
                         f"overcommit, drf, predicates, proportion, nodeorder, binpack; schedule-period 1 s (default); "
                         f"--kube-api-qps={QPS} --kube-api-burst={BURST}")
        self.scheduler = scheduler
        self.crds = crds

    def spec(self, planes: ControlPlanes) -> ComponentSpec:
        conf = planes.dir / "volcano-scheduler.conf"
        conf.write_text(VOLCANO_CONF)
        health = _free_port("vc-scheduler healthz")
        metrics = _free_port("vc-scheduler metrics")
        return ComponentSpec(
            name="bench-volcano",
            argv=[str(self.scheduler), f"--kubeconfig={planes.kubeconfig(COMPUTE)}", f"--scheduler-conf={conf}",
                  "--leader-elect=false", "--enable-healthz", f"--healthz-address=127.0.0.1:{health}",
                  f"--listen-address=127.0.0.1:{metrics}", f"--kube-api-qps={QPS}", f"--kube-api-burst={BURST}",
                  "--cache-dumper=false", "-v=1", *self.args],
            log=planes.dir / "logs" / "bench-volcano.log",
            probe=http_probe("127.0.0.1", health, "/healthz"), ports=(health, metrics))

    async def prepare(self, planes: ControlPlanes, rest: Rest) -> None:
        kubectl = [str(planes.bin.path("kubectl")), f"--kubeconfig={planes.kubeconfig(COMPUTE)}"]
        for args in (["apply", "--server-side", "-f", str(self.crds)],
                     ["wait", "--for=condition=Established", "--timeout=90s", "crd", "--all"]):
            proc = await asyncio.create_subprocess_exec(*kubectl, *args, stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.PIPE)
            _, err = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"kubectl {' '.join(args[:2])}: {err.decode()[-300:]}")

    async def ready(self, rest: Rest) -> None:
        url = path("scheduling.volcano.sh", "v1beta1", "queues", name="default")
        for _ in range(600):  # vc-scheduler creates the default Queue at start
            if await rest.get_or_none(url) is not None:
                await rest.patch(url + "/status", {"status": {"state": "Open"}})
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("vc-scheduler did not create the default Queue")

    def pod(self, name: str, group: str | None, gpus: int = 1, annotations: dict[str, str] | None = None) -> Obj:
        return {"metadata": _meta(name, {}, {**(annotations or {}), "scheduling.k8s.io/group-name": group or name}),
                "spec": {"schedulerName": "volcano", "restartPolicy": "Never", "containers": [_gpu_container(gpus)]}}

    def group(self, name: str, members: int, queue: str | None = None) -> tuple[str, Obj] | None:
        return ("scheduling.volcano.sh/v1beta1/podgroups",
                {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
                 "spec": {"minMember": members, "queue": queue or "default"}})

    def queue(self, name: str, namespace: str, guaranteed_gpus: int, weight: int, grace_s: int,
              preemptor_delay_s: int) -> tuple[str, Obj]:
        """Volcano's proportion plugin shares by weight; its default actions never preempt, so guarantees
        and grace have no counterpart (a ``guarantee`` would fence capacity off even while it idles)."""
        return ("scheduling.volcano.sh/v1beta1/queues",
                {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name},
                 "spec": {"weight": weight, "reclaimable": True}})

    async def open_queue(self, rest: Rest, url: str) -> None:
        await rest.patch(f"{url}/status", {"status": {"state": "Open"}})  # Volcano's queue controller would

    def compressed(self, workdir: Path, factor: float) -> Contender:
        """The 0.2 s cycle Kube-Ferry runs: the 1 s default would stretch compressed waits."""
        return self.with_args("--schedule-period=200ms")
