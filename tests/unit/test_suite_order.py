"""The suite's order (tests/conftest.py) and the venv it runs in (scripts/provision.sh, docs/testing.md
"The set-up"): the tests that need neither root nor Docker run beside the guest's checks, before the
guest's tests and the emulations; a venv the set-up copied from another checkout's points its
scripts and the project's install at this checkout; and the project's byte code the set-up compiles
is what a process that writes none reads."""

from __future__ import annotations

import os
import shutil
import subprocess
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


def _checkout_of_one_module(root: Path) -> Path:
    """`root` holding scripts/compile_sources.sh and one module of the project's, orchestrator/mod.py."""
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "compile_sources.sh", root / "scripts")
    (root / "orchestrator").mkdir()
    (root / "orchestrator" / "__init__.py").write_text("")
    module = root / "orchestrator" / "mod.py"
    module.write_text("X = 1\n")
    return module


def _import_log(root: Path) -> str:
    """What ``python -v`` says importing orchestrator.mod from `root`, writing no byte code."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-v", "-c", "import orchestrator.mod"], cwd=root, env=env,
                          capture_output=True, text=True, check=True).stderr


def test_the_set_up_compiles_the_sources_that_processes_writing_no_byte_code_then_read(tmp_path: Path) -> None:
    # Prepare: a checkout of one module, not compiled: each import compiles it
    import importlib.util

    from tests.guest.checks import fresh_byte_code

    module = _checkout_of_one_module(tmp_path)
    cached = importlib.util.cache_from_source(str(module))
    assert f"code object from '{cached}'" not in _import_log(tmp_path)
    assert not fresh_byte_code(module)

    # Execute: what make setup runs, for this interpreter
    subprocess.run(["bash", str(tmp_path / "scripts" / "compile_sources.sh"), sys.executable], check=True)

    # Assert: the import reads the byte code beside the source; an edit makes it stale again
    assert f"code object from '{cached}'" in _import_log(tmp_path)
    assert fresh_byte_code(module)
    module.write_text("X = 22\n")
    assert not fresh_byte_code(module)
    assert f"code object from '{cached}'" not in _import_log(tmp_path)
