"""Scheduler plugins: a scheduler named in a config or on the command line, loaded and checked.

An *entry* names a scheduler in one of four forms:

- a registered name (``spff``, ``mst``, ``steiner``, ``spt``: `SCHEDULERS`);
- ``package.module:Class``: imported like any module;
- ``path/to/file.py:Class``: a single file, its path relative to `base_dir` (the config file's
  folder for a config, the working directory on the command line);
- a mapping ``{name: LABEL, spec: ONE_OF_THE_ABOVE, options: {...}}`` (``name`` and ``options``
  optional): a label of one's own and keyword options for the class.

`resolve_scheduler` turns an entry into a `SchedulerSpec`: the label the results, figures and
reports use, the canonical spec (a file spec with its absolute path, so the spec means the same
thing wherever it is read again), the class and its options. Everything is checked there, before
anything starts, each failure one `ConfigError` line: a module or file that cannot be loaded, a
missing class, a class that is not a `Scheduler`, an option the class does not declare (its
``__init__`` keyword parameters), an option of the wrong type (their annotations), an option the
class itself refuses (its ``__init__`` raises ``ValueError`` or ``TypeError``). The contract a
plugin keeps is in docs/schedulers.md.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.scheduling.base import Scheduler
from orchestrator.scheduling.registry import EXTRA_SCHEDULERS, SCHEDULERS

#: A label: what results, figures, reports and task folders call a scheduler.
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}$")
ENTRY_KEYS = ("name", "spec", "options")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class SchedulerSpec:
    """A resolved scheduler entry: `label`, canonical `spec`, the class and its `options`.

    Two specs are equal when label, spec and options are (the class object is not compared: the
    same file loaded again gives the same spec).
    """

    label: str
    spec: str
    cls: type[Scheduler] = field(compare=False, hash=False, repr=False)
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def build(self) -> Scheduler:
        """A new scheduler instance; its schedules carry the label as their scheduler name."""
        scheduler = self.cls(**self.options)
        scheduler.name = self.label
        return scheduler

    def to_entry(self) -> str | dict[str, Any]:
        """The entry that resolves back to this spec: the bare spec when label and options are its
        defaults, else the mapping form."""
        if not self.options and self.label == default_label(self.spec, self.cls):
            return self.spec
        out: dict[str, Any] = {"name": self.label, "spec": self.spec}
        if self.options:
            out["options"] = dict(self.options)
        return out


def registered() -> dict[str, type[Scheduler]]:
    return {**SCHEDULERS, **EXTRA_SCHEDULERS}


def default_label(spec: str, cls: type[Scheduler]) -> str:
    """A registered scheduler's name, else the class's `name` attribute, else its class name."""
    if spec in registered():
        return spec
    return cls.name or cls.__name__


def resolve_scheduler(entry: Any, base_dir: str | Path | None = None) -> SchedulerSpec:
    """Resolve one entry (see the module docstring); `base_dir` (default: the working directory)
    anchors relative file specs.

    Raises
    ------
    ConfigError
        One line naming the entry and what is wrong with it.
    """
    base = Path.cwd() if base_dir is None else Path(base_dir)
    label: str | None = None
    options: dict[str, Any] = {}
    if isinstance(entry, Mapping):
        unknown = sorted(str(k) for k in set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise ConfigError(f"scheduler entry {dict(entry)!r}: unknown key {unknown[0]!r}; "
                              f"allowed: {', '.join(ENTRY_KEYS)}")
        if "spec" not in entry:
            raise ConfigError(f"scheduler entry {dict(entry)!r} needs a spec (a name, module:Class or file.py:Class)")
        spec_text = entry["spec"]
        if "name" in entry:
            label = entry["name"]
            if not isinstance(label, str) or not LABEL_RE.match(label):
                raise ConfigError(f"scheduler name {label!r} must be 1 to 40 letters, digits, or _ . + - "
                                  "(starting with a letter or digit)")
        raw_options = entry.get("options") or {}
        if not isinstance(raw_options, Mapping) or not all(isinstance(k, str) for k in raw_options):
            raise ConfigError(f"scheduler {spec_text!r}: options must be a mapping of option names to values, "
                              f"got {raw_options!r}")
        options = dict(raw_options)
    else:
        spec_text = entry
    if not isinstance(spec_text, str) or not spec_text.strip():
        raise ConfigError(f"a scheduler must be a name, module:Class, path/file.py:Class or a mapping, got {entry!r}")
    spec, cls = load_class(spec_text.strip(), base)
    if label is None:
        label = default_label(spec, cls)
        if not LABEL_RE.match(label):
            raise ConfigError(f"scheduler {spec!r}: its name {label!r} cannot be a label; give one: "
                              f"{{name: LABEL, spec: {spec}}}")
    if label in registered() and registered()[label] is not cls:
        raise ConfigError(f"scheduler label {label!r} is the registered scheduler {label}'s; "
                          f"give {spec!r} another name")
    check_options(spec, cls, options)
    resolved = SchedulerSpec(label=label, spec=spec, options=options, cls=cls)
    try:
        resolved.build()  # the class's own checks of its options, before anything starts
    except (TypeError, ValueError) as e:
        raise ConfigError(f"scheduler {label!r} ({spec}): {_one_line(e)}") from None
    return resolved


def resolve_schedulers(entries: Sequence[Any], base_dir: str | Path | None = None) -> tuple[SchedulerSpec, ...]:
    """Resolve every entry of a list; labels must be unique."""
    specs = tuple(resolve_scheduler(e, base_dir) for e in entries)
    seen: set[str] = set()
    for s in specs:
        if s.label in seen:
            raise ConfigError(f"scheduler label {s.label!r} is used twice; give one of them another name "
                              f"({{name: LABEL, spec: {s.spec}}})")
        seen.add(s.label)
    return specs


def load_class(spec: str, base_dir: Path) -> tuple[str, type[Scheduler]]:
    """(canonical spec, class) for a registered name, ``module:Class`` or ``file.py:Class``."""
    reg = registered()
    if spec in reg:
        return spec, reg[spec]
    if ":" not in spec:
        raise ConfigError(f"unknown scheduler {spec!r}; choose from {', '.join(reg)}, "
                          "or give module:Class or path/to/file.py:Class")
    target, _, attr = spec.rpartition(":")
    if not target or not attr.isidentifier():
        raise ConfigError(f"scheduler spec {spec!r} must be module:Class or path/to/file.py:Class")
    if target.endswith(".py"):
        path = (base_dir / Path(target).expanduser()).resolve()
        module = _load_file(spec, path)
        canonical = f"{path}:{attr}"
    else:
        if not _MODULE_RE.match(target):
            raise ConfigError(f"scheduler spec {spec!r}: {target!r} is neither a module name nor a .py file")
        try:
            module = importlib.import_module(target)
        except Exception as e:  # noqa: BLE001 -- whatever the import raised, one line
            raise ConfigError(f"scheduler {spec!r}: cannot import module {target!r}: {_one_line(e)}") from None
        canonical = spec
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(f"scheduler {spec!r}: {target} has no {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise ConfigError(f"scheduler {spec!r}: {attr} is not a subclass of "
                          "orchestrator.scheduling.base.Scheduler")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise ConfigError(f"scheduler {spec!r}: {attr} is abstract (it does not define {missing})")
    return canonical, cls


def _load_file(spec: str, path: Path) -> types.ModuleType:
    """The module of a scheduler file, loaded once per process (the same class every time)."""
    if not path.is_file():
        raise ConfigError(f"scheduler {spec!r}: no such file {path}")
    name = "netai_scheduler_plugin_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
    module = sys.modules.get(name)
    if module is not None:
        return module
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError(f"scheduler {spec!r}: cannot load {path} as Python")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # dataclasses and pickle-free introspection look modules up here
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 -- a broken file: one line
        del sys.modules[name]
        raise ConfigError(f"scheduler {spec!r}: loading {path} failed: {_one_line(e)}") from None
    return module


# -- options --------------------------------------------------------------------------------------
def declared_options(cls: type[Scheduler]) -> dict[str, inspect.Parameter]:
    """The options a scheduler class takes: the named parameters of its ``__init__`` but self."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_options(spec: str, cls: type[Scheduler], options: Mapping[str, Any]) -> None:
    """Every option declared by `cls` and of its annotated type; every required one given."""
    declared = declared_options(cls)
    takes_any = any(p.kind == p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())
    allowed = ", ".join(declared) or "none"
    for key in options:
        if key not in declared and not takes_any:
            raise ConfigError(f"scheduler {spec!r}: unknown option {key!r}; allowed: {allowed}")
    missing = [n for n, p in declared.items() if p.default is p.empty and n not in options]
    if missing:
        raise ConfigError(f"scheduler {spec!r}: option {missing[0]!r} is required")
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001 -- an annotation that does not resolve is not checked
        hints = {}
    for key, value in options.items():
        expected = hints.get(key)
        if expected is not None and not type_matches(value, expected):
            raise ConfigError(f"scheduler {spec!r}: option {key!r} must be {describe_type(expected)}, got {value!r}")


