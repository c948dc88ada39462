"""Benchmark: the project's bring-up against plain Mininet on the same topology (target: within 1.2x).

Both variants bring up the same `EmulationPlan` (``EmulationPlan.from_model(model, max_link_mbps=100)``):
the same switches (names, datapath ids), one host per site (IP, MAC), the same links on the same
ports, each switch-to-switch link shaped with htb at the plan's rate (``bw=`` in Mbit/s, Mininet's
`TCLink`), with the link's netem delay when the kernel has netem, and tx/rx checksum offload off
with the userspace datapath (the parameters of `topologies.mininet_topo.PlanTopo`, which both use
as their Mininet `Topo`: pure data). The switches are `OVSSwitch` with the same datapath (the
kernel's when it has the openvswitch module, else userspace: Open vSwitch's datapath, which the
project is asked for by name where ``auto`` would pick the tc datapath, `orchestrator.emulation.kernel`),
OpenFlow 1.3, fail mode secure, and both connect to the same controller:
the project's os-ken app (``osken-manager controller.app``, best-effort connectivity). "Every
switch connected" means the same in both: the controller's ``/health`` counts every switch of the
plan as connected, i.e. it has sent the switch its initial entries and got the barrier back
(`ControllerProcess.wait_switches`).

- **project** (A): ``with Emulation(plan):``, timed from before the constructor to the end of
  ``__enter__`` (``enter_s``, the figure compared). It includes everything `Emulation.start` does
  (``bringup_s``, also reported): the kernel probe (openvswitch module, netem in a throwaway
  namespace), the check that the switch interfaces are free, the userspace datapath's socket
  budget, the run's state file, the controller started and its REST API polled, Mininet built and
  started with the project's classes (bridges tagged with the run id, interfaces marked, the htb
  tree of `controller.htb` as one ``tc -batch`` per interface), static ARP, every host tuned (no
  IPv6, TCP rto_min), ovs-vswitchd's threads raised, the ports' receive buffers read, every host's
  pid recorded, and the wait for every switch; plus the signal handlers ``__enter__`` installs.
  Teardown: ``__exit__`` (Mininet stopped, controller stopped, the run's marks cleaned, leftovers
  checked).
- **plain** (B): the same controller process started and its REST API polled, then stock Mininet
  (`Mininet`, `OVSSwitch`, `TCLink`, `Host`; a `RemoteController` whose telnet probe is skipped,
  as its binary reply breaks Mininet's decoding) built and started, then the same wait for every
  switch. No static ARP, no host tuning, no marks, no probe; stock `TCIntf` (one htb class and
  netem per shaped interface, one shell round trip per ``tc`` command; it prints htb's "quantum
  is big" warning for each, on stderr). Teardown: ``net.stop()``, the remote
  controller's shell ended, the controller process stopped.

The machine is shared and noisy, so the figures are paired ratios from one run: each repetition
runs both variants one after the other (the order alternates; each is fully torn down and checked
before the next starts, as both use the same bridge and interface names), and prints both times
and A/B; then the medians, the median of the paired ratios with their range (min..max), and the
verdict against 1.2. Teardown times are reported the same way.

Run as root, serialised with other Mininet users::

    flock /tmp/netai-mininet.lock .venv/bin/python benchmarks/bench_bringup.py [--quick] [--json]
        [--topology sndlib/germany50] [--repetitions 3]

Default germany50 (50 sites, 88 links), 3 repetitions; ``--quick``: sndlib/nobel-us, 1 repetition.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from mininet.link import TCLink
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import OVSSwitch, RemoteController

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.flows import BEST_EFFORT, ENV_CONNECTIVITY  # noqa: E402
from controller.shaping import ENV_LINK_DELAY  # noqa: E402
from orchestrator.emulation.cleanup import existing_interfaces  # noqa: E402
from orchestrator.emulation.controller_process import LISTEN_HOST, ControllerProcess  # noqa: E402
from orchestrator.emulation.kernel import probe_kernel  # noqa: E402
from orchestrator.emulation.network import Emulation  # noqa: E402
from topologies.loaders import load  # noqa: E402
from topologies.mininet_topo import PlanTopo, switch_interfaces  # noqa: E402
from topologies.plan import EmulationPlan  # noqa: E402

LIMIT = 1.2
DEFAULT_TOPOLOGY = "sndlib/germany50"
QUICK_TOPOLOGY = "sndlib/nobel-us"


class PlainRemoteController(RemoteController):
    """Mininet's remote controller without its telnet probe (the controller's REST API was polled)."""

    def checkListening(self) -> None:
        return None


def run_project(plan: EmulationPlan, timeout_s: float, datapath: str) -> dict[str, Any]:
    """Variant A: ``with Emulation(plan, datapath=...)``; the whole ``__enter__`` timed, then ``__exit__``."""
    t0 = time.monotonic()
    emu = Emulation(plan, connect_timeout_s=timeout_s, datapath=datapath)
    with emu:
        enter_s = time.monotonic() - t0
        info = emu.info
        assert info is not None
        t1 = time.monotonic()
    teardown_s = time.monotonic() - t1
    return {
        "enter_s": round(enter_s, 4),
        "bringup_s": info.bringup_s,
        "switches_connected": info.switches_connected,
        "datapath": info.datapath,
        "delay_emulated": info.delay_emulated,
        "teardown_s": round(teardown_s, 4),
        "teardown_clean": info.teardown_clean,
        "leftovers": info.leftovers,
    }


def plain_net(plan: EmulationPlan, *, use_kernel: bool, delay_emulated: bool, of_port: int) -> Any:
    """Stock Mininet on `plan`'s topology, built and started (switches connecting to `of_port`)."""
    topo = PlanTopo(plan, delay_emulated=delay_emulated, checksum_offload=use_kernel)
    switch = partial(OVSSwitch, datapath="kernel" if use_kernel else "user", protocols="OpenFlow13",
                     failMode="secure")
    net = Mininet(topo=topo, switch=switch, link=TCLink, controller=None, autoSetMacs=False,
                  autoStaticArp=False, build=False, waitConnected=False)
    net.addController("c0", controller=PlainRemoteController, ip=LISTEN_HOST, port=of_port)
    try:
        net.build()
        net.start()
    except BaseException:
        stop_plain(net)
        raise
    return net


