"""The scheduler's configuration file: policy tunables in YAML, validated, and re-read while running.

A real deployment mounts it from a ConfigMap (``manifests/compute/scheduler-config.yaml``); a changed
file applies at the next cycle without a restart. A file that does not parse or validate is refused:
the previous configuration stays, and the reason is returned so the service can log it and put it in an
Event. The command-line flags are the base; the file overrides what it sets.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from scheduler.core.actions import ACTIONS
from scheduler.core.plugins import PLUGINS
from scheduler.core.scheduler import PRESETS, SchedulerConfig


class ConfigFile(BaseModel):
    """What the file may set (camelCase keys, as Kubernetes configuration files are written)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)

    period_seconds: float | None = Field(None, gt=0, le=60, description="seconds between cycles at most")
    preset: str | None = Field(None, description=f"one of {', '.join(PRESETS)}: its actions, plugins and backfill")
    actions: list[str] | None = Field(None, description="the cycle's steps, in order (replaces the preset's)")
    plugins: list[str] | None = Field(None, description="the policies that decide, in order (replaces the preset's)")
    backfill: bool | None = None
    min_runtime_seconds: float | None = Field(None, ge=0)
    reservation_after_seconds: float | None = Field(None, ge=0)
    max_reserved_fraction: float | None = Field(None, ge=0, le=1)
    max_hold_doublings: int | None = Field(None, ge=0, le=16)
    starvation_preempt_after_seconds: float | None = Field(None, ge=0, description="0: never")
    preemption_attempts: int | None = Field(None, ge=0, le=64)
    victim_cooldown_seconds: float | None = Field(None, ge=0)
    preemption_retry_seconds: float | None = Field(None, ge=0)
    usage_half_life_seconds: float | None = Field(None, gt=0, description="fair-over-time: half-life of usage")
    consolidation_moves_per_cycle: int | None = Field(None, ge=0, le=64, description="consolidate: jobs moved per "
                                                      "cycle at most")
    consolidation_cooldown_seconds: float | None = Field(None, ge=0, description="consolidate: a moved job is not "
                                                         "moved again this soon")
    loan_cooldown_seconds: float | None = Field(None, ge=0, description="lend-holds: a job whose last run was "
                                                "evicted this recently does not start on loan on held nodes")
    dependency_timeout_seconds: float | None = Field(
        None, ge=0, description="dependencies: a job whose dependency does not exist this long after it arrived "
                                "can never start")
    las_thresholds_gpu_seconds: list[float] | None = Field(
        None, min_length=1, max_length=8, description="las: GPU-seconds received at which a job moves a level down")
    las_promote_knob: float | None = Field(None, ge=0, description="las: a job that waited this many times as long "
                                                                   "as it ran counts afresh (0: never)")

    @field_validator("las_thresholds_gpu_seconds")
    @classmethod
    def _increasing(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (any(v <= 0 for v in value) or value != sorted(set(value))):
            raise ValueError("thresholds must be positive and increasing")
        return value

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise ValueError(f"unknown preset {value!r}; choose from {', '.join(PRESETS)}")
        return value

    @field_validator("actions")
    @classmethod
    def _known_actions(cls, value: list[str] | None) -> list[str] | None:
        return _names(value, ACTIONS, "action", refused={
            "grow": "the service cannot add pods to a job (its operator does); elastic jobs grow by binding "
                    "the pods they already have"})

    @field_validator("plugins")
    @classmethod
    def _known_plugins(cls, value: list[str] | None) -> list[str] | None:
        return _names(value, PLUGINS, "plugin")


def _names(value: list[str] | None, known: Mapping[str, object], kind: str,
           refused: Mapping[str, str] | None = None) -> list[str] | None:
    if value is None:
        return None
    for name in value:
        if refused and name in refused:
            raise ValueError(f"{kind} {name!r} is not for the service: {refused[name]}")
        if name not in known:
            raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(known)}")
    if len(set(value)) != len(value):
        raise ValueError(f"a {kind} is named twice")
    return value


# ConfigFile field -> SchedulerConfig field (the core's names end in _s)
_CORE_FIELDS = {
    "backfill": "backfill", "min_runtime_seconds": "min_runtime_s",
    "reservation_after_seconds": "reservation_after_s", "max_reserved_fraction": "max_reserved_fraction",
    "max_hold_doublings": "max_hold_doublings", "starvation_preempt_after_seconds": "starvation_preempt_after_s",
    "preemption_attempts": "preemption_attempts", "victim_cooldown_seconds": "victim_cooldown_s",
    "preemption_retry_seconds": "preemption_retry_s", "usage_half_life_seconds": "usage_half_life_s",
    "dependency_timeout_seconds": "dependency_timeout_s",
    "consolidation_moves_per_cycle": "consolidation_moves_per_cycle",
    "consolidation_cooldown_seconds": "consolidation_cooldown_s", "loan_cooldown_seconds": "loan_cooldown_s",
    "las_thresholds_gpu_seconds": "las_thresholds_gpu_s", "las_promote_knob": "las_promote_knob",
}


class ConfigError(ValueError):
    """The file cannot be used; the message names the file, the field and what is wrong."""


@dataclass(frozen=True)
class Settings:
    core: SchedulerConfig
    period_s: float


def parse(text: str, base: Settings, source: str = "configuration") -> Settings:
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not YAML: {exc}".replace("\n", " ")) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    try:
        conf = ConfigFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{source}: {problems}") from exc
    changes: dict[str, Any] = {}
    if conf.preset is not None:  # the service never runs grow (see ConfigFile._known_actions)
        preset = SchedulerConfig.preset(conf.preset).without_actions("grow")
        changes.update(actions=preset.actions, plugins=preset.plugins, backfill=preset.backfill)
    if conf.actions is not None:
        changes["actions"] = tuple(conf.actions)
    if conf.plugins is not None:
        changes["plugins"] = tuple(conf.plugins)
    for name, core_name in _CORE_FIELDS.items():
        value = getattr(conf, name)
        if value is None:
            continue
        if name in ("starvation_preempt_after_seconds", "reservation_after_seconds", "las_promote_knob") and value == 0:
            value = None  # 0 switches it off
        if isinstance(value, list):
            value = tuple(value)
        changes[core_name] = value
    core = dataclasses.replace(base.core, **changes)
    return Settings(core, conf.period_seconds if conf.period_seconds is not None else base.period_s)


class SettingsFile:
    """Re-reads a configuration file when its content changes (a ConfigMap volume swaps a symlink)."""

    def __init__(self, path: Path | None, base: Settings) -> None:
        self.path = path
        self.base = base
        self.current = base
        self._digest = ""

    def load(self) -> Settings:
        """The first read: a bad file stops the scheduler from starting (ConfigError)."""
        if self.path is None:
            return self.current
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot be read ({exc.strerror})") from exc
        self.current = parse(data.decode(errors="replace"), self.base, str(self.path))
        self._digest = hashlib.sha256(data).hexdigest()
        return self.current

    def refresh(self) -> tuple[bool, str | None]:
        """(applied a new configuration, why a changed file was refused)."""
        if self.path is None:
            return False, None
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            digest = f"unreadable:{exc.errno}"
            if digest == self._digest:
                return False, None
            self._digest = digest
            return False, f"{self.path}: cannot be read ({exc.strerror}); keeping the previous configuration"
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._digest:
            return False, None
        self._digest = digest
        try:
            self.current = parse(data.decode(errors="replace"), self.base, str(self.path))
        except ConfigError as exc:
            return False, f"{exc}; keeping the previous configuration"
        return True, None
