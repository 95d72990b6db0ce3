"""Weighted max-min fair division of capacity (water-filling), used for entitlements and deserved shares."""

from __future__ import annotations

from collections.abc import Mapping


def water_fill(demand: Mapping[str, float], weight: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Each claimant gets capacity in proportion to its weight, never more than it asks; what a satisfied
    claimant does not need is shared again among the others."""
    out = dict.fromkeys(demand, 0.0)
    active = [t for t, d in demand.items() if d > 0]  # a list: iteration order must not depend on hashing
    remaining = capacity
    while active and remaining > 1e-9:
        total_w = sum(weight[t] for t in active)
        met = []
        for t in active:
            out[t] += remaining * weight[t] / total_w
            if out[t] >= demand[t]:
                out[t] = float(demand[t])
                met.append(t)
        remaining = capacity - sum(out.values())
        if not met:
            break
        active = [t for t in active if t not in met]
    return out
