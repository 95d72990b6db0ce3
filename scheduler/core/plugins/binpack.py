"""binpack: the tightest fit — a GPU share on the fullest device that holds it, then the node with the
fewest free whole GPUs, so empty nodes stay empty for the replicas that need a whole node."""

from __future__ import annotations

from scheduler.core.framework import Framework, Plugin
from scheduler.core.placement import tightest_fit


class Binpack(Plugin):
    name = "binpack"

    def register(self, fw: Framework) -> None:
        fw.node_order.append((self.name, tightest_fit))
