"""Size limits of the code: no function over 60 lines and no module over 500 lines in
orchestrator/, workers/ and controller/, except those docs/architecture.md names, with a reason,
in its "Size exceptions" table.

Measured on the source with `ast`: a function's size is its ``def`` line to its last line
(docstring, nested functions and classes included; decorators not), a module's its line count.
The table must stay true both ways: an unlisted violation fails, and so does a listed entry that
is no longer over the limit, or that grew past the lines the table gives it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.unit.doc_tables import section_rows

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "workers", "controller")
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500
DOC = ROOT / "docs" / "architecture.md"
SECTION = "## Size exceptions"
#: A reason must say what the size is for: at least this many words.
MIN_REASON_WORDS = 4


def function_sizes(source: str, path: str) -> dict[str, int]:
    """``{"path:qualname": lines}`` of every function and method of one module (nested ones too)."""
    sizes: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert child.end_lineno is not None
                sizes[f"{path}:{prefix}{child.name}"] = child.end_lineno - child.lineno + 1
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source, filename=path), "")
    return sizes


def measured() -> dict[str, int]:
    """Every module (``path``) and function (``path:qualname``) of the packages, with its lines."""
    sizes: dict[str, int] = {}
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            source = file.read_text(encoding="utf-8")
            sizes[path] = len(source.splitlines())
            sizes |= function_sizes(source, path)
    return sizes


def limit(key: str) -> int:
    return MAX_FUNCTION_LINES if ":" in key else MAX_MODULE_LINES


def parse_exceptions(markdown: str) -> dict[str, tuple[int, str]]:
    """``{key: (lines, reason)}`` from the table under `SECTION` (``| key | lines | reason |``).

    Raises
    ------
    ValueError
        If the section is missing, a row is malformed or a key is given twice.
    """
    out: dict[str, tuple[int, str]] = {}
    rows = section_rows(markdown, SECTION, DOC.name)
    for row in rows[2:]:  # the header and its separator
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not re.fullmatch(r"[0-9]+", cells[1]):
            raise ValueError(f"malformed size exception row: {row!r}")
        key = cells[0].strip("`")
        if key in out:
            raise ValueError(f"{key} is listed twice")
        out[key] = (int(cells[1]), cells[2])
    return out


@pytest.fixture(scope="module")
def sizes() -> dict[str, int]:
    return measured()


@pytest.fixture(scope="module")
def exceptions() -> dict[str, tuple[int, str]]:
    return parse_exceptions(DOC.read_text(encoding="utf-8"))


def test_function_sizes_count_the_def_to_its_last_line() -> None:
    # Prepare: a module with a method, a nested function and a decorated function
    source = (
        "import functools\n"
        "class A:\n"
        "    def m(self):\n"
        '        """Doc."""\n'
        "        def inner():\n"
        "            return 1\n"
        "        return inner()\n"
        "@functools.cache\n"
        "def f():\n"
        "    return 2\n"
    )
    # Execute
    got = function_sizes(source, "x.py")
    # Assert: docstring and nested function counted in the method; the decorator line is not
    assert got == {"x.py:A.m": 5, "x.py:A.m.inner": 2, "x.py:f": 2}


def test_parse_exceptions_reads_the_table_and_rejects_bad_rows() -> None:
    doc = (
        "## Size exceptions\n\n| path or path:qualname | lines | reason |\n| --- | --- | --- |\n"
        "| `a/b.py` | 612 | one SQL schema string |\n| `a/c.py:f` | 70 | a table of cases |\n\n## Next\n| x | y |\n"
    )
    assert parse_exceptions(doc) == {"a/b.py": (612, "one SQL schema string"), "a/c.py:f": (70, "a table of cases")}
    with pytest.raises(ValueError, match="malformed"):
        parse_exceptions(doc.replace("| 612 |", "| many |"))
    with pytest.raises(ValueError, match="twice"):
        parse_exceptions(doc.replace("`a/c.py:f`", "`a/b.py`"))
    with pytest.raises(ValueError, match="no"):
        parse_exceptions("## Other\n")


def test_no_unlisted_function_or_module_over_the_limit(
    sizes: dict[str, int], exceptions: dict[str, tuple[int, str]]
) -> None:
    over = {key: n for key, n in sizes.items() if n > limit(key) and key not in exceptions}
    assert not over, (
        f"over {MAX_FUNCTION_LINES} lines (function) or {MAX_MODULE_LINES} lines (module), and not in "
        f"docs/architecture.md's size exceptions: split them, or list them with a reason: {over}"
    )


def test_every_listed_exception_is_still_over_the_limit_and_within_its_lines(
    sizes: dict[str, int], exceptions: dict[str, tuple[int, str]]
) -> None:
    stale = {key: sizes.get(key) for key in exceptions if sizes.get(key, 0) <= limit(key)}
    assert not stale, f"listed as size exceptions but gone or within the limit (remove their rows): {stale}"
    grown = {key: (sizes[key], lines) for key, (lines, _) in exceptions.items() if sizes[key] > lines}
    assert not grown, f"size exceptions grown past the lines the table gives them (measured, listed): {grown}"


def test_every_exception_gives_a_reason(exceptions: dict[str, tuple[int, str]]) -> None:
    vague = {key: reason for key, (_, reason) in exceptions.items() if len(reason.split()) < MIN_REASON_WORDS}
    assert not vague, f"size exceptions need a reason that says what the size is for: {vague}"
