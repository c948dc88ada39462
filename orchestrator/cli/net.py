"""`netai net up`, `netai net test`, `netai flows`, `netai links` and `netai clean`: the emulated network.

- ``net up``: bring a topology up (controller + Mininet) and open Mininet's CLI (or, with
  ``--no-cli``, wait for Ctrl-C/SIGTERM); everything is torn down on exit. Hosts have best-effort
  connectivity (every pair routed, below tasks and background) unless ``--strict``; other processes
  work with the running network (``netai schedule --install``, ``netai task run --attach``).
- ``net test``: the self-test of `orchestrator.emulation.selftest.self_test`; non-zero exit when a check fails.
- ``flows`` / ``links``: live, refreshing tables of flow entries (with counters) and link utilisation
  read from the controller's REST API of the running network (``--once`` for one snapshot).
- ``clean``: remove what crashed runs left (only the project's own, see `orchestrator.emulation.cleanup`).

Commands that start Mininet need root and run one at a time on a machine (interface names are
global); this module does not lock: wrap them in ``flock /tmp/netai-mininet.lock``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import interrupts
from orchestrator.cli.dashboard import add_dashboard_args
from orchestrator.emulation.kernel import DATAPATHS
from orchestrator.errors import ConfigError
from topologies.loaders import DEFAULT_TOPOLOGY, load
from topologies.model import NetworkModel
from topologies.plan import DEFAULT_MAX_LINK_MBPS, EmulationPlan


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise ConfigError(f"{what} needs root (Mininet and Open vSwitch): run it with sudo")


# -- net up ---------------------------------------------------------------------------------------
def cmd_net_up(args: argparse.Namespace) -> int:
    _need_root("netai net up")
    from orchestrator.emulation.kernel import DatapathUnavailable, choose_datapath, probe_kernel
    from orchestrator.emulation.network import Emulation, EmulationError

    model = load(args.topology)
    plan = EmulationPlan.from_model(model, max_link_mbps=args.max_link_mbps)
    try:  # before anything starts
        choose_datapath(args.datapath, probe_kernel())
    except DatapathUnavailable as e:
        print(f"netai net up: {e}", file=sys.stderr)
        return 2
    emu = Emulation(plan, mininet_log_level="info", connect_timeout_s=args.timeout, datapath=args.datapath,
                    connectivity="strict" if args.strict else "best-effort")
    live = LiveRecord(emu, model, plan, port=args.dashboard_port if args.dashboard else None)  # a taken port: exit 2
    try:
        with emu, live:
            info = emu.info
            assert info is not None
            print(f"*** {plan.topology}: {info.switches_connected}/{len(plan.switches)} switches connected "
                  f"in {info.bringup_s:.2f} s; datapath {info.datapath}; "
                  f"delay {'emulated' if info.delay_emulated else 'NOT emulated (no netem)'}")
            print(f"*** controller REST API: {info.controller_rest}  (netai flows / netai links)")
            print("*** connectivity: " + ("strict (only tasks' paths and background routes carry traffic)"
                                          if args.strict else "best-effort between every pair of hosts "
                                          "(below tasks and background; --strict turns it off)"))
            print(f"*** logs: {info.log_dir}; link load and tasks recorded in {live.db_path}")
            if live.dashboard is not None:
                print(f"*** dashboard: {live.dashboard.url}", flush=True)
            if args.no_cli:
                print("*** running; Ctrl-C or SIGTERM tears it down", flush=True)
                while True:
                    signal.pause()  # SIGINT/SIGTERM raise out of here and the context manager tears down
            else:
                from mininet.cli import CLI

                CLI(emu.net)
    except EmulationError as e:
        print(f"netai: error: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit):
        _print_teardown(emu)
        raise
    return _print_teardown(emu)


class LiveRecord:
    """What `net up` records while the network runs, in ``<log dir>/results.db``: link load about once
    a second (`LinkRecorder`), and the tasks that other processes run on it (`netai task run --attach`
    finds the database, its run and its clock in the run's state). With `port`, the live dashboard
    (which also shows tasks installed at the controller from elsewhere). Entered after the emulation."""

    def __init__(self, emu: Any, model: NetworkModel, plan: EmulationPlan, *, port: int | None,
                 name: str = "net-up") -> None:
        from orchestrator.dashboard.server import Dashboard

        self.emu = emu
        self.model = model
        self.plan = plan
        self.db_path = Path(emu.log_dir) / "results.db"
        self.dashboard = None if port is None else Dashboard(self.db_path, port=port, live=True, show_installed=True)
        self.recorder: Any = None
        self.db: Any = None
        self.run_id = 0
        self.name = name
        self.clock: Any = None

    def __enter__(self) -> LiveRecord:
        from orchestrator.experiment.link_recorder import LinkRecorder
        from orchestrator.lifecycle.core import RunClock
        from orchestrator.results.db import ResultsDB

        self.db = ResultsDB(self.db_path)
        model = self.model
        self.run_id = self.db.start_run(self.name, {"topology": self.plan.topology}, {
            "mode": "live", "delay_emulated": bool(getattr(self.emu.info, "delay_emulated", False))})
        self.db.record_topology(self.run_id, model.name, model.to_dict(), self.plan.to_dict())
        clock = self.clock = RunClock()
        self.recorder = LinkRecorder(self.emu.client, self.plan, self.db_path, self.run_id, clock=clock.now).start()
        state = getattr(self.emu, "state", None)
        if state is not None:
            state.db_path, state.db_run_id, state.clock_zero = str(self.db_path), self.run_id, clock.t0
            state.save()
        if self.dashboard is not None:
            self.dashboard.controller = self.emu.client
            self.dashboard.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.dashboard is not None:
            self.dashboard.close()
        if self.recorder is not None:
            self.recorder.stop()
        if self.db is not None:
            self.db.finish_run(self.run_id, "completed" if exc[0] is None else "interrupted")
            self.db.close()


def _print_teardown(emu: Any) -> int:
    info = emu.info
    if info is None or info.teardown_clean is None:
        return 0
    print(f"*** torn down in {info.teardown_s:.2f} s, "
          f"{'clean' if info.teardown_clean else f'LEFTOVERS: {info.leftovers}'}", flush=True)
    return 0 if info.teardown_clean else 1


# -- net test -------------------------------------------------------------------------------------
def cmd_net_test(args: argparse.Namespace) -> int:
    _need_root("netai net test")
    from orchestrator.emulation.network import EmulationError
    from orchestrator.emulation.selftest import self_test

    load(args.topology)  # a bad name is a usage error before anything starts
    say: Callable[[str], None] = (lambda _m: None) if args.json else (lambda m: print(f"*** {m}", flush=True))
    try:
        result = self_test(args.topology, locals_per_task=args.locals, iperf_seconds=args.seconds, seed=args.seed,
                           max_link_mbps=args.max_link_mbps, connect_timeout_s=args.timeout, say=say)
    except EmulationError as e:
        result = {"ok": False, "error": str(e)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_test_summary(result)
    return 0 if result.get("ok") else 1


def _print_test_summary(r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"FAILED: {r['error']}")
        return

    def mark(ok: bool) -> str:
        return "ok" if ok else "FAIL"

    print(f"switches connected  {r['switches_connected']}/{r['switches_expected']} in {r['bringup_s']:.2f} s")
    print(f"overlay paths       {mark(r['paths_ok'])} {'; '.join(r['path_failures'])}")
    print(f"isolation           {mark(r['isolation_ok'])} ({' <-> '.join(r['isolated_pair'])})")
    print(f"flow tables         {mark(r['flows_match'])} {json.dumps(r['flow_diffs']) if r['flow_diffs'] else ''}")
    print(f"byte counters       {mark(r['bytes_ok'])} (payload received {r['bytes_sent']}, counted {r['bytes_counted']})")
    print(f"iperf3              {r['iperf_mbps']:.1f} / {r['iperf_configured_mbps']:g} Mbit/s over "
          f"{len(r['iperf_path']) - 1} shaped links: ratio {r['iperf_ratio']:.3f} of line rate, "
          f"{r['iperf_ratio_of_ceiling']:.3f} of the TCP goodput ceiling")
    print(f"delay emulated      {r['delay_emulated']}")
    print(f"teardown            {mark(r['teardown_clean'])} in {r['teardown_s']:.2f} s")
    print("PASSED" if r["ok"] else "FAILED")


# -- flows / links --------------------------------------------------------------------------------
def _client(args: argparse.Namespace) -> Any:
    from orchestrator.emulation.cleanup import run_states
    from orchestrator.emulation.controller_client import ControllerClient

    if args.url:
        return ControllerClient(args.url)
    live = [s for s in run_states() if s.live and s.rest_url]
    if not live:
        raise ConfigError("no running network found (start one with `netai net up`, or give --url)")
    if len(live) > 1:
        raise ConfigError(f"{len(live)} networks run ({', '.join(s.run_id for s in live)}): give --url")
    return ControllerClient(live[0].rest_url)


def cmd_net_link(args: argparse.Namespace) -> int:
    """Cut or restore a link of the running network, both directions; wait until the controller
    has seen it (port status), as the orchestrator would."""
    from orchestrator.emulation.links import link_interfaces, set_link
    from orchestrator.emulation.running import find_running
    from orchestrator.experiment.faults import links_down

    net = find_running(args.url)
    link_interfaces(net.plan, args.a, args.b)  # unknown or unlinked sites: exit 2 before root is asked
    _need_root("changing a link")
    up = args.state == "up"
    ends = set_link(net.plan, args.a, args.b, up)
    want = (min(args.a, args.b), max(args.a, args.b))
    deadline = time.monotonic() + 5.0
    seen = False
    while time.monotonic() < deadline and not seen:
        seen = (want in links_down(net.client.topology())) != up
        if not seen:
            time.sleep(0.1)  # the switch's port-status message is on its way; bounded by the deadline
    print(f"link {args.a}-{args.b} {args.state} ({ends[0]}, {ends[1]}); the controller "
          f"{'saw it' if seen else 'has not reported it yet'}")
    return 0 if seen else 1


def _refresh(args: argparse.Namespace, render: Callable[[], str]) -> int:
    from orchestrator.emulation.controller_client import ControllerHTTPError, ControllerUnreachable

    try:
        while True:
            try:
                text = render()
            except ControllerHTTPError as e:
                raise ConfigError(e.message) from e
            except ControllerUnreachable as e:
                if args.once:
                    raise ConfigError(str(e)) from e
                text = f"{e} (retrying)"
            if args.once:
                print(text)
                return 0
            sys.stdout.write("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + text + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)  # refresh period of a live display, not a readiness wait
    except KeyboardInterrupt:
        interrupts.INTERRUPTED.clear()  # Ctrl-C is how a live display ends: a normal exit
        return 0


#: The task column of entries no task installed: background routes, best-effort connectivity.
_FLOW_KIND_LABELS = {"background": "bg", "best-effort": "be"}


def render_flows(flows: list[dict[str, Any]]) -> str:
    lines = [f"{'switch':<7}{'site':<18}{'task':>6}{'prio':>6}  {'match':<62}{'out':>5}{'packets':>10}{'bytes':>13}"]
    for f in flows:
        m = dict(f["match"])
        m.pop("eth_type", None)
        m.pop("ip_proto", None)
        match = ",".join(f"{k}={v}" for k, v in m.items()) or "*"
        out = next((a["port"] for a in f["actions"] if "port" in a), "drop")
        task = f["task"] if f["task"] is not None else _FLOW_KIND_LABELS.get(str(f.get("kind")), "-")
        lines.append(f"{f['switch']:<7}{str(f['site'])[:17]:<18}{task!s:>6}{f['priority']:>6}  {match[:61]:<62}"
                     f"{out!s:>5}{f['packets']:>10}{f['bytes']:>13}")
    lines.append(f"{len(flows)} entries")
    return "\n".join(lines)


def render_links(links: list[dict[str, Any]]) -> str:
    lines = [f"{'link':<40}{'port':>10}{'Mbit/s':>9}{'shaped':>8}{'util':>7}{'bytes':>14}{'up':>4}"]
    for ln in links:
        name = f"{ln['link'][0]} -> {ln['link'][1]}"
        lines.append(f"{name[:39]:<40}{ln['switch'] + '-eth' + str(ln['port']):>10}{ln['rate_mbps']:>9.2f}"
                     f"{ln['emulated_mbps']:>8g}{ln['utilisation'] * 100:>6.1f}%{ln['tx_bytes']:>14}"
                     f"{'y' if ln['up'] else 'N':>4}")
    return "\n".join(lines)


def cmd_flows(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.json:
        print(json.dumps(client.flows(args.task), indent=2))
        return 0
    return _refresh(args, lambda: render_flows(client.flows(args.task)))


def cmd_links(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.json:
        print(json.dumps(client.link_stats(), indent=2))
        return 0
    return _refresh(args, lambda: render_links(client.link_stats()))


# -- clean ----------------------------------------------------------------------------------------
def cmd_clean(args: argparse.Namespace) -> int:
    _need_root("netai clean")
    from orchestrator.emulation.cleanup import clean

    report = clean(log=lambda m: print(f"netai clean: {m}"))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif report.nothing:
        print("netai clean: nothing to clean")
    else:
        print(f"netai clean: removed {len(report.processes)} processes, {len(report.bridges)} bridges, "
              f"{len(report.interfaces)} interfaces"
              + (f" of run(s) {', '.join(report.runs)}" if report.runs else "")
              + (f"; {len(report.folders)} far run folder(s)" if report.folders else "")
              + (f"; {len(report.control_folders)} control-socket folder(s)" if report.control_folders else ""))
    if report.survivors:
        print(f"netai clean: processes survived SIGKILL: {report.survivors}", file=sys.stderr)
        return 1
    return 0


# -- registration ---------------------------------------------------------------------------------
def _add_topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", "-t", default=DEFAULT_TOPOLOGY,
                   help=f"TopoHub key, generator, built-in name or file (default {DEFAULT_TOPOLOGY})")
    p.add_argument("--max-link-mbps", type=float, default=DEFAULT_MAX_LINK_MBPS,
                   help="emulated rate of the largest link, Mbit/s (others scale with it)")


def _add_live_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="controller REST URL (default: the running network's)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--interval", type=float, default=1.0, help="refresh period, s")
    p.add_argument("--json", action="store_true", help="print one snapshot as JSON")


def register(subparsers: Any) -> None:
    net = subparsers.add_parser("net", help="the emulated network (Mininet + Open vSwitch + controller)")
    net_sub = net.add_subparsers(dest="net_command", metavar="NET_COMMAND")
    net_sub.required = True

    up = net_sub.add_parser("up", help="bring a topology up and open Mininet's CLI")
    _add_topology_args(up)
    up.add_argument("--no-cli", action="store_true", help="no Mininet CLI: stay up until Ctrl-C/SIGTERM")
    up.add_argument("--timeout", type=float, default=30.0,
                    help="seconds to wait for the controller, then for all switches")
    up.add_argument("--strict", action="store_true",
                    help="no best-effort connectivity: only tasks' paths and background routes carry traffic")
    up.add_argument("--datapath", choices=DATAPATHS, default="auto",
                    help="what forwards packets: Open vSwitch's kernel module, its userspace datapath, or tc "
                         "filters in the kernel (auto: the kernel module where the kernel has it, else tc)")
    add_dashboard_args(up)
    up.set_defaults(func=cmd_net_up)

    test = net_sub.add_parser("test", help="self-test: bring up, install an mst schedule, check, tear down")
    _add_topology_args(test)
    test.add_argument("--locals", type=int, default=5, help="local models of the test task")
    test.add_argument("--seed", type=int, default=1, help="seed of the test task")
    test.add_argument("--seconds", type=float, default=3.0, help="iperf3 duration")
    test.add_argument("--json", action="store_true", help="print the summary as JSON")
    test.add_argument("--timeout", type=float, default=30.0,
                      help="seconds to wait for the controller, then for all switches")
    test.set_defaults(func=cmd_net_test)

    link = net_sub.add_parser("link", help="cut (down) or restore (up) a link of the running network, both ways")
    link.add_argument("a", help="one end's site")
    link.add_argument("b", help="the other end's site")
    link.add_argument("state", choices=("down", "up"))
    link.add_argument("--url", help="controller REST URL of the running network (default: the only one running)")
    link.set_defaults(func=cmd_net_link)

    flows = subparsers.add_parser("flows", help="live table of flow entries and counters of a running network")
    flows.add_argument("--task", type=int, help="only this task's entries")
    _add_live_args(flows)
    flows.set_defaults(func=cmd_flows)

    links = subparsers.add_parser("links", help="live table of link utilisation of a running network")
    _add_live_args(links)
    links.set_defaults(func=cmd_links)

    clean = subparsers.add_parser("clean", help="remove what crashed runs left (only the project's own)")
    clean.add_argument("--json", action="store_true", help="print what was removed as JSON")
    clean.set_defaults(func=cmd_clean)
