"""The kill campaign of issue 48 (`tests.kill_campaign`): `netai experiment` killed with SIGKILL at
seeded moments, the results database checked after every kill, the run resumed to its end and compared
with an uninterrupted run of the same config. On the simulation (no root; about 30 s of one core) and
on the emulation (root, Mininet; the process backend; about 80 s)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.kill_campaign import campaign, lingering, processes_naming, ratios, sim_leftovers, table

pytestmark = [pytest.mark.slow]

SIM_CONFIG = """\
name: survive
engine: simulation
topology: sndlib/nobel-us
schedulers: [spff, mst]
locals: [2, 4]
tasks_per_point: 6
seed: 3
task: {model: mlp, model_args: {hidden: 200, layers: 1}, rounds: 3, demand_mbps: 1000, partition: iid}
emulation: {max_link_mbps: 100}
background: {enabled: true, pattern: demand-matrix, load: 0.3, pairs: 6}
simulation: {calibration: "kill campaign: the model's defaults, the same in every run"}
"""

EMU_CONFIG = """\
name: survive-emu
topology: ring:6
schedulers: [spff, mst]
locals: [3]
tasks_per_point: 4
seed: 3
task: {model: mlp, model_args: {hidden: 64, layers: 1}, rounds: 2, demand_mbps: 10, partition: iid}
emulation: {max_link_mbps: 100, backend: process, time_dilation: 8}
background: {enabled: false}
"""


def test_kill_campaign_on_the_simulation(tmp_path: Path, figures: list[str]) -> None:
    # Prepare: a short simulated run of 24 task runs (2 schedulers x 2 points x 6 tasks).
    config = tmp_path / "sim.yaml"
    config.write_text(SIM_CONFIG)

    # Execute: 20 seeded kills (issue 48: at least 20), up to 4 in a row on one run.
    runs = tmp_path / "runs"
    found = campaign(config, runs, seed=48, kills=20, per_chain=4, extra=("--no-progress", "--no-figures"),
                     limit_s=120, check_after=lambda: sim_leftovers(runs))

    # Assert: the simulation's timing is the model's, so every resumed run is faithful and compared
    figures.extend(["kill campaign (simulation):", *table(found.chains), *ratios(found.reference, found.chains),
                    *found.notes])
    assert sum(len(c.kills) for c in found.chains) >= 20
    assert any(0 < k.whole < 24 for c in found.chains for k in c.kills), "no kill landed mid-recording"
    assert found.notes == []
    assert found.problems == []


@pytest.mark.root
def test_kill_campaign_on_the_emulation(tmp_path: Path, figures: list[str]) -> None:
    from orchestrator.emulation import ctl_dirs
    from orchestrator.emulation.cleanup import run_states
    from tests.integration.test_emulation_teardown import NOTHING, leftovers
    from topologies.loaders import load
    from topologies.plan import EmulationPlan

    # Prepare: a short emulated run of 8 task runs on a ring of six, workers as processes.
    config = tmp_path / "emu.yaml"
    config.write_text(EMU_CONFIG)
    plan = EmulationPlan.from_model(load("ring:6"))

    before = {s.run_id for s in run_states()}  # other runs of this machine are not the campaign's
    folders_before = set(Path(tempfile.gettempdir()).glob(ctl_dirs.PREFIX + "*"))
    servers_before = set(processes_naming(ctl_dirs.PREFIX))

    def left() -> list[str]:
        # what the killed runs left, once the chain's last run (which cleans before it starts) is done:
        # their switches, processes and state files, their site servers' control-socket folders, and any
        # process naming one (a site server or fork server started before its run connected carries no
        # run mark: it exits within a second of its socket's removal, with the next run's cleanup)
        return [f"run {s.run_id} left {got}" for s in run_states() if s.run_id not in before and not s.live
                and (got := leftovers(s.run_id, plan)) != NOTHING] + \
            [f"left {d}" for d in sorted(set(Path(tempfile.gettempdir()).glob(ctl_dirs.PREFIX + "*")) - folders_before)] + \
            [f"left process {p}" for p in lingering(ctl_dirs.PREFIX, servers_before)]

    # Execute: 20 seeded kills, up to 4 in a row on one run. Each resumed run must have run at the
    # uninterrupted run's K (their environments'), and where its verdict is faithful its mst/spff latency
    # and reserved bandwidth must lie inside the uninterrupted run's 95 % intervals (a faithful one's). The
    # run is at K = 8, where this config is faithful on a small host (docs/long-runs.md). Three locals on
    # a ring of six give tasks whose trees differ, so the interval (mst/spff latency 0.97 [0.93, 1.01]) is
    # wider than two faithful runs of the same tasks differ by their timers (0.967-0.979 over 20 runs).
    # A run the host distorted is flagged by its verdict and its figures are the host's: one such
    # uninterrupted run gave 1.003 [0.984, 1.039], two of its mst tasks' rounds held up by 1.3 ms, and
    # one resumed run in CI 1.053 (docs/long-runs.md, "The kill campaign").
    found = campaign(config, tmp_path / "runs", seed=48, kills=20, per_chain=4,
                     extra=("--no-progress", "--no-figures"), limit_s=600, check_after=left)

    # Assert
    figures.extend(["kill campaign (emulation):", *table(found.chains), *ratios(found.reference, found.chains),
                    *found.notes])
    assert sum(len(c.kills) for c in found.chains) >= 20
    assert found.problems == []
