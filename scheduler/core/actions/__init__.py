"""The actions a cycle can run, by the name a configuration uses."""

from __future__ import annotations

from scheduler.core.actions.allocate import Allocate
from scheduler.core.actions.consolidate import Consolidate, DrainHolds
from scheduler.core.actions.grow import Grow
from scheduler.core.actions.preempt import Preempt
from scheduler.core.actions.reserve import Reserve
from scheduler.core.framework import Action

ACTIONS: dict[str, type[Action]] = {a.name: a for a in (Allocate, Reserve, Preempt, Grow, Consolidate, DrainHolds)}
