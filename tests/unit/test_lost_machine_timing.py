"""A far machine lost mid-run is found within `LOST_TIMEOUT_S` by design (issue 48): its forward's
keepalives, the run's looks and the probe's timeout add up to it. Checked on a fake clock, with fake
forward and probe processes: no SSH, no waiting."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation import cluster_far
from orchestrator.emulation.cluster import LOCAL, ClusterServer, ClusterSpec
from orchestrator.emulation.cluster_far import (
    KEEPALIVE_COUNT,
    KEEPALIVE_INTERVAL_S,
    LOOK_PERIOD_S,
    LOST_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    FarSide,
    lost_within_s,
)
from orchestrator.experiment.lost_machines import MachineWatch
from topologies.loaders import load
from topologies.plan import EmulationPlan

FAR = ClusterServer(name="root@10.9.0.2:22", user="root", host="10.9.0.2", key="/k", known_hosts="/kh",
                    sites=("r2",))
#: The run's loop: the sequential mode looks every 0.05 s (the online mode every 0.1 s).
STEP_S = 0.05
#: When ssh ends a forward to a machine that stopped answering at 0: at the keepalive after the
#: `KEEPALIVE_COUNT` unanswered ones.
FORWARD_ENDS_S = (KEEPALIVE_COUNT + 1) * KEEPALIVE_INTERVAL_S


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Proc:
    """A forward or a probe: it exits with `status` once the clock reaches `exits_at` (never if None)."""

    def __init__(self, clock: Clock, exits_at: float | None, status: int = 255) -> None:
        self.clock, self.exits_at, self.status, self.killed = clock, exits_at, status, False

    def poll(self) -> int | None:
        if self.killed:
            return -9
        return self.status if self.exits_at is not None and self.clock() >= self.exits_at else None

    def kill(self) -> None:
        self.killed = True

    def wait(self, timeout: float | None = None) -> int:
        """As `Popen.wait`, the fake clock moving on instead of the time passing."""
        if self.killed:
            return -9
        if self.exits_at is not None and (timeout is None or self.exits_at - self.clock() <= timeout):
            self.clock.t = max(self.clock.t, self.exits_at)
            return self.status
        assert timeout is not None, "waiting for ever on a probe that never answers"
        self.clock.t += timeout
        raise subprocess.TimeoutExpired("ssh", timeout)


class Emu:
    """The emulation's side of `MachineWatch`: the sites of the far servers lost so far."""

    def __init__(self, far: FarSide, placement: dict[str, str]) -> None:
        self.far, self.placement = far, placement
        self.net = type("Net", (), {"hosts": [], "switches": []})()

    def lost_sites(self, *, settle: bool = False) -> dict[str, str]:
        lost = self.far.poll_lost(self.net, settle=settle)
        return {site: server for site, server in self.placement.items() if server in lost}


def _watched(tmp_path: Path, clock: Clock, probe_status: int | None,
             monkeypatch: pytest.MonkeyPatch) -> tuple[MachineWatch, FarSide, list[Proc], list[dict[str, Any]]]:
    """A ring of four with r2 on a far machine that stops answering at 0; its probes exit with
    `probe_status` at once (None: they never answer)."""
    far = FarSide(ClusterSpec((ClusterServer(LOCAL), FAR)), tmp_path, {}, 1500, clock=clock)
    far.forwards[FAR.name] = Proc(clock, FORWARD_ENDS_S)  # type: ignore[assignment]
    probes: list[Proc] = []

    def start_probe(_self: FarSide, _server: ClusterServer) -> Proc:
        probes.append(Proc(clock, None if probe_status is None else clock(), probe_status or 0))
        return probes[-1]

    monkeypatch.setattr(FarSide, "_start_probe", start_probe)
    faults: list[dict[str, Any]] = []
    plan = EmulationPlan.from_model(load("ring:4"))
    placement = {"r1": LOCAL, "r2": FAR.name, "r3": LOCAL, "r4": LOCAL}
    watch = MachineWatch(Emu(far, placement), plan, lambda _label, **f: faults.append(f), clock, monotonic=clock)
    return watch, far, probes, faults


def _run_loop(watch: MachineWatch, clock: Clock, faults: list[dict[str, Any]], until_s: float) -> None:
    while not faults and clock.t < until_s:
        watch.links()
        clock.t += STEP_S


def test_the_design_adds_up_to_the_stated_timeout() -> None:
    assert PROBE_TIMEOUT_S > 1.0  # room for an SSH connection to a machine that answers
    assert lost_within_s() <= LOST_TIMEOUT_S
    assert FORWARD_ENDS_S + 2 * LOOK_PERIOD_S + PROBE_TIMEOUT_S == pytest.approx(lost_within_s())


