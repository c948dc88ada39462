"""Loading what a spec names: ``module:attr`` or ``path/to/file.py:attr`` (models, datasets and
selection policies are given this way; see docs/models.md and docs/selection.md)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_target(target: str, *, what: str, spec: str, error: type[Exception]) -> ModuleType:
    """The module `target` names: a ``.py`` file (loaded once per path, under a private name) or an
    importable module. Raises `error` with one line naming `what` (e.g. ``model``) and `spec`."""
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise error(f"{what} file {path} does not exist")
        mod_name = f"netai_user_{what.replace(' ', '_')}_{abs(hash(str(path)))}"
        module = sys.modules.get(mod_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise error(f"cannot load {path} as Python")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            loader_spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ImportError as e:
        raise error(f"cannot import {target!r} for {what} {spec!r}: {e}") from e
