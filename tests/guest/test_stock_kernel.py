"""The paths users take on a stock Debian/Ubuntu kernel: the OVS kernel datapath and netem delay.

`tests.guest.checks` runs once for the module, on this host when its kernel has both (then under
the Mininet lock), else in the test guest (Debian's stock kernel under QEMU: docs/guest.md). The
tests assert on what it measured:

- the emulation comes up on the kernel datapath (``datapath="kernel"``) with delay emulated;
- ping on a line of long fibres: what the links' delays add to each path's RTT is twice its summed
  fibre delay (5 us/km), within 10 % + 1 ms. The lowest of the path's echoes is compared, free of
  the scheduling delays an emulated CPU on a busy host adds to some echoes (tens of ms each; the
  median is printed too), less the lowest of the same path pinged again with every netem delay at
  zero: the machine's own round trip, its forwarding and scheduling, which is the host's cost and
  not the network's (0.4-0.7 ms a path in a guest under TCG; on a real kernel, tens of us). What
  stays in the figure beyond the fibre is how late the emulated CPU's timers release netem's
  packets: about 0.3 ms per link crossed under TCG. Without netem under the class the pings take,
  the added delay is under 1 ms; with the delay twice, it is twice as high;
- a task's paths installed by the controller: its htb class with netem under it on every link of its
  path, and its reserved rate held against four saturating background iperf3 streams (and not
  without the reservation, the control);
- ``netai net test`` passes there;
- teardown leaves nothing (in the guest: nothing at all).

The figures (where the checks ran, the accelerator, RTT over expected per path, the isolation ratio)
are printed in the run's summary.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.guest import checks
from tests.guest.driver import ChecksRun, checks_run

pytestmark = [pytest.mark.root, pytest.mark.slow]

RTT_TOLERANCE = 0.10
RTT_SLACK_MS = 1.0


@pytest.fixture(scope="module")
def run(figures: list[str]) -> ChecksRun:
    result = checks_run()  # started at collection when the suite runs these tests (tests/conftest.py)
    figures.append(f"stock-kernel checks ran on the {result.where}"
                   + (f" (guest accelerator: {result.accel})" if result.where == "guest" else "")
                   + f", exit status {result.status}, {result.elapsed_s:.0f} s in all"
                   + (f" (the guest's build: {result.build_s:.0f} s)" if result.build_s is not None else "")
                   + (f"; the suite waited {result.waited_s:.0f} s for them" if result.waited_s is not None else ""))
    return result


def result_of(run: ChecksRun, name: str) -> dict[str, Any]:
    """The named check's result; a failure here shows the run's output."""
    got = run.results.get(name)
    assert got is not None, f"no result from check {name!r} (status {run.status}):\n{run.output[-6000:]}"
    assert "error" not in got, f"check {name!r} failed:\n{got.get('traceback', got['error'])}"
    return got


def added_ms(path: dict[str, Any]) -> float:
    """What the links' delays add to a path's round trip: its lowest RTT less its lowest with no delay."""
    return float(path["min_ms"] - path["undelayed"]["min_ms"])


def test_the_checks_ran_to_the_end(run: ChecksRun) -> None:
    assert run.status == 0, run.output[-6000:]
    assert not run.bad_lines
    assert set(run.results) == set(checks.RESULTS)


def test_bringup_uses_the_kernel_datapath_with_delay_emulated(run: ChecksRun) -> None:
    rtt = result_of(run, "rtt")

    assert rtt["datapath"] == "kernel"
    assert rtt["delay_emulated"] is True
    assert rtt["switches_connected"] == len(checks.RTT_LINE_KM) + 1
    # Every bridge on the kernel datapath (OVS writes "system", or leaves the default empty).
    assert set(rtt["bridge_datapath_types"].values()) <= {"system", ""}, rtt["bridge_datapath_types"]
    assert "system@ovs-system" in rtt["kernel_datapaths"]


def test_ping_rtt_is_twice_the_fibre_delay_path_by_path(run: ChecksRun, figures: list[str]) -> None:
    rtt = result_of(run, "rtt")
    paths = rtt["paths"]

    for p in paths:
        base = p["undelayed"]["min_ms"]
        figures.append(f"RTT {'-'.join(p['path'])}: min {p['min_ms']} ms - {base} ms undelayed = "
                       f"{added_ms(p):.2f} ms = {added_ms(p) / p['expected_ms']:.3f} x expected "
                       f"{p['expected_ms']:.3f} ms (raw min {p['min_ms'] / p['expected_ms']:.3f} x, median "
                       f"{p['median_ms']} ms)" if None not in (p["min_ms"], base)
                       else f"RTT {'-'.join(p['path'])}: no answer")
    sites = len(checks.RTT_LINE_KM) + 1
    assert len(paths) == sites * (sites - 1) // 2
    # Every netem of the run's links was set to no delay for the second pass, and none kept one.
    assert rtt["netem_zeroed"] >= 2 * len(checks.RTT_LINE_KM), rtt
    assert rtt["delays_left"] == [], rtt["delays_left"]
    for p in paths:
        assert p["received"] == p["sent"] and p["undelayed"]["received"] == p["sent"], p
        assert abs(added_ms(p) - p["expected_ms"]) <= RTT_TOLERANCE * p["expected_ms"] + RTT_SLACK_MS, p
    # the longest path is the sum of its fibres: 2 x (1.5 + 3.5 + 5) ms = 20 ms
    assert max(p["expected_ms"] for p in paths) == pytest.approx(2 * sum(checks.RTT_LINE_KM) * 0.005)


def test_a_task_class_with_netem_holds_its_reservation_against_saturating_background(
    run: ChecksRun, figures: list[str]
) -> None:
    r = result_of(run, "reservation")
    reserved = r["reserved_mbps"]

    figures.append(
        f"reservation {reserved:g} of {r['link_mbps']:g} Mbit/s ({r['datapath']} datapath, netem under the class) "
        f"vs {r['background_streams']} background streams: task {r['task_mbps']:.2f} Mbit/s = "
        f"{r['task_mbps'] / reserved:.2f} x reserved (background {r['background_mbps']:.2f}); control without "
        f"the reservation: {r['control_task_mbps']:.2f} Mbit/s = {r['control_task_mbps'] / reserved:.2f} x reserved "
        f"(background {r['control_background_mbps']:.2f})")
    assert r["datapath"] == "kernel" and r["delay_emulated"] is True
    assert r["enforced"] is True
    # netem under the task's class on every link of its path, both directions.
    for link, qdisc in r["task_qdiscs"].items():
        assert "netem" in qdisc and "delay" in qdisc, (link, qdisc)
    assert r["task_mbps"] >= 0.9 * reserved
    assert r["task_class_bytes"] >= r["task_mbps"] * 1e6 / 8 * (r["iperf_seconds"] - 1)
    # The control: without the reservation the same flow gets well below what it got with it. (Its
    # absolute rate varies more here than on the host: the background leaf is netem's 1000-packet
    # queue rather than the short pfifo; the background starts ahead so that it has filled it.)
    assert r["control_task_mbps"] < 0.6 * r["task_mbps"]
    assert r["task_class"] not in r["classes_after_remove"]


def test_netai_net_test_passes_on_the_stock_kernel(run: ChecksRun, figures: list[str]) -> None:
    r = result_of(run, "net_test")
    s = r["summary"]

    figures.append(f"netai net test {' '.join(r['args'][2:])}: exit {r['exit_status']}, datapath "
                   f"{s.get('datapath')}, delay emulated {s.get('delay_emulated')}, iperf3 ratio "
                   f"{s.get('iperf_ratio')}")
    assert r["exit_status"] == 0, r
    assert s["ok"] is True
    assert s["datapath"] == "kernel" and s["delay_emulated"] is True


def test_teardown_leaves_nothing(run: ChecksRun) -> None:
    for name in ("rtt", "reservation"):
        r = result_of(run, name)
        assert r["teardown_clean"] is True, (name, r["leftovers"])
    assert result_of(run, "net_test")["summary"]["teardown_clean"] is True
    clean = result_of(run, "guest_clean")
    if run.where == "guest":
        assert "skipped" not in clean
    if "skipped" not in clean:  # in the guest (also when these tests run inside it, on its "host")
        assert not any(clean["leftovers"].values()), clean["leftovers"]


def test_the_guest_reads_the_byte_code_compiled_on_the_host(run: ChecksRun) -> None:
    # The share is read-only: a module without byte code beside it is compiled by every process that
    # imports it (scripts/guest/run.sh compiles them before the boot; docs/guest.md, "Time").
    if run.where != "guest":
        pytest.skip("the checks ran on this host, whose checkout is writable: the guest's byte code is not in play")
    got = result_of(run, "guest_clean")["byte_code"]
    assert got["pycache_prefix"] is None, got
    assert got["modules"] >= 20, got
    assert got["compiled_again"] == [], got