def stop_plain(net: Any) -> list[int]:
    """Stop stock Mininet and end the remote controller's shell; the pids of its nodes' shells."""
    pids = [int(n.pid) for n in (*net.hosts, *net.switches, *net.controllers) if getattr(n, "pid", None)]
    net.stop()
    for c in net.controllers:  # a remote controller's stop() leaves its shell
        c.terminate()
    return pids


def run_plain(plan: EmulationPlan, *, use_kernel: bool, delay_emulated: bool, timeout_s: float) -> dict[str, Any]:
    """Variant B: the same controller process, stock Mininet, the same wait for every switch."""
    log_dir = Path(tempfile.mkdtemp(prefix="netai-bench-bringup-"))
    env = {ENV_LINK_DELAY: "1" if delay_emulated else "0", ENV_CONNECTIVITY: BEST_EFFORT}
    controller = ControllerProcess(plan, log_dir, env=env)
    net = None
    t0 = time.monotonic()
    try:
        controller.start()
        controller.wait_ready(timeout_s)
        net = plain_net(plan, use_kernel=use_kernel, delay_emulated=delay_emulated, of_port=controller.of_port)
        health = controller.wait_switches(timeout_s)
    except BaseException:
        if net is not None:
            stop_plain(net)
        controller.stop()
        print(f"bench_bringup: plain Mininet failed; controller log in {log_dir}", file=sys.stderr)
        raise
    bringup_s = time.monotonic() - t0
    t1 = time.monotonic()
    pids = stop_plain(net)
    controller.stop()
    teardown_s = time.monotonic() - t1
    left = plain_leftovers(plan, pids, controller)
    shutil.rmtree(log_dir, ignore_errors=True)
    return {
        "bringup_s": round(bringup_s, 4),
        "switches_connected": int(health["switches_connected"]),
        "datapath": "kernel" if use_kernel else "user",
        "delay_emulated": delay_emulated,
        "teardown_s": round(teardown_s, 4),
        "teardown_clean": not any(left.values()),
        "leftovers": left,
    }


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return not any(line.startswith("State:") and "Z" in line.split()[1] for line in status.splitlines())


def plain_leftovers(plan: EmulationPlan, pids: list[int], controller: ControllerProcess) -> dict[str, list[Any]]:
    """What of a plain run still exists: its nodes' shells and the controller, bridges named as the
    plan's switches, the switch interfaces."""
    procs = [p for p in pids if running(p)]
    if controller.pid is not None and running(controller.pid):
        procs.append(controller.pid)
    names = {s.name for s in plan.switches}
    res = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True, check=False)
    bridges = sorted(b for b in res.stdout.split() if b in names)
    return {"processes": sorted(procs), "bridges": bridges, "interfaces": existing_interfaces(switch_interfaces(plan))}


