"""When an emulation starts, every thread of ovs-vswitchd runs at the nice value docs/data-plane.md
gives the switch datapath (-10), as /proc reads back, and the run records what was applied."""

from __future__ import annotations

import os

import pytest

from orchestrator.emulation.datapath_priority import (
    DATAPATH_NICE,
    daemon_pids,
    set_threads_nice,
    thread_ids,
    thread_sched,
)
from orchestrator.emulation.network import Emulation
from topologies.loaders import load
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_the_emulation_raises_every_ovs_vswitchd_thread() -> None:
    (pid,) = daemon_pids()
    saved = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in thread_ids(pid)}
    set_threads_nice(pid, 0)  # start from the daemon's default, so the emulation has to act
    try:
        # the userspace datapath, asked for by name (auto picks the kernel module or tc): its smoke test too
        with Emulation(EmulationPlan.from_model(load("triangle")), datapath="user") as emu:
            assert emu.info is not None and emu.info.datapath == "user"
            record = emu.info.datapath_priority  # type: ignore[attr-defined]
            seen = {tid: thread_sched(pid, tid) for tid in thread_ids(pid)}
            a, b = emu.net.hosts[0], emu.net.hosts[-1]
            pinged = a.cmd("ping", "-c2", "-W2", b.IP())
    finally:
        for tid, nice in saved.items():
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except ProcessLookupError:
                pass  # the thread ended meanwhile

    assert record["applied"] is True and record["pid"] == pid and record["nice"] == DATAPATH_NICE
    assert record["threads"] >= 1 and record["nice_before"] == [0]
    assert seen and set(seen.values()) == {(0, DATAPATH_NICE)}, seen
    assert " 0% packet loss" in pinged, pinged
