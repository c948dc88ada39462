"""The layers import one way (docs/architecture.md): topologies at the bottom, then scheduling,
then the controller and the workers, then the orchestrator's results, emulation, runtime, experiment
and CLI. Checked on the source (ast), so a violating import fails here before anything runs it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Package (path prefix, as a module name) -> module prefixes it must not import.
FORBIDDEN = {
    "topologies": ("orchestrator", "controller", "workers"),
    "orchestrator.scheduling": ("orchestrator.emulation", "orchestrator.runtime", "orchestrator.experiment",
                                "orchestrator.cli", "controller", "workers"),
    "controller": ("orchestrator", "workers"),
    "workers": ("orchestrator", "controller"),
    "orchestrator.emulation": ("orchestrator.runtime", "orchestrator.experiment", "orchestrator.cli", "workers"),
    "orchestrator.runtime": ("orchestrator.experiment", "orchestrator.cli"),
    "orchestrator.experiment": ("orchestrator.cli",),
    # The flow-level simulation models the network and the rounds: no emulation, workers or runner.
    "orchestrator.simulation": ("orchestrator.emulation", "orchestrator.experiment", "orchestrator.cli",
                                "controller", "workers"),
    # The results (schema, queries, report, figures) read a run's database: no code that makes a run.
    "orchestrator.results": ("orchestrator.emulation", "orchestrator.runtime", "orchestrator.experiment",
                             "orchestrator.cli", "orchestrator.dashboard", "controller", "workers"),
    # The dashboard reads a run's database through orchestrator.results.queries and serves it: it needs
    # no emulation, worker or runner code.
    "orchestrator.dashboard": ("orchestrator.emulation", "orchestrator.runtime", "orchestrator.experiment",
                               "orchestrator.cli", "controller", "workers"),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    base = ROOT.joinpath(*package.split("."))
    bad = []
    for path in sorted(base.rglob("*.py")):
        for line, name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layers_import_one_way(package: str) -> None:
    assert _violations(package, FORBIDDEN[package]) == []


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    # Prepare: a module text with an upward import, checked the same way the tests check files.
    src = tmp_path / "m.py"
    src.write_text("from orchestrator.scheduling.schedule import Schedule\nimport workers.agent\n")

    found = [name for _, name in _imports(src)]

    assert found == ["orchestrator.scheduling.schedule", "workers.agent"]


def test_cli_start_up_config_validation_and_scheduling_commands_load_no_torch() -> None:
    # Execute in a fresh interpreter: what the CLI, config validation and the pure commands load.
    code = """
import contextlib, io, json, sys
from orchestrator.cli import build_parser, main
from orchestrator.experiment.config import load_config
build_parser()
cfg = load_config("experiments/quick.yaml")
with contextlib.redirect_stdout(io.StringIO()):
    codes = [main(["topo", "show", "sndlib/nobel-us"]),
             main(["schedule", "--scheduler", "mst", "--locals", "4", "--seed", "1"]),
             main(["compare", "--locals", "2,4", "--tasks", "2"])]
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules,
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "workers"))}))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)

    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["codes"] == [0, 0, 0]
    assert out["torch"] is False, out["loaded"]
