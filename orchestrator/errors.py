"""Errors the orchestrator raises for bad user input (the CLI turns them into exit status 2), and
the checks of config entries that several sections share."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """Bad user input: a task, a scheduler name, an experiment config. One-line message."""


def config_entry(where: str, raw: Any, allowed: Iterable[str], expected: str) -> Mapping[str, Any]:
    """`raw` as a mapping whose keys are all in `allowed`, or a ConfigError naming `where` (`expected`
    says what the entry should hold, e.g. "sites, docker and key")."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping with {expected}, got {raw!r}")
    allowed = tuple(allowed)
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")
    return raw


def readable_file(value: Any, base: Path, where: str) -> str:
    """The absolute path of a readable file named by a config entry (relative to `base`)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a file path, got {value!r}")
    path = (base / Path(value).expanduser()).resolve()
    if not path.is_file() or not os.access(path, os.R_OK):
        raise ConfigError(f"{where}: {path} is not a readable file")
    return str(path)
