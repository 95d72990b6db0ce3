"""``ferry simulate``: replay traces through the scheduling core and its baselines."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from scheduler.core.decisions import Decision
from scheduler.core.scheduler import SchedulerConfig
from scheduler.sim.traces import Problems, TraceError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="replay GPU cluster traces through the scheduler and baselines")
    kinds = p.add_subparsers(dest="trace", required=True, metavar="TRACE")

    o = kinds.add_parser("openb", help="FGD's GPU-sharing allocation experiment (Alibaba openb traces)")
    o.add_argument("--pods", type=Path, required=True)
    o.add_argument("--nodes", type=Path, required=True)
    o.add_argument("--policy", choices=("random", "bestfit", "gpupacking", "fgd", "ferry"), default="ferry")
    o.add_argument("--seed", type=int, default=42)
    o.add_argument("--json", action="store_true", help="print the result as JSON")
    o.add_argument("--strict", action="store_true", help="stop at the first bad row instead of skipping it")
    o.set_defaults(func=run_openb)

    h = kinds.add_parser("philly", help="job-level replay of the Microsoft Philly trace with tenant queues")
    h.add_argument("--jobs", type=Path, required=True)
    h.add_argument("--vc-nodes", type=Path, required=True)
    h.add_argument("--nodes", type=int, default=96)
    h.add_argument("--gpus-per-node", type=int, default=8)
    h.add_argument("--month", type=int, metavar="1-12", help="replay only the jobs submitted in this calendar "
                   "month (UTC), as the matrix of `make bench-philly` slices the trace (9: September, 10: October)")
    h.add_argument("--from", dest="start", type=_utc_date, metavar="YYYY-MM-DD", help="replay only --count "
                   "consecutive jobs submitted from this day (UTC) on, from an empty cluster, as the held-out "
                   "windows of `make bench-philly-heldout` do")
    h.add_argument("--count", type=int, metavar="N", help="how many jobs --from replays")
    h.add_argument("--policy", choices=("ferry", "fifo", "volcano"), default="ferry")
    h.add_argument("--config", type=Path, help="the scheduler's configuration file (as `ferry scheduler --config` "
                   "reads it), applied over --policy: simulate the policy a cluster is configured with")
    h.add_argument("--departments", type=int, default=0, help="group the VCs into this many departments (parent "
                   "queues; VCs dealt out largest first), and report fairness per department too")
    h.add_argument("--grouping-seed", type=int, metavar="SEED", help="with --departments: deal the VCs out in the "
                   "random order of this seed instead of largest first (another grouping, as "
                   "`make bench-philly-groupings` replays several)")
    h.add_argument("--las", action="store_true", help="every queue orders its jobs by least attained service and "
                   "every job may checkpoint (Tiresias' assumption): the las plugin added to the policy")
    h.add_argument("--preemptor-delay", type=float, metavar="SECONDS", help="every tenant queue's "
                   "preemptorDelaySeconds: how long a job of a queue below its guarantee waits for free capacity "
                   "before reclaiming (default: the simulated tenants' 300; the Queue CRD's default is 0)")
    h.add_argument("--victim-grace", type=float, metavar="SECONDS", help="every tenant queue's victimGraceSeconds: "
                   "the notice a victim gets to checkpoint (default: the simulated tenants' 60)")
    h.add_argument("--event-only", action="store_true", help="cycle only on arrivals and completions, not also "
                   "whenever a rule that waits for time falls due (a victim's deadline, the end of a preemptor "
                   "delay, ...) as the service cycling every period does: faster, less faithful")
    h.add_argument("--json", action="store_true")
    h.add_argument("--plot", type=Path, help="write a PNG: utilization and queue over time, waits per tenant")
    h.add_argument("--decisions", type=Path, metavar="FILE", help="write every decision (binds, notices with the "
                   "rule and the preemptor, evictions, pending reasons) as JSON lines with the replay's time: why "
                   "a job waited or was evicted")
    h.add_argument("--strict", action="store_true")
    h.set_defaults(func=run_philly)


def _utc_date(text: str) -> datetime:
    """A day as YYYY-MM-DD, its midnight in UTC (the trace's timestamps are UTC)."""
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a day is YYYY-MM-DD, got {text!r}") from None


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[TextIO]:
    """A file written beside ``path`` that takes its place only once the run succeeded: a refused or
    interrupted run leaves whatever was there untouched."""
    part = path.with_name(path.name + ".part")
    try:
        with part.open("w") as out:
            yield out
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)


def _write_decisions(out: TextIO, now: float, decisions: list[Decision]) -> None:
    """One JSON object a line: the replay's time, the decision's kind and its fields."""
    for d in decisions:
        out.write(json.dumps({"t": now, "kind": type(d).__name__, **dataclasses.asdict(d)}) + "\n")


