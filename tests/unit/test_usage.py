"""The virtual node's /metrics/resource (vnode/usage.py): rates of the compute cluster's PodMetrics
integrated into the counters a kubelet serves, and the text metrics-server parses."""

from __future__ import annotations

import pytest

from vnode.status import epoch
from vnode.usage import Sample, Usage, parse_duration, samples_of

T0 = 1_800_000_000.0


def sample(cores: float, at: float, started: float = T0 - 100, memory: int = 2**20, container: str = "main",
           window: float = 10.0) -> Sample:
    return Sample("team-a", "trainer-0", container, cores, memory, at, window, started)


def series(text: str, name: str) -> dict[str, tuple[float, int]]:
    """``name``'s samples by label set: (value, timestamp ms)."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value, ms = line.rsplit(" ", 2)
            out[head[len(name):]] = (float(value), int(ms))
    return out


def test_a_steady_rate_becomes_a_counter_whose_slope_is_that_rate() -> None:
    usage = Usage()
    usage.observe([sample(0.25, T0)])
    first = series(usage.render(), "container_cpu_usage_seconds_total")
    usage.observe([sample(0.25, T0 + 20)])
    second = series(usage.render(), "container_cpu_usage_seconds_total")
    (key,) = first
    assert key == '{container="main",namespace="team-a",pod="trainer-0"}'
    (v1, t1), (v2, t2) = first[key], second[key]
    assert (v2 - v1) / ((t2 - t1) / 1000) == pytest.approx(0.25)  # what metrics-server computes
    assert v1 == pytest.approx(0.25 * 10)  # the first sample: what it used over its window


def test_the_same_sample_twice_adds_nothing_and_a_restart_starts_the_counter_again() -> None:
    usage = Usage()
    usage.observe([sample(1.0, T0)])
    usage.observe([sample(1.0, T0 + 30)])
    usage.observe([sample(1.0, T0 + 30)])  # a scrape before the compute side measured again
    key = '{container="main",namespace="team-a",pod="trainer-0"}'
    assert series(usage.render(), "container_cpu_usage_seconds_total")[key][0] == pytest.approx(40.0)
    usage.observe([sample(1.0, T0 + 60, started=T0 + 45)])
    assert series(usage.render(), "container_cpu_usage_seconds_total")[key][0] == pytest.approx(10.0)
    assert series(usage.render(), "container_start_time_seconds")[key][0] == pytest.approx(T0 + 45)
    # the node's counter never goes back: it is what every container used
    assert series(usage.render(), "node_cpu_usage_seconds_total")[""][0] == pytest.approx(50.0)


def test_node_memory_is_its_containers_and_a_gone_container_is_forgotten() -> None:
    usage = Usage()
    usage.observe([sample(0.5, T0, memory=300 * 2**20), sample(0.5, T0, memory=100 * 2**20, container="side")])
    assert series(usage.render(), "node_memory_working_set_bytes")[""][0] == 400 * 2**20
    usage.observe([sample(0.5, T0 + 10, memory=300 * 2**20)])
    text = usage.render()
    assert len(series(text, "container_memory_working_set_bytes")) == 1
    assert series(text, "node_memory_working_set_bytes")[""][0] == 300 * 2**20


def test_an_idle_node_reports_no_node_series_rather_than_zero() -> None:
    """metrics-server drops a node whose counter is 0 as incomplete; the vnode says nothing instead."""
    text = Usage().render()
    assert "scrape_error 0" in text
    assert "node_cpu_usage_seconds_total" not in text and "container_" not in text


def test_a_podmetrics_object_gives_the_tenant_containers_only() -> None:
    item = {"metadata": {"name": "tenant-1-team-a-trainer-0-x"}, "timestamp": "2027-01-15T08:00:00Z",
            "window": "10.5s", "containers": [
                {"name": "main", "usage": {"cpu": "250m", "memory": "300Mi"}},
                {"name": "istio-proxy", "usage": {"cpu": "12345678n", "memory": "40Ki"}}]}
    (s,) = samples_of(item, "team-a", "trainer-0", ["main"], {"main": T0})
    assert (s.cores, s.memory_bytes, s.window_s, s.started) == (0.25, 300 * 2**20, 10.5, T0)
    assert s.at == epoch("2027-01-15T08:00:00Z")


@pytest.mark.parametrize(("text", "seconds"), [("10s", 10.0), ("1m0s", 60.0), ("1.5s", 1.5), ("500ms", 0.5),
                                               ("1h2m3s", 3723.0), ("", 0.0), ("soon", 0.0), ("10", 0.0)])
def test_windows_are_read_as_go_writes_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_label_values_are_escaped() -> None:
    usage = Usage()
    usage.observe([Sample('ns"x', "p\\q", "c", 1.0, 1, T0, 1.0, T0)])
    assert 'namespace="ns\\"x",pod="p\\\\q"' in usage.render()
