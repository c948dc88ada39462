"""The project on a cluster's servers: shipped over SSH, installed in a venv there, and checked.

``netai cluster prepare CONFIG`` and ``netai cluster check CONFIG`` (`orchestrator.cli.cluster`) act on
the servers of the config's ``emulation.cluster``:

- **prepare** ships this checkout's packages (`project_files`: topologies, controller, workers,
  orchestrator and the packaging files, as one tar stream over the server's SSH connection, into a
  fresh folder swapped in whole) to ``~/.netai/deploy/src`` of the SSH user, makes a venv at
  ``~/.netai/deploy/venv`` with ``--system-site-packages`` (the server's own torch, numpy... are
  used: a lab installs those once) and puts the code on its path (a ``.pth`` entry, as an editable
  install does). It then runs the shipped code there (`probe`): the project version must be this
  checkout's and torch's must be this venv's. It never installs an OS package: a missing tool or
  Python package is reported, with the Debian package that has it.
- **check** reports per server: reachability, the host key (known and matching, or refused), the
  prerequisites, the project version there (or that it is absent or another), the clock offset
  (the far ``date`` against the midpoint of the round trip, best of several) and the underlay MTU
  (the MTU of the far interface that routes to this machine, and of this machine's one towards it).

Everything runs through `orchestrator.emulation.cluster.ssh_run` (the ssh binary, argument lists
quoted with `shlex.join`, strict host keys, the config's key only).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import re
import sys
import tarfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.emulation.cluster import ClusterServer, local_underlay, ssh_run

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("topologies", "controller", "workers", "orchestrator")
PACKAGING = ("setup.py", "pyproject.toml")
#: Where a server keeps the project, relative to the SSH user's home.
DEPLOY_DIR = ".netai/deploy"
#: The tools a server runs for the emulation and the sites, and the Debian package of each.
PREREQUISITES = {
    "mnexec": "mininet", "ovs-vsctl": "openvswitch-switch", "ovs-vswitchd": "openvswitch-switch",
    "ip": "iproute2", "bridge": "iproute2", "tc": "iproute2", "ss": "iproute2", "ethtool": "ethtool",
    "ifconfig": "net-tools", "iperf3": "iperf3", "python3": "python3", "tar": "tar",
}
#: Python packages the site servers import there (import name -> Debian / pip name).
PYTHON_PACKAGES = {"torch": "torch (pip)", "numpy": "python3-numpy", "yaml": "python3-yaml",
                   "networkx": "python3-networkx", "safetensors": "safetensors (pip)",
                   "sklearn": "python3-sklearn", "xxhash": "python3-xxhash"}
#: The distribution that installs each of `PYTHON_PACKAGES` (whose metadata gives its version).
DISTRIBUTIONS = {"torch": "torch", "numpy": "numpy", "yaml": "PyYAML", "networkx": "networkx",
                 "safetensors": "safetensors", "sklearn": "scikit-learn", "xxhash": "xxhash"}
#: Packages whose version must equal this venv's (the models' numbers depend on them).
SAME_VERSION = ("torch",)


# -- the code -------------------------------------------------------------------------------------
def project_files(root: Path = ROOT) -> list[str]:
    """The files that make the project (relative, sorted): the packages' sources and data, the packaging."""
    out = [p for p in PACKAGING if (root / p).is_file()]
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in {".pyc", ".pyo"}:
                out.append(str(path.relative_to(root)))
    return sorted(out)


def project_version(root: Path = ROOT, files: Iterable[str] | None = None) -> str:
    """``<setup.py version>+<16 hex digits>``: the version and a hash of every file's name and content,
    so that any edit of the checkout makes another version."""
    h = hashlib.sha256()
    for rel in project_files(root) if files is None else files:
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return f"{_base_version(root)}+{h.hexdigest()[:16]}"


def _base_version(root: Path) -> str:
    """The ``__version__`` of ``orchestrator/__init__.py`` (which setup.py reads), else a literal
    ``version="..."`` of setup.py, else "0"."""
    for rel, pattern in (("orchestrator/__init__.py", r'^__version__ = "([^"]+)"'),
                         ("setup.py", r'^\s*version\s*=\s*["\']([^"\']+)["\']')):
        path = root / rel
        found = re.search(pattern, path.read_text(), re.M) if path.is_file() else None
        if found:
            return found.group(1)
    return "0"


