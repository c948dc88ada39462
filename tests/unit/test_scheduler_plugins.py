"""Scheduler plugins (orchestrator/scheduling/plugins.py): every entry form, every bad entry as one
clear line before anything starts, configs that keep a label per scheduler and round-trip, the CLI
with a file spec, and the example plugin's own heuristic (examples/schedulers/widest_path.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import load_config, parse_config
from orchestrator.scheduling import NetworkState, SchedulerSpec, resolve_scheduler, resolve_schedulers
from orchestrator.scheduling.mst import MST
from orchestrator.scheduling.plugins import type_matches
from orchestrator.scheduling.tasks import Task
from orchestrator.scheduling.trees import SPT
from tests.unit.plugin_schedulers import EXAMPLE_PLUGIN, ROOT, make_scheduler
from topologies.model import NetworkModel

PLUGIN = '''
from typing import Literal

from orchestrator.scheduling.trees import SPT


class Hopper(SPT):
    """A plugin with declared options of several types."""

    name = "hopper"

    def __init__(self, *, weight: Literal["delay", "hops"] = "hops", depth: int = 3, scale: float = 1.0,
                 sites: list[str] | None = None) -> None:
        if depth > 10:
            raise ValueError(f"depth must be at most 10, got {depth}")
        super().__init__(weight=weight)
        self.depth, self.scale, self.sites = depth, scale, sites


class NotAScheduler:
    pass


class NeedsK(SPT):
    name = "needs-k"

    def __init__(self, *, k: int) -> None:
        super().__init__()
        self.k = k
'''


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    (tmp_path / "plugs").mkdir()
    (tmp_path / "plugs" / "hopper.py").write_text(PLUGIN)
    return tmp_path


def one_line_error(entry: Any, base: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_scheduler(entry, base)
    message = str(info.value)
    assert "\n" not in message
    return message


# -- each entry form ------------------------------------------------------------------------------------
def test_a_registered_name_is_its_own_label() -> None:
    spec = resolve_scheduler("mst")

    assert (spec.label, spec.spec, dict(spec.options), spec.cls) == ("mst", "mst", {}, MST)
    assert spec.to_entry() == "mst"


def test_a_module_spec_loads_the_class(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(plugin_dir / "plugs"))

    spec = resolve_scheduler("hopper:Hopper")
    registered_class = resolve_scheduler("orchestrator.scheduling.trees:SPT")

    assert (spec.label, spec.spec, spec.cls.__name__) == ("hopper", "hopper:Hopper", "Hopper")
    assert (registered_class.label, registered_class.cls) == ("spt", SPT)


def test_a_file_spec_is_relative_to_the_base_folder_and_kept_absolute(plugin_dir: Path) -> None:
    spec = resolve_scheduler("plugs/hopper.py:Hopper", plugin_dir)
    again = resolve_scheduler(spec.spec, Path("/"))  # the canonical spec means the same anywhere

    assert spec.spec == f"{plugin_dir.resolve() / 'plugs' / 'hopper.py'}:Hopper"
    assert spec.label == "hopper"
    assert again == spec and again.cls is spec.cls  # the file is loaded once: the same class


def test_a_mapping_gives_a_label_and_options(plugin_dir: Path) -> None:
    spec = resolve_scheduler(
        {"name": "hop-5", "spec": "plugs/hopper.py:Hopper", "options": {"depth": 5, "scale": 2, "sites": ["A"]}},
        plugin_dir,
    )
    scheduler = spec.build()

    assert spec.label == "hop-5" and dict(spec.options) == {"depth": 5, "scale": 2, "sites": ["A"]}
    assert (scheduler.name, scheduler.depth, scheduler.scale) == ("hop-5", 5, 2)  # type: ignore[attr-defined]
    assert resolve_scheduler(spec.to_entry()) == spec


def test_a_registered_scheduler_with_options_under_its_own_label() -> None:
    spec = resolve_scheduler({"name": "mst-hops", "spec": "mst", "options": {"weight": "hops"}})

    s = spec.build().schedule(NetworkState(line()), Task(1, "A", ("C",)))

    assert s.scheduler == "mst-hops"  # results, figures and reports key by the label
    assert spec.to_entry() == {"name": "mst-hops", "spec": "mst", "options": {"weight": "hops"}}


# -- bad entries: one clear line each -----------------------------------------------------------------
def test_a_module_that_cannot_be_imported() -> None:
    message = one_line_error("no_such_package.sched:Thing")

    assert "cannot import module 'no_such_package.sched'" in message and "ModuleNotFoundError" in message


def test_a_file_that_is_missing_or_broken(plugin_dir: Path) -> None:
    (plugin_dir / "broken.py").write_text("class Broken(:\n")

    assert "no such file" in one_line_error("plugs/missing.py:X", plugin_dir)
    assert "loading" in one_line_error("broken.py:Broken", plugin_dir)
    assert "SyntaxError" in one_line_error("broken.py:Broken", plugin_dir)


def test_a_class_the_module_does_not_have(plugin_dir: Path) -> None:
    assert "has no 'Missing'" in one_line_error("plugs/hopper.py:Missing", plugin_dir)
    assert "has no 'Nope'" in one_line_error("orchestrator.scheduling.trees:Nope")


def test_a_class_that_is_not_a_scheduler(plugin_dir: Path) -> None:
    message = one_line_error("plugs/hopper.py:NotAScheduler", plugin_dir)

    assert "NotAScheduler is not a subclass of orchestrator.scheduling.base.Scheduler" in message
    assert "is abstract" in one_line_error("orchestrator.scheduling.base:Scheduler")


def test_an_unknown_option_names_the_allowed_ones(plugin_dir: Path) -> None:
    message = one_line_error({"spec": "plugs/hopper.py:Hopper", "options": {"detph": 2}}, plugin_dir)

    assert "unknown option 'detph'; allowed: weight, depth, scale, sites" in message
    assert "allowed: weight, latency_weight" in one_line_error({"spec": "mst", "options": {"lam": 1}})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"depth": "3"}, "option 'depth' must be an integer, got '3'"),
        ({"depth": 2.5}, "option 'depth' must be an integer"),
        ({"depth": True}, "option 'depth' must be an integer"),
        ({"scale": "big"}, "option 'scale' must be a number"),
        ({"weight": "km"}, "option 'weight' must be one of 'delay', 'hops', got 'km'"),
        ({"sites": "A"}, "option 'sites' must be a list of a string or null"),
        ({"sites": [1]}, "option 'sites' must be a list"),
    ],
)
def test_an_option_of_the_wrong_type(plugin_dir: Path, options: dict[str, Any], message: str) -> None:
    assert message in one_line_error({"spec": "plugs/hopper.py:Hopper", "options": options}, plugin_dir)


def test_required_options_and_the_class_own_checks(plugin_dir: Path) -> None:
    assert "option 'k' is required" in one_line_error("plugs/hopper.py:NeedsK", plugin_dir)
    assert resolve_scheduler({"spec": "plugs/hopper.py:NeedsK", "options": {"k": 2}}, plugin_dir).label == "needs-k"
    # Hopper's own __init__ refuses depth 11: still before anything starts, one line
    refused = one_line_error({"spec": "plugs/hopper.py:Hopper", "options": {"depth": 11}}, plugin_dir)
    assert "scheduler 'hopper'" in refused and "depth must be at most 10" in refused


def test_bad_mappings_and_labels() -> None:
    assert "unknown key 'label'" in one_line_error({"label": "x", "spec": "mst"})
    assert "needs a spec" in one_line_error({"name": "x"})
    assert "must be 1 to 40 letters" in one_line_error({"name": "a/b", "spec": "mst"})
    assert "options must be a mapping" in one_line_error({"spec": "mst", "options": [1]})
    assert "is the registered scheduler spff's" in one_line_error({"name": "spff", "spec": "mst"})
    assert "unknown scheduler 'dijkstra'" in one_line_error("dijkstra")
    assert "must be a name, module:Class" in one_line_error(3)


def test_labels_must_be_unique() -> None:
    with pytest.raises(ConfigError, match="label 'mst' is used twice"):
        resolve_schedulers(["mst", {"spec": "mst", "options": {"weight": "hops"}}])

    specs = resolve_schedulers(["mst", {"name": "mst-hops", "spec": "mst", "options": {"weight": "hops"}}])
    assert [s.label for s in specs] == ["mst", "mst-hops"]


def test_option_types_understood() -> None:
    assert type_matches(3, float) and not type_matches(True, float) and not type_matches(3.0, int)
    assert type_matches(None, int | None) and type_matches("a", Literal["a", "b"])
    assert type_matches({"a": 1}, dict[str, int]) and not type_matches({"a": "x"}, dict[str, int])
    assert type_matches([1, "x"], tuple[int, str]) and not type_matches([1], tuple[int, str])
    assert type_matches(object(), Any)


# -- configs ----------------------------------------------------------------------------------------------
def write_config(folder: Path, schedulers: list[Any]) -> Path:
    path = folder / "cfg.yaml"
    path.write_text(json.dumps({"name": "p", "topology": "sndlib/nobel-us", "locals": [2], "schedulers": schedulers}))
    return path


def test_a_config_resolves_files_from_its_own_folder_keeps_labels_and_round_trips(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir("/")  # not the config's folder
    cfg = load_config(write_config(plugin_dir, [
        "spff", "plugs/hopper.py:Hopper", {"name": "hop-deep", "spec": "plugs/hopper.py:Hopper",
                                           "options": {"depth": 9}}]))

    assert cfg.schedulers == ("spff", "hopper", "hop-deep")
    assert [s.label for s in cfg.scheduler_specs] == list(cfg.schedulers)
    assert parse_config(cfg.to_dict()) == cfg  # what a run records parses back, from any folder
    assert cfg.to_dict()["schedulers"][2]["options"] == {"depth": 9}
    assert cfg.scheduler("hop-deep").depth == 9  # type: ignore[attr-defined]
    assert cfg.scheduler("hopper").name == "hopper"
    fewer = replace(cfg, schedulers=("hop-deep", "mst"))  # changed in code: labels without a spec are names
    assert parse_config(fewer.to_dict()).schedulers == ("hop-deep", "mst")
    assert fewer.scheduler("mst").name == "mst"


@pytest.mark.parametrize(
    ("schedulers", "message"),
    [
        (["mst", "mst"], "label 'mst' is used twice"),
        (["plugs/hopper.py:NotAScheduler"], "is not a subclass"),
        ([{"spec": "plugs/hopper.py:Hopper", "options": {"depht": 1}}], "unknown option 'depht'; allowed:"),
        (["../missing.py:X"], "no such file"),
    ],
)
def test_a_config_with_a_bad_scheduler_fails_with_one_line(
    plugin_dir: Path, schedulers: list[Any], message: str
) -> None:
    path = write_config(plugin_dir, schedulers)
    with pytest.raises(ConfigError) as info:
        load_config(path)

    assert message in str(info.value) and str(info.value).startswith(f"{path}: ")
    assert "\n" not in str(info.value)


def test_the_shipped_plugin_config_runs_the_example_plugin_under_its_label() -> None:
    cfg = load_config(ROOT / "experiments" / "plugin.yaml")

    assert cfg.schedulers == ("spff", "mst", "widest")
    widest = cfg.scheduler_specs[2]
    assert widest.spec == f"{ROOT / 'examples' / 'schedulers' / 'widest_path.py'}:WidestPath"
    assert widest.cls is resolve_scheduler(EXAMPLE_PLUGIN, ROOT).cls


# -- the CLI ---------------------------------------------------------------------------------------------
def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_netai_compare_with_a_file_spec_on_nsfnet() -> None:
    out = run_cli("compare", "--topology", "sndlib/nobel-us", "--schedulers", f"mst,{EXAMPLE_PLUGIN}",
                  "--locals", "2,8", "--tasks", "10", "--json")

    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {(r["scheduler"], r["locals"]) for r in rows} == {(s, n) for s in ("mst", "widest") for n in (2, 8)}
    assert all(r["reserved_mbps_mean"] > 0 for r in rows)


def test_netai_schedule_with_a_file_spec_and_bad_specs_on_the_cli(tmp_path: Path) -> None:
    ok = run_cli("schedule", "--scheduler", EXAMPLE_PLUGIN, "--locals", "4", "--seed", "2", "--json")
    not_here = run_cli("schedule", "--scheduler", EXAMPLE_PLUGIN, "--locals", "4", cwd=tmp_path)
    twice = run_cli("compare", "--schedulers", "mst,mst", "--locals", "2", "--tasks", "1")
    hops = run_cli("schedule", "--scheduler", EXAMPLE_PLUGIN, "--hops", "--locals", "2")

    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["scheduler"] == "widest"
    for out, message in ((not_here, "no such file"), (twice, "used twice"), (hops, "unknown option 'weight'")):
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


# -- the example plugin's heuristic -----------------------------------------------------------------------
def line() -> NetworkModel:
    return NetworkModel.build("line", [{"name": n} for n in "ABC"],
                              [{"a": "A", "b": "B", "length_km": 10}, {"a": "B", "b": "C", "length_km": 10}])


def detour() -> NetworkModel:
    """A-B short; A-X-B long. Every link 8 x 10 Gbit/s."""
    return NetworkModel.build(
        "detour", [{"name": "A"}, {"name": "B"}, {"name": "X", "has_compute": False}],
        [{"a": "A", "b": "B", "length_km": 10}, {"a": "A", "b": "X", "length_km": 500},
         {"a": "X", "b": "B", "length_km": 500}],
    )


def test_widest_path_leaves_a_loaded_short_link_for_a_wider_detour() -> None:
    model = detour()
    state = NetworkState(model)
    task = Task(1, "A", ("B",), demand_mbps=1000)
    idle = make_scheduler(EXAMPLE_PLUGIN).schedule(state, task)
    state.set_background({("A", "B"): 60_000, ("B", "A"): 60_000})  # 20 of 80 Gbit/s left on A-B

    loaded = make_scheduler(EXAMPLE_PLUGIN).schedule(state, task)
    spt = make_scheduler("spt").schedule(state, task)

    assert idle.path("broadcast", "A", "B") == ("A", "B")  # equally wide: the shorter one
    assert loaded.path("broadcast", "A", "B") == ("A", "X", "B")  # 80 Gbit/s free beats 20
    assert loaded.path("upload", "B", "A") == ("B", "X", "A")
    assert spt.path("broadcast", "A", "B") == ("A", "B")
    # headroom: a link must keep this much free beyond the demand
    picky = make_scheduler(EXAMPLE_PLUGIN, headroom_mbps=80_000).schedule(state, task)
    assert picky.blocked and "81000 Mbit/s free" in picky.reason


def test_the_example_plugin_is_a_scheduler_spec() -> None:
    spec = resolve_scheduler(EXAMPLE_PLUGIN, ROOT)

    assert isinstance(spec, SchedulerSpec) and spec.label == "widest"
    assert "headroom_mbps must be >= 0" in one_line_error(
        {"spec": EXAMPLE_PLUGIN, "options": {"headroom_mbps": -1}}, ROOT)
    assert "must be one of 'delay', 'hops'" in one_line_error(
        {"spec": EXAMPLE_PLUGIN, "options": {"tie_break": "km"}}, ROOT)

