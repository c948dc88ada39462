"""`SGD`: the local training's optimizer, stochastic gradient descent with momentum.

It computes what ``torch.optim.SGD(params, lr=lr, momentum=m)`` computes on the CPU (no dampening,
weight decay or Nesterov; torch's single-tensor path, which is the one it takes for CPU tensors),
step for step and bit for bit (tests/unit/test_sgd.py). It is not torch.optim's own because that
one imports ``torch._dynamo`` in its constructor and in every ``step`` (about 800 modules: sympy,
inductor): 1.6-2 s of CPU in each process that trains, a third of what a site server in a worker
container takes to start, paid by each of an emulation's containers at once.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class SGD:
    """SGD with momentum over `params` (tensors that require grad); the momentum buffers start empty,
    as a new ``torch.optim.SGD``'s do."""

    def __init__(self, params: Iterable[torch.Tensor], *, lr: float, momentum: float = 0.0) -> None:
        if lr < 0.0 or momentum < 0.0:
            raise ValueError(f"SGD: lr and momentum must be >= 0, got {lr} and {momentum}")
        self.params = list(params)
        self.lr = lr
        self.momentum = momentum
        self._buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        """Drop every gradient (``set_to_none``, torch.optim's default)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient; one without is left as it is."""
        for i, p in enumerate(self.params):
            grad = p.grad
            if grad is None:
                continue
            if self.momentum != 0.0:
                buf = self._buffers[i]
                if buf is None:
                    buf = self._buffers[i] = torch.clone(grad).detach()
                else:
                    buf.mul_(self.momentum).add_(grad, alpha=1.0)
                grad = buf
            p.add_(grad, alpha=-self.lr)
