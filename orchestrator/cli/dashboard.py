"""``netai dashboard RUN_DIR``: replay a finished run in the browser, read-only, from its results.db.

No root and no Mininet: the page draws the run's topology, link loads, task trees and round
figures at any time of the run, chosen with a slider. Live runs have their own dashboard:
``netai experiment --dashboard``, ``netai task run --dashboard``, ``netai net up --dashboard``.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from orchestrator import interrupts
from orchestrator.errors import ConfigError


def add_dashboard_args(p: argparse.ArgumentParser, *, flag: bool = True) -> None:
    """``--dashboard`` (when `flag`) and ``--dashboard-port`` of the commands that run a network."""
    from orchestrator.dashboard.server import DEFAULT_PORT

    if flag:
        p.add_argument("--dashboard", action="store_true",
                       help="serve the live dashboard on 127.0.0.1 while this runs (prints its URL)")
    p.add_argument("--dashboard-port", type=int, default=DEFAULT_PORT, metavar="PORT",
                   help=f"its port on 127.0.0.1 (default {DEFAULT_PORT}; 0: any free port)")


def results_db(run_dir: Path) -> Path:
    """The results database of a run folder (or the file itself)."""
    path = run_dir / "results.db" if run_dir.is_dir() else run_dir
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no results.db (give a run folder written by `netai experiment`)")
    return path


def cmd_dashboard(args: argparse.Namespace) -> int:
    import sqlite3

    from orchestrator.dashboard.server import Dashboard
    from orchestrator.dashboard.view import RunView

    db = results_db(args.run_dir)
    try:
        RunView(db, args.run).meta()  # a database that is not a run's fails here, before the port is taken
    except (ValueError, KeyError, sqlite3.DatabaseError) as e:
        raise ConfigError(f"{db}: {e}") from e
    dash = Dashboard(db, port=args.dashboard_port, live=False, run_id=args.run)
    with dash:
        print(f"netai: replaying {args.run_dir} at {dash.url}  (Ctrl-C to stop)", flush=True)
        try:
            while True:
                signal.pause()
        except KeyboardInterrupt:
            interrupts.INTERRUPTED.clear()  # Ctrl-C is how a replay ends: a normal exit
            return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("dashboard", help="replay a finished run in the browser (read-only, no root)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder (or its results.db)")
    p.add_argument("--run", type=int, default=None, help="run id in the database (default: the last)")
    add_dashboard_args(p, flag=False)
    p.set_defaults(func=cmd_dashboard)
