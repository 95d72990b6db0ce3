"""``ferry demo --dir DIR``: play the scenario on the clusters ``ferry up --dir DIR`` started.

Prepares a clean ``demo`` namespace in each tenant cluster (removing an earlier run's), then plays the
steps while an observer samples the clusters for the live view and the timeline. At the end it prints a
summary (each step's checked claim, GPU-seconds per queue from the accounting records), writes the PNG
timeline and a JSON report next to the kubeconfigs, and names the commands to explore. The clusters
stay up. Exit status 1 names the step whose claim did not come true, with what the clusters showed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from ferry.demo.objects import NAMESPACE
from ferry.demo.observe import Observer
from ferry.demo.scenario import MIN_NODES, TENANT_A, TENANT_B, Demo, DemoError, Step, steps
from ferry.kube.rest import Rest, api_client, path, status_of
from ferry.usage import collect

POLL = 0.5  # seconds between reads while a step waits for its claim (a condition with a deadline)
TAIL = 5.0  # seconds observed after the last step
SHAPE = ("--tenants", "2", "--gpu-nodes", "32", "--min-runtime", "20")  # what `--start` gives `ferry up`


def say(line: str) -> None:
    print(line, flush=True)


async def _gpu_nodes(compute: Rest) -> tuple[int, int]:
    nodes = (await compute.get(path("", "v1", "nodes")))["items"]
    gpus = [int(float((n.get("status", {}).get("allocatable") or {}).get("nvidia.com/gpu", 0))) for n in nodes]
    gpus = [g for g in gpus if g > 0]
    return len(gpus), max(gpus, default=0)


async def fresh_namespace(rest: Rest, tenant: str, timeout: float = 180) -> None:
    """Remove an earlier run's ``demo`` namespace (its pods leave the compute cluster with it) and make a
    new one; pods are refused until its ``default`` ServiceAccount exists."""
    ns_url = path("", "v1", "namespaces", name=NAMESPACE)
    deadline = time.monotonic() + timeout
    if await rest.get_or_none(ns_url) is not None:
        say(f"  {tenant}: removing the namespace {NAMESPACE} of an earlier run")
        try:
            await rest.delete(ns_url)
        except Exception as exc:
            if status_of(exc) not in (404, 409):
                raise
        while await rest.get_or_none(ns_url) is not None:
            if time.monotonic() > deadline:
                raise DemoError(f"{tenant}: namespace {NAMESPACE} still terminating after {timeout:.0f} s")
            await asyncio.sleep(POLL)
    await rest.create(path("", "v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
    while await rest.get_or_none(path("", "v1", "serviceaccounts", NAMESPACE, "default")) is None:
        if time.monotonic() > deadline:
            raise DemoError(f"{tenant}: no default ServiceAccount in {NAMESPACE}; is its controller-manager up?")
        await asyncio.sleep(POLL)


async def play_step(demo: Demo, step: Step, headless: bool) -> None:
    step.state, step.started = "running", time.time()
    if headless:
        say(f"… {step.title}")
    await step.act(demo)
    deadline = step.started + step.timeout
    next_note = step.started + 15
    while True:
        try:
            claim = await step.check(demo)
        except Exception as exc:  # a refused or slow read is not the end: read again until the deadline
            claim, demo.observed = None, f"reading the clusters failed: {getattr(exc, 'reason', None) or exc}"
        now = time.time()
        if claim:
            step.state, step.claim, step.finished = "done", claim, now
            break
        if now > deadline:
            step.state, step.finished = "failed", now
            step.claim = f"{step.title}: not true after {step.timeout:.0f} s — last seen: {demo.observed}"
            raise DemoError(step.claim)
        if headless and now >= next_note:
            say(f"    still waiting ({now - step.started:.0f} s): {demo.observed}")
            next_note = now + 15
        await asyncio.sleep(POLL)
    if headless:
        say(f"✓ {step.claim}  [{step.finished - step.started:.1f} s]")


def running(directory: Path) -> bool:
    from ferry.cluster.planes import read_state
    from ferry.cluster.process import pid_alive

    state = read_state(directory) or {}
    pid = state.get("supervisor_pid")
    return state.get("ready") is True and isinstance(pid, int) and pid_alive(pid)


def start(directory: Path) -> int:
    """``ferry up --detach`` with the demo's shape (its progress is printed as it goes)."""
    import subprocess

    say(f"Starting the clusters in {directory} (the first time builds the binaries: about 10 minutes)")
    argv = [sys.executable, "-m", "ferry", "up", "--dir", str(directory), *SHAPE, "--detach"]
    return subprocess.run(argv, check=False).returncode


async def play(directory: Path, headless: bool, grace: int, pace: float) -> int:
    configs = {name: directory / f"{name}.kubeconfig" for name in ("compute", TENANT_A, TENANT_B)}
    missing = [str(p) for p in configs.values() if not p.exists()]
    if missing:
        say(f"ferry demo: error: {', '.join(missing)} not found; start the clusters first: "
            f"ferry up --dir {directory} --tenants 2 --gpu-nodes 32 --min-runtime 20 --detach (make demo does)")
        return 2
    apis = {name: await api_client(p) for name, p in configs.items()}
    try:
        rests = {name: Rest(api) for name, api in apis.items()}
        nodes, per_node = await _gpu_nodes(rests["compute"])
        if nodes < MIN_NODES:
            say(f"ferry demo: error: the compute cluster has {nodes} GPU nodes; the scenario needs at least "
                f"{MIN_NODES} (ferry up --gpu-nodes 32)")
            return 2
        demo = Demo(rests["compute"], {TENANT_A: rests[TENANT_A], TENANT_B: rests[TENANT_B]}, nodes, per_node,
                    grace=grace)
        say(f"Kube-Ferry demo: {nodes} GPU nodes × {per_node} GPUs shared by {TENANT_A} and {TENANT_B}")
        for tenant in (TENANT_A, TENANT_B):
            await fresh_namespace(demo.tenants[tenant], tenant)
        return await _scenario(demo, directory, headless, pace)
    finally:
        for api in apis.values():
            await api.close()


