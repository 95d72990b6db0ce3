"""Local control planes: one shared etcd, one compute cluster with kwok GPU nodes, N tenant clusters.

Everything binds to 127.0.0.1 and lives under one folder. The layout (ports, certificates,
kubeconfigs, command lines) is decided once by :meth:`ControlPlanes.prepare`; components can then
be started, stopped, killed and restarted one by one, which fault tests rely on.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from ferry.binaries import Binaries
from ferry.cluster import bootstrap, kubeconfig, pki
from ferry.cluster.gpunodes import MODEL_LABEL, pool_name
from ferry.cluster.ports import PortAllocator
from ferry.cluster.process import (
    Component,
    ComponentSpec,
    StartError,
    http_probe,
    https_probe,
    insecure_https_probe,
)

COMPUTE = "compute"
LOCAL_NODE_PREFIX = "local-gpu-node"  # a tenant's own GPU nodes (--tenant-gpu-nodes)
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
WEBHOOK_SERVICE_HOST = "kube-ferry-scheduler-webhook.kube-ferry-system.svc"
STATE_FILE = "state.json"
ALWAYS_ALLOW = "/healthz,/readyz,/livez,/metrics"


def tenant_name(i: int) -> str:
    return f"tenant-{i}"


@dataclass(frozen=True)
class Shape:
    """What the user asked for."""

    tenants: int = 1
    gpu_nodes: int = 4
    gpus_per_node: int = 8
    base_port: int | None = None
    tenant_gpu_nodes: int = 0  # GPU nodes of each tenant's own (local first, the shared cluster when full)
    gpu_models: tuple[str, ...] = ()  # the compute GPU nodes' products, in equal blocks (default: one)
    own_etcd: tuple[str, ...] = ()  # clusters with an etcd of their own (the rest share one)

    def validate(self) -> None:
        if not 0 <= self.tenants <= 50:
            raise ValueError(f"--tenants must be between 0 and 50, got {self.tenants}")
        if not 0 <= self.gpu_nodes <= 10000:
            raise ValueError(f"--gpu-nodes must be between 0 and 10000, got {self.gpu_nodes}")
        if not 0 <= self.tenant_gpu_nodes <= 1000:
            raise ValueError(f"--tenant-gpu-nodes must be between 0 and 1000, got {self.tenant_gpu_nodes}")
        if not 1 <= self.gpus_per_node <= 64:
            raise ValueError(f"--gpus-per-node must be between 1 and 64, got {self.gpus_per_node}")
        if len({pool_name(m) for m in self.gpu_models}) != len(self.gpu_models) or len(self.gpu_models) > 4 \
                or not all(re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", m) for m in self.gpu_models):
            raise ValueError("--gpu-models must be at most 4 label values whose lower-case names differ, got "
                             + ",".join(self.gpu_models))
        if self.base_port is not None and not 1024 <= self.base_port <= 65000:
            raise ValueError(f"--base-port must be between 1024 and 65000, got {self.base_port}")


@dataclass
class ClusterInfo:
    """One Kubernetes cluster of the set: where it listens and how to reach it as admin."""

    name: str
    apiserver_port: int
    pki: Path
    kubeconfig: Path

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"


Progress = Callable[[str], None]


class ControlPlanes:
    def __init__(self, directory: Path, shape: Shape, binaries: Binaries) -> None:
        self.dir = directory.resolve()
        self.shape = shape
        self.bin = binaries
        self.clusters: dict[str, ClusterInfo] = {}
        self.components: dict[str, Component] = {}
        self._phases: list[list[str]] = []
        # One allocator for every port of these clusters: a port it gave out is never given again, even
        # after its probe socket is released and before the component binds it (two allocators could
        # hand the same free port to two components that start later).
        self._ports = PortAllocator(shape.base_port)

    # ---------------------------------------------------------------- layout
    @property
    def tenant_names(self) -> list[str]:
        return [tenant_name(i) for i in range(1, self.shape.tenants + 1)]

    def kubeconfig(self, cluster: str) -> Path:
        return self.clusters[cluster].kubeconfig

    def prepare(self) -> None:
        """Allocate ports, write certificates, kubeconfigs and configs; build component specs."""
        self.shape.validate()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        ports = self._ports
        try:
            shared = self._add_etcd("etcd")
            for name in [COMPUTE, *self.tenant_names]:
                info = self._make_cluster(name, ports.take(f"{name} apiserver"))
                etcd_url = self._add_etcd(f"etcd-{name}") if name in self.shape.own_etcd else shared
                self._add(1, self._apiserver_spec(info, etcd_url))
                self._add(2, self._kcm_spec(info, ports.take(f"{name} controller-manager")))
                if name != COMPUTE:
                    self._add(2, self._scheduler_spec(info, ports.take(f"{name} kube-scheduler")))
            self._add(2, self._kwok_spec(self.clusters[COMPUTE], ports.take("kwok kubelet API")))
            if self.shape.tenant_gpu_nodes:
                for name in self.tenant_names:
                    self._add(2, self._kwok_spec(self.clusters[name], ports.take(f"{name} kwok kubelet API")))
        finally:
            ports.release()

    def _add(self, phase: int, spec: ComponentSpec) -> None:
        while len(self._phases) <= phase:
            self._phases.append([])
        self._phases[phase].append(spec.name)
        self.components[spec.name] = Component(spec)

    def _make_cluster(self, name: str, port: int) -> ClusterInfo:
        folder = self.dir / name / "pki"
        ca = pki.CertificateAuthority(folder, f"kube-ferry-{name}-ca")
        ca.issue(
            "apiserver", "kube-apiserver", server=True,
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"),
            ips=("127.0.0.1", "10.96.0.1"),
        )
        ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", orgs=("system:masters",), client=True)
        admin = ca.issue("admin", "kubernetes-admin", orgs=("system:masters",), client=True)
        # The aggregation layer (metrics.k8s.io for `kubectl top`): the apiserver proxies to an extension
        # apiserver with a client certificate of its own CA, which the extension trusts to name the user.
        front = pki.CertificateAuthority(folder / "front-proxy", f"kube-ferry-{name}-front-proxy-ca")
        front.issue("front-proxy-client", "front-proxy-client", client=True)
        kcm = ca.issue("controller-manager", "system:kube-controller-manager", client=True)
        pki.service_account_keys(folder)
        server = f"https://127.0.0.1:{port}"
        info = ClusterInfo(name, port, folder, self.dir / f"{name}.kubeconfig")
        kubeconfig.write(info.kubeconfig, cluster=name, server=server, ca=ca.cert_path,
                         cert=admin.cert, key=admin.key, user=f"{name}-admin")
        kubeconfig.write(folder / "controller-manager.kubeconfig", cluster=name, server=server,
                         ca=ca.cert_path, cert=kcm.cert, key=kcm.key, user="system:kube-controller-manager")
        if name == COMPUTE or self.shape.tenant_gpu_nodes:
            ca.issue("kwok-serving", "kwok", server=True, dns=("localhost",), ips=("127.0.0.1",))
            # kwok manages nodes and pods: status, leases and events across the cluster.
            kw = ca.issue("kwok", "kwok-controller", orgs=("system:masters",), client=True)
            kubeconfig.write(folder / "kwok.kubeconfig", cluster=name, server=server,
                             ca=ca.cert_path, cert=kw.cert, key=kw.key, user="kwok-controller")
        if name == COMPUTE:
            for tenant in self.tenant_names:  # each vnode: its own identity, rights granted per namespace
                vn = ca.issue(f"vnode-{tenant}", f"kube-ferry:vnode:{tenant}", orgs=("kube-ferry:vnodes",),
                              client=True)
                kubeconfig.write(folder / f"vnode-{tenant}.kubeconfig", cluster=name, server=server,
                                 ca=ca.cert_path, cert=vn.cert, key=vn.key, user=f"kube-ferry:vnode:{tenant}")
        else:
            sched = ca.issue("scheduler", "system:kube-scheduler", client=True)
            kubeconfig.write(folder / "scheduler.kubeconfig", cluster=name, server=server,
                             ca=ca.cert_path, cert=sched.cert, key=sched.key, user="system:kube-scheduler")
            vn = ca.issue("vnode", "kube-ferry:vnode", orgs=("kube-ferry:vnodes",), client=True)
            kubeconfig.write(folder / "vnode.kubeconfig", cluster=name, server=server,
                             ca=ca.cert_path, cert=vn.cert, key=vn.key, user="kube-ferry:vnode")
            ca.issue("vnode-serving", f"ferry-{name}", server=True, dns=("localhost", f"ferry-{name}"),
                     ips=("127.0.0.1",))
        self.clusters[name] = info
        return info

    def _log(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    def _add_etcd(self, name: str) -> str:
        """An etcd (its data in ``<dir>/<name>``); returns its client URL."""
        client, peer = self._ports.take(f"{name} client"), self._ports.take(f"{name} peer")
        self._add(0, self._etcd_spec(name, client, peer))
        return f"http://127.0.0.1:{client}"

    def _etcd_spec(self, name: str, client_port: int, peer_port: int) -> ComponentSpec:
        client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        return ComponentSpec(
            name=name,
            argv=[
                str(self.bin.path("etcd")), "--name=ferry", f"--data-dir={self.dir / name}",
                f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=ferry={peer_url}", "--unsafe-no-fsync=true",
                "--auto-compaction-mode=periodic", "--auto-compaction-retention=5m",
                "--quota-backend-bytes=8589934592", "--log-level=warn",
            ],
            log=self._log(name),
            probe=http_probe("127.0.0.1", client_port, "/health"),
            ports=(client_port, peer_port),
        )

    def _apiserver_spec(self, info: ClusterInfo, etcd_url: str) -> ComponentSpec:
        p = info.pki
        return ComponentSpec(
            name=f"{info.name}-apiserver",
            argv=[
                str(self.bin.path("kube-apiserver")),
                f"--etcd-servers={etcd_url}", f"--etcd-prefix=/kube-ferry/{info.name}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--secure-port={info.apiserver_port}",
                f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--service-account-issuer={info.server}",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=Node,RBAC",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={self.dir / info.name / 'certs'}",
                "--max-requests-inflight=1000", "--max-mutating-requests-inflight=500",
                f"--requestheader-client-ca-file={p / 'front-proxy' / 'ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={p / 'front-proxy' / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={p / 'front-proxy' / 'front-proxy-client.key'}",
            ],
            log=self._log(f"{info.name}-apiserver"),
            probe=https_probe(f"{info.server}/readyz", p / "ca.crt", p / "admin.crt", p / "admin.key"),
            ports=(info.apiserver_port,),
            ready_timeout=120,
        )

    def _kcm_spec(self, info: ClusterInfo, port: int) -> ComponentSpec:
        p = info.pki
        kc = p / "controller-manager.kubeconfig"
        return ComponentSpec(
            name=f"{info.name}-controller-manager",
            argv=[
                str(self.bin.path("kube-controller-manager")),
                f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--authorization-always-allow-paths={ALWAYS_ALLOW}",
                f"--service-account-private-key-file={p / 'sa.key'}", f"--root-ca-file={p / 'ca.crt'}",
                "--use-service-account-credentials=true",
                f"--cert-dir={self.dir / info.name / 'certs'}",
                "--kube-api-qps=200", "--kube-api-burst=400",
                "--concurrent-job-syncs=20",
                # kwok's node watch backs off for up to a minute after an apiserver restart, and only
                # a watch event lets it answer a NotReady mark: a grace over the longest outage kept
                # here (60 s) keeps simulated nodes from dropping the tenants' capacity for as long.
                *(["--node-monitor-grace-period=2m"] if info.name == COMPUTE else []),
            ],
            log=self._log(f"{info.name}-controller-manager"),
            probe=insecure_https_probe("127.0.0.1", port, "/healthz"),
            ports=(port,),
        )

    def _scheduler_spec(self, info: ClusterInfo, port: int) -> ComponentSpec:
        kc = info.pki / "scheduler.kubeconfig"
        return ComponentSpec(
            name=f"{info.name}-kube-scheduler",
            argv=[
                str(self.bin.path("kube-scheduler")),
                f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--authorization-always-allow-paths={ALWAYS_ALLOW}",
                f"--cert-dir={self.dir / info.name / 'certs'}",
                # Two writes per pod (binding + event): the default 50 QPS would cap tenants at 25 pods/s.
                "--kube-api-qps=500", "--kube-api-burst=1000",
            ],
            log=self._log(f"{info.name}-kube-scheduler"),
            probe=insecure_https_probe("127.0.0.1", port, "/healthz"),
            ports=(port,),
        )

    def _kwok_spec(self, info: ClusterInfo, port: int) -> ComponentSpec:
        """kwok for a cluster's simulated GPU nodes: the compute cluster's, or a tenant's own."""
        home = self.dir / info.name
        stages, pod_log = home / "kwok-stages.yaml", home / "pod.log"
        # CRI log format, as kubelets store container logs (kwok parses it).
        pod_log.write_text("".join(f"2026-01-01T00:00:{i:02d}.000000000Z stdout F kube-ferry simulated workload: "
                                   f"line {i}\n" for i in range(1, 21)))
        root, attach_log = home / "pod-root", home / "attach.log"
        root.mkdir(exist_ok=True)
        attach_log.touch()
        # Simulated pods answer kubectl like real ones: exec runs the command on this machine in
        # pod-root/ (so cp works), attach follows attach.log, every forwarded port echoes (cat).
        logs = (f"---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: ClusterLogs\nmetadata:\n  name: every-pod\n"
                f"spec:\n  selector: {{}}\n  logs:\n  - logsFile: {pod_log}\n    follow: true\n"
                f"---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: ClusterExec\nmetadata:\n  name: every-pod\n"
                f"spec:\n  selector: {{}}\n  execs:\n  - local:\n      workDir: {root}\n"
                f"---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: ClusterAttach\nmetadata:\n  name: every-pod\n"
                f"spec:\n  selector: {{}}\n  attaches:\n  - logsFile: {attach_log}\n"
                "---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: ClusterPortForward\nmetadata:\n  name: every-pod\n"
                "spec:\n  selector: {}\n  forwards:\n  - command: [cat]\n"
                # kwok plays pod stages 4 at a time by default: a ceiling of some 60 pods/s here.
                "---\napiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n"
                "  enableDebuggingHandlers: true\n"
                "  podPlayStageParallelism: 32\n  nodePlayStageParallelism: 4\n  nodeLeaseParallelism: 8\n"
                "  podsOnNodeSyncParallelism: 2\n")
        config = resources.files("ferry.cluster")
        stages.write_text(config.joinpath("stages/kwok-stages.yaml").read_text()
                          + config.joinpath("stages/kwok-metrics.yaml").read_text() + logs)
        p = info.pki
        return ComponentSpec(
            name=f"{info.name}-kwok",
            argv=[
                str(self.bin.path("kwok")),
                f"--kubeconfig={p / 'kwok.kubeconfig'}", f"--config={stages}",
                "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--manage-nodes-with-label-selector=", "--manage-single-node=",
                "--cidr=10.128.0.0/12", "--node-ip=127.0.0.1", "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{port}", f"--node-port={port}",
                f"--tls-cert-file={p / 'kwok-serving.crt'}", f"--tls-private-key-file={p / 'kwok-serving.key'}",
            ],
            log=self._log(f"{info.name}-kwok"),
            probe=insecure_https_probe("127.0.0.1", port, "/healthz"),
            ports=(port,),
        )

    # ------------------------------------------------------------ kube-ferry
    def _kubectl(self, cluster: str, *args: str, stdin: str | None = None) -> None:
        import subprocess

        cmd = [str(self.bin.path("kubectl")), f"--kubeconfig={self.kubeconfig(cluster)}", *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False, input=stdin)
        if res.returncode != 0:
            raise StartError(f"kubectl {' '.join(args[:2])} on {cluster} failed: {res.stderr.strip()[-300:]}")

    def install_crds(self) -> None:
        """Install Kube-Ferry: CRDs, the default Queue and vnode rights in the compute cluster, one
        namespace + Queue per tenant; in each tenant cluster the vnode's rights, the StorageClass it
        provisions and PodGroup CRDs of the gang conventions it plays. Idempotent (server-side apply)."""
        crds = MANIFESTS / "crds"
        self._kubectl(COMPUTE, "apply", "--server-side", "-k", str(crds))
        self._kubectl(COMPUTE, "wait", "--for=condition=Established", "--timeout=60s", *_files(crds))
        self._kubectl(COMPUTE, "apply", "--server-side", "-f", str(MANIFESTS / "compute" / "namespace.yaml"),
                      "-f", str(MANIFESTS / "compute" / "default-queue.yaml"),
                      "-f", str(MANIFESTS / "compute" / "rbac-vnode.yaml"),
                      "-f", str(MANIFESTS / "compute" / "flowcontrol.yaml"))
        self._kubectl(COMPUTE, "apply", "--server-side", "-f", "-", stdin=local_webhooks(
            (MANIFESTS / "compute" / "webhook.yaml").read_text(), self.webhook_port))
        template = (MANIFESTS / "tenant-template.yaml").read_text()
        for tenant in self.tenant_names:
            self._kubectl(COMPUTE, "apply", "--server-side", "-f", "-", stdin=template.replace("${TENANT}", tenant))
            tcrds = MANIFESTS / "tenant-crds"
            self._kubectl(tenant, "apply", "--server-side", "-k", str(tcrds))
            self._kubectl(tenant, "apply", "--server-side", "-f", str(MANIFESTS / "tenant" / "rbac-vnode.yaml"),
                          "-f", str(MANIFESTS / "tenant" / "storageclass.yaml"))
            self._kubectl(tenant, "wait", "--for=condition=Established", "--timeout=60s", *_files(tcrds))

    @functools.cached_property
    def webhook_port(self) -> int:
        """Where the first scheduler serves the Queue admission webhook (the compute API server calls it)."""
        port = self._ports.take("scheduler webhook")
        self._ports.release()
        return port

    def add_scheduler(self, name: str = "kube-ferry-scheduler", extra: tuple[str, ...] = ()) -> Component:
        """The Kube-Ferry scheduler service as a supervised component (started with the rest). The first
        one added serves the Queue webhook (one port: the others leave it to that one)."""
        import sys

        webhook: list[str] = []
        if not any(c.startswith("kube-ferry-scheduler") for c in self.components):
            webhook = [f"--webhook-port={self.webhook_port}", "--webhook-address=127.0.0.1",
                       f"--webhook-hosts={WEBHOOK_SERVICE_HOST},127.0.0.1"]
        port = self._ports.take(f"{name} metrics")
        self._ports.release()
        spec = ComponentSpec(
            name=name,
            argv=[sys.executable, "-m", "ferry", "scheduler", f"--kubeconfig={self.kubeconfig(COMPUTE)}",
                  f"--metrics-port={port}", *webhook, *extra],
            log=self._log(name),
            probe=http_probe("127.0.0.1", port, "/readyz"),
            ports=(port,),
        )
        return self.add_component(spec)

    def add_vnode(self, tenant: str, extra: tuple[str, ...] = ()) -> Component:
        """The tenant's vnode as a supervised component, with its own credentials on both sides; its compute
        pods' in-cluster clients are pointed at the tenant API (at 127.0.0.1: simulated pods are this host's).
        Where the compute GPU nodes are of several products, a GPU pool per product."""
        import sys

        models = self.shape.gpu_models if len(self.shape.gpu_models) > 1 else ()
        pools = [f"--gpu-pool={pool_name(m)}={MODEL_LABEL}={m}" for m in models]
        kubelet = self._ports.take_block(1 + len(pools), f"{tenant} vnode kubelet APIs")
        metrics = self._ports.take(f"{tenant} vnode metrics")
        self._ports.release()
        tp = self.clusters[tenant].pki
        spec = ComponentSpec(
            name=f"{tenant}-vnode",
            argv=[sys.executable, "-m", "ferry", "vnode", f"--tenant={tenant}",
                  f"--tenant-kubeconfig={tp / 'vnode.kubeconfig'}",
                  f"--compute-kubeconfig={self.clusters[COMPUTE].pki / f'vnode-{tenant}.kubeconfig'}",
                  f"--kubelet-port={kubelet}", f"--metrics-port={metrics}",
                  f"--serving-cert={tp / 'vnode-serving.crt'}", f"--serving-key={tp / 'vnode-serving.key'}",
                  f"--client-ca={tp / 'ca.crt'}", "--storage-class=kube-ferry",
                  f"--tenant-api=127.0.0.1:{self.clusters[tenant].apiserver_port}", *pools, *extra],
            log=self._log(f"{tenant}-vnode"),
            probe=http_probe("127.0.0.1", metrics, "/readyz"),
            ports=(*range(kubelet, kubelet + 1 + len(pools)), metrics),
        )
        return self.add_component(spec)

    # ------------------------------------------------------------- lifecycle
    def add_component(self, spec: ComponentSpec, after_bootstrap: bool = True) -> Component:
        """Register an extra process (scheduler, vnode) started after the control planes."""
        phase = 3 if after_bootstrap else 2
        self._add(phase, spec)
        return self.components[spec.name]

    def start(self, progress: Progress = lambda _: None) -> None:
        """Start every component phase by phase, then create GPU nodes and wait for readiness.
        On any failure everything started so far is stopped and StartError is raised."""
        try:
            for i, phase in enumerate(self._phases):
                if i == 3:  # Kube-Ferry's own components come after the control planes are ready
                    self._bootstrap(progress)
                    self.install_crds()
                    progress("Kube-Ferry CRDs and the default Queue installed")
                self._start_many(phase, progress)
            if len(self._phases) <= 3:
                self._bootstrap(progress)
        except BaseException:
            self.stop()
            raise

    def _start_many(self, names: Iterable[str], progress: Progress) -> None:
        comps = [self.components[n] for n in names]
        for c in comps:
            c.start()
        for c in comps:
            c.wait_ready()
            progress(f"{c.name} ready (pid {c.pid})")

    def _bootstrap(self, progress: Progress) -> None:
        compute = self.clusters[COMPUTE].kubeconfig
        t0 = time.monotonic()

        async def run() -> None:
            local = self.shape.tenant_gpu_nodes
            await bootstrap.create_gpu_nodes(compute, self.shape.gpu_nodes, self.shape.gpus_per_node,
                                             models=self.shape.gpu_models)
            for tenant in self.tenant_names if local else ():
                await bootstrap.create_gpu_nodes(self.kubeconfig(tenant), local, self.shape.gpus_per_node,
                                                 prefix=LOCAL_NODE_PREFIX)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(bootstrap.wait_nodes_ready(compute, self.shape.gpu_nodes, timeout=120))
                for tenant in self.tenant_names if local else ():
                    tg.create_task(bootstrap.wait_nodes_ready(self.kubeconfig(tenant), local, timeout=120))
                for name in [COMPUTE, *self.tenant_names]:
                    tg.create_task(bootstrap.wait_service_account(self.kubeconfig(name), "default", timeout=120))

        try:
            asyncio.run(run())
        except* TimeoutError as eg:
            raise StartError(str(eg.exceptions[0])) from None
        progress(f"{self.shape.gpu_nodes} GPU nodes Ready, service accounts present ({time.monotonic() - t0:.1f} s)")

    def stop(self) -> None:
        """Stop everything, last-started first."""
        for phase in reversed(self._phases):
            for name in reversed(phase):
                self.components[name].stop()

    def pids(self) -> dict[str, int]:
        return {n: c.pid for n, c in self.components.items() if c.pid is not None and c.alive()}

    def write_state(self, supervisor_pid: int, ready: bool) -> None:
        state = {
            "supervisor_pid": supervisor_pid,
            "ready": ready,
            "shape": self.shape.__dict__,
            "clusters": {n: {"server": c.server, "kubeconfig": str(c.kubeconfig)} for n, c in self.clusters.items()},
            "components": {
                n: {"pid": c.pid, "alive": c.alive(), "starts": c.starts, "log": str(c.spec.log),
                    "ports": list(c.spec.ports)}
                for n, c in self.components.items()
            },
        }
        tmp = self.dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.dir / STATE_FILE)

    def remove_state(self) -> None:
        (self.dir / STATE_FILE).unlink(missing_ok=True)


def local_webhooks(manifests: str, port: int) -> str:
    """``manifests`` (YAML documents) with each admission webhook's Service replaced by the URL of one
    served on 127.0.0.1:``port``: local planes have no cluster network (envtest does the same)."""
    docs = [d for d in yaml.safe_load_all(manifests) if d]
    for d in docs:
        if d.get("kind") in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            for hook in d.get("webhooks") or ():
                service = hook["clientConfig"].pop("service")
                hook["clientConfig"]["url"] = f"https://127.0.0.1:{port}{service.get('path', '/')}"
    return yaml.safe_dump_all(docs, sort_keys=False)


def _files(kustomization: Path) -> list[str]:
    """``-f`` arguments for the objects of a kustomization folder (``kubectl wait`` has no ``-k``)."""
    return [a for f in sorted(kustomization.glob("*.yaml")) if f.name != "kustomization.yaml" for a in ("-f", str(f))]


def read_state(directory: Path) -> dict[str, object] | None:
    try:
        data: dict[str, object] = json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data


def clean_dir(directory: Path) -> None:
    """Remove what a previous run left (state, etcd data) but keep logs for post-mortems."""
    for path in [*directory.glob("etcd*"), directory / STATE_FILE]:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
