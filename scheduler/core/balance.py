"""Node balance: how evenly the GPU nodes in use are loaded.

``node_imbalance`` is the coefficient of variation (population standard deviation over mean) of GPU
utilisation across schedulable GPU nodes with at least one GPU (or share) allocated, in percent: 0 when
every node in use is equally loaded. Idle nodes are left out on purpose — binpacking keeps nodes whole
for big gangs, and an empty node is room, not imbalance; what the figure catches is load smeared over
half-used nodes. (OpenI-Octopus reports node imbalance below 20 %.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from scheduler.core.model import Node


def node_imbalance(nodes: Iterable[Node]) -> float:
    used = [1 - n.free_gpu_milli / n.gpu_capacity for n in nodes
            if n.schedulable and n.devices and n.free_gpu_milli < n.gpu_capacity]
    if not used:
        return 0.0
    mean = sum(used) / len(used)
    variance = sum((u - mean) ** 2 for u in used) / len(used)
    return 100 * math.sqrt(variance) / mean
