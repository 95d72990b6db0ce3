"""The plugins a configuration can enable, by name. A new policy is a module here and an entry below."""

from __future__ import annotations

from scheduler.core.framework import Plugin
from scheduler.core.plugins.binpack import Binpack
from scheduler.core.plugins.capacity import Capacity
from scheduler.core.plugins.dependencies import Dependencies
from scheduler.core.plugins.fair_over_time import FairOverTime
from scheduler.core.plugins.fifo import Fifo
from scheduler.core.plugins.fragmentation import Fragmentation
from scheduler.core.plugins.guarantee import Guarantee
from scheduler.core.plugins.las import LeastAttainedService
from scheduler.core.plugins.lend_holds import LendHolds
from scheduler.core.plugins.priority import Priority
from scheduler.core.plugins.proportion import Proportion
from scheduler.core.plugins.protection import Protection
from scheduler.core.plugins.reclaim import Reclaim
from scheduler.core.plugins.starvation import Starvation
from scheduler.core.plugins.tier_preemption import TierPreemption

PLUGINS: dict[str, type[Plugin]] = {p.name: p for p in (
    Priority, Guarantee, Fifo, Proportion, Capacity, Protection, TierPreemption, Reclaim, Starvation,
    Fragmentation, Binpack, FairOverTime, Dependencies, LeastAttainedService, LendHolds)}
