"""Settings of one vnode process (validated once, at start-up)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, IPvAnyAddress, field_validator

from vnode.podsecurity import PodSecurity
from vnode.translate import Bridge

DEFAULT_SERVED = ("kube-ferry", "volcano", "scheduler-plugins", "scheduler-plugins-scheduler")
# node labels the virtual node carries when every GPU node of the compute cluster has the same value (a key,
# or a prefix ending in "." or "/"): GPU feature discovery's, Kube-Ferry's GPU model, the region and zone
DEFAULT_ADVERTISED = ("nvidia.com/gpu.", "nvidia.com/cuda.", "nvidia.com/mig.", "kubeferry.io/gpu-model",
                      "topology.kubernetes.io/")


class VnodeConfig(BaseModel):
    tenant: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
    tenant_kubeconfig: Path | None = None  # None: in-cluster
    compute_kubeconfig: Path
    node_name: str = ""  # default ferry-<tenant>
    compute_namespace: str = ""  # default: the tenant's name
    queue: str = ""  # default: the tenant's name
    served_schedulers: tuple[str, ...] = DEFAULT_SERVED
    advertised_labels: tuple[str, ...] = DEFAULT_ADVERTISED
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

    def bridge(self) -> Bridge:
        return Bridge(tenant=self.tenant, node=self.node, namespace=self.namespace,
                      queue=self.queue or self.tenant, max_priority=self.max_priority,
                      pod_security=self.pod_security, dns_server=str(self.dns_server or ""),
                      cluster_domain=self.cluster_domain, tenant_api=self.tenant_api)
