"""Find and remove what an emulation run left behind, and only what the project itself created.

A run (`orchestrator.emulation.network.Emulation`) owns:

- a *run id*; every process it starts (Mininet host shells and whatever runs in them, the
  controller) carries ``NETAI_RUN=<run id>`` in its environment, which `/proc/PID/environ` shows;
- its Open vSwitch bridges, tagged ``external_ids:netai-run=<run id>`` when they are created;
- its switch interfaces (root namespace), whose alias (``ifalias``) is ``netai-run=<run id>`` from
  just after Mininet builds the links (Mininet's names, ``s1-eth2``, are the same in every run);
- a state file ``/var/lib/netai/runs/run-<run id>.json`` naming the owner process (and its boot),
  the switch interfaces and the controller, written before anything is created and removed once
  nothing of the run is left. It outlives a reboot, as the run's bridges and containers do.

A run is *live* while its owner process runs (same boot, pid and start time). `clean()` removes the
processes, bridges and interfaces of every run that is not live (or of one given run); it never
touches a process, bridge or interface without the run's mark, so other Mininet users, OVS
bridges and containers on the machine are left alone. It must not call ``mn -c``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.emulation import ctl_dirs
from orchestrator.emulation.kernel import delete_stale_probes
from orchestrator.emulation.link_groups import BATCH_WORD, delete_together, existing_interfaces, ip_batch
from orchestrator.procs import boot_id, proc_start_ticks, process_alive

ENV_RUN = "NETAI_RUN"
BRIDGE_TAG = "netai-run"
DEFAULT_STATE_DIR = Path("/var/lib/netai/runs")
STATE_DIR = Path(os.environ.get("NETAI_STATE_DIR", DEFAULT_STATE_DIR))
#: Where earlier versions kept the state files (gone at a reboot): read too, so that their live runs are known.
LEGACY_STATE_DIR = Path("/run/netai")
KILL_TIMEOUT_S = 2.0


# -- processes ------------------------------------------------------------------------------------
def process_run_id(pid: int) -> str | None:
    """The ``NETAI_RUN`` value in a process's initial environment, if any."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{ENV_RUN}=".encode()
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def marked_processes(run_ids: Iterable[str] | None = None) -> dict[int, str]:
    """{pid: run id} of every process carrying a run mark (of `run_ids` when given), except us."""
    wanted = None if run_ids is None else set(run_ids)
    me = os.getpid()
    out = {}
    for pid in (int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and int(e.name) != me):
        rid = process_run_id(pid)
        if rid is not None and (wanted is None or rid in wanted):
            out[pid] = rid
    return out


def kill_pids(pids: Iterable[int], *, timeout_s: float = KILL_TIMEOUT_S) -> list[int]:
    """SIGTERM, then SIGKILL whatever still runs after `timeout_s`; returns pids that survived."""
    targets = {p: proc_start_ticks(p) for p in pids}
    targets = {p: t for p, t in targets.items() if t is not None}
    for pid in targets:
        # SIGHUP too: an interactive shell (a Mininet node's) ignores SIGTERM.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(process_alive(p, t) for p, t in targets.items()):
        time.sleep(0.05)
    for pid, ticks in targets.items():
        if process_alive(pid, ticks):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(process_alive(p, t) for p, t in targets.items()):
        time.sleep(0.05)
    return [p for p, t in targets.items() if process_alive(p, t)]


# -- OVS bridges and interfaces -------------------------------------------------------------------
def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def tagged_bridges() -> dict[str, str]:
    """{bridge: run id} of the OVS bridges that carry the project's tag."""
    res = _run(["ovs-vsctl", "--timeout=5", "--format=json", "--columns=name,external_ids", "list", "Bridge"])
    if res.returncode != 0:
        return {}
    out = {}
    for name, ext in json.loads(res.stdout).get("data", []):
        pairs = dict(ext[1]) if isinstance(ext, list) and ext[0] == "map" else {}
        if BRIDGE_TAG in pairs:
            out[str(name)] = str(pairs[BRIDGE_TAG])
    return out


def ovs_port_names() -> set[str] | None:
    """Every interface attached to any OVS bridge; None if Open vSwitch could not be asked."""
    res = _run(["ovs-vsctl", "--timeout=5", "--format=json", "--columns=name", "list", "Interface"])
    if res.returncode != 0:
        return None
    try:
        return {str(row[0]) for row in json.loads(res.stdout).get("data", [])}
    except (ValueError, AttributeError, IndexError, TypeError):
        return None


