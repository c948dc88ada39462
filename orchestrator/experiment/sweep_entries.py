"""A config's ``sweep``: the settings each of its runs overrides, merged into the config and checked
whole, before anything starts. The config module passes its own parser in (`parse_sweep`), so this
module imports neither it nor the runner; the sweep's driver is `orchestrator.experiment.sweep`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from orchestrator.errors import ConfigError

T = TypeVar("T")


def merged(base: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `entry`'s settings: a section (a mapping in both) gets the entry's keys, anything
    else is replaced (so ``task: {model_args: ...}`` replaces the model's arguments, keeping the task's
    other keys)."""
    out = dict(base)
    for key, v in entry.items():
        out[key] = {**base[key], **v} if isinstance(v, Mapping) and isinstance(base.get(key), Mapping) else v
    return out


def parse_sweep(raw: Mapping[str, Any], *, name: str, keys: Sequence[str],
                parse: Callable[[dict[str, Any]], T]) -> tuple[tuple[T, ...], tuple[dict[str, Any], ...]]:
    """The runs of `raw`'s ``sweep`` (each entry merged into `raw` without it, named ``name-1``, ...,
    and parsed by `parse`) and the entries as written; ((), ()) without a sweep.

    Raises
    ------
    ConfigError
        The sweep is not a non-empty list of mappings, an entry sets a key not in `keys`, or the run
        it makes is invalid (prefixed ``sweep[i]:``).
    """
    entries = raw.get("sweep")
    if entries is None:
        return (), ()
    if not isinstance(entries, list) or not entries or not all(isinstance(e, Mapping) for e in entries):
        raise ConfigError("sweep must be a non-empty list of mappings (the settings each run of the sweep overrides)")
    base = {k: v for k, v in raw.items() if k != "sweep"}
    runs = []
    for i, entry in enumerate(entries, 1):
        bad = sorted(set(entry) - set(keys))
        if bad:
            raise ConfigError(f"sweep[{i}]: unknown key {bad[0]!r}; a sweep entry may set: {', '.join(keys)}")
        try:
            runs.append(parse(merged(base, entry) | {"name": f"{name}-{i}"}))
        except ConfigError as e:
            raise ConfigError(f"sweep[{i}]: {e}") from None
    return tuple(runs), tuple(dict(e) for e in entries)
