"""`workers.sgd.SGD` computes what ``torch.optim.SGD`` computes, bit for bit, and keeps torch's
compiler stack out of a process that trains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import workers.learning
from workers.config import AgentConfig
from workers.learning import Learner
from workers.models import build_model
from workers.sgd import SGD

ROOT = Path(__file__).resolve().parents[2]


def _steps(model: nn.Module, make_opt: object, *, steps: int, frozen: str | None = None) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    if frozen is not None:
        dict(model.named_parameters())[frozen].requires_grad_(False)
    opt = make_opt([p for p in model.parameters() if p.requires_grad])  # type: ignore[operator]
    for _ in range(steps):
        x = torch.randn(16, 1, 8, 8, generator=gen)
        y = torch.randint(0, 10, (16,), generator=gen)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y) + 0.05 * sum((p ** 2).sum() for p in model.parameters())
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_every_step_equals_torch_optim_sgd_bit_for_bit(name: str, momentum: float) -> None:
    got, want = (
        _steps(build_model(name, input_shape=(1, 8, 8), num_classes=10, seed=3), make, steps=12)
        for make in (lambda ps: SGD(ps, lr=0.07, momentum=momentum),
                     lambda ps: torch.optim.SGD(ps, lr=0.07, momentum=momentum))
    )
    assert got.keys() == want.keys()
    for k in got:
        assert torch.equal(got[k], want[k]), k


def test_a_parameter_without_a_gradient_is_left_alone_as_torch_leaves_it() -> None:
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, seed=3)
    first = next(iter(model.state_dict()))
    before = model.state_dict()[first].clone()
    got = _steps(model, lambda ps: SGD(ps, lr=0.1, momentum=0.9), steps=3, frozen=first)
    want = _steps(build_model("mlp", input_shape=(1, 8, 8), num_classes=10, seed=3),
                  lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), steps=3, frozen=first)
    assert torch.equal(got[first], before)
    assert all(torch.equal(got[k], want[k]) for k in got)


def test_a_learner_trains_to_the_same_weights_as_with_torch_optim(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = AgentConfig(task=1, site="L", host="127.0.0.2", broadcast_port=1, upload_port=2, rounds=1,
                      part_index=0, num_parts=4, local_epochs=2, strategy="fedprox", mu=0.5)
    ours = Learner(cfg)
    ours.train()
    monkeypatch.setattr(workers.learning, "SGD", torch.optim.SGD)
    theirs = Learner(cfg)
    theirs.train()
    a, b = ours.state(), theirs.state()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="lr and momentum"):
        SGD([torch.zeros(1, requires_grad=True)], lr=-0.1)


def test_a_process_that_trains_never_imports_torchs_compiler() -> None:
    code = ("import sys\n"
            "from workers.learning import warm_process\n"
            "from workers.config import AgentConfig\n"
            "from workers.learning import Learner\n"
            "warm_process()\n"
            "Learner(AgentConfig(task=1, site='L', host='127.0.0.2', broadcast_port=1, upload_port=2, rounds=1,"
            " part_index=0, num_parts=4, local_epochs=1)).train()\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor', 'sympy'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]
