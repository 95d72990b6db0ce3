"""PNG of a Philly replay: GPUs in use and jobs waiting over time; wait distribution per tenant."""

from __future__ import annotations

from pathlib import Path

from scheduler.sim.philly import PhillyResult


def plot_philly(res: PhillyResult, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(11, 10))
    days = [t / 86400 for t, _, _ in res.timeline]
    top.plot(days, [a for _, a, _ in res.timeline], lw=0.6)
    top.set_ylabel("GPUs allocated")
    top.set_title(f"Philly replay, policy {res.policy}")
    mid.plot(days, [p for _, _, p in res.timeline], lw=0.6, color="tab:orange")
    mid.set_ylabel("jobs waiting")
    mid.set_xlabel("days")
    tenants = sorted(res.tenant_waits, key=lambda t: -len(res.tenant_waits[t]))
    data = [[max(w, 1.0) for w in res.tenant_waits[t]] or [1.0] for t in tenants]
    low.boxplot(data, tick_labels=tenants, showfliers=False)
    low.set_yscale("log")
    low.set_ylabel("wait (s, log)")
    low.set_xlabel("tenant (virtual cluster)")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
