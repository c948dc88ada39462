"""The layers import one way (docs/architecture.md): topologies at the bottom, then scheduling,
then the controller and the workers, then the orchestrator's results, emulation, runtime, experiment
and CLI. No two modules of the project import each other, directly or around a longer cycle, and none
imports another module's private (``_underscore``) names. Checked on the source (ast, imports
inside functions included), so a violating import fails here before anything runs it."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from tests.unit.doc_tables import section_rows

ROOT = Path(__file__).resolve().parents[2]
#: The project's packages: every module in them is a node of the import graph.
PACKAGES = ("topologies", "orchestrator", "controller", "workers")

DOC = ROOT / "docs" / "architecture.md"
#: The heading of the rules' section and the marker naming the workers' torch-free modules.
SECTION = "## Layers and imports"
TORCH_FREE_MARKER = re.compile(r"<!--\s*torch-free workers:([^>]*)-->")


def parse_rules(markdown: str) -> dict[str, tuple[str, ...]]:
    """Package (as a module name) -> the module prefixes it must not import, from the table of
    `SECTION` (``| `package` | holds | `a`, `b` (a note) |``; a cell with no code span forbids nothing).

    Raises
    ------
    ValueError
        If the section or its table is missing, or a package is given twice.
    """
    rows = section_rows(markdown, SECTION, DOC.name)
    out: dict[str, tuple[str, ...]] = {}
    for row in rows[2:]:  # the header and its separator
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        package = cells[0].strip("`").replace("/", ".")
        if package in out:
            raise ValueError(f"{package} is listed twice")
        stated = cells[-1].split("(")[0]
        out[package] = tuple(m.replace("/", ".") for m in re.findall(r"`([^`]+)`", stated))
    if not out:
        raise ValueError(f"{DOC.name}'s {SECTION!r} has no table")
    return out


def parse_torch_free(markdown: str) -> tuple[str, ...]:
    """The workers' modules the orchestrator may import at module level (the page's marker)."""
    found = TORCH_FREE_MARKER.search(markdown)
    if found is None:
        raise ValueError(f"{DOC.name} has no torch-free workers marker")
    return tuple(found.group(1).split())


#: Package (path prefix, as a module name) -> module prefixes it must not import (the page's table).
FORBIDDEN = parse_rules(DOC.read_text(encoding="utf-8"))
TORCH_FREE = parse_torch_free(DOC.read_text(encoding="utf-8"))


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
    """Module -> the project modules it imports (anywhere in it: at module level, in functions, and
    for type checkers only under ``if TYPE_CHECKING:``); each edge keeps its first line. A type-only
    import back is a cycle too: the two modules' designs depend on each other (issue 47)."""
    modules = _project_modules(root, packages)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for line, target, _, _ in _imported(module, path, modules):
            if target != module and not graph.has_edge(module, target):
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
    # import back (a cycle too).
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

    # Assert: the three cycles, each hop with its line; the private name, not the dunder.
    assert cycles == [
        "pkg -> pkg.sub.c (pkg/__init__.py:1); pkg.sub.c -> pkg.d (pkg/sub/c.py:1); pkg.d -> pkg (pkg/d.py:1)",
        "pkg.a -> pkg.b (pkg/a.py:2); pkg.b -> pkg.a (pkg/b.py:1)",
        "pkg.e -> pkg.f (pkg/e.py:3); pkg.f -> pkg.e (pkg/f.py:2)",
    ]
    assert private == ["pkg/b.py:2 imports _hidden from pkg.sub.c"]


def _runs_at_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported: at module level, in class
    bodies, ``if``/``try``/``with`` blocks; not in functions, nor under ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                out.append(node)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit([n for n in getattr(node, field, []) if isinstance(n, ast.stmt | ast.excepthandler)])

    visit(tree.body)
    return out


def module_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import that runs when `path` is imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in _runs_at_import(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif node.module and node.level == 0:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _workers_module(name: str) -> str | None:
    """The workers module `name` (``workers.x`` or ``workers.x.y``) refers to, if it is one."""
    while name.startswith("workers.") and not (ROOT / (name.replace(".", "/") + ".py")).exists() \
            and not (ROOT / name.replace(".", "/") / "__init__.py").exists():
        name = name.rpartition(".")[0]
    return name if name.startswith("workers.") else None


def test_the_rules_table_names_every_package_and_only_real_ones() -> None:
    packages = {"topologies", "controller", "workers"} | {
        f"orchestrator.{d.name}" for d in (ROOT / "orchestrator").iterdir() if (d / "__init__.py").exists()}
    named = set(FORBIDDEN) | {m for ms in FORBIDDEN.values() for m in ms}
    real = {m for m in named if (ROOT / m.replace(".", "/")).is_dir() or (ROOT / (m.replace(".", "/") + ".py")).exists()}
    assert packages - set(FORBIDDEN) == set(), "packages the architecture page states no rule for"
    assert named - real == set(), "the architecture page's rules name modules that do not exist"


def test_parse_rules_reads_the_table_and_a_false_rule_fails() -> None:
    # Prepare: a rules table that states a false rule (the lifecycle must not use the scheduling layer)
    doc = ("## Layers and imports\n\n| package | holds | must not import |\n| --- | --- | --- |\n"
           "| `orchestrator/lifecycle` | x | `orchestrator/scheduling` (it does) |\n"
           "| `orchestrator/cli` | y | nothing |\n\n## Next\n| a | b | c |\n")
    # Execute
    rules = parse_rules(doc)
    # Assert: the table as read, and the code breaks the false rule
    assert rules == {"orchestrator.lifecycle": ("orchestrator.scheduling",), "orchestrator.cli": ()}
    assert _violations("orchestrator.lifecycle", rules["orchestrator.lifecycle"])
    with pytest.raises(ValueError, match="twice"):
        parse_rules(doc.replace("`orchestrator/cli`", "`orchestrator/lifecycle`"))
    assert parse_torch_free("a <!-- torch-free workers: workers.a workers.b --> b") == ("workers.a", "workers.b")


def test_orchestrator_imports_only_the_torch_free_workers_modules_at_module_level() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}"
           for path in sorted((ROOT / "orchestrator").rglob("*.py"))
           for line, name in module_level_imports(path)
           if (mod := _workers_module(name)) is not None and mod not in TORCH_FREE]
    assert bad == [], "module-level imports of workers modules the architecture page does not list as torch-free"


def test_the_torch_free_workers_modules_import_no_torch_at_module_level() -> None:
    seen: set[str] = set()
    todo = list(TORCH_FREE)
    loads_torch = []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / module.replace(".", "/") / "__init__.py"
        for line, name in module_level_imports(path):
            if name.split(".")[0] == "torch":
                loads_torch.append(f"{path.relative_to(ROOT)}:{line}")
            elif (mod := _workers_module(name)) is not None:
                todo.append(mod)
    assert loads_torch == []


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