def delete_bridges(names: Iterable[str]) -> None:
    for name in names:
        _run(["ovs-vsctl", "--timeout=5", "--if-exists", "del-br", name])


#: Cluster mode's private namespace of a run, holding its VXLAN tunnels' sockets
#: (`orchestrator.emulation.cluster`): ``netai-ul-<run id>``.
UNDERLAY_PREFIX = "netai-ul-"
NETNS_DIR = Path("/run/netns")


def underlay_netns(run_id: str) -> str:
    return UNDERLAY_PREFIX + run_id


def underlay_runs() -> list[str]:
    """Run ids that have an underlay namespace."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name[len(UNDERLAY_PREFIX):] for p in NETNS_DIR.iterdir() if p.name.startswith(UNDERLAY_PREFIX))


def underlay_exists(run_id: str) -> bool:
    return (NETNS_DIR / underlay_netns(run_id)).exists()


def delete_underlay(run_id: str) -> bool:
    """Delete the run's underlay namespace if it exists; True if one was deleted."""
    if not underlay_exists(run_id):
        return False
    _run(["ip", "netns", "delete", underlay_netns(run_id)])
    return True


IFALIAS_MARK = "netai-run="
SYS_NET = Path("/sys/class/net")


def marked_interfaces() -> dict[str, str]:
    """{interface: run id} of the root namespace's interfaces whose alias carries the project's mark."""
    out = {}
    for path in SYS_NET.glob("*/ifalias"):
        try:
            alias = path.read_text().strip()
        except OSError:
            continue
        if alias.startswith(IFALIAS_MARK) and len(alias) > len(IFALIAS_MARK):
            out[path.parent.name] = alias[len(IFALIAS_MARK):]
    return out


def mark_interfaces(names: Iterable[str], run_id: str) -> list[str]:
    """Give each of `names` that exists the alias ``netai-run=<run_id>`` (one ``ip -batch``); the
    names that could not be marked."""
    names = existing_interfaces(names)
    if not names:
        return []
    for word in (*names, run_id):  # one word each on ip's batch line (the names are Mininet's, s1-eth2)
        if not BATCH_WORD.fullmatch(word):
            raise ValueError(f"not an interface name or run id: {word!r}")
    ip_batch([f"link set dev {n} alias {IFALIAS_MARK}{run_id}" for n in names])
    marks = marked_interfaces()
    return [n for n in names if marks.get(n) != run_id]


def delete_interfaces(names: Iterable[str]) -> None:
    """Delete each of `names` that exists, together (`link_groups.delete_together`)."""
    delete_together(list(names), "netai-clean")


# -- worker containers (the docker CLI: this module needs only the standard library) ---------------
CONTAINER_LABEL = "org.netai.run"  # = orchestrator.runtime.backends.RUN_LABEL; its value is the run id


def labelled_containers() -> dict[str, str]:
    """{container id: run id} of the project's worker containers (none without a Docker daemon)."""
    try:
        res = _run(["docker", "ps", "-a", "--filter", f"label={CONTAINER_LABEL}",
                    "--format", '{{.ID}} {{.Label "' + CONTAINER_LABEL + '"}}'])
    except OSError:  # no docker client
        return {}
    if res.returncode != 0:
        return {}
    out = {}
    for line in res.stdout.splitlines():
        cid, _, rid = line.partition(" ")
        if cid:
            out[cid] = rid
    return out


def delete_containers(ids: Iterable[str]) -> None:
    ids = list(ids)
    if ids:
        _run(["docker", "rm", "-f", *ids])


# -- run state files ------------------------------------------------------------------------------
@dataclass
class RunState:
    """What a run records about itself so that a crash can be cleaned up (see the module docstring)."""

    run_id: str
    owner_pid: int
    owner_start_ticks: int | None
    interfaces: list[str] = field(default_factory=list)
    controller_pid: int | None = None
    rest_url: str = ""
    topology: str = ""
    log_dir: str = ""
    #: `netai net up`'s results database (link load, tasks run on it), its run id, and the
    #: CLOCK_MONOTONIC time its run clock counts from, so that other processes record on the same clock.
    db_path: str = ""
    db_run_id: int = 0
    clock_zero: float = 0.0
    #: The controller's connectivity mode (``best-effort`` or ``strict``), the pid of every compute
    #: site's Mininet host (the shell holding its network namespace) and whether link delay is
    #: emulated, so that another process (`netai task run --attach`) can run in the hosts' namespaces.
    connectivity: str = ""
    host_pids: dict[str, int] = field(default_factory=dict)
    delay_emulated: bool = False
    #: The owner's boot: after a reboot the run is dead whatever process has its pid now.
    boot_id: str = field(default_factory=boot_id)

    @property
    def path(self) -> Path:
        return STATE_DIR / f"run-{self.run_id}.json"

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=1))
        tmp.replace(self.path)

    def remove(self) -> None:
        for folder in state_dirs():
            (folder / self.path.name).unlink(missing_ok=True)

    @property
    def live(self) -> bool:
        return self.boot_id == boot_id() and process_alive(self.owner_pid, self.owner_start_ticks)

    @classmethod
    def load(cls, path: Path) -> RunState:
        return cls(**json.loads(path.read_text()))


