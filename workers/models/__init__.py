"""Model registry of the FL workers.

A model spec is one of:

- a registered name: ``mlp``, ``cnn``, ``large`` (an MLP with >= 40 MB of float32 weights, so that
  weight exchange dominates a round), or any name added with `register_model`;
- ``package.module:callable`` — an importable factory;
- ``path/to/file.py:callable`` — a factory in a Python file (loaded by path; the user's own code).

A factory is called as ``factory(input_shape=(C, H, W), num_classes=K, **model_args)`` and returns
a ``torch.nn.Module``. Every worker of a task builds the same model from the same spec and seed, so
the state dicts agree in names, shapes and dtypes (the wire format checks this).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from workers.config import normalize_spec
from workers.specs import import_target

ModelFactory = Callable[..., nn.Module]

_REGISTRY: dict[str, ModelFactory] = {}
#: A site server builds the models of several tasks' roles at once, each from its own seed: the
#: seeding and the factory call hold this lock, on a forked global RNG.
_BUILD_LOCK = threading.RLock()  # re-entrant: a factory may build another registered model


class ModelSpecError(ValueError):
    """A model spec names nothing loadable or the factory returns something unusable."""


def register_model(name: str, factory: ModelFactory) -> None:
    """Register `factory` under `name` (replacing an earlier registration of the same name)."""
    if not name or ":" in name:
        raise ModelSpecError(f"a model name must be non-empty and contain no ':', got {name!r}")
    _REGISTRY[name] = factory


def registered_models() -> list[str]:
    return sorted(_REGISTRY)


def resolve_factory(spec: str) -> ModelFactory:
    """The factory a spec names (see the module docstring).

    Raises
    ------
    ModelSpecError
        Unknown name, module or file that does not exist, attribute missing or not callable.
    """
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    if ":" not in spec:
        raise ModelSpecError(
            f"unknown model {spec!r}: registered are {registered_models()}; or give "
            "'module:callable' or 'path/to/file.py:callable'"
        )
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ModelSpecError(f"model spec {spec!r} must be 'module:callable' or 'file.py:callable'")
    module = import_target(target, what="model", spec=spec, error=ModelSpecError)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelSpecError(f"{target} has no callable {attr!r}")
    return factory


def build_model(
    spec: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int = 0,
    model_args: dict[str, Any] | None = None,
) -> nn.Module:
    """Build the model a spec names, with weights initialised from `seed`."""
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):
        factory = resolve_factory(spec)
        torch.manual_seed(seed)
        model = factory(input_shape=tuple(input_shape), num_classes=num_classes, **(model_args or {}))
    if not isinstance(model, nn.Module):
        raise ModelSpecError(f"model {spec!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def state_nbytes(model: nn.Module) -> int:
    """Bytes of the model's state dict tensors (what one GLOBAL or UPDATE carries)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


# -- built-in models --------------------------------------------------------------------------------
def mlp(*, input_shape: tuple[int, ...], num_classes: int, hidden: int = 64, layers: int = 1) -> nn.Module:
    """A multilayer perceptron: `layers` hidden layers of width `hidden` with ReLU."""
    dims = [math.prod(input_shape), *([hidden] * layers)]
    mods: list[nn.Module] = [nn.Flatten()]
    for a, b in itertools.pairwise(dims):
        mods += [nn.Linear(a, b), nn.ReLU()]
    mods.append(nn.Linear(dims[-1], num_classes))
    return nn.Sequential(*mods)


def cnn(*, input_shape: tuple[int, ...], num_classes: int, channels: int = 16) -> nn.Module:
    """A small CNN: two 3x3 convolutions, one 2x2 max-pool, two linear layers."""
    c, h, w = (input_shape if len(input_shape) == 3 else (1, *input_shape))
    return nn.Sequential(
        nn.Conv2d(c, channels, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * (h // 2) * (w // 2), 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


def large(*, input_shape: tuple[int, ...], num_classes: int, hidden: int = 3200) -> nn.Module:
    """An MLP with two hidden layers of width `hidden`: 3200 gives 10.5 M float32 weights (42 MB),
    so that transferring weights dominates a round. `hidden` is the model-size knob."""
    return mlp(input_shape=input_shape, num_classes=num_classes, hidden=hidden, layers=2)


register_model("mlp", mlp)
register_model("cnn", cnn)
register_model("large", large)

__all__ = [
    "ModelSpecError",
    "build_model",
    "cnn",
    "large",
    "mlp",
    "normalize_spec",
    "register_model",
    "registered_models",
    "resolve_factory",
    "state_nbytes",
]
