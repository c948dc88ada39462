"""The stock-kernel checks: run where the OVS kernel datapath and netem exist, print marked JSON results.

``python -m tests.guest.checks`` runs inside the test guest (scripts/guest/run.sh), or directly on a
host whose kernel has the openvswitch module and sch_netem (`tests.guest.driver` chooses). Each
check prints one line ``NETAI-GUEST-RESULT {json}`` with what it measured; the pytest side
(`tests/guest/test_stock_kernel.py`) asserts on them, so the same figures are judged wherever they
were measured. A check that raises reports its error instead; the others still run.

- ``line``: a line of four sites joined by long fibres at 10 Mbit/s (a rate an emulated CPU
  carries), brought up once with ``datapath="kernel"`` (a bring-up takes about 35 s under TCG) for
  two results:
  - ``rtt``: ping between every pair of hosts (path by path): each path's lowest and median RTT, and
    twice its summed fibre delay; then, last, the same with every netem delay set to zero (the
    path's own round trip);
  - ``reservation``: a task's paths from end to end of the line installed by the controller: its
    htb class with netem under it on every link of its path, its flow against four saturating
    background iperf3 streams (started ahead of it), and a control run without the task.
- ``net_test``: ``netai net test`` (the CLI) on a small ring, as a user runs it.
- ``guest_clean``: after the runs, nothing of them in the machine (in the guest: nothing at all);
  and, in the guest, which of the project's modules this process compiled as it imported them
  rather than reading the byte code compiled beside them on the host (`byte_code`).

Traffic stays between the emulation's hosts. This module asserts nothing itself.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.htb import interface, shaped_links
from controller.paths import PathSpec, TaskPaths
from orchestrator.emulation.network import Emulation, EmulationInfo
from tests.integration.test_reservations import Flow, class_bytes, run_together, tc_show
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

RESULT_MARK = "NETAI-GUEST-RESULT "
IN_GUEST = os.environ.get("NETAI_IN_GUEST") == "1"
#: The line of both results of the ``line`` check: A - B - C - D, fibre lengths in km (1.5, 3.5 and
#: 5 ms one way), each link LINK_MBPS.
RTT_LINE_KM = (300.0, 700.0, 1000.0)
#: Echoes per path, PING_INTERVAL_S apart: enough that some escape the scheduling delays of an
#: emulated CPU on a busy host (30 were not always, with the unit tests beside the guest).
PINGS = 50
PING_INTERVAL_S = 0.1
LINK_MBPS = 10.0
#: The reservation's task: from one end of the line to the other, RESERVED_MBPS of each link.
RESERVED_MBPS = 5.0
TASK_ID = 28
TASK_PORT = 21028
BACKGROUND_PORT = 5201
BACKGROUND_STREAMS = 4
IPERF_SECONDS = 6
#: The background starts this much ahead of the task, with and without the reservation: it has filled
#: the link (and the background leaf's netem queue) when the task starts, as load present before a
#: task arrives would have. Started together (on a line of two 200 km fibres), the control's share
#: swung with who won the first seconds in that 1000-packet queue: 1.9-6.2 Mbit/s over nine runs.
BACKGROUND_HEAD_START_S = 2
#: ``netai net test`` in the guest: a small ring at a rate the emulated CPU carries.
#: How long a bring-up may wait for the controller, then for the switches: an emulated CPU on a busy
#: host starts os-ken in tens of seconds.
CONNECT_TIMEOUT_S = 180.0
NET_TEST_ARGS = ["net", "test", "--topology", "ring:6", "--locals", "2", "--max-link-mbps", "10",
                 "--timeout", f"{CONNECT_TIMEOUT_S:g}", "--json"]


def line_plan(name: str, lengths_km: tuple[float, ...], capacity_mbps: float) -> EmulationPlan:
    """Sites A, B, C, ... in a line; link i joins site i and i+1 with fibre `lengths_km[i]`."""
    names = [chr(ord("A") + i) for i in range(len(lengths_km) + 1)]
    links = [{"a": a, "b": b, "capacity_mbps": capacity_mbps, "wavelengths": 1, "length_km": km}
             for (a, b), km in zip(itertools.pairwise(names), lengths_km, strict=True)]
    model = NetworkModel.build(name, [{"name": s} for s in names], links)
    return EmulationPlan.from_model(model, bw_scale=1.0)


def emulation_facts(info: EmulationInfo | None) -> dict[str, Any]:
    assert info is not None
    return {"datapath": info.datapath, "delay_emulated": info.delay_emulated,
            "switches_connected": info.switches_connected, "bringup_s": info.bringup_s}


def teardown_facts(emu: Emulation) -> dict[str, Any]:
    info = emu.info
    assert info is not None
    return {"teardown_clean": info.teardown_clean, "leftovers": info.leftovers}


def bridge_datapath_types(emu: Emulation) -> dict[str, str]:
    """``datapath_type`` of each of the run's bridges (``system`` or empty: the kernel datapath)."""
    out = {}
    for sw in emu.plan.switches:
        res = subprocess.run(["ovs-vsctl", "get", "bridge", sw.name, "datapath_type"],
                             capture_output=True, text=True, check=False)
        out[sw.name] = res.stdout.strip().strip('"') if res.returncode == 0 else f"error: {res.stderr.strip()}"
    return out


