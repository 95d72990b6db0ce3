"""``ferry vnode``: join one tenant cluster to the compute cluster."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

from vnode.config import DEFAULT_ADVERTISED, DEFAULT_DOMAINS, DEFAULT_SERVED


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("vnode", help="run the virtual node of one tenant cluster")
    p.add_argument("--tenant", required=True, help="tenant name (lower-case DNS label)")
    p.add_argument("--tenant-kubeconfig", type=Path,
                   help="default: the pod's ServiceAccount (the vnode runs in the tenant cluster)")
    p.add_argument("--compute-kubeconfig", type=Path, required=True)
    p.add_argument("--node-name", default="", help="virtual Node name (default ferry-<tenant>)")
    p.add_argument("--compute-namespace", default="", help="the tenant's compute namespace (default <tenant>)")
    p.add_argument("--queue", default="", help="the tenant's compute Queue (default <tenant>)")
    p.add_argument("--served-schedulers", default=",".join(DEFAULT_SERVED),
                   help="scheduler names whose pods this vnode binds (comma-separated)")
    p.add_argument("--advertise-labels", default=",".join(DEFAULT_ADVERTISED),
                   help="node label keys (or prefixes ending in . or /) the virtual node carries when every GPU "
                        "node of the compute cluster has the same value; empty: none")
    p.add_argument("--domain-labels", default=",".join(DEFAULT_DOMAINS),
                   help="topology label keys (or prefixes ending in . or /) that the GPU nodes of the compute cluster "
                        "carry with several values (racks, zones): the virtual node carries each with its own name "
                        "for value, so a rule per domain (JobSet's exclusive placement, pod affinity) is met there and "
                        "over the compute nodes' domains by the compute cluster's scheduler; empty: none")
    p.add_argument("--gpu-pool", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                   help="a virtual node <node>-NAME for the compute GPU nodes with these labels (e.g. one GPU "
                        "product): its capacity and labels are the pool's, the pods it is given run there; its "
                        "kubelet API listens on --kubelet-port + its place among the pools (repeat for each pool)")
    p.add_argument("--pod-security", default="baseline", choices=("privileged", "baseline", "restricted"))
    p.add_argument("--max-priority", type=int, default=0, help="highest priority a tenant pod may carry down")
    p.add_argument("--node-ip", default="127.0.0.1")
    p.add_argument("--kubelet-port", type=int, default=10250)
    p.add_argument("--serving-cert", type=Path)
    p.add_argument("--serving-key", type=Path)
    p.add_argument("--client-ca", type=Path, help="CA that signs the tenant apiserver's kubelet-client cert")
    p.add_argument("--metrics-address", default="127.0.0.1")
    p.add_argument("--metrics-port", type=int, default=10255)
    p.add_argument("--max-pods", type=int, default=10000)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--heartbeat", type=float, default=10.0, help="seconds between Lease renewals")
    p.add_argument("--gc-interval", type=float, default=30.0,
                   help="seconds between sweeps for copied ConfigMaps/Secrets/Services no pod uses any more")
    p.add_argument("--gc-min-age", type=float, default=60.0,
                   help="an unused copy younger than this many seconds is kept (its pod may be on its way)")
    p.add_argument("--unreachable-after", type=float, default=10.0,
                   help="seconds the compute API must fail before the node reports it unreachable (a starting "
                        "apiserver answers 429 for a moment)")
    p.add_argument("--token-refresh-at", type=float, default=0.8,
                   help="renew a pod's ServiceAccount token after this share of its life (kubelets: 0.8)")
    p.add_argument("--storage-class", default="",
                   help="tenant StorageClass whose claims this vnode provisions as claims in the compute namespace "
                        "(provisioner kubeferry.io/vnode); default: none, and pods mounting claims are refused")
    p.add_argument("--compute-storage-class", default="",
                   help="StorageClass of those compute claims (default: the compute cluster's default class)")
    p.add_argument("--dns-server", default="",
                   help="IP of `ferry dns` in the compute cluster: the nameserver of compute pods whose tenant pod "
                        "uses the cluster's DNS, so peers resolve by their tenant names (default: none, the "
                        "compute cluster's own DNS)")
    p.add_argument("--cluster-domain", default="cluster.local", help="the tenant cluster's DNS zone")
    p.add_argument("--tenant-api", type=_optional_host_port,
                   help="HOST:PORT of the tenant apiserver as compute pods reach it (its certificate must name "
                        "HOST): their in-cluster clients talk to it, with the tenant token and CA they are given "
                        "(default: none; such clients find the compute cluster's API, which refuses that token)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run)

    d = sub.add_parser("dns", help="answer tenant peer names (<host>.<subdomain>.<namespace>.svc) in the compute "
                       "cluster; relay every other query to the cluster's DNS")
    d.add_argument("--compute-kubeconfig", type=Path, help="default: the pod's ServiceAccount (in-cluster)")
    d.add_argument("--listen", default="0.0.0.0:53", type=_host_port, help="UDP and TCP address to serve")
    d.add_argument("--upstream", type=_host_port,
                   help="HOST:PORT of the compute cluster's DNS, which answers every other name (default: the first "
                        "nameserver of /etc/resolv.conf, port 53: kube-dns for a pod of the cluster)")
    d.add_argument("--cluster-domain", default="cluster.local", help="the tenant clusters' DNS zone")
    d.add_argument("--metrics-address", default="0.0.0.0")
    d.add_argument("--metrics-port", type=int, default=10256)
    d.add_argument("--log-level", default="info")
    d.set_defaults(func=run_dns)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _optional_host_port(text: str) -> tuple[str, int] | None:
    """HOST:PORT, or nothing (as a manifest's empty setting passes it)."""
    return _host_port(text) if text else None


def _resolv_conf_nameserver(conf: Path) -> tuple[str, int] | None:
    """The first ``nameserver`` of a resolv.conf: the DNS this pod itself is given."""
    try:
        lines = conf.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            return fields[1], 53
    return None


def run_dns(args: argparse.Namespace) -> int:
    from ferry import log as flog
    from vnode import dnsserver

    flog.configure(args.log_level, json=True)
    if args.compute_kubeconfig is not None and not args.compute_kubeconfig.exists():
        print(f"ferry dns: error: --compute-kubeconfig: {args.compute_kubeconfig} does not exist", file=sys.stderr)
        return 2
    upstream = args.upstream or _resolv_conf_nameserver(Path("/etc/resolv.conf"))
    if upstream is None:
        print("ferry dns: error: --upstream: not given, and /etc/resolv.conf names no nameserver", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        host, port = args.listen
        asyncio.run(dnsserver.main(args.compute_kubeconfig, host, port, upstream, args.cluster_domain,
                                   args.metrics_address, args.metrics_port))
    return 0


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from ferry import log as flog
    from vnode.config import VnodeConfig, parse_pool

    flog.configure(args.log_level, json=True)
    try:
        pools = tuple(parse_pool(text) for text in args.gpu_pool)
    except ValueError as exc:
        print(f"ferry vnode: error: --gpu-pool: {exc}", file=sys.stderr)
        return 2
    try:
        cfg = VnodeConfig(
            tenant=args.tenant, tenant_kubeconfig=args.tenant_kubeconfig, compute_kubeconfig=args.compute_kubeconfig,
            node_name=args.node_name, compute_namespace=args.compute_namespace, queue=args.queue,
            served_schedulers=tuple(s for s in args.served_schedulers.split(",") if s),
            advertised_labels=tuple(s for s in args.advertise_labels.split(",") if s),
            domain_labels=tuple(s for s in args.domain_labels.split(",") if s), gpu_pools=pools,
            pod_security=args.pod_security, max_priority=args.max_priority, node_ip=args.node_ip,
            kubelet_port=args.kubelet_port, serving_cert=args.serving_cert, serving_key=args.serving_key,
            client_ca=args.client_ca, metrics_address=args.metrics_address, metrics_port=args.metrics_port,
            max_pods=args.max_pods, workers=args.workers, heartbeat_s=args.heartbeat,
            gc_interval_s=args.gc_interval, gc_min_age_s=args.gc_min_age,
            unreachable_after_s=args.unreachable_after, token_refresh_at=args.token_refresh_at,
            storage_class=args.storage_class, compute_storage_class=args.compute_storage_class,
            dns_server=args.dns_server, cluster_domain=args.cluster_domain, tenant_api=args.tenant_api,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        print(f"ferry vnode: error: --{'-'.join(str(x) for x in err['loc']).removesuffix('_s').replace('_', '-')}: "
              f"{err['msg']}",
              file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(cfg))
    return 0


async def _main(cfg: object) -> None:
    from vnode.app import main
    from vnode.config import VnodeConfig

    assert isinstance(cfg, VnodeConfig)
    await main(cfg)
