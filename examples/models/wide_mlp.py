"""A model of your own, without editing the project (docs/models.md, docs/tutorial.md): a factory
called as ``factory(input_shape=(C, H, W), num_classes=K, **model_args)`` that returns a
``torch.nn.Module``. Name it as ``examples/models/wide_mlp.py:wide_mlp``."""

from torch import nn


def wide_mlp(*, input_shape: tuple[int, ...], num_classes: int, width: int = 256) -> nn.Module:
    """One hidden layer of `width` units over the flattened input."""
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, width), nn.ReLU(), nn.Linear(width, num_classes))