def project_tar(root: Path = ROOT) -> bytes:
    """The project's files as one tar (names relative, owner root, fixed times: the same checkout
    gives the same bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in project_files(root):
            info = tar.gettarinfo(str(root / rel), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            with open(root / rel, "rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


def probe() -> dict[str, Any]:
    """What a server's installed project says of itself (run there by `prepare` and `check`): the
    project's version, Python's, and each of `PYTHON_PACKAGES` as its installed distribution's
    version (`DISTRIBUTIONS`), None where the import system finds no such package, "?" where it
    finds one without a distribution. Nothing is imported: importing torch and scikit-learn took
    about 4 s of a core, on each server and here, for every `prepare` and `check`."""
    versions: dict[str, str | None] = {}
    for name in PYTHON_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        try:
            versions[name] = importlib.metadata.version(DISTRIBUTIONS[name]) if found else None
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "?"
    return {"project": project_version(), "python": ".".join(map(str, sys.version_info[:3])), "packages": versions}


@functools.lru_cache(maxsize=1)
def _here() -> dict[str, Any]:
    """This checkout's `probe` (once per process: it hashes the project's files)."""
    return probe()


# -- per server -----------------------------------------------------------------------------------
@dataclass
class ServerReport:
    """One server's state, as `check` and `prepare` report it."""

    server: str
    reachable: bool = False
    host_key: str = "unchecked"  # "ok", "refused", "unchecked"
    error: str = ""
    missing: list[str] = field(default_factory=list)
    project: str = "absent"
    python: str = ""
    packages: dict[str, str | None] = field(default_factory=dict)
    clock_offset_ms: float | None = None
    clock_uncertainty_ms: float | None = None
    underlay_mtu: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.reachable and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


def remote_paths(home: str) -> dict[str, str]:
    """The deploy folder's paths on a server whose SSH user's home is `home`."""
    base = f"{home.rstrip('/')}/{DEPLOY_DIR}"
    return {"base": base, "src": f"{base}/src", "new": f"{base}/src.new", "venv": f"{base}/venv",
            "python": f"{base}/venv/bin/python"}


def _reach(server: ClusterServer, control_dir: Path, report: ServerReport) -> str | None:
    """Reach the server (host key, key); its SSH user's home, or None with the report saying why."""
    res = ssh_run(server, control_dir, ["printenv", "HOME"])
    if res.host_key_refused:
        report.host_key, report.error = "refused", f"host key not the one in {server.known_hosts}: {res.why}"
    elif res.returncode != 0:
        report.error = f"no SSH session: {res.why}"
    else:
        report.reachable, report.host_key = True, "ok"
        return res.stdout.strip() or "/root"
    report.problems.append(report.error)
    return None


def _prerequisites(server: ClusterServer, control_dir: Path, report: ServerReport) -> None:
    res = ssh_run(server, control_dir, ["sh", "-c", 'for t; do command -v "$t" >/dev/null || echo "$t"; done',
                                        "sh", *PREREQUISITES])
    report.missing = res.stdout.split()
    if report.missing:
        pkgs = sorted({PREREQUISITES.get(t, t) for t in report.missing})
        report.problems.append(f"missing {', '.join(report.missing)} (install: apt-get install {' '.join(pkgs)})")


def _versions(server: ClusterServer, control_dir: Path, home: str, report: ServerReport) -> None:
    """The installed project's own account (`probe`), compared with this checkout and this venv."""
    paths = remote_paths(home)
    res = ssh_run(server, control_dir, [paths["python"], "-m", "orchestrator.emulation.cluster_deploy", "probe"],
                  timeout=120)
    if res.returncode != 0:
        report.project = "absent"
        report.problems.append("the project is not installed there (netai cluster prepare)")
        return
    far = json.loads(res.stdout.strip().splitlines()[-1])
    here = _here()
    report.project, report.python, report.packages = far["project"], far["python"], far["packages"]
    if far["project"] != here["project"]:
        report.problems.append(f"project {far['project']} there, {here['project']} here (netai cluster prepare)")
    lacking = sorted(n for n, v in far["packages"].items() if v is None)
    if lacking:
        report.problems.append("Python packages missing there: " + ", ".join(PYTHON_PACKAGES[n] for n in lacking))
    for name in SAME_VERSION:
        if far["packages"].get(name) and far["packages"][name] != here["packages"].get(name):
            report.problems.append(f"{name} {far['packages'][name]} there, {here['packages'].get(name)} here")


def clock_offset(server: ClusterServer, control_dir: Path, samples: int = 5) -> tuple[float, float]:
    """(offset, uncertainty) in ms: the server's clock less this one's, read at the midpoint of the
    round trip with the shortest round trip of `samples` (the uncertainty is half that round trip)."""
    best: tuple[float, float] | None = None
    for _ in range(samples):
        t0 = time.time()
        res = ssh_run(server, control_dir, ["date", "+%s.%N"])
        t1 = time.time()
        if res.returncode != 0:
            raise RuntimeError(f"{server.name}: date failed: {res.why}")
        far = float(res.stdout.strip())
        cand = ((far - (t0 + t1) / 2) * 1000, (t1 - t0) * 500)
        if best is None or cand[1] < best[1]:
            best = cand
    assert best is not None
    return round(best[0], 3), round(best[1], 3)


