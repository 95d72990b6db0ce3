"""The demo's live terminal view (rich): steps with progress, queues, jobs, GPUs per tenant, events.

:class:`LiveView` is a renderable: ``rich.live.Live`` asks it for a fresh rendering several times a
second, and it reads the latest :class:`~ferry.demo.observe.Picture` and the steps' states.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ferry.demo.observe import Picture
from ferry.demo.scenario import Step

MARKS = {"waiting": ("·", "dim"), "running": ("…", "yellow"), "done": ("✓", "green"), "failed": ("✗", "red")}
STATE_STYLES = {"Running": "green", "Pending": "yellow", "Running, eviction notice": "bold magenta"}


def steps_panel(steps: list[Step], now: float) -> Panel:
    done = sum(1 for s in steps if s.state == "done")
    table = Table.grid(padding=(0, 1))
    table.add_column(width=1)
    table.add_column()
    for s in steps:
        mark, style = MARKS[s.state]
        if s.state == "running":
            text = Text(f"{s.title}  ({now - s.started:.0f} s)", style=style)
        elif s.state == "failed":
            text = Text(s.claim, style=style)
        else:
            text = Text(s.title, style=style)
        table.add_row(Text(mark, style=style), text)
    ended = [s for s in steps if s.state == "done"]
    parts: list[RenderableType] = [table, ProgressBar(total=len(steps), completed=done, width=40)]
    if ended:  # what the latest step made true, as checked in the clusters
        parts.append(Text(f"✓ {ended[-1].claim}", style="italic"))
    return Panel(Group(*parts), title=f"Scenario  {done}/{len(steps)} steps", title_align="left")


def queues_table(pic: Picture) -> Table:
    t = Table(title="Queues (compute cluster)", title_justify="left", expand=True)
    for col in ("queue", "guaranteed", "max", "allocated", "borrowed", "lent", "running", "pending"):
        t.add_column(col, justify="left" if col == "queue" else "right")
    for q in pic.queues:
        t.add_row(q["NAME"], q["GUARANTEED"], q["MAX"], q["ALLOCATED"], q["BORROWED"], q["LENT"],
                  str(q["RUNNING"]), str(q["PENDING"]))
    return t


def jobs_table(pic: Picture) -> Table:
    t = Table(title="Jobs (as the tenants see their pods)", title_justify="left", expand=True)
    for col in ("tenant", "job", "tier", "pods running", "state"):
        t.add_column(col)
    for j in pic.jobs:
        style = STATE_STYLES.get(j.state, "red" if j.state.startswith("Failed") else "")
        t.add_row(j.tenant, j.name, j.tier, f"{j.running}/{j.pods}", Text(j.state, style=style))
    return t


def gpu_panel(pic: Picture) -> Panel:
    grid = Table.grid(padding=(0, 1))
    for tenant, gpus in sorted(pic.gpus.items()):
        grid.add_row(tenant, ProgressBar(total=pic.capacity or 1, completed=gpus, width=50),
                     f"{gpus:g} / {pic.capacity:g} GPUs")
    return Panel(grid, title="GPUs held per tenant (compute cluster)", title_align="left")


def events_panel(pic: Picture) -> Panel:
    lines = Text("\n".join(pic.events) or "no events yet", overflow="ellipsis", no_wrap=True)
    return Panel(lines, title="Recent events (tenant clusters)", title_align="left")


class LiveView:
    def __init__(self, steps: list[Step], picture: Callable[[], Picture]) -> None:
        self.steps = steps
        self.picture = picture

    def __rich__(self) -> RenderableType:
        pic = self.picture()
        return Group(steps_panel(self.steps, time.time()), gpu_panel(pic), queues_table(pic), jobs_table(pic),
                     events_panel(pic))


def plain_line(step: Step) -> str:
    """What the headless run prints as a step ends (or starts)."""
    mark = MARKS[step.state][0]
    if step.state == "running":
        return f"{mark} {step.title}"
    return f"{mark} {step.claim or step.title}  [{step.finished - step.started:.1f} s]"