def test_the_forward_s_keepalives_are_the_design_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr(cluster_far.subprocess, "Popen", lambda argv, **_kw: started.append(argv))
    far = FarSide(ClusterSpec((ClusterServer(LOCAL), FAR)), tmp_path, {}, 1500)
    far.forwarded = (6653, "run-1")

    far._start_forward(FAR)

    (argv,) = started
    assert f"ServerAliveInterval={KEEPALIVE_INTERVAL_S}" in argv and f"ServerAliveCountMax={KEEPALIVE_COUNT}" in argv
    assert not any(a.startswith("ServerAliveInterval=") and a != f"ServerAliveInterval={KEEPALIVE_INTERVAL_S}"
                   for a in argv)


@pytest.mark.parametrize("phase_s", [0.0, 0.05, 0.2, 0.45])
def test_a_machine_that_stops_answering_is_lost_within_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase_s: float) -> None:
    # Prepare: the machine stops answering at 0; the run's looks start at `phase_s`; probes never answer
    clock = Clock(phase_s)
    watch, far, probes, faults = _watched(tmp_path, clock, None, monkeypatch)

    # Execute: the run's loop
    _run_loop(watch, clock, faults, until_s=3 * LOST_TIMEOUT_S)

    # Assert: one machine_lost fault, within the design's bound; the probe that hung ended
    (fault,) = faults
    assert fault["action"] == "machine_lost" and fault["target"] == FAR.name
    assert FORWARD_ENDS_S + PROBE_TIMEOUT_S <= fault["at_s"] <= lost_within_s() + STEP_S
    assert len(probes) == 1 and probes[0].killed
    assert far.lost == [FAR.name] and far.lost_at[FAR.name] == fault["at_s"] and not far.probes
    assert watch.links() == {("r1", "r2"), ("r2", "r3")}


def test_a_probe_refused_at_once_finds_the_machine_lost_at_the_next_look(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    watch, _far, probes, faults = _watched(tmp_path, clock, 255, monkeypatch)

    _run_loop(watch, clock, faults, until_s=3 * LOST_TIMEOUT_S)

    (fault,) = faults
    assert fault["at_s"] <= FORWARD_ENDS_S + 2 * LOOK_PERIOD_S + STEP_S  # not the probe's whole timeout
    assert len(probes) == 1 and not probes[0].killed


def test_a_server_that_answers_gets_its_forward_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: the forward ended, but the machine answers the probe
    clock = Clock()
    watch, far, probes, faults = _watched(tmp_path, clock, 0, monkeypatch)
    again: list[str] = []

    def start_forward(self: FarSide, server: ClusterServer) -> None:
        again.append(server.name)
        self.forwards[server.name] = Proc(clock, None)  # type: ignore[assignment]

    monkeypatch.setattr(FarSide, "_start_forward", start_forward)

    # Execute
    _run_loop(watch, clock, faults, until_s=FORWARD_ENDS_S + 3 * LOOK_PERIOD_S)

    # Assert: forwarded again, not lost, no probe left
    assert again == [FAR.name] and len(probes) == 1
    assert faults == [] and far.lost == [] and not far.probes


def test_a_look_never_waits_on_a_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: the forward has ended; the probe hangs
    clock = Clock(FORWARD_ENDS_S)
    _watch, far, probes, _faults = _watched(tmp_path, clock, None, monkeypatch)

    # Execute: looks before the probe's deadline, the clock standing still
    looks = [far.poll_lost(type("Net", (), {"hosts": [], "switches": []})()) for _ in range(3)]

    # Assert: nothing lost yet, one probe started and still pending
    assert looks == [[], [], []] and len(probes) == 1 and far.probes[FAR.name][1] == FORWARD_ENDS_S + PROBE_TIMEOUT_S


def test_before_a_task_is_admitted_a_machine_being_asked_is_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: the forward has ended and a probe is under way (a look started it)
    clock = Clock(FORWARD_ENDS_S)
    watch, _far, probes, faults = _watched(tmp_path, clock, None, monkeypatch)
    assert watch.links() == set() and len(probes) == 1

    # Execute: a task is about to be admitted
    watch.refresh()
    links = watch.links()

    # Assert: the probe ran out its time, and the task is scheduled without the lost machine's links
    assert links == {("r1", "r2"), ("r2", "r3")}
    (fault,) = faults
    assert fault["at_s"] == pytest.approx(FORWARD_ENDS_S + PROBE_TIMEOUT_S) and probes[0].killed