def kernel_datapaths() -> list[str]:
    """The kernel's OVS datapaths (``ovs-dpctl dump-dps``), e.g. ``system@ovs-system``."""
    res = subprocess.run(["ovs-dpctl", "dump-dps"], capture_output=True, text=True, check=False)
    return res.stdout.split()


def ping_paths(emu: Emulation, pairs: list[tuple[str, str]], count: int = PINGS) -> list[list[float]]:
    """Round-trip times (ms) of `count` ICMP echoes on each (source, destination) pair of sites, the pairs
    pinged at the same time (so that every path sees the host as it was then)."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for a, b in pairs:
            procs.append(emu.host(a).popen(["ping", "-n", "-c", str(count), "-i", f"{PING_INTERVAL_S:g}", "-W", "2",
                                            emu.host(b).IP()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [proc.communicate(timeout=count * PING_INTERVAL_S + 30)[0] for proc in procs]
    finally:  # none is left behind when one times out
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return [[float(m) for m in re.findall(r"time=([0-9.]+) ms", out)] for out in outs]


def zero_netem_delays(plan: EmulationPlan) -> tuple[int, list[str]]:
    """Set every netem on the run's links to no delay (`tc qdisc change`, its limit kept): (how many were
    changed, the netem lines that still carry a delay afterwards)."""
    changed, left = 0, []
    for dev in (ln.dev for ln in shaped_links(plan)):
        for handle, parent, limit in re.findall(r"qdisc netem (\S+) parent (\S+) limit (\d+)", tc_show("qdisc", dev)):
            subprocess.run(["tc", "qdisc", "change", "dev", dev, "parent", parent, "handle", handle, "netem",
                            "limit", limit, "delay", "0ms"], check=True, capture_output=True, text=True)
            changed += 1
        left += [f"{dev}: {ln.strip()}" for ln in tc_show("qdisc", dev).splitlines() if "netem" in ln and "delay" in ln]
    return changed, left


def rtt_figures(rtts: list[float]) -> dict[str, Any]:
    """How many echoes came back, their lowest and their median (the first echo of a pair may wait for the
    kernel datapath's upcall: left out of the median)."""
    return {"received": len(rtts), "min_ms": min(rtts) if rtts else None,
            "median_ms": statistics.median(rtts[1:]) if len(rtts) > 1 else None}


def check_line() -> list[dict[str, Any]]:
    """The ``rtt`` and ``reservation`` results on one line, brought up once: the delayed pings first,
    on the line as it came up; then the reservation, which needs netem's delays; then the pings with
    every netem delay at zero. A part that raises reports its error as its result; the other's stand."""
    plan = line_plan("guest-line-4", RTT_LINE_KM, LINK_MBPS)
    rtt: dict[str, Any] = {"check": "rtt", "lengths_km": list(RTT_LINE_KM), "paths": []}
    reservation: dict[str, Any] = {"check": "reservation", "link_mbps": LINK_MBPS, "reserved_mbps": RESERVED_MBPS,
                                   "background_streams": BACKGROUND_STREAMS}
    emu = Emulation(plan, datapath="kernel", connect_timeout_s=CONNECT_TIMEOUT_S)
    with emu:
        facts = emulation_facts(emu.info)
        rtt.update(facts)
        reservation.update(facts)
        part(rtt, lambda: rtt.update(bridge_datapath_types=bridge_datapath_types(emu),
                                     kernel_datapaths=kernel_datapaths(),
                                     qdiscs_a_b=tc_show("qdisc", interface(plan, "A", "B"))))
        pairs = list(itertools.combinations([h.site for h in plan.hosts], 2))
        delayed = part(rtt, lambda: ping_paths(emu, pairs))
        part(reservation, lambda: reservation_run(emu, reservation))
        if delayed is not None:
            part(rtt, lambda: rtt_undelayed(emu, pairs, delayed, rtt))
    teardown = teardown_facts(emu)
    return [{**rtt, **teardown}, {**reservation, **teardown}]


def part(result: dict[str, Any], run: Callable[[], Any]) -> Any:
    """`run()`, or None with its error and traceback in `result` (as `main` reports a check's)."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - reported as the result's; the line's other result still runs
        result.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        return None


def rtt_undelayed(emu: Emulation, pairs: list[tuple[str, str]], delayed: list[list[float]],
                  result: dict[str, Any]) -> None:
    """Every netem delay set to zero, each pair pinged again: what the delays add to each path's RTT
    against twice its fibre delay (the second pass is the emulated machine's own round trip on that
    path, its forwarding and scheduling: 0.4-0.7 ms in a guest under TCG)."""
    plan = emu.plan
    model_delay = {(ln.a, ln.b): ln.delay_ms for ln in plan.links}
    sites = [h.site for h in plan.hosts]
    result["netem_zeroed"], result["delays_left"] = zero_netem_delays(plan)
    undelayed = ping_paths(emu, pairs)
    for (a, b), rtts, base in zip(pairs, delayed, undelayed, strict=True):
        i, j = sites.index(a), sites.index(b)
        one_way = sum(model_delay[(sites[k], sites[k + 1])] for k in range(i, j))
        result["paths"].append({"path": sites[i:j + 1], "expected_ms": round(2 * one_way, 3), "sent": PINGS,
                                **rtt_figures(rtts), "undelayed": rtt_figures(base)})


def the_task(plan: EmulationPlan) -> TaskPaths:
    sites = tuple(h.site for h in plan.hosts)
    return TaskPaths(task_id=TASK_ID, label="stock-kernel", paths=(
        PathSpec(src=sites[0], dst=sites[-1], sites=sites, tcp_dst=TASK_PORT, reserved_mbps=RESERVED_MBPS,
                 kind="broadcast"),
    ))


def task_qdiscs(emu: Emulation, classid: str) -> dict[str, str]:
    """Per link of the task's path (both directions): the qdisc line under the task's class."""
    out = {}
    sites = [h.site for h in emu.plan.hosts]
    for a, b in itertools.chain(itertools.pairwise(sites), itertools.pairwise(reversed(sites))):
        lines = [ln for ln in tc_show("qdisc", interface(emu.plan, a, b)).splitlines() if f"parent {classid} " in ln]
        out[f"{a}->{b}"] = lines[0].strip() if lines else ""
    return out


def reservation_run(emu: Emulation, result: dict[str, Any]) -> None:
    """A task's class (with netem under it) keeps its reserved rate against saturating background; then the
    control, the same flows without the task's paths."""
    plan = emu.plan
    src, dst = plan.hosts[0].site, plan.hosts[-1].site
    task_flow = Flow("task", src, dst, TASK_PORT)
    background = Flow("background", src, dst, BACKGROUND_PORT, streams=BACKGROUND_STREAMS)
    emu.client.set_background([[src, dst]])
    summary = emu.client.install_task(the_task(plan))
    task_class = summary["reservation"]["classid"]
    result["enforced"] = summary["reservation"]["enforced"]
    result["task_qdiscs"] = task_qdiscs(emu, task_class)
    dev = interface(plan, src, plan.hosts[1].site)
    before = class_bytes(dev)
    shaped = run_together(emu, [background, task_flow], seconds=IPERF_SECONDS, head_start_s=BACKGROUND_HEAD_START_S)
    result["task_class_bytes"] = class_bytes(dev).get(task_class, 0) - before.get(task_class, 0)
    emu.client.remove_task(TASK_ID)
    result["classes_after_remove"] = sorted(class_bytes(dev))
    result["task_class"] = task_class
    control = run_together(emu, [background, task_flow], seconds=IPERF_SECONDS, head_start_s=BACKGROUND_HEAD_START_S)
    result.update(task_mbps=shaped["task"], background_mbps=shaped["background"], control_task_mbps=control["task"],
                  control_background_mbps=control["background"], iperf_seconds=IPERF_SECONDS)


def check_net_test() -> dict[str, Any]:
    """``netai net test`` as a user runs it; its JSON summary and exit status."""
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli", *NET_TEST_ARGS],
                         capture_output=True, text=True, timeout=600, check=False)
    try:
        summary = json.loads(res.stdout)
    except json.JSONDecodeError:
        summary = {"unparsed_stdout": res.stdout[-2000:]}
    return {"check": "net_test", "args": NET_TEST_ARGS, "exit_status": res.returncode, "summary": summary,
            "stderr_tail": res.stderr[-2000:]}