def repetition(plan: EmulationPlan, i: int, *, use_kernel: bool, delay_emulated: bool,
               timeout_s: float) -> dict[str, Any]:
    """One pair: both variants, project first on even `i`, plain first on odd; A/B ratios."""
    order = ("project", "plain") if i % 2 == 0 else ("plain", "project")
    out: dict[str, Any] = {"order": list(order)}
    for variant in order:
        if variant == "project":
            out[variant] = run_project(plan, timeout_s, "kernel" if use_kernel else "user")
        else:
            out[variant] = run_plain(plan, use_kernel=use_kernel, delay_emulated=delay_emulated, timeout_s=timeout_s)
        if not out[variant]["teardown_clean"]:
            raise RuntimeError(f"the {variant} variant left {out[variant]['leftovers']}")
    a, b = out["project"], out["plain"]
    if a["datapath"] != b["datapath"] or a["delay_emulated"] != b["delay_emulated"]:
        raise RuntimeError(f"the variants differ: project {a['datapath']}/{a['delay_emulated']}, "
                           f"plain {b['datapath']}/{b['delay_emulated']}")
    out["ratio"] = round(a["enter_s"] / b["bringup_s"], 4)
    out["bringup_ratio"] = round(a["bringup_s"] / b["bringup_s"], 4)
    out["teardown_ratio"] = round(a["teardown_s"] / b["teardown_s"], 4)
    return out


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of each variant's times and of the paired ratios, the ratios' range, the verdict."""
    def med(key: str, variant: str | None = None) -> float:
        return round(statistics.median(r[variant][key] if variant else r[key] for r in reps), 4)

    ratios = [r["ratio"] for r in reps]
    return {
        "median_project_enter_s": med("enter_s", "project"),
        "median_project_bringup_s": med("bringup_s", "project"),
        "median_plain_bringup_s": med("bringup_s", "plain"),
        "ratio_median": med("ratio"),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "bringup_ratio_median": med("bringup_ratio"),
        "median_project_teardown_s": med("teardown_s", "project"),
        "median_plain_teardown_s": med("teardown_s", "plain"),
        "teardown_ratio_median": med("teardown_ratio"),
        "teardown_ratio_min": min(r["teardown_ratio"] for r in reps),
        "teardown_ratio_max": max(r["teardown_ratio"] for r in reps),
        "limit": LIMIT,
        "within_limit": statistics.median(ratios) <= LIMIT,
    }


def print_repetition(i: int, r: dict[str, Any]) -> None:
    a, b = r["project"], r["plain"]
    print(f"rep {i + 1} ({' then '.join(r['order'])}): project {a['enter_s']:.2f} s "
          f"(Emulation.bringup_s {a['bringup_s']:.2f}), plain {b['bringup_s']:.2f} s, ratio A/B {r['ratio']:.3f}; "
          f"teardown project {a['teardown_s']:.2f} s, plain {b['teardown_s']:.2f} s, ratio {r['teardown_ratio']:.3f}",
          flush=True)


def print_summary(s: dict[str, Any], n: int) -> None:
    verdict = "within" if s["within_limit"] else "NOT within"
    print(f"bring-up, {n} pair{'s' if n != 1 else ''}: median project {s['median_project_enter_s']:.2f} s (bringup_s "
          f"{s['median_project_bringup_s']:.2f}), median plain {s['median_plain_bringup_s']:.2f} s; "
          f"A/B paired median {s['ratio_median']:.3f} [{s['ratio_min']:.3f}..{s['ratio_max']:.3f}] "
          f"(bringup_s / plain: {s['bringup_ratio_median']:.3f})")
    print(f"teardown: median project {s['median_project_teardown_s']:.2f} s, median plain "
          f"{s['median_plain_teardown_s']:.2f} s; A/B paired median {s['teardown_ratio_median']:.3f} "
          f"[{s['teardown_ratio_min']:.3f}..{s['teardown_ratio_max']:.3f}]")
    print(f"verdict: the project's bring-up is {verdict} {LIMIT}x of plain Mininet (median paired ratio "
          f"{s['ratio_median']:.3f}; the whole range is {'below' if s['ratio_max'] <= LIMIT else 'not below'} {LIMIT})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", help=f"topology key (default {DEFAULT_TOPOLOGY}; {QUICK_TOPOLOGY} with --quick)")
    parser.add_argument("--repetitions", type=int, help="pairs (default 3; 1 with --quick)")
    parser.add_argument("--max-link-mbps", type=float, default=100.0, help="the plan's largest emulated rate")
    parser.add_argument("--connect-timeout", type=float, default=60.0, help="s, for the controller and switches")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_TOPOLOGY}, one pair")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    topology = args.topology or (QUICK_TOPOLOGY if args.quick else DEFAULT_TOPOLOGY)
    reps_n = args.repetitions or (1 if args.quick else 3)
    setLogLevel("warning")
    plan = EmulationPlan.from_model(load(topology), max_link_mbps=args.max_link_mbps)
    features = probe_kernel()  # what Emulation's "auto" picks; probed again inside each project bring-up
    use_kernel, delay = features.ovs_kernel_datapath, features.netem
    if not args.json:
        print(f"{topology}: {len(plan.switches)} switches, {len(plan.hosts)} hosts, {len(plan.links)} links; "
              f"datapath {'kernel' if use_kernel else 'user'}, delay {'emulated' if delay else 'not emulated'}; "
              f"{reps_n} pairs", flush=True)
    t0 = time.monotonic()
    reps = []
    for i in range(reps_n):
        reps.append(repetition(plan, i, use_kernel=use_kernel, delay_emulated=delay, timeout_s=args.connect_timeout))
        if not args.json:
            print_repetition(i, reps[-1])
    summary = summarize(reps)
    if args.json:
        print(json.dumps({"topology": topology, "switches": len(plan.switches), "hosts": len(plan.hosts),
                          "links": len(plan.links), "datapath": "kernel" if use_kernel else "user",
                          "delay_emulated": delay, "repetitions": reps, **summary,
                          "elapsed_s": round(time.monotonic() - t0, 2)}))
        return 0
    print_summary(summary, reps_n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
