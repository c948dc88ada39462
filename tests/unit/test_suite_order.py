"""The suite's order (tests/conftest.py) and the venv it runs in (scripts/provision.sh, docs/testing.md
"The set-up"): the tests that need neither root nor Docker run beside the guest's checks, before the
guest's tests and the emulations; and a venv the set-up copied from another checkout's points its
scripts and the project's install at this checkout."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import orchestrator
from tests.conftest import _phase

ROOT = Path(__file__).resolve().parents[2]


def _item(path: str, *marks: str) -> SimpleNamespace:
    return SimpleNamespace(path=Path("/checkout") / path, keywords={m: True for m in marks})


def test_unit_then_no_root_nor_docker_then_the_guest_then_the_rest_each_in_its_own_order() -> None:
    # Prepare: the collected order, mixed
    items = [_item("tests/integration/test_emu.py", "root", "slow"),
             _item("tests/guest/test_stock_kernel.py", "root", "slow"),
             _item("tests/integration/test_sim_b.py", "slow"),
             _item("tests/docker/test_containers.py", "docker", "slow"),
             _item("tests/unit/test_b.py"),
             _item("tests/guest/test_driver.py"),
             _item("tests/integration/test_sim_a.py", "slow"),
             _item("tests/unit/test_a.py", "root")]

    # Execute
    ordered = sorted(items, key=_phase)  # type: ignore[arg-type]

    # Assert: each phase in its collected order
    assert [i.path.name for i in ordered] == [
        "test_b.py", "test_a.py",  # the unit tests, root or not
        "test_sim_b.py", "test_sim_a.py",  # the others without root or Docker, beside the guest's checks
        "test_stock_kernel.py", "test_driver.py",  # the guest's
        "test_emu.py", "test_containers.py"]  # then the emulations and the containers


def test_the_venv_runs_this_checkouts_code_and_its_scripts_its_own_python() -> None:
    # A venv copied from another checkout's cache (scripts/provision.sh) has its scripts' shebangs and
    # the project's editable install rewritten to point here; one that was not would run the other's.
    venv = Path(sys.prefix)
    if venv.parent != ROOT:
        pytest.skip(f"the venv {venv} is not this checkout's: the set-up made none here")
    assert Path(orchestrator.__file__).resolve().is_relative_to(ROOT)
    for script in ("netai", "pytest"):
        first = (venv / "bin" / script).read_text().splitlines()[0]
        assert first.startswith(f"#!{venv}/bin/python"), (script, first)
