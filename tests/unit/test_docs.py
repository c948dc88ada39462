"""The documentation holds together: page sizes, links and anchors, the code's references to pages,
and every measured figure beside the command that reproduces it (issue 47).

`make docs` builds the site strictly (mkdocs checks the links between pages of docs/); these tests
check what the site does not see, the README and the references written in code and configs, and
run without mkdocs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: docs/architecture.md is the design only; no page is over MAX_PAGE_LINES.
MAX_ARCHITECTURE_LINES = 600
MAX_PAGE_LINES = 800
#: Where the code, configs and scripts refer to pages (``docs/page.md, "Heading"``).
REFERRING = ("orchestrator", "workers", "controller", "topologies", "tests", "experiments", "examples",
             "scripts", "benchmarks")
REFERENCE = re.compile(r'docs/(?P<page>[a-z0-9_/-]+\.md)[,:]?\s*["“](?P<quote>[^"”]{2,80})["”]')
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
#: A passage that quotes a measured figure: "measured" with a number and its unit, or an interval.
MEASURED = re.compile(r"\bmeasured\b", re.I)
FIGURE = re.compile(r"\d[\d.,]*\s?(?:ms|s|%|x|MB|KB|GB|Mbit/s|Gbit/s|min)\b|\[\d[\d.]*, \d[\d.]*\]")
#: What names a command or a benchmark: a `netai`, `make`, `pytest`, script or benchmark invocation,
#: a test that measures, or a link to the measurement page that gives the command.
COMMAND = re.compile(r"`[^`]*(?:netai |make |pytest|bench_|benchmarks/|scripts/)[^`]*`"
                     r"|benchmarks/bench_\w+\.py|bench_\w+\.py|tests/\w+/test_\w+\.py"
                     r"|\]\((?:\.\./)?measurements/[a-z-]+\.md")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (mkdocs) gives a heading."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text).strip("-")


def headings(page: Path) -> list[str]:
    out, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def targets_of(page: Path) -> list[str]:
    """What a quoted reference may name on `page`: its headings and its bold list leads
    (``- **Carried bytes** ...``), without markup, lower case."""
    text = page.read_text(encoding="utf-8")
    bold = re.findall(r"^\s*(?:[-*] |\d+\. )?\*\*([^*]+)\*\*", text, flags=re.M)
    return [re.sub(r"[`*]", "", t).strip().lower() for t in [*headings(page), *bold]]


def passages(text: str) -> list[tuple[str, str]]:
    """(section lead, passage) for every paragraph, list item and table row of a Markdown text;
    the lead is the first passage after the section's heading."""
    out: list[tuple[str, str]] = []
    block: list[str] = []
    lead = ""

    def flush() -> None:
        nonlocal lead
        if block:
            text = " ".join(s.strip() for s in block)
            lead = lead or text
            out.append((lead, text))
            block.clear()

    for line in text.splitlines():
        if line.startswith("#"):
            flush()
            lead = ""
        elif not line.strip():
            flush()
        elif re.match(r"\s*(?:[-*]|\d+\.) |\|", line):
            flush()
            block.append(line)
        else:
            block.append(line)
    flush()
    return out


def unsourced_figures(text: str) -> list[str]:
    """Passages that quote a measured figure and name no command or benchmark, nor does their
    section's lead."""
    return [p for lead, p in passages(text)
            if MEASURED.search(p) and FIGURE.search(p) and not COMMAND.search(p) and not COMMAND.search(lead)]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_no_page_is_over_its_size(page: Path) -> None:
    lines = len(page.read_text(encoding="utf-8").splitlines())
    limit = MAX_ARCHITECTURE_LINES if page.name == "architecture.md" else MAX_PAGE_LINES
    assert lines <= limit, f"{page.relative_to(ROOT)} has {lines} lines (at most {limit}): split it into topic pages"


@pytest.mark.parametrize("doc", [ROOT / "README.md", *pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_anchor_resolves(doc: Path) -> None:
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for m in LINK.finditer(text):
        target = m.group("target")
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        page = (doc.parent / path).resolve() if path else doc
        if not page.exists():
            broken.append(target)
        elif anchor and page.suffix == ".md" and anchor not in {slug(h) for h in headings(page)}:
            broken.append(target)
    assert broken == [], f"{doc.relative_to(ROOT)}: links to no file or no heading"


def test_every_reference_from_the_code_names_a_page_and_its_section() -> None:
    broken = []
    for folder in REFERRING:
        for file in sorted((ROOT / folder).rglob("*")):
            if file.suffix not in (".py", ".yaml", ".sh", ".md") or not file.is_file() or file == Path(__file__):
                continue
            text = re.sub(r"\s*\n\s*(?:#+|//)?\s*", " ", file.read_text(encoding="utf-8"))
            for m in REFERENCE.finditer(text):
                page = DOCS / m.group("page")
                quote = re.sub(r"[`*]", "", m.group("quote")).strip().lower()
                if not page.exists() or not any(t.startswith(quote) for t in targets_of(page)):
                    broken.append(f"{file.relative_to(ROOT)}: docs/{m.group('page')}, \"{m.group('quote')}\"")
    assert broken == [], "references to a page or a section that does not exist"


@pytest.mark.parametrize("doc", [ROOT / "README.md", *pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_measured_figure_names_its_command(doc: Path) -> None:
    assert unsourced_figures(doc.read_text(encoding="utf-8")) == []


def test_the_checks_see_a_figure_without_a_command_and_a_broken_anchor() -> None:
    # Prepare: a figure with no command, one with its benchmark, and one whose section lead names it
    text = ("## A\n\nWe measured 3.7 s against 36 s.\n\n"
            "## B\n\nMeasured by `python benchmarks/bench_hop.py`: 13.5 ms.\n\n"
            "## C\n\nCommand: `netai validate experiments/quick.yaml`.\n\n- measured 0.99 [0.98, 1.01]\n")
    # Execute
    found = unsourced_figures(text)
    # Assert: only the first
    assert found == ["We measured 3.7 s against 36 s."]
    assert slug("The claim point, true to the config") == "the-claim-point-true-to-the-config"
    assert slug("Choosing K: `time_dilation: auto`") == "choosing-k-time_dilation-auto"


def test_an_optional_page_joins_the_nav_only_when_it_exists(tmp_path: Path) -> None:
    # Prepare: the site's hooks module, and a nav with the section the optional page joins
    import importlib.util

    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)

    def nav() -> list[object]:
        return [{"Home": "index.md"}, {"Topics": [{"Fidelity": "fidelity.md"}, {"Data plane": "data-plane.md"},
                                                  {"Dashboard": "dashboard.md"}]}]

    # Execute: without the page, then with it
    without = hooks.on_config({"docs_dir": str(tmp_path), "nav": nav()})["nav"]
    (tmp_path / "datapaths.md").write_text("# Datapaths\n")
    with_page = hooks.on_config({"docs_dir": str(tmp_path), "nav": nav()})["nav"]

    # Assert: the nav is untouched without it; with it, the page follows the data plane
    assert without == nav()
    assert with_page[1]["Topics"][2] == {"Kernel datapaths (tc)": "datapaths.md"}


def test_the_readme_keeps_the_two_commands_and_points_to_the_pages() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## The two commands", 1)[1].split("```", 2)[1]
    assert [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()] == \
        ["sudo make experiment", "make test"]
    assert "(docs/tutorial.md)" in text and "(docs/architecture.md)" in text
