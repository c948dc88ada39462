"""The value checks of the experiment config's declared schema (`orchestrator.experiment.config`):
each takes the key as written and the value, and returns the value or raises `ConfigError` naming
the key."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.errors import ConfigError

Check = Callable[[str, Any], Any]


def int_check(lo: int, hi: int | None = None) -> Check:
    def check(key: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
            raise ConfigError(f"{key} must be an integer {rng}, got {v!r}")
        return v

    return check


def num_check(lo: float, hi: float | None = None, *, lo_open: bool = False) -> Check:
    def check(key: str, v: Any) -> float:
        ok = not isinstance(v, bool) and isinstance(v, (int, float))
        if ok:
            ok = (v > lo if lo_open else v >= lo) and (hi is None or v <= hi)
        if not ok:
            bound = f"{'>' if lo_open else '>='} {lo:g}" + ("" if hi is None else f" and <= {hi:g}")
            raise ConfigError(f"{key} must be a number {bound}, got {v!r}")
        return float(v)

    return check


def choice_check(options: tuple[str, ...]) -> Check:
    def check(key: str, v: Any) -> str:
        if v not in options:
            raise ConfigError(f"{key} must be one of {', '.join(options)}, got {v!r}")
        return str(v)

    return check


def str_check(key: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{key} must be a non-empty string, got {v!r}")
    return v


def text_check(key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{key} must be a string, got {v!r}")
    return v


def bool_check(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{key} must be true or false, got {v!r}")
    return v


def section_check(prefix: str, raw: Any, schema: Mapping[str, Check]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix} must be a mapping, got {raw!r}")
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise ConfigError(f"unknown key {prefix}.{unknown[0]}; allowed in {prefix}: {', '.join(schema)}")
    return {k: schema[k](f"{prefix}.{k}", v) for k, v in raw.items()}
