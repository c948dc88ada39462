"""Running ``tc``: the batch text of a list of commands, the `TcRunner` port and its subprocess form.

`SubprocessTc` runs ``tc -batch -`` with the lines on stdin, never a shell; `batch_text` refuses an
argument that tc would split. `layout_problem` says from ``tc -j qdisc show`` whether the
interfaces carry the base layout of `controller.htb` (the controller starts before Mininet makes them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from controller.htb import BACKGROUND_CLASS, ROOT_MAJOR, interface_switch


class ShapingError(RuntimeError):
    """``tc`` refused or failed to run a batch (the message carries its output)."""



def batch_text(commands: Sequence[Sequence[str]]) -> str:
    """The input of ``tc -batch -``: one command a line. Raises ValueError on an argument tc would split."""
    lines = []
    for cmd in commands:
        for arg in cmd:
            if not arg or any(c.isspace() or c in "\"'\\#" for c in arg):
                raise ValueError(f"unsafe tc argument {arg!r} in {list(cmd)}")
        lines.append(" ".join(cmd))
    return "".join(line + "\n" for line in lines)


class TcRunner(Protocol):
    """Executes tc batches; `check` says why the given interfaces cannot be shaped (None: they can)."""

    def check(self, devices: Sequence[str]) -> str | None: ...

    def run(self, commands: Sequence[Sequence[str]], *, force: bool = False) -> None:
        """Run the batch; stop at the first error unless `force`. Raises ShapingError if any command failed."""
        ...


class SubprocessTc:
    """`TcRunner` running the ``tc`` binary (root, in the namespace of the switch interfaces)."""

    def __init__(self, tc: str | None = None, *, timeout_s: float = 20.0, default_class: int = BACKGROUND_CLASS) -> None:
        self.tc = tc
        self.timeout_s = timeout_s
        #: The htb default class the layout must have (`controller.htb.base_layout`).
        self.default_class = default_class

    def _binary(self) -> str | None:
        return self.tc or shutil.which("tc") or next(
            (p for p in ("/usr/sbin/tc", "/sbin/tc") if os.access(p, os.X_OK)), None
        )

    def check(self, devices: Sequence[str]) -> str | None:
        tc = self._binary()
        if tc is None:
            return "tc (iproute2) is not installed"
        if os.geteuid() != 0:
            return "the controller does not run as root (tc needs CAP_NET_ADMIN)"
        try:
            res = subprocess.run([tc, "-j", "qdisc", "show"], capture_output=True, text=True,
                                 timeout=self.timeout_s, check=False)
            qdiscs = json.loads(res.stdout or "[]") if res.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            return f"tc qdisc show failed: {e}"
        if not isinstance(qdiscs, list):
            return f"tc qdisc show failed: {res.stderr.strip()[:200]}"
        return layout_problem(devices, qdiscs, self.default_class)

    def run(self, commands: Sequence[Sequence[str]], *, force: bool = False) -> None:
        if not commands:
            return
        tc = self._binary()
        if tc is None:
            raise ShapingError("tc (iproute2) is not installed")
        text = batch_text(commands)
        try:
            res = subprocess.run([tc, *(["-force"] if force else []), "-batch", "-"], input=text,
                                 capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            raise ShapingError(f"tc -batch failed: {e}") from e
        if res.returncode != 0:
            raise ShapingError(f"tc -batch exited {res.returncode}: {(res.stderr or res.stdout).strip()[:500]}")


def layout_problem(devices: Sequence[str], qdiscs: Iterable[Mapping[str, Any]],
                   default_class: int = BACKGROUND_CLASS) -> str | None:
    """Why `devices` lack the base layout, from ``tc -j qdisc show`` (None if every one has it)."""
    roots = {q.get("dev"): q for q in qdiscs if q.get("root")}
    expected_default = f"{default_class:#x}"
    bad = []
    for dev in devices:
        q = roots.get(dev)
        if (q is None or q.get("kind") != "htb" or q.get("handle") != f"{ROOT_MAJOR}:"
                or (q.get("options") or {}).get("default") != expected_default):
            bad.append(dev)
    if not bad:
        return None
    shown = ", ".join(bad[:4]) + (", ..." if len(bad) > 4 else "")
    return (f"{len(bad)} of {len(devices)} switch-to-switch interfaces lack the htb layout "
            f"(root {ROOT_MAJOR}: default {default_class:x}): {shown}")


#: Names a JSON file that places switch interfaces on other servers (cluster mode): ``{"servers":
#: {name: [ssh argument list ending with the target]}, "devices": {interface: name}}``.
ENV_TC_SERVERS = "NETAI_TC_SERVERS"


class ClusterTc:
    """`TcRunner` for interfaces spread over servers: those of this machine through `local`, each
    other server's through ``tc`` run there over its SSH connection (the same argument list, the
    batch on stdin). A batch is split by the device each command names, keeping its order.

    A server whose every switch the controller has lost (`switches_down`: its machine is gone, or its
    controller forward) is not asked: its commands fail at once, where an SSH call would wait out its
    connect timeout (the classes there went with the machine, or stay on interfaces the run's
    teardown deletes). It is asked again once one of its switches is back."""

    def __init__(self, local: TcRunner, servers: Mapping[str, Sequence[str]], devices: Mapping[str, str], *,
                 timeout_s: float = 30.0) -> None:
        self.local, self.servers, self.devices, self.timeout_s = local, dict(servers), dict(devices), timeout_s
        self._switches = {server: {interface_switch(dev) for dev, on in self.devices.items() if on == server}
                          for server in self.servers}
        self._down: frozenset[str] = frozenset()

    def switches_down(self, switches: Iterable[str]) -> None:
        """The switches (names) not connected to the controller now."""
        self._down = frozenset(switches)

    def unreachable(self, server: str) -> bool:
        mine = self._switches.get(server, set())
        return bool(mine) and mine <= self._down

    def _by_server(self, devices: Iterable[str]) -> dict[str | None, list[str]]:
        out: dict[str | None, list[str]] = {}
        for dev in devices:
            out.setdefault(self.devices.get(dev), []).append(dev)
        return out

    def _remote(self, server: str, argv: Sequence[str], text: str = "") -> subprocess.CompletedProcess[str]:
        import shlex

        try:
            return subprocess.run([*self.servers[server], shlex.join(argv)], input=text, capture_output=True,
                                  text=True, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            raise ShapingError(f"tc on {server} failed: {e}") from e

    def check(self, devices: Sequence[str]) -> str | None:
        for server, devs in self._by_server(devices).items():
            if server is None:
                problem = self.local.check(devs)
            else:
                try:
                    res = self._remote(server, ["tc", "-j", "qdisc", "show"])
                    problem = (layout_problem(devs, json.loads(res.stdout or "[]")) if res.returncode == 0
                               else f"tc qdisc show on {server} failed: {res.stderr.strip()[:200]}")
                except (ShapingError, ValueError) as e:
                    problem = str(e)
            if problem:
                return problem
        return None

    def run(self, commands: Sequence[Sequence[str]], *, force: bool = False) -> None:
        groups: dict[str | None, list[Sequence[str]]] = {}
        for cmd in commands:
            dev = cmd[list(cmd).index("dev") + 1] if "dev" in cmd else None
            groups.setdefault(self.devices.get(dev or ""), []).append(cmd)
        errors: list[str] = []  # every server's batch is run: a lost server does not stop the others'
        for server, cmds in groups.items():
            try:
                if server is None:
                    self.local.run(cmds, force=force)
                    continue
                if self.unreachable(server):
                    errors.append(f"tc on {server} not run: its switches are disconnected (the machine lost?)")
                    continue
                res = self._remote(server, ["tc", *(["-force"] if force else []), "-batch", "-"], batch_text(cmds))
            except ShapingError as e:
                errors.append(str(e))
                continue
            if res.returncode != 0:
                errors.append(f"tc -batch on {server} exited {res.returncode}: "
                              f"{(res.stderr or res.stdout).strip()[:500]}")
        if errors:
            raise ShapingError("; ".join(errors))


def runner_from_env(default_class: int = BACKGROUND_CLASS) -> TcRunner:
    """`SubprocessTc`, or a `ClusterTc` when `ENV_TC_SERVERS` names a file of far interfaces;
    `default_class` is the links' htb default (`controller.htb.base_layout`)."""
    path = os.environ.get(ENV_TC_SERVERS)
    if not path:
        return SubprocessTc(default_class=default_class)
    with open(path) as f:
        spec = json.load(f)
    return ClusterTc(SubprocessTc(), spec["servers"], spec["devices"])