def machine_leftovers() -> dict[str, Any]:
    """What emulations left in this machine: bridges, kernel datapaths' ports, interfaces, namespaces,
    processes. Only meaningful in the guest, where nothing else runs."""
    bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=False).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    names = [m.split("@")[0] for m in re.findall(r"^\d+: (\S+):", links, flags=re.M)]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split()
    procs = []
    for stat in Path("/proc").glob("[0-9]*/comm"):
        try:
            comm = stat.read_text().strip()
        except OSError:
            continue
        if comm in {"iperf3", "ping", "mnexec", "osken-manager", "tc"} or comm.startswith("osken"):
            procs.append(comm)
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, check=False).stdout
    return {"bridges": bridges, "interfaces": [n for n in names if n not in {"lo", "ovs-system"}],
            "netns": netns, "processes": sorted(procs),
            "shaped": [ln for ln in qdiscs.splitlines() if any(k in ln for k in ("htb", "netem"))],
            "datapath_ports": kernel_datapath_ports()}


def kernel_datapath_ports() -> list[str]:
    """Ports left on the kernel datapaths, other than each datapath's own internal port."""
    out = subprocess.run(["ovs-dpctl", "show"], capture_output=True, text=True, check=False).stdout
    return [ln.strip() for ln in out.splitlines() if re.match(r"\s+port \d+:", ln) and "(internal)" not in ln]


