"""The background the schedulers are told, in real runs (`orchestrator.emulation.background_view`):
only the background's own traffic, settled before the first task, the same for every scheduler of
a task. Two small interleaved experiments (spff and mst on each task, in the rotated order: spff
first on the first task, mst first on the second; the process backend):

- a ring of 14 with the background off: no scheduler sees background (a task that just ended under
  spff used to show as background to mst and block its tasks), and every task that an empty
  network admits runs;
- NSFNET with a 30 % demand-matrix background: each task's summed background is the same for
  both schedulers, the first task's agrees with the later ones', and its most loaded link is near
  the planned load.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.experiment.runs import scheduler_order
from orchestrator.results.db import ResultsDB
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import Task
from tests.integration.test_experiment import run_config
from topologies.loaders import load

pytestmark = [pytest.mark.root, pytest.mark.slow]

COMMON: dict[str, Any] = {"schedulers": ["spff", "mst"], "locals": [8], "tasks_per_point": 2, "seed": 1,
                          "task": {"model": "mlp", "rounds": 2}}


def _run(tmp_path: Path, name: str, **cfg: Any) -> ResultsDB:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **COMMON, **cfg}))
    code, out, _, db = run_config(path, tmp_path / name, timeout=1500)
    assert code == 0, out[-3000:]
    return db


def _summed(db: ResultsDB) -> dict[int, dict[str, float]]:
    """Task -> scheduler -> background summed over directed links, as recorded before scheduling."""
    rows = db.query("SELECT scheduler, task_id, SUM(background_mbps) AS s FROM network_state GROUP BY 1, 2")
    by_task: dict[int, dict[str, float]] = {}
    for r in rows:
        by_task.setdefault(r["task_id"], {})[r["scheduler"]] = r["s"]
    return by_task


def test_schedulers_see_the_background_only_and_alike(tmp_path: Path, figures: list[str]) -> None:
    # Execute: the held-out config (background off), then the same comparison with background on.
    off = _run(tmp_path, "ring14-off", topology="ring:14", emulation={"backend": "process"},
               background={"enabled": False})
    on = _run(tmp_path, "nsfnet-on", topology="sndlib/nobel-us",
              emulation={"backend": "process", "max_link_mbps": 100},
              background={"enabled": True, "pattern": "demand-matrix", "load": 0.3, "pairs": 6})

    # Assert (off): under 1 % of capacity on every link for every scheduler; every task an empty
    # network admits ran to the end.
    state_off = off.query("SELECT background_mbps, capacity_mbps FROM network_state")
    assert len(state_off) == 2 * 2 * 2 * 14  # schedulers x tasks x directed links
    worst_off = max(r["background_mbps"] / r["capacity_mbps"] for r in state_off)
    assert worst_off < 0.01
    model = load("ring:14")
    tasks = off.query("SELECT * FROM tasks")
    admitted = 0
    for t in tasks:
        task = Task(id=t["task_id"], global_site=t["global_site"], local_sites=tuple(json.loads(t["local_sites_json"])),
                    model=t["model"], rounds=t["rounds"], demand_mbps=t["demand_mbps"], model_bytes=t["model_bytes"])
        if not get_scheduler(t["scheduler"]).schedule(NetworkState(model), task).blocked:
            admitted += 1
            assert t["state"] == "done", t
    assert admitted == len(tasks) == 4
    for db in (off, on):  # each task's schedulers ran in the rotated order (`runs.scheduler_order`)
        ran = db.query("SELECT scheduler, task_id FROM tasks ORDER BY arrival_s")
        ids = sorted({r["task_id"] for r in ran})
        assert [(r["task_id"], r["scheduler"]) for r in ran] == \
            [(t, s) for k, t in enumerate(ids) for s in scheduler_order(["spff", "mst"], k)]

    # Assert (on): measured once per task, settled, the same for both schedulers; the first task's
    # background is the later ones'; the busiest link carries about the planned 30 %.
    views = on.query("SELECT task_id, total_mbps, cv, settled FROM background_views ORDER BY t_s")
    assert [v["task_id"] for v in views] == sorted(v["task_id"] for v in views) and len(views) == 2
    assert all(v["settled"] for v in views), views
    summed = _summed(on)
    spread = max((max(s.values()) - min(s.values())) / max(s.values()) for s in summed.values())
    assert all(set(s) == {"spff", "mst"} for s in summed.values())
    assert spread <= 0.10
    totals = [v["total_mbps"] for v in views]
    first_vs_rest = abs(totals[0] - statistics.median(totals[1:])) / statistics.median(totals[1:])
    assert first_vs_rest <= 0.10
    peak = on.query("SELECT MAX(background_mbps / capacity_mbps) AS p FROM network_state")[0]["p"]
    assert 0.2 < peak < 0.4
    figures.append(f"background view: off -> max {worst_off:.4f} of capacity; on -> summed background differs "
                   f"by at most {spread:.4f} between schedulers per task, first task vs later {first_vs_rest:.3f}, "
                   f"CV {max(v['cv'] for v in views):.3f}, busiest link {peak:.3f} of capacity")