def type_matches(value: Any, expected: Any) -> bool:
    """Whether a config value (YAML scalars, lists, mappings) fits an annotation.

    Understood: Any, None, bool, int, float (an int fits), str, Literal, unions and Optional,
    list/tuple/Sequence[...] and dict/Mapping[...]; a plain class by isinstance. Anything else is
    taken as matching (the class's own ``__init__`` still checks).
    """
    if expected is Any or expected is object:
        return True
    if expected is None or expected is type(None):
        return value is None
    origin = typing.get_origin(expected)
    args = typing.get_args(expected)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is typing.Union or origin is types.UnionType:
        return any(type_matches(value, a) for a in args)
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin in (list, tuple, Sequence, typing.Sequence) or expected in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return len(args) == len(value) and all(type_matches(v, a) for v, a in zip(value, args, strict=True))
        item = args[0] if args else Any
        return all(type_matches(v, item) for v in value)
    if origin in (dict, Mapping, typing.Mapping) or expected is dict:
        if not isinstance(value, Mapping):
            return False
        kt, vt = args if len(args) == 2 else (Any, Any)
        return all(type_matches(k, kt) and type_matches(v, vt) for k, v in value.items())
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True


def describe_type(expected: Any) -> str:
    """A short reading of an annotation for an error message."""
    origin = typing.get_origin(expected)
    args = typing.get_args(expected)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(describe_type(a) for a in args)
    if expected is type(None) or expected is None:
        return "null"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if expected in names:
        return names[expected]
    if origin in (list, tuple, Sequence, typing.Sequence):
        return "a list" + (f" of {describe_type(args[0])}" if args else "")
    if origin in (dict, Mapping, typing.Mapping):
        return "a mapping"
    return getattr(expected, "__name__", str(expected))


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
