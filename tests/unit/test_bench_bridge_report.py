"""The bridge section of the benchmark report: which phases the targets compare, and the machine's bound."""

from __future__ import annotations

from bench.bridge import Phase
from bench.report import bridge_bound, bridge_targets


def _phase(path: str, rate: float, pods_per_s: float, cpu: dict[str, float]) -> Phase:
    return Phase(path, rate, 1000, pods_per_s, 100.0, 900.0, cpu)


def test_targets_compare_the_paths_at_the_direct_rate_and_the_bound_discounts_only_the_vnode() -> None:
    direct_cpu = {"compute-apiserver": 12.0, "kube-ferry-scheduler": 4.0, "etcd": 4.0}
    bridged_cpu = {**direct_cpu, "tenant-1-apiserver": 20.0, "tenant-1-vnode": 10.0}
    phases = [_phase("direct", 0, 100, direct_cpu), _phase("direct", 90, 88, direct_cpu),
              _phase("bridge", 90, 22, bridged_cpu), _phase("bridge", 0, 25, bridged_cpu),
              _phase("direct", 22, 22, direct_cpu), _phase("bridge", 22, 21.5, bridged_cpu)]
    ratio, p99 = bridge_targets(phases)
    assert ratio.ratio == 22 / 88 and ratio.met is False  # the bridge at 90/s, not at its own 22/s
    assert p99.ratio == 0.9
    bound = bridge_bound(phases)
    assert bound is not None and "0.50×" in bound  # 20 ms direct / (50 - 10) ms bridged without the vnode