#: Where a far machine keeps the run folders of the site servers it ran for another machine's runs
#: (under the SSH user's home: `orchestrator.runtime.far_servers`); a run's folder comes back to
#: the machine that ran it at the end and is removed, except from a machine lost mid-run.
FAR_RUNS = ".netai/runs"


def far_run_folders(home: Path | None = None) -> dict[Path, str]:
    """{folder: run id} of the far run folders under `home` (default: this user's)."""
    root = (home or Path.home()) / FAR_RUNS
    try:
        return {p: p.name for p in root.iterdir() if p.is_dir() and not p.is_symlink()}
    except OSError:
        return {}


def state_dirs() -> list[Path]:
    """Where state files are: `STATE_DIR`, and the earlier versions' folder unless a test or the
    environment chose another `STATE_DIR`."""
    return [STATE_DIR, *([LEGACY_STATE_DIR] if STATE_DIR == DEFAULT_STATE_DIR else [])]


def run_states() -> list[RunState]:
    """Every run of this machine with a state file, live or not (one each)."""
    states: dict[str, RunState] = {}
    for path in sorted(p for folder in state_dirs() for p in folder.glob("run-*.json")):
        try:
            states.setdefault(path.stem[len("run-"):], RunState.load(path))
        except (OSError, ValueError, TypeError):
            continue
    return list(states.values())


@dataclass
class CleanReport:
    runs: list[str] = field(default_factory=list)
    skipped_live: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    #: The site servers' control-socket folders of processes that are gone (`ctl_dirs`).
    control_folders: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def nothing(self) -> bool:
        return not (self.runs or self.processes or self.bridges or self.interfaces or self.containers
                    or self.folders or self.control_folders)


def clean_run(state: RunState, *, report: CleanReport | None = None) -> CleanReport:
    """Remove everything of one run: its marked processes, tagged bridges, its interfaces, then its
    state file, unless a process of it survived (the next bring-up tries again, knowing whose it is)."""
    report = report or CleanReport()
    report.runs.append(state.run_id)
    survivors = len(report.survivors)
    _clean_ids({state.run_id}, report, interfaces=state.interfaces)
    if len(report.survivors) == survivors:
        state.remove()
    return report


def _clean_ids(run_ids: set[str], report: CleanReport, *, interfaces: Iterable[str] = ()) -> None:
    pids = sorted(marked_processes(run_ids))
    report.processes += pids
    report.survivors += kill_pids(pids)
    bridges = sorted(b for b, rid in tagged_bridges().items() if rid in run_ids)
    delete_bridges(bridges)
    report.bridges += bridges
    # An interface of a dead run (named in its state file, or carrying its mark) is removed only if
    # no bridge (of anyone) holds it and it carries no other run's mark (the names are Mininet's, the
    # same in every run); if Open vSwitch cannot say which are attached, none is removed.
    attached = ovs_port_names()
    marks = marked_interfaces()
    mine = [n for n, rid in marks.items() if rid in run_ids]
    names = [n for n in dict.fromkeys([*interfaces, *mine]) if n not in marks or marks[n] in run_ids]
    leftover = [] if attached is None else [n for n in existing_interfaces(names) if n not in attached]
    delete_interfaces(leftover)
    report.interfaces += leftover
    for rid in sorted(run_ids):
        if delete_underlay(rid):
            report.interfaces.append(f"netns {underlay_netns(rid)}")


