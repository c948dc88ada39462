"""Aggregation strategies of a task: what local training optimises and how updates combine.

A strategy is named in the task's config (``strategy``, `workers.config.AgentConfig`):

- ``fedavg`` (McMahan et al., AISTATS 2017): local SGD on the local loss; updates combine as the
  example-weighted mean (`workers.aggregate`). Today's behaviour and the default.
- ``fedprox`` (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020): local
  training adds the proximal term ``mu / 2 * ||w - w_global||^2`` to the local loss, which keeps a
  local model near the round's global model (helps with non-IID parts); updates combine as in
  FedAvg, so in-path aggregation along any tree is unchanged. ``mu = 0`` is FedAvg.

The hook is `Strategy`: `begin` is called with the model before local training (the round's global
model is loaded), `penalty` adds to every batch's loss. Aggregation is the example-weighted mean for
both strategies (the one the agents' chunked, in-path aggregation computes exactly).
"""

from __future__ import annotations

from typing import Final

import torch
from torch import nn

STRATEGIES: Final = ("fedavg", "fedprox")


class Strategy:
    """FedAvg: no term beyond the local loss."""

    name = "fedavg"

    def begin(self, model: nn.Module) -> None:
        """Local training of one round starts from `model` (the round's global model)."""

    def penalty(self, model: nn.Module) -> torch.Tensor | None:
        """What to add to a batch's loss (None: nothing)."""
        return None


class FedProx(Strategy):
    """FedProx: ``mu / 2 * ||w - w_global||^2`` over the trainable parameters."""

    name = "fedprox"

    def __init__(self, mu: float) -> None:
        if not mu >= 0:
            raise ValueError(f"mu must not be negative, got {mu!r}")
        self.mu = mu
        self._anchor: list[torch.Tensor] = []

    def begin(self, model: nn.Module) -> None:
        self._anchor = [p.detach().clone() for p in model.parameters()]

    def penalty(self, model: nn.Module) -> torch.Tensor | None:
        if self.mu == 0 or not self._anchor:
            return None
        total = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), self._anchor, strict=True))
        assert isinstance(total, torch.Tensor)
        return 0.5 * self.mu * total


def make_strategy(name: str, *, mu: float = 0.0) -> Strategy:
    """The strategy `name` (one of `STRATEGIES`). Raises ValueError for an unknown name."""
    if name == "fedavg":
        return Strategy()
    if name == "fedprox":
        return FedProx(mu)
    raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
