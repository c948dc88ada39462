"""Start, health-check and stop the SDN controller (``osken-manager controller.app``) as a process.

The OpenFlow listener and the REST API both bind to 127.0.0.1; free ports are picked unless given.
The plan is written to ``<run_dir>/plan.json`` and handed over in ``NETAI_PLAN_FILE``; the log goes
to ``<run_dir>/controller.log`` (never the system temp dir, which ``mn -c`` empties). Readiness is
polled through ``GET /health``, never slept for.

This module must not start Mininet or touch switches.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from controller.state_store import ENV_STATE_DB
from orchestrator.emulation.controller_client import ControllerClient
from topologies.plan import EmulationPlan

LISTEN_HOST = "127.0.0.1"
APP_MODULE = "controller.app"
STOP_TIMEOUT_S = 10.0
#: The controller listens and connects by address only, so eventlet's own resolver (dnspython, a
#: third of os-ken's imports) is left out: a name, were one ever given, goes to the system's resolver.
#: A start reaches ``/health`` about 0.16 s sooner (0.51 s against 0.67 s on the 2-core host, docs/testing.md).
CONTROLLER_ENV = {"EVENTLET_NO_GREENDNS": "yes"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LISTEN_HOST, 0))
        port: int = s.getsockname()[1]
        return port


def manager_command() -> list[str]:
    """``osken-manager`` next to this Python (the venv), else on PATH; ``ryu-manager`` as a last resort."""
    here = Path(sys.executable).parent
    for name in ("osken-manager", "ryu-manager"):
        candidate = here / name
        if candidate.exists():
            return [str(candidate)]
        found = shutil.which(name)
        if found:
            return [found]
    raise FileNotFoundError("neither osken-manager nor ryu-manager found (install the 'net' extra)")


class ControllerProcess:
    """The controller as a child process (see the module docstring).

    Parameters
    ----------
    plan
        The emulation plan the controller must use.
    run_dir
        Where the plan file and the log go.
    of_port, rest_port
        Ports on 127.0.0.1; free ones are chosen when None.
    """

    def __init__(
        self,
        plan: EmulationPlan,
        run_dir: Path,
        *,
        of_port: int | None = None,
        rest_port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.plan = plan
        self.run_dir = Path(run_dir)
        self.of_port = of_port or free_port()
        self.rest_port = rest_port or free_port()
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.run_dir / "controller.log"
        #: The controller's own database of what it installed: a restarted controller restores it.
        self.state_db = self.run_dir / "controller-state.db"
        self._restarting = False
        self.client = ControllerClient(f"http://{LISTEN_HOST}:{self.rest_port}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        """Launch the manager (returns at once; call `wait_ready`)."""
        if self.proc is not None:
            raise RuntimeError("controller already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self._restarting:
            self.state_db.unlink(missing_ok=True)  # a first start begins empty; a restart restores
        plan_file = self.run_dir / "plan.json"
        plan_file.write_text(json.dumps(self.plan.to_dict(), indent=1))
        cmd = [
            *manager_command(),
            "--ofp-listen-host", LISTEN_HOST,
            "--ofp-tcp-listen-port", str(self.of_port),
            APP_MODULE,
        ]
        env = {**os.environ, **CONTROLLER_ENV, **self.extra_env, "NETAI_PLAN_FILE": str(plan_file),
               "NETAI_REST_PORT": str(self.rest_port), ENV_STATE_DB: str(self.state_db)}
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )

    def restart(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Stop the controller and start it again on the same ports with the same state database (it
        restores the installed tasks and background); returns ``/health`` once every switch has
        reconnected and got its entries back."""
        self.stop()
        self.proc = None
        self._restarting = True
        try:
            self.start()
        finally:
            self._restarting = False
        self.wait_ready(timeout_s)
        return self.wait_switches(timeout_s)

    def exited(self) -> str | None:
        """None while running; else why it stopped, with the end of its log."""
        if self.proc is None:
            return "controller not started"
        rc = self.proc.poll()
        if rc is None:
            return None
        return f"controller exited with status {rc}; log tail:\n{self.log_tail()}"

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout_s: float = 20.0) -> dict[str, Any]:
        """Poll ``/health`` until the REST API answers."""
        return self.client.wait_for(
            f"the controller's REST API on {LISTEN_HOST}:{self.rest_port}",
            lambda _h: True,
            timeout_s=timeout_s,
            alive=self.exited,
        )

    def wait_switches(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Poll ``/health`` until every switch of the plan is connected and configured."""
        n = len(self.plan.switches)
        return self.client.wait_for(
            f"all {n} switches to connect to the controller on {LISTEN_HOST}:{self.of_port}",
            lambda h: h.get("switches_connected") == n,
            timeout_s=timeout_s,
            alive=self.exited,
        )

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM the manager's process group, SIGKILL after `timeout_s`; returns its exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=timeout_s)
        return proc.returncode

    def __enter__(self) -> ControllerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