def check_guest_clean() -> dict[str, Any]:
    if not IN_GUEST:
        return {"check": "guest_clean", "skipped": "not in the guest: only each run's own marks were checked"}
    return {"check": "guest_clean", "leftovers": machine_leftovers(), "byte_code": byte_code()}


#: The project's packages, whose byte code scripts/compile_sources.sh compiles on the host.
PROJECT_PACKAGES = ("orchestrator", "workers", "controller", "topologies", "tests")


def byte_code() -> dict[str, Any]:
    """The project's modules this process imported, and those of them it compiled from source: no
    byte code beside the source that matches it (`fresh_byte_code`). With a cache prefix set, Python
    looks for byte code under it only, so ``pycache_prefix`` is reported too."""
    loaded = sorted(name for name, module in list(sys.modules.items())
                    if name.split(".")[0] in PROJECT_PACKAGES and getattr(module, "__file__", None))
    compiled = [name for name in loaded if not fresh_byte_code(Path(sys.modules[name].__file__ or ""))]
    return {"pycache_prefix": sys.pycache_prefix, "modules": len(loaded), "compiled_again": compiled}


def fresh_byte_code(source: Path) -> bool:
    """Whether `source` has byte code where this interpreter looks for it, of this Python, stamped
    with the source's modification time and size (as `compileall` writes it and the import checks it)."""
    try:
        head = Path(importlib.util.cache_from_source(str(source))).read_bytes()[:16]
        st = source.stat()
    except (OSError, ValueError):
        return False
    word = [int.from_bytes(head[i:i + 4], "little") for i in (4, 8, 12)]
    return head[:4] == importlib.util.MAGIC_NUMBER and word == [0, int(st.st_mtime) & 0xFFFFFFFF,
                                                                 st.st_size & 0xFFFFFFFF]


#: The checks, by the name `main` takes; each gives one result, or a list (``line``: rtt, reservation).
CHECKS: dict[str, Callable[[], dict[str, Any] | list[dict[str, Any]]]] = {
    "line": check_line,
    "net_test": check_net_test,
    "guest_clean": check_guest_clean,
}
#: The results the checks give, by their ``check`` field.
RESULTS = ("rtt", "reservation", "net_test", "guest_clean")


def main(argv: list[str]) -> int:
    names = argv or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    for name in names:
        print(f"*** check {name}", file=sys.stderr, flush=True)
        try:
            got = CHECKS[name]()
        except Exception as e:  # noqa: BLE001 - reported as the check's result; the other checks still run
            got = {"check": name, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        for result in got if isinstance(got, list) else [got]:
            print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
