"""`netai cluster prepare` and `netai cluster check`: the servers of a config's ``emulation.cluster``.

- ``prepare CONFIG``: ship this checkout's code to every server over SSH and install it in a venv
  there (`orchestrator.emulation.cluster_deploy.prepare_server`); nothing of the OS is installed: a
  missing tool is reported with its package. Exit status 1 when a server is not ready.
- ``check CONFIG``: per server, reachability, host key, prerequisites, the project's version there,
  the clock offset and the underlay MTU (`check_server`). Exit status 1 when a server has a problem.
- ``clean CONFIG``: ``netai clean`` on every server by the project installed there (`clean_server`):
  what runs left there (a machine lost mid-run and back). Refused while a run is live on this
  machine (its parts on the servers carry no state file there and would be removed). Needs root
  there (the SSH user, or ``sudo -n``).

``--json`` prints the reports as one JSON list. Neither command needs root.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from orchestrator.emulation.cluster import ClusterServer, ClusterSpec, parse_cluster
from orchestrator.errors import ConfigError
from orchestrator.experiment.config import read_config_file


def _cluster(path: str) -> ClusterSpec:
    p = Path(path)
    raw = read_config_file(p)
    emulation = raw.get("emulation") if isinstance(raw, dict) else None
    spec = parse_cluster(emulation.get("cluster") if isinstance(emulation, dict) else None,
                         base_dir=p.resolve().parent)
    if spec is None:
        raise ConfigError(f"{p}: no emulation.cluster servers")
    return spec


def _print(reports: list[Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps([r.to_dict() for r in reports], indent=1))
        return
    for r in reports:
        clock = ("-" if r.clock_offset_ms is None
                 else f"{r.clock_offset_ms:+.1f} ms (+/- {r.clock_uncertainty_ms:.1f})")
        print(f"{r.server}: {'ok' if r.ok else 'NOT READY'}")
        print(f"  reachable {'yes' if r.reachable else 'no'}; host key {r.host_key}; "
              f"prerequisites {'all present' if r.reachable and not r.missing else ', '.join(r.missing) or '-'}")
        print(f"  project {r.project}; python {r.python or '-'}; torch {r.packages.get('torch') or '-'}")
        print(f"  clock offset {clock}; underlay MTU {r.underlay_mtu or '-'}")
        for problem in r.problems:
            print(f"  problem: {problem}")


def _run(args: argparse.Namespace, prepare: bool) -> int:
    from orchestrator.emulation.cluster_deploy import check_server, prepare_server

    spec = _cluster(args.config)
    control_dir = Path(tempfile.mkdtemp(prefix="netai-ssh-"))

    def one(server: ClusterServer) -> Any:
        if not prepare:
            return check_server(server, control_dir)
        report = prepare_server(server, control_dir)  # its versions checked by the installed code
        if not report.ok:
            return report
        checked = check_server(server, control_dir, versions=False)
        checked.project, checked.python, checked.packages = report.project, report.python, report.packages
        return checked

    try:  # the servers at once: each is its own SSH connection
        with ThreadPoolExecutor(max_workers=8) as pool:
            reports = list(pool.map(one, [s for s in spec.servers if not s.local]))
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)
    _print(reports, args.json)
    return 0 if all(r.ok for r in reports) else 1


def _clean(args: argparse.Namespace) -> int:
    from orchestrator.emulation.cleanup import run_states
    from orchestrator.emulation.cluster_deploy import clean_server

    live = sorted(s.run_id for s in run_states() if s.live)
    if live:
        raise ConfigError(f"run(s) {', '.join(live)} still running here: their parts on the servers would be "
                          "removed too; clean once they have ended")
    spec = _cluster(args.config)
    control_dir = Path(tempfile.mkdtemp(prefix="netai-ssh-"))
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            reports = list(pool.map(lambda s: clean_server(s, control_dir), [s for s in spec.servers if not s.local]))
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(reports, indent=1))
    for r in [] if args.json else reports:
        got = r["removed"] or {}
        print(f"{r['server']}: " + (r["error"] or f"removed {len(got.get('processes', []))} processes, "
                                    f"{len(got.get('bridges', []))} bridges, {len(got.get('interfaces', []))} "
                                    f"interfaces of run(s) {', '.join(got.get('runs', [])) or '-'}"))
    return 0 if all(r["ok"] for r in reports) else 1


def register(subparsers: Any) -> None:
    cluster = subparsers.add_parser("cluster", help="the servers of a config's emulation.cluster: prepare, check, clean")
    sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True
    for name, help_text, prepare in (
            ("prepare", "ship this checkout's code to every server over SSH and install it in a venv there", True),
            ("check", "reachability, host key, prerequisites, project version, clock offset, underlay MTU", False)):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("config", help="an experiment config with emulation.cluster.servers")
        p.add_argument("--json", action="store_true", help="print the reports as JSON")
        p.set_defaults(func=lambda args, prepare=prepare: _run(args, prepare))
    p = sub.add_parser("clean", help="netai clean on every server (what runs left there, e.g. a machine lost "
                                     "mid-run and back); not while a run is live here")
    p.add_argument("config", help="an experiment config with emulation.cluster.servers")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(func=_clean)