async def _scenario(demo: Demo, directory: Path, headless: bool, pace: float) -> int:
    plan = steps(demo)
    observer = Observer(demo.compute, demo.tenants)
    failure: str | None = None

    async def run_steps() -> None:
        nonlocal failure
        try:
            for step in plan:
                await play_step(demo, step, headless)
                await asyncio.sleep(pace)  # time for a watcher to read the view; nothing waits on it
            await asyncio.sleep(TAIL)  # the timeline shows the state the last step left
        except DemoError as exc:
            failure = str(exc)
        finally:
            observer_task.cancel()

    t0 = time.time()
    observer.t0 = t0
    async with asyncio.TaskGroup() as tg:
        observer_task = tg.create_task(observer.run())
        if headless:
            tg.create_task(run_steps())
        else:
            from rich.live import Live

            from ferry.demo.view import LiveView

            with Live(LiveView(plan, lambda: observer.picture), refresh_per_second=4, screen=False):
                await tg.create_task(run_steps())
    await observer.sample()
    return await _summary(demo, plan, observer, directory, t0, failure)


async def _summary(demo: Demo, plan: list[Step], observer: Observer, directory: Path, t0: float,
                   failure: str | None) -> int:
    from ferry.demo import timeline

    try:
        png: Path | str = timeline.write(observer.series, observer.picture.capacity, plan, t0,
                                         directory / "demo-timeline.png")
    except ImportError:
        png = "not drawn: matplotlib is missing (pip install 'kube-ferry[plot]')"
    usage = await collect(demo.compute, None, None, "queue")
    report: dict[str, Any] = {"seconds": round(time.time() - t0, 1), "nodes": demo.nodes,
                              "gpusPerNode": demo.gpus_per_node, "steps": [s.as_dict() for s in plan],
                              "victims": demo.victims, "usage": usage, "timeline": str(png), "failure": failure}
    (directory / "demo-report.json").write_text(json.dumps(report, indent=2))
    say("")
    say(f"Summary ({report['seconds']:.0f} s):")
    for s in plan:
        say(f"  {'✓' if s.state == 'done' else '✗' if s.state == 'failed' else '·'} {s.claim or s.title}")
    say("  GPU-seconds per queue so far (kubectl ferry usage): "
        + ", ".join(f"{r['QUEUE']} {r['GPU-SECONDS']:.0f}" for r in usage))
    say(f"  timeline: {png}   report: {directory / 'demo-report.json'}")
    kc = {name: directory / f"{name}.kubeconfig" for name in ("compute", TENANT_A, TENANT_B)}
    say("")
    say("Explore (the clusters stay up; kubectl is in the folder `ferry binaries` prints):")
    say(f"  kubectl --kubeconfig {kc[TENANT_A]} -n {NAMESPACE} get pods -L tier -o wide")
    say(f"  kubectl --kubeconfig {kc[TENANT_A]} -n {NAMESPACE} get podgroups.scheduling.volcano.sh")
    victim = demo.victims[0] if demo.victims else "soak-1"
    say(f"  kubectl --kubeconfig {kc[TENANT_A]} -n {NAMESPACE} describe pod {victim}-0")
    say(f"  kubectl --kubeconfig {kc['compute']} get fq,fpg -A")
    say(f"  kubectl ferry status --kubeconfig {kc['compute']}")
    say(f"  kubectl ferry status --kubeconfig {kc[TENANT_B]}")
    say(f"  kubectl ferry why-pending podgroup/huge -n {NAMESPACE} --kubeconfig {kc[TENANT_B]}")
    say(f"  kubectl ferry usage --by job --kubeconfig {kc['compute']}")
    say(f"Stop: make down (ferry down --dir {directory})")
    if failure:
        say(f"ferry demo: error: {failure}")
        return 1
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    headless = args.headless or not sys.stdout.isatty()
    directory = Path(args.dir).resolve()
    if args.start and not running(directory) and (code := start(directory)) != 0:
        return code
    pace = args.pace if args.pace is not None else 0.0 if headless else 4.0
    try:
        return asyncio.run(play(directory, headless, args.grace, pace))
    except DemoError as exc:
        say(f"ferry demo: error: {exc}")
        return 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="play the scripted scenario on the clusters of `ferry up --dir DIR` "
                                    "(make demo starts them)")
    p.add_argument("--dir", required=True, help="the folder given to `ferry up`")
    p.add_argument("--headless", action="store_true", help="print steps as lines instead of the live view "
                                                           "(the default when stdout is not a terminal)")
    p.add_argument("--start", action="store_true", help="start the clusters first unless they run (ferry up "
                                                        f"--dir DIR {' '.join(SHAPE)} --detach)")
    p.add_argument("--grace", type=int, default=20, help="seconds the elastic jobs get to checkpoint")
    p.add_argument("--pace", type=float, help="seconds to pause after each step for a watcher (default: 4 with "
                                              "the live view, 0 headless)")
    p.set_defaults(func=cmd_demo)