def underlay_mtu(server: ClusterServer, control_dir: Path) -> int:
    """The smaller MTU of the two ends of the underlay: this machine's interface towards the server
    and the server's interface towards this machine's address."""
    local_addr, local_dev = local_underlay(server.host)
    here = int(Path(f"/sys/class/net/{local_dev}/mtu").read_text())
    res = ssh_run(server, control_dir, ["ip", "-o", "route", "get", local_addr])
    words = res.stdout.split()
    if res.returncode != 0 or "dev" not in words:
        raise RuntimeError(f"{server.name}: no route back to {local_addr}: {res.why}")
    dev = words[words.index("dev") + 1]
    mtu = ssh_run(server, control_dir, ["cat", f"/sys/class/net/{dev}/mtu"])
    return min(here, int(mtu.stdout.strip()))


def check_server(server: ClusterServer, control_dir: Path, *, versions: bool = True) -> ServerReport:
    """Everything `check` reports of one server (see the module docstring)."""
    report = ServerReport(server.name)
    home = _reach(server, control_dir, report)
    if home is None:
        return report
    _prerequisites(server, control_dir, report)
    if versions:
        _versions(server, control_dir, home, report)
    try:
        report.clock_offset_ms, report.clock_uncertainty_ms = clock_offset(server, control_dir)
        report.underlay_mtu = underlay_mtu(server, control_dir)
    except (RuntimeError, ValueError, OSError) as e:
        report.problems.append(str(e))
    return report


def clean_server(server: ClusterServer, control_dir: Path) -> dict[str, Any]:
    """``netai clean`` run on `server` by the project installed there (`prepare`): what it removed
    (its JSON report) or why it could not run."""
    out: dict[str, Any] = {"server": server.name, "ok": False, "error": "", "removed": None}
    res = ssh_run(server, control_dir, ["printenv", "HOME"])
    if res.returncode != 0:
        out["error"] = f"no SSH session: {res.why}"
        return out
    argv = [remote_paths(res.stdout.strip() or "/root")["python"], "-m", "orchestrator.cli", "clean", "--json"]
    res = ssh_run(server, control_dir, argv if server.user == "root" else ["sudo", "-n", *argv], timeout=120)
    lines = res.stdout.splitlines()
    try:  # its log lines ("netai clean: ..."), then the report
        out["removed"] = json.loads("\n".join(lines[lines.index("{"):]))
    except ValueError:
        out["error"] = f"netai clean there: {res.why if res.returncode else 'no report'}"
        return out
    out["ok"] = res.returncode == 0
    if not out["ok"]:
        out["error"] = f"netai clean there exited {res.returncode}: {res.stderr.strip()[-300:]}"
    return out


def prepare_server(server: ClusterServer, control_dir: Path) -> ServerReport:
    """Ship, install and check the project on one server; nothing is installed when a prerequisite lacks."""
    report = ServerReport(server.name)
    home = _reach(server, control_dir, report)
    if home is None:
        return report
    _prerequisites(server, control_dir, report)
    if report.missing:
        return report
    paths = remote_paths(home)
    steps: list[tuple[list[str], bytes | None]] = [
        (["rm", "-rf", paths["new"]], None), (["mkdir", "-p", paths["new"]], None),
        (["tar", "-x", "-C", paths["new"]], project_tar()),
        (["rm", "-rf", paths["src"]], None), (["mv", paths["new"], paths["src"]], None),
        (["python3", "-m", "venv", "--system-site-packages", "--without-pip", paths["venv"]], None),
        ([paths["python"], "-c", _PTH_SCRIPT, paths["src"]], None),
    ]
    for argv, data in steps:
        res = ssh_run(server, control_dir, argv, input=data, timeout=120)
        if res.returncode != 0:
            report.problems.append(f"`{' '.join(argv[:3])}` failed there: {res.why}")
            return report
    _versions(server, control_dir, home, report)
    return report


#: Run by the venv's Python there: the code's folder as a path entry of the venv (an editable install).
_PTH_SCRIPT = ("import sys, sysconfig, pathlib; "
               "pathlib.Path(sysconfig.get_paths()['purelib'], 'netai.pth').write_text(sys.argv[1] + '\\n')")


def _main(argv: list[str]) -> int:
    if argv == ["probe"]:
        print(json.dumps(probe()))
        return 0
    print("usage: python -m orchestrator.emulation.cluster_deploy probe", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))

