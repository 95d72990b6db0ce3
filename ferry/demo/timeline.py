"""The demo's PNG: GPUs held per tenant over time, with the moments the steps completed."""

from __future__ import annotations

from pathlib import Path

from ferry.demo.scenario import Step


def write(series: list[tuple[float, dict[str, float]]], capacity: float, steps: list[Step], t0: float,
          out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tenants = sorted({t for _, gpus in series for t in gpus})
    xs = [at for at, _ in series]
    ys = [[gpus.get(t, 0.0) for _, gpus in series] for t in tenants]
    fig, ax = plt.subplots(figsize=(11, 5))
    if xs:
        ax.stackplot(xs, ys, labels=tenants, step="post", alpha=0.85)
    ax.axhline(capacity, color="black", linewidth=1, linestyle=":", label=f"capacity ({capacity:g} GPUs)")
    top = capacity * 1.25 if capacity else 1.0
    for i, s in enumerate(st for st in steps if st.finished):
        x = s.finished - t0
        ax.axvline(x, color="grey", linewidth=0.8, linestyle="--")
        ax.text(x, top * (0.97 - 0.05 * (i % 4)), f" {s.key}", fontsize=8, va="top")
    ax.set_ylim(0, top)
    ax.set_xlabel("seconds since the scenario started")
    ax.set_ylabel("GPUs held in the compute cluster")
    ax.set_title("Kube-Ferry demo: GPU allocation per tenant")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
