"""Reservations hold on real links: a task's class keeps its reserved rate against background iperf3.

A three-site line A - B - C at 30 Mbit/s (emulated 1:1), brought up once for the module with the real
controller. A task reserves half of the link on the path A -> B -> C for one TCP port; a background
route joins the same two hosts. Four background iperf3 streams saturate the path while one iperf3
flow runs on the task's port:

- with the task installed, the task's flow runs in its own htb class and gets at least its reserved
  rate (it gets more: spare capacity goes to tasks before the background), and the task's class on
  A's egress interface counted its bytes;
- in the control run, without the task (the same flow then follows the background route, into the
  background class, one FIFO with the four streams), it gets well below the reserved rate;
- a task alone on its links borrows up to near the link's rate;
- two tasks saturating the same links each get at least their own (unequal) guarantee;
- best-effort traffic (A -> B has no task or background route: the controller's best-effort entries
  carry it, marked Lower Effort) goes into the links' lowest class and does not take the task's rate.

Goodput bands are loose (two cores, userspace datapath); the measured figures are printed.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from controller.htb import (
    ACK_CLASS,
    BACKGROUND_CLASS,
    BACKGROUND_QDISC_MAJOR,
    BACKGROUND_QUEUE_PACKETS,
    BEST_EFFORT_CLASS,
    LINK_CLASS,
    classid,
    interface,
)
from controller.paths import PathSpec, TaskPaths
from orchestrator.emulation.background import wait_listening
from orchestrator.emulation.network import Emulation
from orchestrator.emulation.selftest import GOODPUT_CEILING, dump_flows
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.slow]

LINK_MBPS = 30.0
RESERVED_MBPS = 15.0
TASK_ID = 41
TASK_PORT = 21041
BACKGROUND_PORT = 5201
BACKGROUND_STREAMS = 4
SECONDS = 6
OMIT_S = 1  # iperf3 leaves the first second (slow start, the flows finding their shares) out
LISTEN_TIMEOUT_S = 5.0


def line_plan() -> EmulationPlan:
    sites = [{"name": s} for s in ("A", "B", "C")]
    links = [
        {"a": a, "b": b, "capacity_mbps": LINK_MBPS, "wavelengths": 1, "length_km": 10}
        for a, b in (("A", "B"), ("B", "C"))
    ]
    return EmulationPlan.from_model(NetworkModel.build("line-3", sites, links), bw_scale=1.0)


def the_task(reserved_mbps: float = RESERVED_MBPS, task_id: int = TASK_ID, port: int = TASK_PORT) -> TaskPaths:
    return TaskPaths(task_id=task_id, label="reservation-test", paths=(
        PathSpec(src="A", dst="C", sites=("A", "B", "C"), tcp_dst=port, reserved_mbps=reserved_mbps,
                 kind="broadcast"),
    ))


@pytest.fixture(scope="module")
def line() -> Iterator[Emulation]:
    emu = Emulation(line_plan())
    emu.start()
    try:
        emu.client.set_background([["A", "C"]])
        yield emu
    finally:
        info = emu.stop()
        assert info is not None and info.teardown_clean, f"teardown left {info and info.leftovers}"


@pytest.fixture(autouse=True)
def dump_on_failure(request: pytest.FixtureRequest, line: Emulation) -> Iterator[None]:
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(dump_flows(line))
        for dev in (interface(line.plan, "A", "B"), interface(line.plan, "B", "C")):
            print(f"--- tc {dev}\n{tc_show('class', dev)}{tc_show('filter', dev)}")
        assert line.controller is not None
        print("--- controller log\n" + line.controller.log_tail(40))


@pytest.fixture
def no_task(line: Emulation) -> Iterator[None]:
    """The test starts and ends without tasks."""
    _remove_task(line)
    yield
    _remove_task(line)


def _remove_task(emu: Emulation) -> None:
    for t in emu.client.tasks():
        emu.client.remove_task(t["task_id"])


# -- helpers -----------------------------------------------------------------------------------------
def tc_show(what: str, dev: str) -> str:
    res = subprocess.run(["tc", "-s", what, "show", "dev", dev], capture_output=True, text=True, check=False)
    return res.stdout + res.stderr


def class_bytes(dev: str) -> dict[str, int]:
    """Bytes sent per htb class of `dev` (``tc -s class show``)."""
    out: dict[str, int] = {}
    current = None
    for line in tc_show("class", dev).splitlines():
        m = re.match(r"class htb (\S+) ", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(r"\s*Sent (\d+) bytes", line)
        if m and current is not None:
            out[current] = int(m.group(1))
            current = None
    return out


@dataclass(frozen=True)
class Flow:
    name: str
    src: str
    dst: str
    port: int
    streams: int = 1
    #: iperf3's target rate (``-b``, Mbit/s of payload); None: as fast as the link lets it
    rate_mbps: float | None = None


def run_together(emu: Emulation, flows: Sequence[Flow], seconds: int = SECONDS,
                 head_start_s: int = 0) -> dict[str, float]:
    """Run the iperf3 flows at the same time; goodput (Mbit/s, at the receiver, after `OMIT_S`) of each.

    With `head_start_s`, the first flow starts that much earlier and leaves that much more out, so that
    it is at its steady rate (the link saturated) when the others start, and all are measured over the
    same seconds."""
    servers = []
    clients: list[tuple[Flow, subprocess.Popen[str]]] = []
    try:
        for f in flows:
            dst = emu.host(f.dst)
            servers.append(dst.popen(["iperf3", "-s", "-1", "-p", str(f.port), "-B", dst.IP()],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_listening([(server, emu.host(f.dst).IP(), f.port, f.name) for server, f in zip(servers, flows, strict=True)],
                       timeout_s=LISTEN_TIMEOUT_S)
        for k, f in enumerate(flows):
            src, dst = emu.host(f.src), emu.host(f.dst)
            if k == 1 and head_start_s:
                time.sleep(head_start_s)
            omit = OMIT_S + (head_start_s if k == 0 else 0)
            clients.append((f, src.popen(
                ["iperf3", "-c", dst.IP(), "-p", str(f.port), "-P", str(f.streams), "-t", str(seconds),
                 "-O", str(omit), "-J", *(["-b", f"{f.rate_mbps:g}M"] if f.rate_mbps is not None else [])],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )))
        result = {}
        for f, client in clients:
            out, err = client.communicate(timeout=seconds + head_start_s + 30)
            report = json.loads(out)
            assert client.returncode == 0 and "error" not in report, f"{f.name}: {report.get('error', err)}"
            result[f.name] = float(report["end"]["sum_received"]["bits_per_second"]) / 1e6
        return result
    finally:
        for _f, client in clients:
            if client.poll() is None:
                client.kill()
                client.communicate()
        for server in servers:
            if server.poll() is None:
                server.kill()
            server.wait()


TASK_FLOW = Flow("task", "A", "C", TASK_PORT)
BACKGROUND_FLOW = Flow("background", "A", "C", BACKGROUND_PORT, streams=BACKGROUND_STREAMS)


# -- tests -------------------------------------------------------------------------------------------
def test_links_have_the_base_layout_and_the_controller_enforces_reservations(line: Emulation) -> None:
    health = line.client.health()
    dev = interface(line.plan, "A", "B")

    classes = class_bytes(dev)

    assert health["reservations"]["enforced"] is True, health["reservations"]
    assert set(classes) == {classid(LINK_CLASS), classid(BACKGROUND_CLASS), classid(BEST_EFFORT_CLASS), classid(ACK_CLASS)}
    assert "rate 30Mbit ceil 30Mbit" in tc_show("class", dev)
    # no netem here: the background leaf has its short queue (controller.htb.BACKGROUND_QUEUE_PACKETS)
    background_leaf = f"qdisc pfifo {BACKGROUND_QDISC_MAJOR}: parent {classid(BACKGROUND_CLASS)} limit {BACKGROUND_QUEUE_PACKETS}p"
    assert background_leaf in tc_show("qdisc", dev)


def test_a_reservation_holds_against_saturating_background_traffic(
    line: Emulation, no_task: None, figures: list[str]
) -> None:
    dev = interface(line.plan, "A", "B")
    summary = line.client.install_task(the_task())
    reservation = summary["reservation"]
    task_class = reservation["classid"]
    rev = interface(line.plan, "B", "A")  # the ACK direction of the task's first link
    before, rev_before = class_bytes(dev), class_bytes(rev)

    shaped = run_together(line, [BACKGROUND_FLOW, TASK_FLOW])

    after, rev_after = class_bytes(dev), class_bytes(rev)
    line.client.remove_task(TASK_ID)
    control = run_together(line, [BACKGROUND_FLOW, TASK_FLOW])  # the same flows, the task's port unreserved

    figures.append(
        f"reservation {RESERVED_MBPS:g} of {LINK_MBPS:g} Mbit/s vs {BACKGROUND_STREAMS} background streams: "
        f"task {shaped['task']:.2f} Mbit/s = {shaped['task'] / RESERVED_MBPS:.2f} x reserved, "
        f"{shaped['task'] / LINK_MBPS:.2f} x link (background {shaped['background']:.2f}); "
        f"control without reservation: task {control['task']:.2f} Mbit/s = "
        f"{control['task'] / RESERVED_MBPS:.2f} x reserved, {control['task'] / LINK_MBPS:.2f} x link "
        f"(background {control['background']:.2f})"
    )
    assert reservation["enforced"] is True, reservation
    assert {(tuple(ln["link"]), ln["guaranteed_mbps"]) for ln in reservation["links"]} == {
        (("A", "B"), RESERVED_MBPS), (("B", "C"), RESERVED_MBPS), (("B", "A"), 0.0), (("C", "B"), 0.0)
    }
    # The guarantee holds (the task gets more: spare capacity goes to it before the background).
    assert shaped["task"] >= 0.9 * RESERVED_MBPS
    # Its bytes went through its class on A's egress, not through the background class.
    task_bytes = after.get(task_class, 0) - before.get(task_class, 0)
    assert task_bytes >= shaped["task"] * 1e6 / 8 * (SECONDS - OMIT_S)
    # The ACKs coming back went to the ACK class, not behind data in a FIFO of their flow's class.
    acks = rev_after.get(classid(ACK_CLASS), 0) - rev_before.get(classid(ACK_CLASS), 0)
    assert acks > 0
    assert rev_after.get(task_class, 0) - rev_before.get(task_class, 0) < acks
    # Without the reservation the same flow shares one FIFO with the four background streams.
    assert control["task"] < 0.75 * RESERVED_MBPS
    assert control["task"] < 0.6 * shaped["task"]
    # And removing the task took its class and filters with it (the best-effort filter stays).
    assert set(class_bytes(dev)) == {classid(LINK_CLASS), classid(BACKGROUND_CLASS), classid(BEST_EFFORT_CLASS), classid(ACK_CLASS)}
    assert f"flowid {task_class}" not in tc_show("filter", dev)


def test_a_task_alone_borrows_up_to_the_link_rate(line: Emulation, no_task: None, figures: list[str]) -> None:
    line.client.install_task(the_task())

    alone = run_together(line, [TASK_FLOW])

    figures.append(
        f"task alone (reserved {RESERVED_MBPS:g} of {LINK_MBPS:g} Mbit/s): {alone['task']:.2f} Mbit/s = "
        f"{alone['task'] / LINK_MBPS:.3f} x link, {alone['task'] / (LINK_MBPS * GOODPUT_CEILING):.3f} x TCP ceiling, "
        f"{alone['task'] / RESERVED_MBPS:.2f} x reserved"
    )
    assert alone["task"] >= 0.75 * LINK_MBPS
    assert alone["task"] >= 1.4 * RESERVED_MBPS


def test_two_tasks_on_the_same_links_each_get_their_own_guarantee(
    line: Emulation, no_task: None, figures: list[str]
) -> None:
    big, small = 20.0, 5.0
    line.client.install_task(the_task(big, TASK_ID, TASK_PORT))
    second = line.client.install_task(the_task(small, TASK_ID + 1, TASK_PORT + 1))

    got = run_together(line, [Flow("big", "A", "C", TASK_PORT), Flow("small", "A", "C", TASK_PORT + 1)])

    figures.append(
        f"two tasks reserving {big:g} and {small:g} of {LINK_MBPS:g} Mbit/s, both saturating: "
        f"{got['big']:.2f} ({got['big'] / big:.2f} x its reservation) and "
        f"{got['small']:.2f} Mbit/s ({got['small'] / small:.2f} x)"
    )
    assert second["reservation"]["classid"] != line.client.task(TASK_ID)["reservation"]["classid"]
    assert got["big"] >= 0.9 * big
    assert got["small"] >= 0.8 * small
    assert got["big"] > got["small"]


def test_best_effort_traffic_uses_the_lowest_class_and_leaves_a_task_its_rate(
    line: Emulation, no_task: None, figures: list[str]
) -> None:
    # The task sends at its reservation, so that it leaves the rest of the link: best effort, the
    # lowest class (its guaranteed rate is MIN_RATE_MBPS, and a task's class borrows before it), gets
    # only what a task leaves; beside a task sending as fast as it can it got 0.00-0.10 Mbit/s
    dev = interface(line.plan, "A", "B")
    line.client.install_task(the_task())
    best_effort = Flow("best-effort", "A", "B", BACKGROUND_PORT + 100, streams=BACKGROUND_STREAMS)
    task = Flow("task", "A", "C", TASK_PORT, rate_mbps=RESERVED_MBPS)
    before = class_bytes(dev)

    got = run_together(line, [best_effort, task])

    after = class_bytes(dev)
    figures.append(
        f"task reserving {RESERVED_MBPS:g} of {LINK_MBPS:g} Mbit/s vs {BACKGROUND_STREAMS} best-effort streams on "
        f"A -> B: task {got['task']:.2f} Mbit/s = {got['task'] / RESERVED_MBPS:.2f} x reserved, "
        f"best-effort {got['best-effort']:.2f}"
    )
    assert line.client.health()["connectivity"] == "best-effort"
    assert got["task"] >= 0.9 * RESERVED_MBPS  # four best-effort streams do not take the task's rate
    assert got["best-effort"] >= 0.5 * (LINK_MBPS - got["task"])  # they take what the task leaves
    # Its bytes went through the best-effort class, none of them through the background class.
    best_effort_bytes = after[classid(BEST_EFFORT_CLASS)] - before.get(classid(BEST_EFFORT_CLASS), 0)
    assert best_effort_bytes >= got["best-effort"] * 1e6 / 8 * (SECONDS - OMIT_S)
    assert after[classid(BACKGROUND_CLASS)] - before.get(classid(BACKGROUND_CLASS), 0) < best_effort_bytes / 10
