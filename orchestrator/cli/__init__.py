"""The `netai` command line.

Subcommands live in modules that expose ``register(subparsers)``; each parser sets
``func(args) -> int``. A `UsageError` (bad input: unknown topology or scheduler, malformed file,
an impossible task) prints one line ``netai: error: ...`` and exits with status 2, never a
traceback; Ctrl-C exits with 130 after the subcommand's own cleanup has run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from orchestrator import interrupts
from orchestrator.errors import ConfigError

#: Modules that add subcommands, in help order. A module missing its optional dependencies
#: (e.g. Mininet on a machine without it) is skipped, and says so only when asked for.
SUBCOMMAND_MODULES = (
    "orchestrator.cli.topo",
    "orchestrator.cli.net",
    "orchestrator.cli.task",
    "orchestrator.cli.experiment",
    "orchestrator.cli.dashboard",
    "orchestrator.cli.simulation",
    "orchestrator.cli.cluster",
)


def usage_errors() -> tuple[type[Exception], ...]:
    """The errors that are bad input (exit status 2). Imported when `main` runs, not with this
    module: `python -m` imports this package before anything can take Ctrl-C over, and the topology
    package pulls in networkx."""
    from topologies.errors import TopologyError

    return (ConfigError, TopologyError)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="netai",
        description="Emulate an optical-like network in Mininet and run federated-learning tasks "
        "on scheduler-chosen trees.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue  # not written yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Installed before the subcommands' modules load: a Ctrl-C while they do (nothing started yet)
    # exits 130 too, not with a traceback and the signal's own status.
    previous = interrupts.install()
    status = 130
    errors: tuple[type[Exception], ...] = (ConfigError,)
    try:
        errors = usage_errors()
        args = build_parser().parse_args(argv)
        status = int(args.func(args) or 0)
    except errors as e:
        print(f"netai: error: {e}", file=sys.stderr)
        status = 2
    except KeyboardInterrupt:
        status = 130
    except BaseException as e:
        from orchestrator.results.durability import disk_full

        if disk_full(e) and not interrupts.INTERRUPTED.is_set():  # one line, not a traceback (issue 48)
            print(f"netai: error: the disk is full ({e}): the results written so far are whole; free space, "
                  "then netai experiment --resume RUN_DIR", file=sys.stderr)
            return 1
        if not interrupts.INTERRUPTED.is_set():
            raise
        status = 130  # what an interrupt left behind (an import cut short fails as ImportError)
    finally:
        interrupts.uninstall(previous)
    if interrupts.INTERRUPTED.is_set():
        status = 130  # even where the KeyboardInterrupt itself was swallowed (see orchestrator.interrupts)
    if status == 130:
        print("netai: interrupted", file=sys.stderr)
        interrupts.clear_unhandled_mark()  # handled here: the process must not end killed by SIGINT
    return status

if __name__ == "__main__":
    sys.exit(main())
