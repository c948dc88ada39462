"""A network another process runs (``netai net up``), as seen from a second process that works with it.

An `Emulation` records its run in a state file (`orchestrator.emulation.cleanup.RunState`): the
controller's REST URL, every compute site's host pid, the connectivity mode, and, for ``net up``,
its results database. `find_running` finds the one live run (or the one behind a given controller
URL) and returns a `RunningNetwork`:

- the controller client and the emulation plan the controller runs (``GET /topology``);
- `model`: the running topology as a `NetworkModel` (loaded by the plan's topology name, or from a
  given spec such as the file it was built from), checked to be the one the controller runs;
- `network_state`: what a scheduler sees: the installed tasks' reservations, as load on their links;
- `install_lock`, `free_task_id`: so that processes installing tasks side by side never take the
  same task id (a PUT of an installed id would replace that task), nor one its results database
  already records;
- `host_pid`: a host's pid, checked to still be that run's host (another process enters its network
  namespace by it).

It starts nothing and changes nothing but what a caller installs through the client; it talks to the
controller on loopback only (`ControllerClient`).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.emulation.cleanup import RunState, process_run_id, run_states
from orchestrator.emulation.controller_client import (
    ControllerClient,
    ControllerHTTPError,
    ControllerUnreachable,
)
from orchestrator.errors import ConfigError
from orchestrator.procs import process_alive
from orchestrator.results import queries
from orchestrator.scheduling import NetworkState
from topologies.errors import TopologyError
from topologies.loaders import load
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

INSTALL_LOCK_NAME = "install.lock"


def find_running(url: str | None = None) -> RunningNetwork:
    """The running network: the only live run, or the one whose controller answers at `url`.

    Raises
    ------
    ConfigError
        No live run (and no `url`), several live runs and no `url`, or its controller does not answer.
    """
    live = [s for s in run_states() if s.live and s.rest_url]
    if url:
        client = ControllerClient(url)
        state = next((s for s in live if s.rest_url.rstrip("/") == client.base_url), None)
    else:
        if not live:
            raise ConfigError("no running network found (start one with `netai net up`, or give --url)")
        if len(live) > 1:
            raise ConfigError(f"{len(live)} networks run ({', '.join(s.run_id for s in live)}): give --url")
        state = live[0]
        client = ControllerClient(state.rest_url)
    try:
        plan = EmulationPlan.from_dict(client.topology()["plan"])
    except (ControllerUnreachable, ControllerHTTPError) as e:
        raise ConfigError(f"the running network's controller does not answer: {e}") from e
    except (KeyError, TypeError, TopologyError) as e:
        raise ConfigError(f"the controller at {client.base_url} sent no usable plan: {e}") from e
    return RunningNetwork(client=client, plan=plan, state=state)


def _layout(plan: EmulationPlan) -> tuple[Any, ...]:
    """What the controller's entries depend on: switches, hosts and their addresses, links and ports."""
    return (
        tuple((sw.site, sw.name, sw.dpid) for sw in plan.switches),
        tuple((h.site, h.name, h.ip) for h in plan.hosts),
        tuple((ln.a, ln.b, ln.port_a, ln.port_b) for ln in plan.links),
    )


@dataclass
class RunningNetwork:
    """A live network of another process (see the module docstring). `state` is None when it was
    found by URL only: tasks can be installed, nothing can run in its hosts."""

    client: ControllerClient
    plan: EmulationPlan
    state: RunState | None

    @property
    def name(self) -> str:
        return self.state.run_id if self.state is not None else self.client.base_url

    def model(self, topology: str | None = None) -> NetworkModel:
        """The running topology: `topology` (a spec) or the plan's topology name, with compute at the
        plan's hosts, checked against the running plan.

        Raises
        ------
        ConfigError
            It cannot be loaded, or it is not the topology the controller runs.
        """
        spec = topology or self.plan.topology
        hosts = [h.site for h in self.plan.hosts]
        try:
            model = load(spec)
            if sorted(model.compute_sites) != sorted(hosts) and set(hosts) <= set(model.sites):
                model = load(spec, compute_sites=hosts)
            ours = EmulationPlan.from_model(model, bw_scale=self.plan.bw_scale)
        except TopologyError as e:
            hint = "" if topology else "; give --topology with the spec or file it was built from"
            raise ConfigError(f"the running network's topology {spec!r} cannot be loaded: {e}{hint}") from e
        if _layout(ours) != _layout(self.plan):
            raise ConfigError(f"topology {spec!r} is not the one the running network ({self.plan.topology}) "
                              "was built from: its sites, hosts or links differ")
        return model

    def installed(self) -> list[dict[str, Any]]:
        """The controller's installed tasks (summaries)."""
        return self.client.tasks()

    def network_state(self, model: NetworkModel) -> NetworkState:
        """What a scheduler sees: every installed task's reserved rates (converted back to the model's
        Mbit/s) as load on the directed links its paths cross."""
        loads: dict[tuple[str, str], float] = {}
        for summary in self.installed():
            for path in self.client.task(int(summary["task_id"]))["paths"]:
                sites = path["sites"]
                for a, b in itertools.pairwise(sites):
                    loads[(a, b)] = loads.get((a, b), 0.0) + float(path["reserved_mbps"]) / self.plan.bw_scale
        state = NetworkState(model)
        state.set_background(loads)
        return state

    def recorded_task_ids(self) -> set[int]:
        """Task ids the network's results database already holds (none without one)."""
        if self.state is None or not self.state.db_path or not Path(self.state.db_path).is_file():
            return set()
        try:
            with contextlib.closing(queries.connect_read_only(Path(self.state.db_path))) as db:
                return queries.task_ids(db, self.state.db_run_id)
        except (sqlite3.Error, FileNotFoundError):
            return set()

    def free_task_id(self, taken: Iterable[int] = ()) -> int:
        """A task id above every installed one, every recorded one and every id in `taken`."""
        used = {int(t["task_id"]) for t in self.installed()} | self.recorded_task_ids() | set(taken)
        return max(used, default=0) + 1

    @contextlib.contextmanager
    def install_lock(self) -> Iterator[None]:
        """Held while a process picks a task id and installs it (an exclusive lock in the run's log
        directory); without a run state there is nothing to lock on."""
        if self.state is None or not self.state.log_dir:
            yield
            return
        path = Path(self.state.log_dir) / INSTALL_LOCK_NAME
        with path.open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def host_pid(self, site: str) -> int:
        """The pid of `site`'s Mininet host, checked to be alive and to carry the run's mark.

        Raises
        ------
        ConfigError
            The run recorded no pids, `site` has no host, or the host is gone.
        """
        if self.state is None:
            raise ConfigError("the network was found by --url only: its hosts are unknown (give no --url)")
        if not self.state.host_pids:
            raise ConfigError(f"run {self.state.run_id} recorded no host pids (started by an older netai?)")
        pid = self.state.host_pids.get(site)
        if pid is None:
            raise ConfigError(f"site {site!r} has no host in run {self.state.run_id}")
        if not process_alive(pid) or process_run_id(pid) != self.state.run_id:
            raise ConfigError(f"the host of {site!r} (pid {pid}) of run {self.state.run_id} is gone")
        return pid
