"""Run `tests.guest.checks` where the stock-kernel paths exist: on this host, or in the test guest.

A host whose kernel has the openvswitch module and sch_netem (what `probe_kernel` finds, as
``datapath: auto`` would) runs the checks directly, under the machine-wide Mininet lock. Any other
host boots the guest (scripts/guest/run.sh: Debian's stock kernel, built and cached by
scripts/guest/build.sh, KVM when it boots there, else TCG) and runs them inside; the results come
back as marked lines on the guest's console. ``NETAI_STOCK_KERNEL=host|guest`` forces the choice.

This module is test tooling: the orchestrator does not import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUN_SCRIPT = REPO / "scripts" / "guest" / "run.sh"
RESULT_MARK = "NETAI-GUEST-RESULT "
ACCEL_MARK = "NETAI-GUEST-ACCEL "
ENV_WHERE = "NETAI_STOCK_KERNEL"
MININET_LOCK = "/tmp/netai-mininet.lock"
#: The guest's own time limit for the checks, seconds (its build, when the cache is cold, comes on top).
GUEST_TIMEOUT_S = 600
#: The niceness of the guest's QEMU (and its build) while it runs: ahead of the unit tests it overlaps.
GUEST_NICE = -5
BUILD_ALLOWANCE_S = 600


@dataclass
class ChecksRun:
    """Where the checks ran and what they reported."""

    where: str  # "host" or "guest"
    accel: str | None  # the guest's accelerator ("kvm" or "tcg"); None on the host
    status: int
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    output: str = ""
    bad_lines: list[str] = field(default_factory=list)
    #: Wall time of the whole run, s (the guest's build included when its cache was cold).
    elapsed_s: float = 0.0
    #: The guest build's own time, s, when this run built it (None: the cache was warm, or the host).
    build_s: float | None = None


def host_has_stock_paths() -> bool:
    """The OVS kernel datapath and netem, probed as the emulation probes them (it loads the module)."""
    from orchestrator.emulation.kernel import probe_kernel

    features = probe_kernel()
    return features.ovs_kernel_datapath and features.netem


def choose_where() -> str:
    """``host`` or ``guest`` (see the module docstring)."""
    forced = os.environ.get(ENV_WHERE, "auto")
    if forced not in {"auto", "host", "guest"}:
        raise ValueError(f"{ENV_WHERE} must be auto, host or guest, got {forced!r}")
    if forced != "auto":
        return forced
    return "host" if host_has_stock_paths() else "guest"


def command(where: str, checks: list[str]) -> list[str]:
    module = ["-m", "tests.guest.checks", *checks]
    if where == "host":
        return ["flock", MININET_LOCK, sys.executable, *module]
    # The guest's CPU is emulated: its timers and echoes are only as prompt as QEMU's threads get the
    # host's cores. In the suite the unit tests share them (tests/conftest.py), so QEMU runs at a
    # higher priority (as the emulation's own ovs-vswitchd does): their work waits, not the guest's.
    return ["nice", "-n", str(GUEST_NICE), "bash", str(RUN_SCRIPT), "--timeout", str(GUEST_TIMEOUT_S), "--",
            "/opt/venv/bin/python", *module]


def parse(output: str) -> tuple[str | None, dict[str, dict[str, Any]], list[str]]:
    """(accelerator, {check: result}, marked lines that did not parse) from the checks' output."""
    accel = None
    results: dict[str, dict[str, Any]] = {}
    bad = []
    for line in output.splitlines():
        if line.startswith(ACCEL_MARK):
            accel = line[len(ACCEL_MARK):].strip()
        at = line.find(RESULT_MARK)
        if at < 0:
            continue
        try:
            result = json.loads(line[at + len(RESULT_MARK):])
            results[str(result["check"])] = result
        except (ValueError, KeyError, TypeError):
            bad.append(line)
    return accel, results, bad


class PendingChecks:
    """The checks started in the background (`start_checks`); `wait` collects them as a `ChecksRun`.

    The suite starts them once it has collected (tests/conftest.py), so that the guest's boot and
    checks overlap the unit tests, which need no network; the guest's tests then wait for them."""

    def __init__(self, checks: list[str] | None = None, where: str | None = None) -> None:
        self.where = where or choose_where()
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.setdefault("VENV", sys.prefix)  # the guest build's pip is this venv's (scripts/guest/build.sh)
        self.t0 = time.monotonic()
        # A process group of its own: on a timeout QEMU (or the host's emulation) goes with the script.
        self.proc = subprocess.Popen(command(self.where, checks or []), cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        self._run: ChecksRun | None = None

    def wait(self) -> ChecksRun:
        """The finished run (waits at most the guest's limit plus the build's, counted from the start)."""
        if self._run is not None:
            return self._run
        limit = GUEST_TIMEOUT_S + BUILD_ALLOWANCE_S
        try:
            output, _ = self.proc.communicate(timeout=max(1.0, limit - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.stop()
            output, _ = self.proc.communicate()
            output += f"\n(stopped after {limit} s)"
        elapsed_s = time.monotonic() - self.t0
        accel, results, bad = parse(output)
        built = re.search(r"^\[guest-build\] built guest \S+ .* in (\d+) s$", output, flags=re.M)
        self._run = ChecksRun(where=self.where, accel=accel if self.where == "guest" else None,
                              status=self.proc.returncode, results=results, output=output, bad_lines=bad,
                              elapsed_s=round(elapsed_s, 1), build_s=float(built.group(1)) if built else None)
        return self._run

    def stop(self) -> None:
        """End the run's process group (QEMU, or the host's emulation) if it still runs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)


def start_checks(checks: list[str] | None = None, where: str | None = None) -> PendingChecks:
    """Start the named checks (all by default) on the host or in the guest, in the background."""
    return PendingChecks(checks, where)


def run_checks(checks: list[str] | None = None, where: str | None = None) -> ChecksRun:
    """Run the named checks (all by default) on the host or in the guest; see the module docstring."""
    return start_checks(checks, where).wait()


#: The checks the suite started at collection (tests/conftest.py), if it did.
_EARLY: PendingChecks | None = None


def start_early() -> None:
    """Start every check in the background now; `checks_run` collects them."""
    global _EARLY
    if _EARLY is None:
        _EARLY = start_checks()


def stop_early() -> None:
    """End the early checks if nobody waited for them (an interrupted or narrowed run)."""
    if _EARLY is not None:
        _EARLY.stop()


def checks_run() -> ChecksRun:
    """Every check's results: those started early when they were, else a run started now."""
    return _EARLY.wait() if _EARLY is not None else run_checks()