def _config(path: Path, policy: str) -> SchedulerConfig:
    """The scheduler's configuration file over the preset ``policy``, validated as the service does it."""
    from scheduler.service.settings import Settings, parse

    return parse(path.read_text(), Settings(SchedulerConfig.preset(policy), 1.0), source=str(path)).core


def _report(problems: Problems) -> None:
    for err in problems.errors[:20]:
        print(f"ferry: skipped row {err}", file=sys.stderr)
    if len(problems.errors) > 20:
        print(f"ferry: ... and {len(problems.errors) - 20} more bad rows", file=sys.stderr)
    if problems.errors:
        print(f"ferry: {len(problems.errors)} bad row(s) skipped", file=sys.stderr)


def _fail(message: str) -> int:
    print(f"ferry: error: {message}", file=sys.stderr)
    return 1


def run_openb(args: argparse.Namespace) -> int:
    from scheduler.sim import openb

    problems = Problems([])
    try:
        nodes = openb.load_nodes(args.nodes, problems, args.strict)
        pods = openb.load_pods(args.pods, problems, args.strict)
        _report(problems)
        t0 = time.monotonic()
        res = openb.run(nodes, pods, args.policy, args.seed)
    except (TraceError, ValueError) as exc:
        return _fail(str(exc))
    out: dict[str, Any] = {
        "trace": "openb", "policy": res.policy, "seed": res.seed, "pods": res.pods, "failed_pods": res.failed,
        "gpu_allocation_ratio": res.gpu_allocation_ratio, "curve": res.curve,
        "bad_rows": len(problems.errors), "seconds": round(time.monotonic() - t0, 2),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{res.policy} seed {res.seed}: GPU allocation ratio {res.gpu_allocation_ratio}% at 130% arrived "
              f"({res.pods} pods, {res.failed} unplaced)")
    return 0


def run_philly(args: argparse.Namespace) -> int:
    from scheduler.sim import philly

    if args.nodes < 1 or args.gpus_per_node < 1:
        return _fail("--nodes and --gpus-per-node must be positive")
    if args.departments < 0:
        return _fail("--departments must not be negative")
    if args.grouping_seed is not None and args.departments < 1:
        return _fail("--grouping-seed groups the VCs into departments: give --departments too")
    if (args.start is None) != (args.count is None):
        return _fail("--from and --count go together: a window is where it starts and how many jobs it holds")
    delay = philly.PREEMPTOR_DELAY_S if args.preemptor_delay is None else args.preemptor_delay
    grace = philly.VICTIM_GRACE_S if args.victim_grace is None else args.victim_grace
    problems = Problems([])
    notes: list[str] = []
    try:
        jobs = philly.load_jobs(args.jobs, problems, args.strict)
        vc = philly.load_vc_nodes(args.vc_nodes, problems, args.strict)
        _report(problems)
        where = ""
        if args.month is not None:
            jobs, where = philly.in_month(jobs, args.month), f" in month {args.month}"
        if args.start is not None:
            jobs, where = philly.window(jobs, args.start, args.count), f"{where} from {args.start:%Y-%m-%d} on"
        if not jobs:
            return _fail(f"{args.jobs}: no usable jobs{where}")
        config = _config(args.config, args.policy) if args.config else None
        t0 = time.monotonic()
        with _replacing(args.decisions) if args.decisions else contextlib.nullcontext() as log:
            res = philly.simulate(jobs, vc, args.policy, args.nodes, args.gpus_per_node,
                                  progress=lambda s: print(f"ferry: {s}", file=sys.stderr, flush=True), notes=notes,
                                  config=config, departments=args.departments, grouping_seed=args.grouping_seed,
                                  las=args.las,
                                  preemptor_delay_s=delay, victim_grace_s=grace, cycle_when_due=not args.event_only,
                                  decisions=None if log is None else functools.partial(_write_decisions, log))
    except (TraceError, ValueError, OSError) as exc:
        return _fail(str(exc))
    for note in notes[:20]:
        print(f"ferry: note: {note}", file=sys.stderr)
    metrics = dict(res.metrics)
    metrics["bad_rows"] = len(problems.errors)
    metrics["seconds"] = round(time.monotonic() - t0, 1)
    if args.plot:
        from scheduler.sim.plot import plot_philly

        plot_philly(res, args.plot)
    if args.json:
        print(json.dumps(metrics))
    else:
        keys = ("avg_wait_s", "avg_first_wait_s", "p50_wait_s", "p99_wait_s", "max_wait_s", "avg_jct_s",
                "gpu_utilization", "jain_fairness", "jain_daily_mean", "preemptions", "wasted_gpu_s")
        print(" ".join(f"{k}={metrics[k]}" for k in keys))
        if metrics["departments"]:  # each department's teams, and what it received per GPU-second it was entitled to
            print("departments: " + "; ".join(f"{d} ({' '.join(metrics['department_teams'][d])}) {share}"
                                              for d, share in metrics["departments"].items()))
        if metrics["evictions_by_rule"]:
            print(philly.eviction_costs(metrics["evictions_by_rule"]))
    return 0
