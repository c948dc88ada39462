"""docs/tutorial.md's commands, checked without running anything: every ``netai`` command of its
bash blocks parses with the command's own parser (a wrong flag fails here), every config it names
loads, every file spec it names exists, and it covers what a first hour needs.
`tests/integration/test_tutorial.py` runs the marked blocks for real.

The markers (HTML comments right before a fenced block, invisible on the site):
``<!-- tutorial -->`` runs the block, which must exit 0; ``<!-- tutorial: background -->`` starts it
and leaves it running (the next block is retried until it succeeds: the network or the server
coming up); ``<!-- tutorial: stop -->`` ends what runs in the background, as Ctrl-C does. A bash
block without a marker is shown only (its ``netai`` commands are still checked here).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cli import build_parser
from orchestrator.experiment.config import load_config

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
MARKER = re.compile(r"^<!--\s*tutorial(?::\s*(?P<kind>background|stop))?\s*-->\s*$")
#: What the tutorial must run (a marked block's text matches each): the issue's list of a first hour.
COVERS = {
    "an experiment": r"netai experiment experiments/tutorial\.yaml",
    "net up": r"netai net up",
    "installing a schedule": r"netai schedule --install",
    "live flows": r"netai flows",
    "the dashboard's replay": r"netai dashboard",
    "a model of one's own": r"--model examples/models/\S+\.py:\w+",
    "a scheduler plugin": r"examples/schedulers/\S+\.py:\w+",
    "a faithful sweep": r"experiments/tutorial-sweep\.yaml",
    "a simulation at scale": r"experiments/tutorial-scale\.yaml",
}


@dataclass(frozen=True)
class Step:
    """One step of the tutorial: ``run``, ``background``, ``stop`` or ``shown``; its bash text and
    the line of the page it starts on."""

    kind: str
    text: str
    line: int


def tutorial_steps(markdown: str) -> list[Step]:
    """The page's bash blocks and stop markers, in order.

    Raises
    ------
    ValueError
        If a marker is not followed by a bash block (stop markers excepted).
    """
    lines = markdown.splitlines()
    steps: list[Step] = []
    pending: tuple[str, int] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line.strip())
        if m and m.group("kind") == "stop":
            steps.append(Step("stop", "", i + 1))
        elif m:
            pending = ("background" if m.group("kind") else "run", i + 1)
        elif line.startswith("```bash"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            steps.append(Step(pending[0] if pending else "shown", "\n".join(lines[i + 1:end]), i + 2))
            pending, i = None, end
        elif line.strip() and pending is not None:
            raise ValueError(f"docs/tutorial.md:{pending[1]}: a tutorial marker must come right before a bash block")
        i += 1
    return steps


def commands(text: str) -> list[list[str]]:
    """The commands of a bash block as argument lists: continuations joined, comments dropped, one
    per line or ``&&``-separated part."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|;", line):
            words = shlex.split(part, comments=True)
            if words:
                out.append(words)
    return out


def netai_argv(words: list[str]) -> list[str] | None:
    """The arguments of a ``netai`` command (under ``sudo`` or by the venv's path), else None."""
    if words[0] == "sudo":
        words = words[1:]
    return words[1:] if words and (words[0] == "netai" or words[0].endswith("/netai")) else None


def check_command(argv: list[str]) -> None:
    """Parse `argv` with netai's parser and check the configs and file specs it names.

    Raises
    ------
    AssertionError
        If the parser refuses it (a wrong flag, a missing argument), a config does not load, or a
        named file does not exist.
    """
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            raise AssertionError(f"netai {shlex.join(argv)}: {err.getvalue().strip()}") from e
    for word in argv:
        for spec in word.split(","):
            if re.fullmatch(r"experiments/[\w.-]+\.yaml", spec):
                load_config(ROOT / spec)
            elif re.fullmatch(r"[\w./-]+\.py:\w+", spec):
                assert (ROOT / spec.split(":")[0]).is_file(), f"{spec}: no such file"


STEPS = tutorial_steps(TUTORIAL.read_text(encoding="utf-8"))


@pytest.mark.parametrize("argv", [a for s in STEPS for w in commands(s.text) if (a := netai_argv(w)) is not None],
                         ids=lambda a: " ".join(a)[:60])
def test_every_netai_command_of_the_tutorial_parses(argv: list[str]) -> None:
    check_command(argv)


def test_the_tutorial_runs_what_a_first_hour_needs() -> None:
    ran = "\n".join(s.text for s in STEPS if s.kind in ("run", "background"))
    missing = [what for what, pattern in COVERS.items() if not re.search(pattern, ran)]
    assert missing == [], "docs/tutorial.md runs no block for these"
    assert any(s.kind == "stop" for s in STEPS) and STEPS[-1].kind != "background"


def test_a_wrong_flag_fails_the_check() -> None:
    # Prepare: a tutorial block whose command has a misspelled flag
    page = "<!-- tutorial -->\n```bash\nnetai schedule --scheduler mst --locale 4\n```\n"
    # Execute
    [step] = tutorial_steps(page)
    argv = netai_argv(commands(step.text)[0])
    # Assert
    assert step.kind == "run" and argv is not None
    with pytest.raises(AssertionError, match="unrecognized arguments: --locale"):
        check_command(argv)


def test_the_markers_are_read_in_order_and_a_stray_one_is_refused() -> None:
    page = ("```bash\nmake test\n```\n<!-- tutorial: background -->\n```bash\nsudo .venv/bin/netai net up \\\n"
            "    --no-cli\n```\n<!-- tutorial: stop -->\n")
    steps = tutorial_steps(page)
    assert [s.kind for s in steps] == ["shown", "background", "stop"]
    assert commands(steps[1].text) == [["sudo", ".venv/bin/netai", "net", "up", "--no-cli"]]
    with pytest.raises(ValueError, match="marker"):
        tutorial_steps("<!-- tutorial -->\ntext\n```bash\nls\n```\n")
