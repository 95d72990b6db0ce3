"""``ferry`` command line: local control planes, the scheduler, virtual nodes, the simulator."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from ferry import log as flog


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit 2."""


def _die(message: str, code: int = 1) -> NoReturn:
    print(f"ferry: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _progress(line: str) -> None:
    print(f"ferry: {line}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ binaries
def cmd_binaries(args: argparse.Namespace) -> int:
    from ferry import binaries

    try:
        found = binaries.build(_progress) if args.rebuild else binaries.ensure(_progress)
        if args.clients:
            from ferry.binaries.clients import ALL, ensure_operator

            for source in ALL:
                ensure_operator(source, _progress)
    except binaries.BuildError as exc:
        _die(str(exc))
    print(found.root)
    return 0


# ------------------------------------------------------------------------ up
def _positive(name: str, lo: int, hi: int) -> type[int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be between {lo} and {hi}, got {value}")
        return value

    parse.__name__ = name
    return parse  # type: ignore[return-value]


def cmd_up(args: argparse.Namespace) -> int:
    from ferry import binaries
    from ferry.cluster.planes import ControlPlanes, Shape, clean_dir, read_state
    from ferry.cluster.ports import PortInUse
    from ferry.cluster.process import StartError, pid_alive

    directory = Path(args.dir).resolve()
    if directory.exists() and not directory.is_dir():
        _die(f"--dir {directory} exists and is not a folder")
    state = read_state(directory)
    if state is not None:
        pid = state.get("supervisor_pid")
        if isinstance(pid, int) and pid_alive(pid) and pid != os.getpid():
            _die(f"{directory} is in use by a running `ferry up` (pid {pid}); run `ferry down --dir {directory}` first")
    shape = Shape(tenants=args.tenants, gpu_nodes=args.gpu_nodes, gpus_per_node=args.gpus_per_node,
                  base_port=args.base_port, tenant_gpu_nodes=args.tenant_gpu_nodes,
                  gpu_models=tuple(m for m in args.gpu_models.split(",") if m))
    try:
        shape.validate()
    except ValueError as exc:
        _die(str(exc), code=2)
    try:
        bins = binaries.ensure(_progress)
    except binaries.BuildError as exc:
        _die(str(exc))

    if args.detach and not args.supervise:
        return _detach(args, directory)

    (directory / "logs").mkdir(parents=True, exist_ok=True)
    clean_dir(directory)
    flog.configure(json=True, stream=(directory / "logs" / "supervisor.log").open("a", buffering=1))
    logger = flog.get("ferry.up")
    planes = ControlPlanes(directory, shape, bins)
    from ferry.cluster.supervisor import Supervisor

    sup = Supervisor(planes, logger)
    sup.install_signal_handlers()
    t0 = time.monotonic()
    try:
        planes.prepare()
        if not args.control_plane_only:
            planes.add_scheduler(extra=() if args.min_runtime is None else (f"--min-runtime={args.min_runtime}",))
            for tenant in planes.tenant_names:
                planes.add_vnode(tenant)
        planes.write_state(os.getpid(), ready=False)
        planes.start(_progress)
    except (StartError, PortInUse, ValueError) as exc:
        planes.stop()
        planes.remove_state()
        logger.error("start failed", error=str(exc))
        _die(str(exc))
    if sup.stopping.is_set():
        planes.stop()
        planes.remove_state()
        return 1
    elapsed = time.monotonic() - t0
    logger.info("ready", seconds=round(elapsed, 2))
    configs = " ".join(str(c.kubeconfig) for c in planes.clusters.values())
    _progress(f"ready in {elapsed:.1f} s; kubeconfigs: {configs}")
    sup.run(os.getpid())
    return 0


def _detach(args: argparse.Namespace, directory: Path) -> int:
    """Start the supervisor in its own session and return once it reports ready (or failed)."""
    from ferry.cluster.planes import read_state

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "logs").mkdir(exist_ok=True)
    out = directory / "logs" / "up.log"
    argv = [sys.executable, "-m", "ferry", "up", "--dir", str(directory), "--tenants", str(args.tenants),
            "--gpu-nodes", str(args.gpu_nodes), "--gpus-per-node", str(args.gpus_per_node),
            "--tenant-gpu-nodes", str(args.tenant_gpu_nodes), "--gpu-models", args.gpu_models, "--supervise"]
    if args.base_port is not None:
        argv += ["--base-port", str(args.base_port)]
    if args.control_plane_only:
        argv.append("--control-plane-only")
    if args.min_runtime is not None:
        argv += ["--min-runtime", str(args.min_runtime)]
    with out.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + args.timeout
    seen = 0
    while True:
        code = proc.poll()
        lines = out.read_text(errors="replace").splitlines()
        for line in lines[seen:]:
            print(line, file=sys.stderr, flush=True)
        seen = len(lines)
        if code is not None:
            errors = [ln for ln in lines if ln.startswith("ferry: error:")]
            if not errors:
                print(f"ferry: error: supervisor exited with code {code}; see {out}", file=sys.stderr)
            return 1
        state = read_state(directory)
        if state is not None and state.get("ready") is True and state.get("supervisor_pid") == proc.pid:
            print(f"ferry: up (supervisor pid {proc.pid}); stop with: ferry down --dir {directory}", file=sys.stderr)
            return 0
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
            _die(f"not ready after {args.timeout} s; see {out}")
        time.sleep(0.2)  # waiting on another process's state file


# ---------------------------------------------------------------------- down
def cmd_down(args: argparse.Namespace) -> int:
    from ferry.cluster.down import down

    directory = Path(args.dir).resolve()
    return down(directory, _progress)


def cmd_status(args: argparse.Namespace) -> int:
    import json

    if args.dir is not None:  # the local control planes of `ferry up`
        from ferry.cluster.planes import read_state

        state = read_state(Path(args.dir).resolve())
        if state is None:
            print("not running")
            return 1
        print(json.dumps(state, indent=2))
        return 0
    from ferry import status

    view = _against_cluster(args, status.collect)
    _print(view, args.output, lambda v: status.render(v, args.output == "wide"))
    return 0


def cmd_why_pending(args: argparse.Namespace) -> int:
    from ferry import whypending

    async def verdict(rest: Any) -> Any:
        return await whypending.explain(rest, args.namespace or _default_namespace(args), args.target)

    try:
        found = _against_cluster(args, verdict)
    except LookupError as exc:
        _die(str(exc))
    _print(found.as_dict(), args.output, lambda _: found.text())
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from ferry import status, usage

    now = datetime.now(UTC)
    try:
        since, until = usage.when(args.since, now), usage.when(args.until, now)
    except ValueError as exc:
        _die(str(exc))

    async def rows(rest: Any) -> Any:
        return await usage.collect(rest, since, until, args.by)

    found = _against_cluster(args, rows)
    _print(found, args.output, lambda r: status.table(r, usage.COLUMNS[args.by]) if r else "no usage recorded")
    return 0


def _kubeconfig(args: argparse.Namespace) -> Path:
    path = args.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube/config")
    if not Path(path).exists():
        _die(f"kubeconfig {path} does not exist (set --kubeconfig or KUBECONFIG)")
    return Path(path)


def _default_namespace(args: argparse.Namespace) -> str:
    """The kubeconfig context's namespace, as kubectl would use it."""
    import yaml

    conf = yaml.safe_load(_kubeconfig(args).read_text()) or {}
    name = args.context or conf.get("current-context")
    ctx = next((c.get("context") or {} for c in conf.get("contexts") or [] if c.get("name") == name), {})
    return str(ctx.get("namespace") or "default")


def _against_cluster(args: argparse.Namespace, work: Any) -> Any:
    """Run ``work(rest)`` against the cluster the kubeconfig (and --context) names; exit on API errors."""
    import asyncio

    from ferry.kube.rest import Rest, api_client

    async def run() -> Any:
        api = await api_client(_kubeconfig(args), context=args.context)
        try:
            return await work(Rest(api))
        finally:
            await api.close()

    try:
        return asyncio.run(run())
    except LookupError:
        raise
    except Exception as exc:
        _die(f"cannot read the cluster: {getattr(exc, 'reason', None) or exc}")


def _print(data: Any, output: str | None, text: Any) -> None:
    import json

    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        import yaml

        print(yaml.safe_dump(data, sort_keys=False), end="")
    else:
        print(text(data))


# -------------------------------------------------------------------- parser
def _cluster_flags(p: argparse.ArgumentParser, outputs: tuple[str, ...]) -> None:
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, then ~/.kube/config")
    p.add_argument("--context", help="kubeconfig context (default: its current context)")
    p.add_argument("-n", "--namespace", help="default: the context's namespace")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="accepted for kubectl habits; views are "
                                                                        "cluster-wide already")
    p.add_argument("-o", "--output", choices=outputs)


def build_parser() -> argparse.ArgumentParser:
    from ferry import __version__

    parser = argparse.ArgumentParser(prog="ferry", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ferry {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("up", help="start local control planes (compute + tenants) and Kube-Ferry")
    p.add_argument("--dir", required=True, help="folder for state, logs and kubeconfigs")
    p.add_argument("--tenants", type=_positive("--tenants", 0, 50), default=1)
    p.add_argument("--gpu-nodes", type=_positive("--gpu-nodes", 0, 10000), default=4)
    p.add_argument("--gpus-per-node", type=_positive("--gpus-per-node", 1, 64), default=8)
    p.add_argument("--tenant-gpu-nodes", type=_positive("--tenant-gpu-nodes", 0, 1000), default=0,
                   help="GPU nodes of each tenant's own: its pods run there first and overflow to the "
                        "virtual node when they are full")
    p.add_argument("--gpu-models", default="",
                   help="comma-separated GPU products of the compute GPU nodes, in equal blocks (default: one, "
                        "A100-SXM4-80GB); with several, each vnode has a GPU pool (a virtual node) per product")
    p.add_argument("--base-port", type=_positive("--base-port", 1024, 65000), default=None,
                   help="use consecutive ports from here instead of free ones the kernel picks")
    p.add_argument("--detach", action="store_true", help="return once ready and leave everything running")
    p.add_argument("--control-plane-only", action="store_true", help="no scheduler, no virtual nodes")
    p.add_argument("--min-runtime", type=_positive("--min-runtime", 0, 86400), default=None,
                   help="seconds a job runs before the scheduler may preempt it (default: the scheduler's, 300)")
    p.add_argument("--timeout", type=_positive("--timeout", 10, 7200), default=900,
                   help="seconds to wait for readiness with --detach (includes a first build)")
    p.add_argument("--supervise", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="stop everything `ferry up` started in DIR")
    p.add_argument("--dir", required=True)
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("status", help="queues of the compute cluster or the virtual node of a tenant cluster "
                                      "(with --dir: the state of a `ferry up` in DIR)")
    p.add_argument("--dir", help="print the state of the local control planes in DIR instead")
    _cluster_flags(p, outputs=("wide", "json", "yaml"))
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("usage", help="GPU-seconds per queue or job over a time range (the compute cluster's "
                                     "accounting records plus what runs now)")
    p.add_argument("--since", help="RFC 3339 time or a duration back from now (24h, 7d); default: all records")
    p.add_argument("--until", help="RFC 3339 time or a duration back from now; default: now")
    p.add_argument("--by", choices=("queue", "job"), default="queue")
    _cluster_flags(p, outputs=("json", "yaml"))
    p.set_defaults(func=cmd_usage)

    p = sub.add_parser("why-pending", help="why a pod or podgroup/NAME is not running, and what would let it run")
    p.add_argument("target", metavar="POD|podgroup/NAME")
    _cluster_flags(p, outputs=("json", "yaml"))
    p.set_defaults(func=cmd_why_pending)

    p = sub.add_parser("binaries", help="build (or find cached) kube-apiserver, etcd, kwok; print their folder")
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--clients", action="store_true",
                   help="also build (or find cached) the operators the integration tests run as tenant clients")
    p.set_defaults(func=cmd_binaries)

    _register_optional(sub)
    return parser


def _register_optional(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Subcommands owned by other packages register themselves here."""
    from importlib import import_module

    for module in ("scheduler.sim.cli", "scheduler.service.cli", "vnode.cli", "ferry.demo.run"):
        try:
            mod = import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue
            raise
        mod.register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def kubectl_plugin() -> int:
    """``kubectl ferry ...`` is ``ferry ...``."""
    return main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
