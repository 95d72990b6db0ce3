"""The scheduler's configuration file: validation, overrides of the flags, reload and refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.service.settings import ConfigError, Settings, SettingsFile, parse

BASE = Settings(SchedulerConfig.preset("ferry", min_runtime_s=300.0).without_actions("grow"), period_s=0.5)


def test_the_file_overrides_what_it_sets_and_keeps_the_rest() -> None:
    s = parse("minRuntimeSeconds: 20\nperiodSeconds: 0.2\nstarvationPreemptAfterSeconds: 0\n", BASE)
    assert s.core.min_runtime_s == 20 and s.period_s == 0.2
    assert s.core.starvation_preempt_after_s is None  # 0 switches it off
    assert s.core.victim_cooldown_s == BASE.core.victim_cooldown_s and "grow" not in s.core.actions
    assert parse("", BASE) == BASE
    fair = parse("plugins: [priority, fair-over-time, capacity, fragmentation]\nusageHalfLifeSeconds: 7200\n", BASE)
    assert fair.core.usage_half_life_s == 7200 and fair.core.plugins[-1] == "fragmentation"
    las = parse("lasThresholdsGpuSeconds: [1800, 18000, 180000]\nlasPromoteKnob: 0\n", BASE)
    assert las.core.las_thresholds_gpu_s == (1800, 18000, 180000) and las.core.las_promote_knob is None


@pytest.mark.parametrize(("text", "says"), [
    ("minRuntimeSeconds: -1", "minRuntimeSeconds: Input should be greater than or equal to 0"),
    ("minRuntime: 20", "minRuntime: Extra inputs are not permitted"),
    ("maxReservedFraction: 2", "maxReservedFraction: Input should be less than or equal to 1"),
    ("backfill: maybe", "backfill: Input should be a valid boolean"),
    ("- a\n- b", "expected a mapping of settings, got list"),
    ("a: [", "not YAML"),
    ("usageHalfLifeSeconds: 0", "usageHalfLifeSeconds: Input should be greater than 0"),
    ("plugins: [priority, fgd]", "unknown plugin"),
    ("lasThresholdsGpuSeconds: [3600, 60]", "lasThresholdsGpuSeconds: Value error, thresholds must be positive "
                                            "and increasing"),
])
def test_a_bad_file_is_refused_with_the_field_and_the_reason(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        parse(text, BASE, "config.yaml")
    assert says in str(info.value) and str(info.value).startswith("config.yaml: ")


def test_a_changed_file_applies_and_a_broken_one_keeps_the_previous(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text("minRuntimeSeconds: 20\n")
    settings = SettingsFile(f, BASE)
    assert settings.load().core.min_runtime_s == 20
    assert settings.refresh() == (False, None)  # unchanged: nothing to do
    f.write_text("minRuntimeSeconds: 45\n")
    assert settings.refresh() == (True, None) and settings.current.core.min_runtime_s == 45
    f.write_text("minRuntimeSeconds: soon\n")
    applied, error = settings.refresh()
    assert not applied and error is not None and "keeping the previous configuration" in error
    assert settings.current.core.min_runtime_s == 45
    assert settings.refresh() == (False, None)  # said once, not every cycle
    f.unlink()
    applied, error = settings.refresh()
    assert not applied and error is not None and "cannot be read" in error
    assert settings.current.core.min_runtime_s == 45


def test_a_bad_file_at_start_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text("periodSeconds: 0\n")
    with pytest.raises(ConfigError, match="periodSeconds"):
        SettingsFile(f, BASE).load()
