"""The layers import one way (docs/architecture.md): topologies at the bottom, then scheduling,
then the controller and the workers, then the orchestrator's results, emulation, runtime, experiment
and CLI. No two modules of the project import each other, directly or around a longer cycle, and none
imports another module's private (``_underscore``) names. Checked on the source (ast, imports
inside functions included), so a violating import fails here before anything runs it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The project's packages: every module in them is a node of the import graph.
PACKAGES = ("topologies", "orchestrator", "controller", "workers")

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
    # The lifecycle core states its ports and holds the policy: no engine behind a port (emulation,
    # site servers, simulation), no driver. It records through orchestrator.results.
    "orchestrator.lifecycle": ("orchestrator.emulation", "orchestrator.runtime", "orchestrator.simulation",
                               "orchestrator.experiment", "orchestrator.cli", "orchestrator.dashboard",
                               "controller", "workers"),
    # The dashboard reads a run's database through orchestrator.results.queries and serves it: it needs
    # no emulation, worker or runner code.
    "orchestrator.dashboard": ("orchestrator.emulation", "orchestrator.runtime", "orchestrator.experiment",
                               "orchestrator.cli", "controller", "workers"),
}


def _module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
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


def _project_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    return {_module_name(path, root): path for pkg in packages for path in sorted((root / pkg).rglob("*.py"))}


def _import_nodes(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of `tree` (in functions too) and whether it is for type checkers only
    (under ``if TYPE_CHECKING:``, never run)."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append((node, type_only))
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(tree, False)
    return out


def _imported(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str, str | None, bool]]:
    """(line, project module imported, name taken from it or None, for type checkers only) for every
    import in `path`, relative ones resolved. A name that is itself a module (``from pkg import
    mod``) counts as that module. Importing ``a.b.c`` runs the packages ``a`` and ``a.b`` first;
    those implicit parent imports are not edges (a package that imports its own submodules is not a
    cycle)."""

    def project(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[int, str, str | None, bool]] = []
    for node, type_only in _import_nodes(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, m, None, type_only) for a in node.names if (m := project(a.name))]
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        for a in node.names:
            if f"{base}.{a.name}" in modules:
                out.append((node.lineno, f"{base}.{a.name}", None, type_only))
            elif (m := project(base)) is not None:
                out.append((node.lineno, m, a.name, type_only))
    return out


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> nx.DiGraph:
    """Module -> the project modules it imports (anywhere in it, when it runs); each edge keeps its
    first line. An import for type checkers only (``if TYPE_CHECKING:``) is not an edge: it never
    runs, and it is how an annotation names a type of a module that imports this one."""
    modules = _project_modules(root, packages)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for line, target, _, type_only in _imported(module, path, modules):
            if target != module and not type_only and not graph.has_edge(module, target):
                graph.add_edge(module, target, where=f"{path.relative_to(root)}:{line}")
    return graph


def import_cycles(graph: nx.DiGraph) -> list[str]:
    """Every elementary cycle of the graph, as ``a -> b (file:line); b -> ...; ... -> a (file:line)``
    from its first module in name order."""
    out = []
    for found in nx.simple_cycles(graph):
        first = found.index(min(found))
        cycle = found[first:] + found[:first]
        hops = [f"{a} -> {b} ({graph.edges[a, b]['where']})" for a, b in zip(cycle, [*cycle[1:], cycle[0]], strict=True)]
        out.append("; ".join(hops))
    return sorted(out)


def private_imports(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Imports of another module's private names (``from m import _name``; dunders are not private)."""
    modules = _project_modules(root, packages)
    bad = []
    for module, path in modules.items():
        for line, target, name, _ in _imported(module, path, modules):
            private = [p for p in [*target.split("."), name or ""] if p.startswith("_") and not p.endswith("__")]
            if target != module and private:
                bad.append(f"{path.relative_to(root)}:{line} imports {private[-1]} from {target}")
    return bad


def test_no_import_cycles() -> None:
    assert import_cycles(import_graph()) == []


def test_no_module_imports_another_modules_private_names() -> None:
    assert private_imports() == []


def test_the_checker_sees_cycles_and_private_imports(tmp_path: Path) -> None:
    # Prepare: a package whose modules import each other in a function, a three-module cycle through
    # a relative import and a package __init__, a private name taken from a sibling, and a type-only
    # import back (no cycle: it never runs).
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.sub import c\n")
    (pkg / "a.py").write_text("def f():\n    import pkg.b\n")
    (pkg / "b.py").write_text("from pkg import a\nfrom pkg.sub.c import _hidden, __version__\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import d\n_hidden = 1\n__version__ = '1'\n")
    (pkg / "d.py").write_text("import pkg\n")
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.f import F\n")
    (pkg / "f.py").write_text("def g():\n    from pkg import e\n")

    # Execute
    cycles = import_cycles(import_graph(tmp_path, ("pkg",)))
    private = private_imports(tmp_path, ("pkg",))

    # Assert: both cycles, each hop with its line; the private name, not the dunder.
    assert cycles == [
        "pkg -> pkg.sub.c (pkg/__init__.py:1); pkg.sub.c -> pkg.d (pkg/sub/c.py:1); pkg.d -> pkg (pkg/d.py:1)",
        "pkg.a -> pkg.b (pkg/a.py:2); pkg.b -> pkg.a (pkg/b.py:1)",
    ]
    assert private == ["pkg/b.py:2 imports _hidden from pkg.sub.c"]


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
