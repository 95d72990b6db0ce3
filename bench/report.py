"""The benchmark report: a Markdown file with the tables and the targets, PNG plots, and the headline
table printed at the end. Ratios compare contenders measured in the same run on the same machine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bridge import Phase
from bench.profile import table as profile_table
from bench.replay import ReplayResult
from bench.throughput import Result

Obj = dict[str, Any]
FERRY, VOLCANO, KUBE = "kube-ferry", "volcano", "kube-scheduler"


@dataclass
class Target:
    what: str
    ratio: float | None
    goal: float
    higher_is_better: bool = True

    @property
    def met(self) -> bool | None:
        if self.ratio is None:
            return None
        return self.ratio >= self.goal if self.higher_is_better else self.ratio <= self.goal

    def row(self) -> str:
        verdict = {True: "met", False: "**missed**", None: "not measured"}[self.met]
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}×"
        return f"| {self.what} | {ratio} | {'≥' if self.higher_is_better else '≤'} {self.goal:g}× | {verdict} |"


def _find(results: list[Result], contender: str, workload: str, mode: str) -> Result | None:
    return next((r for r in results if (r.contender, r.workload, r.mode) == (contender, workload, mode)), None)


def _ratio(a: Result | None, b: Result | None, field: str) -> float | None:
    if a is None or b is None:
        return None
    x, y = getattr(a, field), getattr(b, field)
    return None if not y else x / y


def _at_direct_rate(phases: list[Phase]) -> tuple[Phase, Phase] | None:
    """The direct and the bridged phase offered the direct sustained rate."""
    direct = next((p for p in phases if p.path == "direct" and p.rate > 0), None)
    bridged = next((p for p in phases if p.path == "bridge" and direct is not None and p.rate == direct.rate), None)
    return (direct, bridged) if direct is not None and bridged is not None else None


def bridge_targets(phases: list[Phase]) -> list[Target]:
    pair = _at_direct_rate(phases)
    if pair is None:
        return []
    direct, bridged = pair
    return [Target("bridge / direct pods/s at the direct sustained rate", bridged.pods_per_s / direct.pods_per_s, 0.8),
            Target("bridge p99 create→Running, seconds (absolute)", bridged.p99_ms / 1000, 1.0,
                   higher_is_better=False)]


def bridge_bound(phases: list[Phase]) -> str | None:
    """What the machine alone allows where its CPU is the limit: the bridge/direct ratio if the vnode (the
    bridge's own process) cost nothing — every other process's CPU per pod, bridged against direct."""
    pair = _at_direct_rate(phases)
    if pair is None:
        return None
    direct, bridged = pair
    total_direct, total_bridged = sum(direct.cpu_ms_per_pod.values()), sum(bridged.cpu_ms_per_pod.values())
    vnode = sum(v for k, v in bridged.cpu_ms_per_pod.items() if k.endswith("-vnode"))
    if total_bridged - vnode <= 0:
        return None
    return (f"A direct pod cost the machine {total_direct:.0f} CPU-ms, a bridged one {total_bridged:.0f}, of which "
            f"the vnode {vnode:.0f}: the second control plane a bridged pod crosses shares these cores, so even a "
            f"vnode that cost nothing could bridge at most {total_direct / (total_bridged - vnode):.2f}× the direct "
            "rate where the CPU is the limit.")


def bridge_table(phases: list[Phase]) -> list[str]:
    lines = ["| path | offered pods/s | pods | pods/s | create→Running p50 (ms) | p99 (ms) |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {p.path} | {'burst' if p.rate <= 0 else f'{p.rate:.0f}'} | {p.pods} | {p.pods_per_s:.0f} | "
              f"{p.p50_ms:.0f} | {p.p99_ms:.0f} |" for p in phases]
    paced = [p for p in phases if p.rate > 0]
    names = sorted({n for p in paced for n in p.cpu_ms_per_pod}, key=lambda n: -max(p.cpu_ms_per_pod.get(n, 0)
                                                                                   for p in paced))
    if paced and names:
        lines += ["", "Where the machine's time went (CPU ms per pod, by process):", "",
                  "| process | " + " | ".join(p.path for p in paced) + " |", "|---|" + "---:|" * len(paced)]
        lines += [f"| {n} | " + " | ".join(f"{p.cpu_ms_per_pod.get(n, 0):.1f}" for p in paced) + " |" for n in names]
        lines.append("| **total** | " + " | ".join(f"{sum(p.cpu_ms_per_pod.values()):.1f}" for p in paced) + " |")
    return lines


def targets(results: list[Result]) -> list[Target]:
    out = []
    for mode in ("stream", "backlog"):
        f_g, v_g = _find(results, FERRY, "gang", mode), _find(results, VOLCANO, "gang", mode)
        f_s, v_s, k_s = (_find(results, c, "single", mode) for c in (FERRY, VOLCANO, KUBE))
        out += [Target(f"gangs of 8, {mode}: Kube-Ferry / Volcano pods/s", _ratio(f_g, v_g, "pods_per_s"), 2.0),
                Target(f"single pods, {mode}: Kube-Ferry / Volcano pods/s", _ratio(f_s, v_s, "pods_per_s"), 1.0),
                Target(f"single pods, {mode}: Kube-Ferry / kube-scheduler pods/s", _ratio(f_s, k_s, "pods_per_s"), 1.0),
                Target(f"single pods, {mode}: Kube-Ferry / kube-scheduler CPU per pod",
                       _ratio(f_s, k_s, "cpu_s_per_1000"), 1.5, higher_is_better=False)]
    return out


def replay_targets(replays: list[ReplayResult]) -> list[Target]:
    f = next((r.metrics for r in replays if r.contender == FERRY), None)
    v = next((r.metrics for r in replays if r.contender == VOLCANO), None)
    if f is None or v is None:
        return []

    def ratio(key: str) -> float | None:
        return None if f.get(key) is None or not v.get(key) else f[key] / v[key]

    return [Target("trace replay: Kube-Ferry / Volcano avg wait", ratio("avg_wait_s"), 0.7, higher_is_better=False),
            Target("trace replay: Kube-Ferry / Volcano GPU utilisation while jobs wait", ratio("gpu_utilization"), 1.0),
            Target("trace replay: Kube-Ferry / Volcano GPU utilisation over the arrivals",
                   ratio("gpu_utilization_arrivals"), 1.0),
            Target("trace replay: Kube-Ferry / Volcano Jain fairness", ratio("jain_fairness"), 1.0)]


REPLAY_COLUMNS = (("avg_wait_s", "avg wait (s)", 0), ("p50_wait_s", "p50 (s)", 0), ("p99_wait_s", "p99 (s)", 0),
                  ("gpu_utilization", "GPU util. while jobs wait (%)", 1),
                  ("gpu_utilization_arrivals", "GPU util. over the arrivals (%)", 1), ("jain_fairness", "Jain", 3),
                  ("preemptions", "preemptions", 0), ("still_waiting", "jobs waiting at the horizon", 0))


def replay_table(replays: list[ReplayResult], simulated: Obj) -> list[str]:
    lines = ["| run | " + " | ".join(label for _, label, _ in REPLAY_COLUMNS) + " |",
             "|---|" + "---:|" * len(REPLAY_COLUMNS)]
    rows = [(f"{r.contender}, real control plane", r.metrics) for r in replays]
    rows += [(f"`ferry simulate philly --policy {p}`", m) for p, m in simulated.items()]
    for label, m in rows:
        lines.append(f"| {label} | " + " | ".join(_fmt(m.get(k), d) for k, _, d in REPLAY_COLUMNS) + " |")
    return lines


def plot_replay(replays: list[ReplayResult], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in replays:
        ax.plot([t / 3600 for t, _, _ in r.timeline], [g for _, g, _ in r.timeline], label=r.contender, lw=1)
    if replays:
        ax.axhline(replays[0].nodes * 8, color="grey", lw=0.8, ls="--", label="capacity")
    ax.set_xlabel("trace hours")
    ax.set_ylabel("GPUs allocated")
    ax.legend()
    fig.tight_layout()
    path = out / "replay-allocation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def throughput_table(results: list[Result]) -> list[str]:
    lines = ["| scheduler | workload | mode | pods | pods/s | last bind after last create (s) | gang p50 (ms) | "
             "gang p99 (ms) | CPU s / 1,000 pods |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.contender} | {r.workload} | {r.mode} | {r.pods} | {r.pods_per_s:.0f} | "
                     f"{_fmt(r.lag_s, 1)} | {_fmt(r.p50_ms)} | {_fmt(r.p99_ms)} | {r.cpu_s_per_1000:.2f} |")
    return lines


def plot(results: list[Result], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    cases = sorted({(r.workload, r.mode) for r in results})
    contenders = list(dict.fromkeys(r.contender for r in results))
    for field, label, name in (("pods_per_s", "pods bound per second", "throughput.png"),
                               ("cpu_s_per_1000", "scheduler CPU seconds per 1,000 pods", "cpu.png")):
        fig, ax = plt.subplots(figsize=(9, 4.5))
        width = 0.8 / max(1, len(contenders))
        for i, c in enumerate(contenders):
            ys = [getattr(r, field) if (r := _find(results, c, w, m)) else 0 for w, m in cases]
            ax.bar([x + i * width for x in range(len(cases))], ys, width, label=c)
        ax.set_xticks([x + width * (len(contenders) - 1) / 2 for x in range(len(cases))],
                      [f"{w}, {m}" for w, m in cases])
        ax.set_ylabel(label)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(out / name)
    return made


def write(out: Path, header: Obj, results: list[Result], phases: list[Phase],
          replays: list[ReplayResult] | None = None, simulated: Obj | None = None) -> str:
    """Write report.md, results.json and the plots into ``out``; return the headline table."""
    replays, simulated = replays or [], simulated or {}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({
        **header, "results": [r.as_dict() for r in results], "bridge": [p.as_dict() for p in phases],
        "replay": [{"contender": r.contender, "jobs": r.jobs, "factor": r.factor, "nodes": r.nodes,
                    "seconds": round(r.seconds, 1), **r.metrics} for r in replays],
        "replay_simulated": simulated}, indent=2))
    pngs = plot(results, out) if results else []
    goal = targets(results) + bridge_targets(phases) + replay_targets(replays)
    headline = ["| target | measured | goal | verdict |", "|---|---:|---:|---|", *(t.row() for t in goal)]
    md = [f"# Kube-Ferry beside its peers — {header['started']}", "",
          f"Machine: {header['machine']}. One run, contenders one after another on identical inputs, each on "
          f"fresh control planes with {header['nodes']} kwok nodes × 8 GPUs. Versions and settings:", ""]
    md += [f"- **{c['name']}** {c['version']}: {c['settings']}" for c in header["contenders"]]
    md += ["", "## Targets", "", *headline, "", "## Throughput and latency", "", *throughput_table(results), "",
           "*stream*: pods created as fast as the machine takes them while the scheduler runs (pods/s from the first "
           "create to the last bind; the apiserver caps creation here, so the lag of the last bind is what tells "
           "schedulers apart). *backlog*: pods created while the scheduler was stopped, pods/s from its first bind "
           "to its last. Gang latency: a gang's last member created → all members bound.", ""]
    md += [f"![{p.stem}]({p.name})" for p in pngs]
    if phases:
        md += ["", "## Bridge overhead", "", *bridge_table(phases), "",
               "The direct burst measures the rate the machine sustains for pods created straight in the compute "
               "cluster; both paths are then offered 90 % of it. The bridged burst measures the rate the machine "
               "sustains through the bridge (two control planes on the same cores); both paths are then offered "
               "half of that too, where the machine is not the limit. Latency: the create call to the pod seen "
               "Running by whoever created it (for the bridge, the tenant pod)."]
        bound = bridge_bound(phases)
        if bound:
            md.append(bound)
    if replays:
        r0 = replays[0]
        md += ["", "## Trace replay on real control planes", "", *replay_table(replays, simulated), "",
               f"{r0.jobs} consecutive Philly jobs from {header.get('replay_start', '?')} on, arrival gaps and run "
               f"times divided by {r0.factor:g}, on {r0.nodes} kwok nodes × 8 GPUs; figures in trace seconds. "
               "Tenants are the virtual clusters with queues proportional to their node counts (Kube-Ferry: "
               "guarantee and weight; Volcano: weight). Scheduler time constants are divided by the same factor. "
               "A run ends when no job waits, or at its horizon (1.5 arrival spans + 5 min), where jobs still "
               "waiting count with the wait they have had. The simulator rows are the same jobs through the same "
               "policy objects without an API server: the difference is what the real control plane adds (cycle "
               "period, API latency, kwok's timing).", "",
               f"![replay]({plot_replay(replays, out).name})"]
    missed = [t for t in goal if t.met is False]
    if missed:
        md += ["", "## Missed", "", *(f"- {t.what}: {t.ratio:.2f}× (goal {t.goal:g}×)" for t in missed if t.ratio)]
        profiles = [p for ph in phases for p in ph.profiles]
        if profiles:
            md += ["", "Where Kube-Ferry's own processes spent the bridged phase (sampled without pausing them; "
                   "the CPU table above shows what the rest of the machine spent):", *profile_table(profiles)]
    (out / "report.md").write_text("\n".join(md) + "\n")
    return "\n".join(headline)
