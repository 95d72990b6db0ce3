"""What a kubelet's ``/metrics/resource`` says, for the virtual node: the usage of its pods, read from
the compute cluster's metrics API (``metrics.k8s.io`` PodMetrics of their copies), under the tenant's
names. A tenant's metrics-server scrapes it, so ``kubectl top pod`` and the HorizontalPodAutoscaler
work in the tenant cluster as for pods of any node.

A kubelet reports CPU as a cumulative counter (core-seconds) that metrics-server turns into a rate
between two scrapes; PodMetrics give a rate (cores, averaged over a window). :class:`Usage` integrates
the rates back into counters that only grow while a container lives, and starts one again when the
container restarts (its start time changes), as a kubelet's does. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ferry.kube import quantity
from vnode.status import epoch


@dataclass(frozen=True)
class Sample:
    """One container's usage as the compute cluster measured it, named as the tenant knows it."""

    namespace: str
    pod: str
    container: str
    cores: float
    memory_bytes: int
    at: float  # end of the window, Unix seconds
    window_s: float
    started: float  # the container's start, Unix seconds (0 when unknown)


@dataclass
class _Counter:
    cpu_s: float
    at: float
    started: float
    memory_bytes: int


def parse_duration(text: str | None) -> float:
    """A PodMetrics window ("10.5s", "1m0s", "500ms") in seconds; 0 when absent or not understood."""
    if not text:
        return 0.0
    total, number = 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = next((u for u in ("ms", "us", "µs", "ns", "h", "m", "s") if text.startswith(u, i)), None)
        if unit is None or not number:
            return 0.0
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    return total if not number else 0.0


def samples_of(metrics: dict[str, Any], namespace: str, pod: str, containers: Iterable[str],
               started: dict[str, float]) -> list[Sample]:
    """The samples of one PodMetrics object for the tenant pod ``namespace/pod``: its containers among
    ``containers`` (what the compute side may have added is not the tenant's), with their start times."""
    want = set(containers)
    at = epoch(metrics.get("timestamp"))
    window = parse_duration(metrics.get("window"))
    out = []
    for c in metrics.get("containers") or []:
        name = c.get("name", "")
        if name not in want:
            continue
        use = c.get("usage") or {}
        out.append(Sample(namespace, pod, name, float(quantity.parse(use.get("cpu", "0"))),
                          int(quantity.parse(use.get("memory", "0"))), at, window, started.get(name, 0.0)))
    return out


class Usage:
    """Cumulative CPU of each container and of the node, from successive samples."""

    def __init__(self) -> None:
        self._containers: dict[tuple[str, str, str], _Counter] = {}
        self._node_cpu_s = 0.0
        self._node_at = 0.0

    def observe(self, samples: Iterable[Sample]) -> None:
        """Fold in the latest samples; containers not among them are forgotten (gone or not measured)."""
        seen: dict[tuple[str, str, str], _Counter] = {}
        for s in samples:
            key = (s.namespace, s.pod, s.container)
            was = self._containers.get(key)
            if was is not None and was.started == s.started:
                grown = s.cores * (s.at - was.at) if s.at > was.at else 0.0
                now = _Counter(was.cpu_s + grown, max(was.at, s.at), s.started, s.memory_bytes)
            else:  # new, or restarted: what it used in the window it was measured over
                grown = s.cores * s.window_s
                now = _Counter(grown, s.at, s.started, s.memory_bytes)
            self._node_cpu_s += grown
            self._node_at = max(self._node_at, s.at)
            seen[key] = now
        self._containers = seen

    def render(self) -> str:
        """The Prometheus text a kubelet's ``/metrics/resource`` serves (the series metrics-server reads),
        each with the time it was measured at."""
        lines = ["# HELP scrape_error 1 if there was an error while getting container metrics, 0 otherwise",
                 "# TYPE scrape_error gauge", "scrape_error 0"]
        if self._node_at and self._node_cpu_s > 0:
            ms = _ms(self._node_at)
            memory = sum(c.memory_bytes for c in self._containers.values())
            lines += ["# HELP node_cpu_usage_seconds_total Cumulative cpu time consumed by the node in core-seconds",
                      "# TYPE node_cpu_usage_seconds_total counter",
                      f"node_cpu_usage_seconds_total {_num(self._node_cpu_s)} {ms}",
                      "# HELP node_memory_working_set_bytes Current working set of the node in bytes",
                      "# TYPE node_memory_working_set_bytes gauge",
                      f"node_memory_working_set_bytes {memory} {ms}"]
        items = sorted(self._containers.items())
        for metric, kind, help_text, value in _CONTAINER_SERIES if items else ():
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
            for (ns, pod, container), c in items:
                if (shown := value(c)) is None:
                    continue
                labels = f'container="{_esc(container)}",namespace="{_esc(ns)}",pod="{_esc(pod)}"'
                lines.append(f"{metric}{{{labels}}} {shown} {_ms(c.at)}")
        return "\n".join(lines) + "\n"


def _cpu(c: _Counter) -> str | None:
    return _num(c.cpu_s)


def _memory(c: _Counter) -> str | None:
    return str(c.memory_bytes)


def _start(c: _Counter) -> str | None:
    return _num(c.started) if c.started else None


_CONTAINER_SERIES: tuple[tuple[str, str, str, Callable[[_Counter], str | None]], ...] = (
    ("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the container in core-seconds",
     _cpu),
    ("container_memory_working_set_bytes", "gauge", "Current working set of the container in bytes", _memory),
    ("container_start_time_seconds", "gauge", "Start time of the container since unix epoch in seconds", _start),
)


def _ms(t: float) -> int:
    return math.floor(t * 1000)


def _num(x: float) -> str:
    return repr(float(x))


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
