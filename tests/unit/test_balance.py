"""Node imbalance: the coefficient of variation of GPU utilisation over the GPU nodes in use."""

from __future__ import annotations

import pytest

from scheduler.core.balance import node_imbalance
from scheduler.core.model import Node
from tests.unit.core_helpers import node


def _loaded(name: str, used_milli: list[int]) -> Node:
    n = node(name, len(used_milli))
    for d, used in zip(n.devices, used_milli, strict=True):
        d.free -= used
    return n


def test_even_load_idle_nodes_and_uneven_load() -> None:
    assert node_imbalance([]) == 0.0
    even = [_loaded("a", [1000, 1000, 0, 0]), _loaded("b", [1000, 500, 500, 0]), _loaded("idle", [0, 0, 0, 0])]
    assert node_imbalance(even) == 0.0  # both nodes in use at 50 %; the idle node is room, not imbalance
    uneven = [_loaded("a", [1000] * 4), _loaded("b", [1000, 0, 0, 0])]  # 100 % and 25 %: mean 62.5, sd 37.5
    assert node_imbalance(uneven) == pytest.approx(60.0)
    cordoned = _loaded("c", [1000, 0, 0, 0])
    cordoned.schedulable = False
    assert node_imbalance([_loaded("a", [1000] * 4), cordoned]) == 0.0
