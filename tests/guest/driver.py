"""Run `tests.guest.checks` where the stock-kernel paths exist: on this host, or in the test guest.

A host whose kernel has the openvswitch module and sch_netem (what `probe_kernel` finds, as
``datapath: auto`` would) runs the checks directly, under the machine-wide Mininet lock. Any other
host boots the guest (scripts/guest/run.sh: Debian's stock kernel, built and cached by
scripts/guest/build.sh, KVM when it boots there, else TCG) and runs them inside; the results come
back as marked lines on the guest's console. ``NETAI_STOCK_KERNEL=host|guest`` forces the choice.

`make test` may start the guest's checks before its set-up (scripts/test.sh): ``python3 -m
tests.guest.driver record DIR`` runs them and writes their `ChecksRun` to ``DIR/result.json``, and the
suite adopts that run (``NETAI_GUEST_RECORD=DIR``) instead of starting its own. This module needs only
the standard library, so that the system's python3 runs it before the venv exists.

This module is test tooling: the orchestrator does not import it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUN_SCRIPT = REPO / "scripts" / "guest" / "run.sh"
RESULT_MARK = "NETAI-GUEST-RESULT "
ACCEL_MARK = "NETAI-GUEST-ACCEL "
ENV_WHERE = "NETAI_STOCK_KERNEL"
#: Names a folder where checks started before the suite record their run (see the module docstring).
ENV_RECORD = "NETAI_GUEST_RECORD"
RESULT_FILE = "result.json"
BUILD_SCRIPT = REPO / "scripts" / "guest" / "build.sh"
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
    #: How long the suite waited for checks started early, s, once it reached their tests (None: not
    #: started early). Zero when they had ended by then.
    waited_s: float | None = None


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
    """Run the named checks (all by default) on the host or in the guest; see the module docstring.
    An interrupt (Ctrl-C) while they run ends them."""
    pending = start_checks(checks, where)
    try:
        return pending.wait()
    finally:
        pending.stop()


class RecordedChecks:
    """Checks another process runs and records (`record`), adopted by the suite: `wait` reads the
    run it wrote, `stop` ends that process (which ends QEMU)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.t0 = time.monotonic()

    def _pid(self) -> int | None:
        try:
            return int((self.folder / "pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def _alive(self) -> bool:
        pid = self._pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def wait(self) -> ChecksRun:
        """The recorded run, once written (at most the guest's limit plus the build's from now); a
        run with status -1 and the reason if the recorder ended without one or never finished."""
        result = self.folder / RESULT_FILE
        limit = GUEST_TIMEOUT_S + BUILD_ALLOWANCE_S
        while not result.exists() and self._alive() and time.monotonic() - self.t0 < limit:
            time.sleep(0.5)
        if result.exists():
            return ChecksRun(**json.loads(result.read_text()))
        why = (f"the recorder in {self.folder} did not finish within {limit} s" if self._alive()
               else f"the recorder in {self.folder} ended without a result")
        self.stop()
        return ChecksRun(where="guest", accel=None, status=-1, output=why)

    def stop(self) -> None:
        pid = self._pid()
        if pid is not None and self._alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def record(folder: Path) -> int:
    """Run every check and write the `ChecksRun` to ``folder/result.json`` (written whole, then
    renamed). SIGTERM or SIGINT ends the checks (QEMU's process group) and writes nothing."""

    def ended(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, ended)
    pending = start_checks()
    try:
        run = pending.wait()
    finally:
        pending.stop()
    tmp = folder / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(run)))
    tmp.rename(folder / RESULT_FILE)
    return 0


#: What scripts/guest/build.sh needs on the host (it installs them when missing, which must not
#: race the set-up's own apt-get).
BUILD_TOOLS = ("qemu-system-x86_64", "debootstrap", "mkfs.ext4", "cpio", "modprobe")


def can_start_early() -> bool:
    """Whether the checks may start before the venv exists: they run in the guest, its build tools
    are installed and its build is cached (a cold build needs the venv's pip: build.sh, pointed at
    no venv, refuses to build rather than start one)."""
    if not all(shutil.which(tool) for tool in BUILD_TOOLS) or choose_where() != "guest":
        return False
    env = {**os.environ, "VENV": str(REPO / ".no-venv-before-set-up")}
    return subprocess.run(["bash", str(BUILD_SCRIPT)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


#: The checks the suite started at collection (tests/conftest.py), or adopted, if it did.
_EARLY: PendingChecks | RecordedChecks | None = None


def start_early() -> None:
    """Adopt the checks recorded in ``$NETAI_GUEST_RECORD`` if set, else start every check in the
    background now; `checks_run` collects them."""
    global _EARLY
    if _EARLY is None:
        folder = os.environ.get(ENV_RECORD)
        _EARLY = RecordedChecks(Path(folder)) if folder else start_checks()


def stop_early() -> None:
    """End the early checks if nobody waited for them (an interrupted or narrowed run)."""
    if _EARLY is not None:
        _EARLY.stop()


def checks_run() -> ChecksRun:
    """Every check's results: those started early when they were (with how long this waited for
    them), else a run started now."""
    if _EARLY is None:
        return run_checks()
    t0 = time.monotonic()
    run = _EARLY.wait()
    run.waited_s = round(time.monotonic() - t0, 1)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.guest.driver",
                                     description="start the stock-kernel checks ahead of the suite")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("can-start-early", help="exit 0 if the checks may start before the venv exists")
    rec = sub.add_parser("record", help="run every check and write the run to FOLDER/result.json")
    rec.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "can-start-early":
        return 0 if can_start_early() else 1
    return record(args.folder)


if __name__ == "__main__":
    sys.exit(main())
