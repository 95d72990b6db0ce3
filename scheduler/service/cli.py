"""``ferry scheduler``: run the compute-cluster scheduler service."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scheduler.core.scheduler import CYCLE_PERIOD_S

if TYPE_CHECKING:
    from kubernetes_asyncio import client


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("scheduler", help="run the gang / queue scheduler against the compute cluster")
    p.add_argument("--kubeconfig", type=Path, help="default: the pod's ServiceAccount (in-cluster)")
    p.add_argument("--metrics-address", default="127.0.0.1")
    p.add_argument("--metrics-port", type=int, default=10259)
    p.add_argument("--leader-elect", action="store_true", help="schedule only while holding the Lease")
    p.add_argument("--identity", default=f"{socket.gethostname()}-{os.getpid()}")
    p.add_argument("--period", type=float, default=CYCLE_PERIOD_S, help="seconds between cycles at most")
    p.add_argument("--min-runtime", type=float, default=300.0,
                   help="seconds a job runs before it may be preempted (victim protection)")
    p.add_argument("--reservation-after", type=float, default=1800.0,
                   help="seconds a passed-over job waits before nodes are held for it")
    p.add_argument("--starvation-preempt-after", type=float, default=6 * 3600.0,
                   help="seconds after which a job whose held nodes did not drain may evict the borrowed "
                        "jobs that overtook it (0: never)")
    p.add_argument("--config", type=Path, help="YAML file of policy settings (a mounted ConfigMap), re-read "
                                               "while running; overrides the flags above")
    p.add_argument("--config-object", default="kube-ferry-system/kube-ferry-scheduler",
                   help="NAMESPACE/NAME of the ConfigMap holding --config: a refused file is an Event on it")
    p.add_argument("--runs-object", default="kube-ferry-system/kube-ferry-scheduler-runs",
                   help="NAMESPACE/NAME of the ConfigMap where the leader keeps what evicted jobs without a PodGroup "
                        "continue, for their next pods ('': in memory only)")
    p.add_argument("--webhook-port", type=int, default=0,
                   help="serve the Queue admission webhook (HTTPS) on this port; 0: do not")
    p.add_argument("--webhook-address", default="0.0.0.0")
    p.add_argument("--webhook-secret", default="kube-ferry-system/kube-ferry-webhook-tls",
                   help="NAMESPACE/NAME of the Secret holding the webhook's certificate (made if missing)")
    p.add_argument("--webhook-configuration", default="kube-ferry-queues",
                   help="the ValidatingWebhookConfiguration whose caBundle the scheduler keeps ('': none)")
    p.add_argument("--webhook-hosts", default="kube-ferry-scheduler-webhook.kube-ferry-system.svc",
                   help="comma-separated names the API server reaches the webhook by (its certificate names them)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ferry import log as flog

    flog.configure(args.log_level, json=True)
    if args.kubeconfig is not None and not args.kubeconfig.exists():
        print(f"ferry: error: kubeconfig {args.kubeconfig} does not exist", file=sys.stderr)
        return 1
    if args.runs_object and not all(args.runs_object.partition("/")[::2]):
        print("ferry: error: --runs-object needs NAMESPACE/NAME (or '' for none)", file=sys.stderr)
        return 1
    if args.webhook_port and (not _hosts(args) or not all(args.webhook_secret.partition("/")[::2])):
        print("ferry: error: --webhook-port needs --webhook-hosts (at least one name) and --webhook-secret "
              "as NAMESPACE/NAME", file=sys.stderr)
        return 1
    from scheduler.service.settings import ConfigError

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_main(args))
    except ConfigError as exc:
        print(f"ferry: error: {exc}", file=sys.stderr)
        return 1
    return 0


async def _main(args: argparse.Namespace) -> None:
    from ferry.health import make_app, serve
    from ferry.kube.rest import api_client
    from ferry.memory import give_back_periodically
    from ferry.shutdown import run_until_signalled
    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.service import metrics
    from scheduler.service.leader import LeaderElector
    from scheduler.service.service import SchedulerService, ServiceConfig
    from scheduler.service.settings import Settings, SettingsFile

    core = SchedulerConfig.preset("ferry", min_runtime_s=args.min_runtime, reservation_after_s=args.reservation_after,
                                  starvation_preempt_after_s=args.starvation_preempt_after or None,
                                  ).without_actions("grow")
    settings = SettingsFile(args.config, Settings(core, args.period))
    start = settings.load()  # a bad file at start is an exit with its reason (run() prints it)
    ns, _, name = args.config_object.partition("/")
    api = await api_client(args.kubeconfig)
    runs_ns, _, runs_name = args.runs_object.partition("/")
    service = SchedulerService(api, ServiceConfig(period_s=start.period_s, core=start.core, settings=settings,
                                                  config_object=(ns, name),
                                                  runs_object=(runs_ns, runs_name) if runs_name else None))
    elector: LeaderElector | None = None
    if args.leader_elect:
        service.leading.clear()

        def changed(leader: bool) -> None:
            metrics.IS_LEADER.set(1 if leader else 0)
            (service.leading.set if leader else service.leading.clear)()

        elector = LeaderElector(api, args.identity, on_change=changed)
    else:
        metrics.IS_LEADER.set(1)

    def ready() -> bool:
        return service.ready() and (elector is None or elector.known.is_set())

    runner = await serve(make_app(ready, metrics.REGISTRY), args.metrics_address, args.metrics_port)

    async def work() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(service.run())
            tg.create_task(give_back_periodically(metrics.MEMORY_GIVEN_BACK.inc))
            if elector is not None:
                tg.create_task(elector.run())
            if args.webhook_port:
                tg.create_task(_serve_webhook(api, args))

    async def cleanup() -> None:
        with contextlib.suppress(Exception):  # notes of the last second, while this replica still leads; briefly:
            async with asyncio.timeout(0.5):  # the Lease's release is what a standby waits on
                await service.save_runs()
        if elector is not None:
            await elector.release()  # a standby takes over now, not when the lease runs out
        with contextlib.suppress(Exception):
            await runner.cleanup()
        await api.close()

    await run_until_signalled(work(), cleanup)


async def _serve_webhook(api: client.ApiClient, args: argparse.Namespace) -> None:
    from scheduler.service.webhook import WebhookConfig, serve_webhook

    ns, _, name = args.webhook_secret.partition("/")
    await serve_webhook(api, WebhookConfig(
        port=args.webhook_port, address=args.webhook_address, secret=(ns, name),
        configuration=args.webhook_configuration,
        hosts=_hosts(args)))


def _hosts(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(h.strip() for h in args.webhook_hosts.split(",") if h.strip())
