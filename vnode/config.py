"""Settings of one vnode process (validated once, at start-up)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field, IPvAnyAddress, field_validator, model_validator

from vnode.podsecurity import PodSecurity
from vnode.translate import LABEL_VALUE, Bridge, Selector

DEFAULT_SERVED = ("kube-ferry", "volcano", "scheduler-plugins", "scheduler-plugins-scheduler")
# node labels the virtual node carries when every GPU node of the compute cluster has the same value (a key,
# or a prefix ending in "." or "/"): GPU feature discovery's, Kube-Ferry's GPU model, the region and zone
DEFAULT_ADVERTISED = ("nvidia.com/gpu.", "nvidia.com/cuda.", "nvidia.com/mig.", "kubeferry.io/gpu-model",
                      "topology.kubernetes.io/")
# topology domains (keys or prefixes) a virtual node stands for many of: it carries each such key with a value of
# its own, as it carries a hostname of its own (vnode/node.py ``domains``)
DEFAULT_DOMAINS = ("topology.kubernetes.io/", "kubeferry.io/topology-domain")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_POOL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?$")


def parse_pool(text: str) -> tuple[str, Selector]:
    """``NAME=KEY=VALUE[,KEY=VALUE...]`` (``--gpu-pool``): a pool's name and the node labels that make it."""
    name, sep, rest = text.partition("=")
    if not sep or not _POOL_NAME.match(name):
        raise ValueError(f"{text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...] with NAME a short lower-case DNS label")
    pairs: list[tuple[str, str]] = []
    for item in rest.split(","):
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
            raise ValueError(f"{text!r}: {item!r} is not a node label KEY=VALUE")
        pairs.append((key, value))
    return name, tuple(sorted(pairs))


class VnodeConfig(BaseModel):
    tenant: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
    tenant_kubeconfig: Path | None = None  # None: in-cluster
    compute_kubeconfig: Path
    node_name: str = ""  # default ferry-<tenant>
    compute_namespace: str = ""  # default: the tenant's name
    queue: str = ""  # default: the tenant's name
    served_schedulers: tuple[str, ...] = DEFAULT_SERVED
    advertised_labels: tuple[str, ...] = DEFAULT_ADVERTISED
    domain_labels: tuple[str, ...] = DEFAULT_DOMAINS
    # GPU pools (``--gpu-pool``): name -> the compute node labels that make it. Each is a virtual node of its
    # own, <node>-<name>, whose capacity and labels are its pool's and whose pods run only there
    gpu_pools: tuple[tuple[str, Selector], ...] = ()
    pod_security: PodSecurity = "baseline"
    max_priority: int = 0
    node_ip: str = "127.0.0.1"
    kubelet_port: int = Field(10250, ge=1, le=65535)
    serving_cert: Path | None = None
    serving_key: Path | None = None
    client_ca: Path | None = None  # CA of the tenant apiserver's kubelet-client certificate
    metrics_address: str = "127.0.0.1"
    metrics_port: int = Field(10255, ge=0, le=65535)
    max_pods: int = Field(10000, ge=1)
    workers: int = Field(16, ge=1, le=256)
    heartbeat_s: float = Field(10.0, gt=0)
    gc_interval_s: float = Field(30.0, gt=0)  # between sweeps for unused copies
    gc_min_age_s: float = Field(60.0, ge=5)  # a younger unused copy may be for a pod being created
    unreachable_after_s: float = Field(10.0, ge=0)  # compute API failing this long before the node says so
    token_refresh_at: float = Field(0.8, gt=0, lt=1)  # share of a token's life after which it is renewed
    # the tenant StorageClass whose claims this vnode provisions in the compute cluster (vnode/volumes.py);
    # empty: none, and pods mounting claims are refused
    storage_class: str = ""
    compute_storage_class: str = ""  # the compute claims' class; empty: the compute cluster's default
    # `ferry dns` (vnode/dnsserver.py): the nameserver of compute pods that use the cluster's DNS; empty: none
    dns_server: IPvAnyAddress | None = None
    cluster_domain: str = Field("cluster.local", pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
    # the tenant apiserver's HOST:PORT as compute pods reach it (its certificate must name HOST): their
    # in-cluster clients are pointed there, to the API whose token they carry; None: not given
    tenant_api: tuple[str, int] | None = None

    @field_validator("dns_server", mode="before")
    @classmethod
    def _empty_is_none(cls, v: object) -> object:
        return v or None

    @field_validator("gpu_pools")
    @classmethod
    def _distinct_pools(cls, pools: tuple[tuple[str, Selector], ...]) -> tuple[tuple[str, Selector], ...]:
        names = [n for n, _ in pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must differ: {', '.join(names)}")
        selectors = [s for _, s in pools]
        if len(set(selectors)) != len(selectors):
            raise ValueError("two pools select the same nodes")
        return pools

    @model_validator(mode="after")
    def _pool_ports(self) -> VnodeConfig:
        if self.kubelet_port + len(self.gpu_pools) > 65535:
            raise ValueError(f"the pools' kubelet ports (--kubelet-port + 1 .. + {len(self.gpu_pools)}) exceed 65535")
        if self.metrics_port in list(self.kubelets.values())[1:]:
            raise ValueError(f"a pool's kubelet port (--kubelet-port + its place among the pools) is the metrics port "
                             f"{self.metrics_port}: move one of them")
        if too_long := [n for n in self.kubelets if len(n) > 63]:
            raise ValueError(f"virtual node name {too_long[0]!r} is longer than 63 characters (a hostname label): "
                             "shorten the pool's name or --node-name")
        return self

    @field_validator("tenant_kubeconfig", "compute_kubeconfig")
    @classmethod
    def _exists(cls, p: Path | None) -> Path | None:
        if p is not None and not p.exists():
            raise ValueError(f"{p} does not exist")
        return p

    @property
    def node(self) -> str:
        return self.node_name or f"ferry-{self.tenant}"

    @property
    def namespace(self) -> str:
        return self.compute_namespace or self.tenant

    @property
    def kubelets(self) -> dict[str, int]:
        """Each virtual node's kubelet API port: the pools' follow the node's (one endpoint per node, so what a
        scraper reads of a node is that node's)."""
        return {self.node: self.kubelet_port,
                **{f"{self.node}-{name}": self.kubelet_port + i for i, (name, _) in enumerate(self.gpu_pools, 1)}}

    def bridge(self) -> Bridge:
        return Bridge(tenant=self.tenant, node=self.node, namespace=self.namespace,
                      queue=self.queue or self.tenant, max_priority=self.max_priority,
                      pod_security=self.pod_security, dns_server=str(self.dns_server or ""),
                      cluster_domain=self.cluster_domain, tenant_api=self.tenant_api,
                      pools=tuple((f"{self.node}-{name}", sel) for name, sel in self.gpu_pools))
