"""``make bench-openb``: the FGD experiment over every shared openb variant and seeds 42-51,
our runs side by side with the published figures (mean GPU allocation ratio at 130 % arrived)."""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections import defaultdict
from pathlib import Path

from scheduler.sim import openb
from scheduler.sim.traces import TRACES, Problems

VARIANTS = ("default", "gpushare40", "multigpu20", "gpuspec10", "cpu100")
PUBLISHED = {"random": "01-Random", "gpupacking": "04-GpuPacking", "bestfit": "05-BestFit", "fgd": "06-FGD"}


def published(folder: Path) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    with (folder / "fgd_published_allo_discrete.csv").open() as fh:
        for row in csv.DictReader(fh):
            out[(row["workload"].removeprefix("openb_pod_list_"), row["sc_policy"])].append(float(row["130"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path,
                        default=TRACES / "openb")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--policies", default="bestfit,gpupacking,fgd,ferry")
    args = parser.parse_args()
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    pub = published(args.traces)
    problems = Problems([])
    nodes = openb.load_nodes(args.traces / "openb_node_list_gpu_node.csv", problems)
    print(f"{'variant':<11} {'policy':<11} {'ours':>7} {'published':>9}  (mean of seeds {seeds[0]}-{seeds[-1]}, "
          "% GPU allocated at 130 % arrived)")
    for variant in args.variants.split(","):
        pods = openb.load_pods(args.traces / f"openb_pod_list_{variant}.csv", problems)
        for policy in args.policies.split(","):
            t0 = time.monotonic()
            vals = [openb.run(nodes, pods, policy, s).gpu_allocation_ratio or 0.0 for s in seeds]
            ref = pub.get((variant, PUBLISHED.get(policy, "")), [])
            ref_text = f"{statistics.fmean(ref):9.2f}" if ref else "        -"
            print(f"{variant:<11} {policy:<11} {statistics.fmean(vals):7.2f} {ref_text}  "
                  f"[{' '.join(f'{v:.2f}' for v in vals)}] {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
