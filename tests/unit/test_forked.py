"""`orchestrator.results.forked`: a function called in a forked child, its result back as JSON, and the
function called here whenever the child gives none; the summary plots drawn that way by `draw_figures`."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from orchestrator.results import forked


def _gone(pid: int) -> bool:
    """Whether `pid` is neither running nor a zombie of ours."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _recording_children(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """`forked.start` made to record each child's pid in the list returned."""
    children: list[int | None] = []
    real_start = forked.start

    def start(fn: object) -> forked.Forked:
        pending = real_start(fn)  # type: ignore[arg-type]
        children.append(pending.pid)
        return pending

    monkeypatch.setattr(forked, "start", start)
    return children


def test_the_result_comes_from_a_child_and_the_child_is_reaped() -> None:
    pending = forked.start(lambda: {"pid": os.getpid(), "values": [1, 2.5, None]})
    child = pending.pid

    got = pending.result()

    assert child is not None and got == {"pid": child, "values": [1, 2.5, None]}
    assert got["pid"] != os.getpid()
    assert _gone(child)


@pytest.mark.parametrize("case", ["raises", "not json", "hangs"])
def test_a_child_without_a_result_is_ended_and_the_function_runs_here(case: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    parent = os.getpid()

    def draw() -> object:
        if os.getpid() != parent:
            if case == "raises":
                raise RuntimeError("no figure")
            if case == "hangs":
                time.sleep(60)
            return {1, 2}  # a set: not JSON
        return "drawn here"

    pending = forked.start(draw)
    child = pending.pid
    started = time.monotonic()

    with caplog.at_level(logging.WARNING, logger="netai.figures"):
        got = pending.result(wait_s=1.0)

    assert got == "drawn here"
    assert "drawn here instead" in caplog.text
    assert child is not None and _gone(child), "the child was ended and reaped"
    assert case == "hangs" or time.monotonic() - started < 30, "a child that failed is not waited for"


def test_without_fork_the_function_runs_when_its_result_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.delattr(os, "fork")

    pending = forked.start(lambda: calls.append(os.getpid()) or "here")

    assert calls == [] and pending.pid is None
    assert pending.result() == "here" and calls == [os.getpid()]


def test_draw_figures_has_the_summary_plots_drawn_in_a_child_as_plot_draws_them(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.summary import run_summary
    from orchestrator.results.summary_figures import draw_figures, plot
    from tests.unit.test_figures import fill

    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db)
    children = _recording_children(monkeypatch)
    figs = {f.name: f for f in draw_figures(db, run_id, tmp_path / "run")}
    direct = plot(run_summary(db, run_id).points, tmp_path / "direct")

    assert len(children) == 1 and children[0] is not None and _gone(children[0]), "one child, reaped"
    assert {name: dict(figs[name].drawn) for name in direct} == direct, "the same rows and types as plot's"
    for name in direct:
        assert figs[name].files == (tmp_path / "run" / f"{name}.png", tmp_path / "run" / f"{name}.svg")
        assert all(f.is_file() for f in figs[name].files)


def test_a_child_whose_result_is_not_asked_for_is_ended_and_reaped() -> None:
    pending = forked.start(lambda: time.sleep(60))
    child = pending.pid

    pending.close()

    assert child is not None and _gone(child) and pending.pid is None and pending.fd is None
    pending.close()  # again: nothing left to do


def test_draw_figures_interrupted_leaves_no_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.results import summary_figures
    from orchestrator.results.db import ResultsDB
    from tests.unit.test_figures import fill

    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db)
    children = _recording_children(monkeypatch)
    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(summary_figures, "draw_all", interrupted)

    with pytest.raises(KeyboardInterrupt):
        summary_figures.draw_figures(db, run_id, tmp_path / "run")

    assert len(children) == 1 and children[0] is not None and _gone(children[0])