def clean(*, log: Callable[[str], None] = lambda _m: None) -> CleanReport:
    """Clean every run that is no longer live, plus marked processes and tagged bridges of unknown runs.

    Live runs (their owner process still runs) are left alone and reported in `skipped_live`.
    """
    report = CleanReport()
    states = run_states()
    live = {s.run_id for s in states if s.live}
    report.skipped_live = sorted(live)
    for s in states:
        if s.run_id in live:
            log(f"run {s.run_id} is still active (pid {s.owner_pid}); left alone")
            continue
        log(f"cleaning run {s.run_id}")
        clean_run(s, report=report)
    # Marks without a state file: a run that crashed before writing it, or whose file was lost. A run
    # writes its state file before it makes anything marked, so the live runs are read again after
    # the marks: a run that started meanwhile is live here, never an orphan.
    orphan_ids = set(marked_processes().values()) | set(tagged_bridges().values()) | set(underlay_runs())
    orphan_ids |= set(marked_interfaces().values())
    live |= {s.run_id for s in run_states() if s.live}
    orphan_ids -= live
    if orphan_ids:
        log(f"cleaning marks of runs without a state file: {sorted(orphan_ids)}")
        report.runs += sorted(orphan_ids - set(report.runs))
        _clean_ids(orphan_ids, report)
    # Worker containers of runs that are not live (e.g. a run killed with SIGKILL).
    dead = sorted(cid for cid, rid in labelled_containers().items() if rid not in live)
    if dead:
        log(f"removing {len(dead)} worker container(s) of runs that are not live")
        delete_containers(dead)
        report.containers += dead
    # Far run folders (this machine ran site servers for another's run) of runs not live here.
    for folder, rid in sorted(far_run_folders().items()):
        if rid not in live:
            log(f"removing the far run folder {folder}")
            shutil.rmtree(folder, ignore_errors=True)
            report.folders.append(str(folder))
    report.interfaces += [f"netns {ns}" for ns in delete_stale_probes(NETNS_DIR)]  # a probe killed mid-way
    report.control_folders += ctl_dirs.remove_stale(log=log)
    return report


def clean_dead_runs(*, log: Callable[[str], None] = lambda _m: None) -> CleanReport:
    """Clean every run of this machine whose state file names an owner that is gone (killed, crashed):
    its processes (controller, host shells, site servers), bridges, interfaces, worker containers and
    state file, each carrying its mark; what was removed is logged. Runs without a state file, and
    far run folders, are `clean`'s (``netai clean``) only. The control-socket folders of processes
    that are gone (`ctl_dirs`) go too."""
    report = CleanReport()
    dead = [s for s in run_states() if not s.live]
    for state in dead:
        log(f"cleaning run {state.run_id}: its process {state.owner_pid} is gone (a crashed or killed run)")
        clean_run(state, report=report)
    if dead:
        ids = {s.run_id for s in dead}
        gone = sorted(cid for cid, rid in labelled_containers().items() if rid in ids)
        delete_containers(gone)
        report.containers += gone
        log(f"removed {len(report.processes)} process(es), {len(report.bridges)} bridge(s), "
            f"{len(report.interfaces)} interface(s), {len(gone)} container(s)")
    report.control_folders += ctl_dirs.remove_stale(log=log)  # once the dead runs' servers are stopped
    return report


def clear_the_way(names: Iterable[str], *, log: Callable[[str], None] = lambda _m: None) -> dict[str, str]:
    """Make way for a new run's switch interfaces `names` (Mininet's names, the same in every run).

    First every dead run of this machine is cleaned (`clean_dead_runs`). If none of `names` exists then,
    nothing more is done. Otherwise they may be what a run that ended without its
    teardown (killed, or its machine's CI job cut off) left: every run that is not live is cleaned
    (`clean`, so only what carries the project's marks). Returns those still there, each with who
    holds it: a live run of this testbed, or not this testbed (left as it is).
    """
    names = list(names)
    clean_dead_runs(log=log)
    found = existing_interfaces(names)
    if not found:
        return {}
    log(f"{len(found)} of this run's interface names are taken ({', '.join(found[:4])}"
        f"{', ...' if len(found) > 4 else ''}): cleaning runs that are no longer live")
    clean(log=log)
    live = [s for s in run_states() if s.live]
    held = {}
    for name in existing_interfaces(names):
        owner = next((s for s in live if name in s.interfaces), None)
        held[name] = (f"run {owner.run_id} (pid {owner.owner_pid}), still running" if owner is not None
                      else "not this testbed's (no run of it holds it)")
    return held


def main() -> int:
    """``python -m orchestrator.emulation.cleanup``: `clean()` without the CLI (for ``make clean`` without a venv)."""
    if os.geteuid() != 0:
        print("netai clean: run as root", flush=True)
        return 2
    report = clean(log=lambda m: print(f"netai clean: {m}"))
    print(json.dumps(report.to_dict()))
    return 1 if report.survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
