"""Model registry: built-ins, the size knob, and user models from a module or a file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from workers.models import ModelSpecError, build_model, register_model, registered_models, state_nbytes


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_builtin_models_classify_digit_shaped_input(name: str) -> None:
    model = build_model(name, input_shape=(1, 8, 8), num_classes=10)
    assert model(torch.zeros(5, 1, 8, 8)).shape == (5, 10)


def test_large_model_has_at_least_40_mb_of_float32_weights() -> None:
    model = build_model("large", input_shape=(1, 8, 8), num_classes=10)
    assert state_nbytes(model) >= 40 * 10**6
    assert all(t.dtype == torch.float32 for t in model.state_dict().values())


def test_model_size_is_a_knob() -> None:
    small = build_model("large", input_shape=(1, 8, 8), num_classes=10, model_args={"hidden": 100})
    assert state_nbytes(small) < 200_000


def test_same_seed_same_weights() -> None:
    a = build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=3).state_dict()
    b = build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=3).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_user_model_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent("""
        from torch import nn

        def tiny(*, input_shape, num_classes, width=8):
            return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))
    """))

    model = build_model(f"{path}:tiny", input_shape=(1, 8, 8), num_classes=10, model_args={"width": 5})

    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    assert model.state_dict()["1.weight"].shape == (5, 64)


def test_user_model_from_a_module_and_registration() -> None:
    model = build_model("workers.models:mlp", input_shape=(1, 8, 8), num_classes=3)
    register_model("test-tiny-mlp", lambda **kw: build_model("mlp", **kw, model_args={"hidden": 4}))

    assert model(torch.zeros(1, 1, 8, 8)).shape == (1, 3)
    assert "test-tiny-mlp" in registered_models()
    assert state_nbytes(build_model("test-tiny-mlp", input_shape=(1, 8, 8), num_classes=10)) < 2000


@pytest.mark.parametrize(
    "spec",
    ["nope", "no.such.module:f", "workers.models:does_not_exist", "/no/such/file.py:f", "x:"],
)
def test_bad_specs_raise_a_clear_error(spec: str) -> None:
    with pytest.raises(ModelSpecError):
        build_model(spec, input_shape=(1, 8, 8), num_classes=10)


def test_factory_must_return_a_module(tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text("def f(**kw):\n    return 42\n")
    with pytest.raises(ModelSpecError, match=r"not a torch\.nn\.Module"):
        build_model(f"{path}:f", input_shape=(1, 8, 8), num_classes=10)
