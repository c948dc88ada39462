"""Bring an `EmulationPlan` up as a real network (Mininet + Open vSwitch + the SDN controller) and down again.

`Emulation` is a context manager::

    with Emulation(plan) as emu:          # controller started, switches connected, ARP static
        emu.install_task(schedule)         # paths through the controller's REST API
        emu.host("Boulder").cmd("...")     # a Mininet host
    # everything removed, on normal exit, exception, Ctrl-C or SIGTERM

What it decides from the kernel (`orchestrator.emulation.kernel.probe_kernel`): the OVS datapath
(the kernel module when the kernel has it, else the userspace datapath with tx/rx checksum offload
off on every veth, which TCP needs there) and whether link delay can be emulated (netem). Without
netem it warns once and records ``delay_emulated = False``. Links between switches are shaped with
htb to the plan's emulated rate, in the layout the controller hangs each task's class under
(`controller.htb`: root 5:0, the link 5:1, the background 5:2, best-effort connectivity 5:3, pure
ACKs 5:4; Mininet's classes for it are in `orchestrator.emulation.mininet_nodes`); host links are
not shaped.
The controller runs in the chosen connectivity mode (`connectivity`: best-effort routes between
every pair of hosts, or strict), and the run's state records it with every host's pid.

Every process it starts carries ``NETAI_RUN=<run id>`` and every bridge the tag
``external_ids:netai-run``, and a state file records the run, so `orchestrator.emulation.cleanup` removes a
crashed run's leftovers and nothing else. Logs go to ``/var/log/netai/runs/<run id>/`` (``mn -c``
empties the system temp dir).

Mininet runs are machine-global (interface names): callers serialise runs (the project wraps
commands that start Mininet in ``flock /tmp/netai-mininet.lock``). This module must not run
``mn -c`` nor touch anything without the run's marks.

Over 400 lines: bring-up and teardown of one run share its state (processes, bridges, state
file); cleanup of crashed runs lives in `orchestrator.emulation.cleanup`, the Mininet classes in
`orchestrator.emulation.mininet_nodes` (`cluster_nodes` in cluster mode), the kernel probe in
`orchestrator.emulation.kernel`, signal handling in `orchestrator.emulation.signals`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from controller.flows import BEST_EFFORT, CONNECTIVITY_MODES, ENV_CONNECTIVITY
from controller.shaping import ENV_LINK_DELAY
from controller.tc import ENV_TC_SERVERS
from controller.tc_flows import ENV_DATAPATH, OPENFLOW, TC
from orchestrator.emulation import cluster as clustering
from orchestrator.emulation import datapath_priority, ovs_socket
from orchestrator.emulation.cleanup import (
    ENV_RUN,
    RunState,
    clean_run,
    clear_the_way,
    existing_interfaces,
    mark_interfaces,
    marked_processes,
    tagged_bridges,
    underlay_exists,
    underlay_netns,
)
from orchestrator.emulation.cluster_far import FarSide, far_side, tc_servers_file
from orchestrator.emulation.cluster_nodes import cluster_classes, create_underlay
from orchestrator.emulation.controller_client import ControllerClient
from orchestrator.emulation.controller_process import ControllerProcess
from orchestrator.emulation.kernel import (
    DATAPATHS,
    KERNEL,
    USER,
    DatapathUnavailable,
    choose_datapath,
    probe_kernel,
    warn_no_delay,
)
from orchestrator.emulation.links import set_link
from orchestrator.emulation.mininet_nodes import delete_links, mininet_classes, static_arp, tune_hosts
from orchestrator.emulation.signals import ignore_signals, restore_signals, terminate_on_signals
from orchestrator.emulation.task_paths import task_paths
from orchestrator.procs import proc_start_ticks
from orchestrator.scheduling.schedule import Schedule
from topologies.errors import TopologyError
from topologies.mininet_topo import HostParams, PlanTopo, switch_interfaces
from topologies.plan import EmulationPlan

LOG = logging.getLogger(__name__)
LOG_ROOT = Path(os.environ.get("NETAI_LOG_DIR", "/var/log/netai"))
DEFAULT_CONNECT_TIMEOUT_S = 30.0


class EmulationError(RuntimeError):
    """The emulation could not be brought up (the message says which step and why)."""


@dataclass
class EmulationInfo:
    """Facts about a run, for summaries and results."""

    run_id: str
    topology: str
    datapath: str
    delay_emulated: bool
    switches: int
    hosts: int
    links: int
    bringup_s: float = 0.0
    switches_connected: int = 0
    controller_rest: str = ""
    log_dir: str = ""
    teardown_s: float = 0.0
    teardown_clean: bool | None = None
    leftovers: dict[str, list[Any]] = field(default_factory=dict)
    #: Cluster mode: the servers, where each site went and the links cut (`PlacementReport.to_dict`).
    cluster: dict[str, Any] = field(default_factory=dict)
    #: The userspace datapath's send budget, bytes, shared by every link (`ovs_socket`); None with
    #: the kernel datapath or when unknown.
    ovs_send_buffer: int | None = None
    #: The smallest receive buffer, bytes, of the packet sockets ovs-vswitchd reads this run's
    #: switch ports with (`ovs_socket`); None with the kernel datapath or when unknown.
    ovs_receive_buffer: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Emulation:
    """A running emulation of `plan` (see the module docstring).

    Parameters
    ----------
    plan
        The emulation plan (names, ports, rates).
    datapath
        ``"auto"`` (kernel if available, else user), ``"kernel"`` or ``"user"``.
    delay
        ``"auto"`` (netem if available), or False to never add delay.
    connect_timeout_s
        How long to wait for the controller's REST API to answer, then for every switch to connect
        to it (a slow machine, e.g. an emulated CPU, needs more than the default).
    log_dir
        Where logs go; default ``/var/log/netai/runs/<run id>``.
    mininet_log_level
        Mininet's verbosity (``"warning"`` for tests, ``"info"`` for ``netai net up``).
    host_cls
        Mininet host class (default Mininet's `Host`; e.g. a Docker-backed host).
    host_params
        Extra parameters of every host (a mapping, or a function of its `HostPlan`); see `PlanTopo`.
    connectivity
        ``"best-effort"`` (the default: every host pair reaches every other on a fewest-hops route,
        below tasks and background, in the links' lowest class, so ``ping`` and a hand-run
        ``iperf3`` work) or ``"strict"`` (only tasks' paths and background routes carry anything;
        what an experiment measures, and what isolation checks need); see `controller.flows`.
    cluster
        Spread the sites over these servers (Mininet's cluster mode; `orchestrator.emulation.cluster`),
        placed by `place_sites` unless `placement` ({site: server name}) says where each goes.
        Plain Mininet hosts only (no `host_cls`).
    """

    def __init__(
        self,
        plan: EmulationPlan,
        *,
        datapath: str = "auto",
        delay: str | bool = "auto",
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        log_dir: Path | None = None,
        mininet_log_level: str = "warning",
        host_cls: Any = None,
        host_params: HostParams | None = None,
        connectivity: str = BEST_EFFORT,
        cluster: clustering.ClusterSpec | None = None,
        placement: dict[str, str] | None = None,
    ) -> None:
        if connectivity not in CONNECTIVITY_MODES:
            raise TopologyError(f"connectivity must be one of {', '.join(CONNECTIVITY_MODES)}, got {connectivity!r}")
        if datapath not in DATAPATHS:
            raise TopologyError(f"datapath must be one of {', '.join(DATAPATHS)}, got {datapath!r}")
        if delay not in {"auto", False}:
            raise TopologyError(f"delay must be 'auto' or False, got {delay!r}")
        self.plan = plan
        self.run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.log_dir = Path(log_dir) if log_dir else LOG_ROOT / "runs" / self.run_id
        self._datapath_choice = datapath
        self._delay_choice = delay
        self.connect_timeout_s = connect_timeout_s
        self.mininet_log_level = mininet_log_level
        self.host_cls = host_cls
        self.host_params = host_params
        self.connectivity = connectivity
        self.cluster = cluster
        self.placement = clustering.checked_placement(plan, cluster, placement, host_cls)
        self._ssh_dir: Path | None = None
        self._far: FarSide | None = None
        self.net: Any = None
        self.controller: ControllerProcess | None = None
        self.state: RunState | None = None
        self.info: EmulationInfo | None = None
        self._old_env: str | None = None
        self._old_handlers: dict[int, Any] = {}
        self._stopped = False

    # -- access ------------------------------------------------------------------------------------
    @property
    def client(self) -> ControllerClient:
        if self.controller is None:
            raise EmulationError("the emulation is not running")
        return self.controller.client

    def install_task(self, schedule: Schedule) -> dict[str, Any]:
        """Install a scheduled task's paths (and their reserved rates) through the controller."""
        return self.client.install_task(task_paths(schedule, bw_scale=self.plan.bw_scale))

    def set_link(self, a: str, b: str, up: bool) -> tuple[str, str]:
        """Cut (``up=False``) or restore the A-B link, both directions (`orchestrator.emulation.links`)."""
        if self.net is None:
            raise EmulationError("the emulation is not running")
        return set_link(self.plan, a, b, up)

    def restart_controller(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Restart the controller (same ports, its state database restored); ``/health`` once every
        switch is back. The run state records the new pid, so teardown and cleanup still find it."""
        if self.controller is None or self.state is None:
            raise EmulationError("the emulation is not running")
        try:
            health = self.controller.restart(timeout_s)
        finally:
            self.state.controller_pid = self.controller.pid
            self.state.save()
        return health

    def host(self, site: str) -> Any:
        """The Mininet host of a compute site."""
        return self.net.get(self.plan.host(site).name)

    def switch(self, site: str) -> Any:
        return self.net.get(self.plan.switch(site).name)

    # -- life cycle --------------------------------------------------------------------------------
    def start(self) -> EmulationInfo:
        """Start the controller, build and start Mininet, wait for every switch; see the module docstring.

        Raises
        ------
        EmulationError
            Naming the step that failed (the partial run is torn down first); or, before anything is
            started, naming the switch interfaces another live run or another program holds.
        """
        t0 = time.monotonic()
        self._clear_the_way()
        datapath, delay_emulated = self._choose_datapath_and_delay()
        budget = ovs_socket.prepare_userspace_datapath() if datapath == USER else None
        self.info = self._new_info(datapath=datapath, delay_emulated=delay_emulated, send_buffer=budget)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.state = self._new_state()
        # Every child from here on (controller, host shells, what runs in them) carries the mark.
        self._old_env = os.environ.get(ENV_RUN)
        os.environ[ENV_RUN] = self.run_id
        try:
            if self.cluster is not None:
                self._prepare_cluster(self.cluster)
            self.controller = self._start_controller(delay_emulated, datapath)
            self._start_mininet(datapath=datapath, delay_emulated=delay_emulated)
            if datapath == USER:
                datapath_priority.raise_datapath(self.info)  # switch threads above training (its docstring)
                self.info.ovs_receive_buffer = ovs_socket.smallest_receive_buffer(self.state.interfaces)
            self._record_hosts()
            health = self.controller.wait_switches(self.connect_timeout_s)
        except BaseException as e:
            self.stop()
            if isinstance(e, (TimeoutError, RuntimeError, OSError, subprocess.SubprocessError)):
                raise EmulationError(f"bringing up {self.plan.topology} failed: {e}") from e
            raise
        self.info.bringup_s = round(time.monotonic() - t0, 3)
        self.info.switches_connected = int(health["switches_connected"])
        self.info.controller_rest = self.controller.client.base_url
        LOG.info("%s up in %.1f s (run %s)", self.plan.topology, self.info.bringup_s, self.run_id)
        return self.info

    def _choose_datapath_and_delay(self) -> tuple[str, bool]:
        """(datapath, delay emulated?) from the choices and what the kernel offers (`choose_datapath`)."""
        features = probe_kernel()
        try:
            datapath = choose_datapath(self._datapath_choice, features, cluster=self.cluster is not None)
        except DatapathUnavailable as e:
            raise EmulationError(str(e)) from None
        delay_emulated = self._delay_choice == "auto" and features.netem
        warn_no_delay(delay_emulated)
        return datapath, delay_emulated

    def _new_info(self, *, datapath: str, delay_emulated: bool, send_buffer: int | None) -> EmulationInfo:
        info = EmulationInfo(
            run_id=self.run_id,
            topology=self.plan.topology,
            datapath=datapath,
            delay_emulated=delay_emulated,
            switches=len(self.plan.switches),
            hosts=len(self.plan.hosts),
            links=len(self.plan.links),
            log_dir=str(self.log_dir),
            ovs_send_buffer=send_buffer,
        )
        if self.cluster is not None:
            names = [s.name for s in self.cluster.servers]
            info.cluster = clustering.placement_report(self.plan, self.placement, names).to_dict()
        return info

    def _new_state(self) -> RunState:
        """The run's state file, saved before anything starts (cleanup finds a crashed run by it)."""
        state = RunState(run_id=self.run_id, owner_pid=os.getpid(), owner_start_ticks=proc_start_ticks(os.getpid()),
                         interfaces=switch_interfaces(self.plan), topology=self.plan.topology, log_dir=str(self.log_dir))
        state.save()
        return state

    def lost_sites(self, *, settle: bool = False) -> dict[str, str]:
        """{site: server} of the far servers lost so far (`FarSide.poll_lost`; `settle`: once the probes
        under way have answered or timed out); {} without far servers."""
        lost = self._far.poll_lost(self.net, settle=settle) if self._far is not None and self.net is not None else []
        return {site: server for site, server in self.placement.items() if server in lost}

    def _prepare_cluster(self, cluster: clustering.ClusterSpec) -> None:
        """Servers checked (host keys, keys, tools) before anything is started on them; the underlay made."""
        self._ssh_dir = Path(tempfile.mkdtemp(prefix="netai-ssh-"))
        clustering.check_servers(cluster, self._ssh_dir)
        self._far = far_side(cluster, self._ssh_dir)  # servers on other machines: the underlay's addresses, MTU
        if self._far is None:
            create_underlay(self.run_id)
        elif self.info is not None:
            self.info.cluster["far"] = self._far.to_dict()

    def _start_controller(self, delay_emulated: bool, datapath: str) -> ControllerProcess:
        """Start the controller, record its pid and REST address in the run's state (`_controller_ready` waits)."""
        assert self.state is not None
        env = {ENV_LINK_DELAY: "1" if delay_emulated else "0", ENV_CONNECTIVITY: self.connectivity,
               ENV_DATAPATH: TC if datapath == TC else OPENFLOW}
        if self._far is not None:  # the far switches' interfaces are shaped over SSH
            env[ENV_TC_SERVERS] = str(tc_servers_file(self.log_dir / "tc-servers.json", self._far, self.plan,
                                                      self.placement))
        controller = ControllerProcess(self.plan, self.log_dir, env=env)
        self.controller = controller  # stop() stops it whatever happens next
        controller.start()
        self.state.controller_pid = controller.pid
        self.state.rest_url = controller.client.base_url
        self.state.save()
        # Ready before the Mininet build (issue 48): a controller that dies at start-up is noticed as it
        # exits (`wait_ready` polls its process), not after the seconds of a build it would not serve; and
        # far switches reach it through the forward, made before they are.
        self._controller_ready()
        return controller

    def _controller_ready(self) -> None:
        """Wait for the controller's /health (`connect_timeout_s`; its exit ends the wait at once);
        forward its OpenFlow port to the far machines."""
        assert self.controller is not None
        self.controller.wait_ready(self.connect_timeout_s)
        if self._far is not None:
            self._far.forward_controller(self.controller.of_port, self.run_id)

    def _clear_the_way(self) -> None:
        """Before anything starts: the switch interfaces' names must be free. Those a run that ended
        without its teardown left are removed (with a note); any other holder is an error."""
        held = clear_the_way(switch_interfaces(self.plan),
                             log=lambda m: print(f"netai: {m}", file=sys.stderr, flush=True))
        if held:
            shown = "; ".join(f"{name}: {who}" for name, who in list(held.items())[:4])
            raise EmulationError(
                f"bringing up {self.plan.topology} failed before anything was started: {len(held)} of its "
                f"switch interfaces already exist ({shown}{'; ...' if len(held) > 4 else ''}). Stop that run "
                f"(exit its Mininet CLI, or Ctrl-C), or remove another program's interfaces (mn -c removes a "
                f"crashed Mininet's; sudo make clean what this testbed's own runs left)")

    def _start_mininet(self, *, datapath: str, delay_emulated: bool) -> None:
        from functools import partial

        from mininet.log import setLogLevel
        from mininet.net import Mininet

        setLogLevel(self.mininet_log_level)
        assert self.controller is not None
        topo = PlanTopo(
            self.plan, delay_emulated=delay_emulated, checksum_offload=datapath != USER, host_params=self.host_params
        )
        switch_cls, controller_cls, link_cls = mininet_classes(self.run_id, datapath)
        extra = {"host": self.host_cls} if self.host_cls is not None else {}
        if self.cluster is not None:
            assert self._ssh_dir is not None
            host, switch_cls, link_cls = cluster_classes(
                self.run_id, self.cluster, self.placement, self.plan, self._ssh_dir, switch_cls, link_cls, self._far)
            extra = {"host": host}
        switch = partial(
            switch_cls,
            datapath="kernel" if datapath == KERNEL else "user",
            protocols="OpenFlow13",
            failMode="secure",
        )
        self.net = Mininet(topo=topo, switch=switch, **extra, link=link_cls, controller=None, autoSetMacs=False,
                           autoStaticArp=False, build=False, waitConnected=False)
        self.net.addController("c0", controller=controller_cls, ip="127.0.0.1", port=self.controller.of_port)
        self.net.build()
        # The links' root-namespace ends carry the run's mark, as its bridges and processes do: what a
        # run killed from here on leaves is found by marks even if its state file is lost.
        unmarked = mark_interfaces(switch_interfaces(self.plan), self.run_id)
        if unmarked:
            LOG.warning("could not mark %d interface(s) with the run id: %s", len(unmarked), ", ".join(unmarked[:4]))
        self.net.start()  # the controller answers already (`_start_controller`): no switch waits out a back-off
        if self.cluster is None:
            static_arp(self.net.hosts)
        else:  # far hosts' shells answer over SSH: Mininet's own, one entry at a time
            self.net.staticArp()
        tune_hosts(self.net.hosts, segmentation_offload=datapath != TC)
        if (far := self._far) is not None:  # no frame larger than a tunnel carries
            for h in self.net.hosts:
                h.cmd("ip", "link", "set", "dev", h.intf().name, "mtu", str(far.inner_mtu))

    def _record_hosts(self) -> None:
        """Record the connectivity mode and every host's pid in the run's state (for attaching processes)."""
        assert self.state is not None
        self.state.connectivity = self.connectivity
        self.state.host_pids = {h.site: int(self.net.get(h.name).pid) for h in self.plan.hosts}
        self.state.delay_emulated = bool(self.info and self.info.delay_emulated)
        self.state.save()

    def stop(self) -> EmulationInfo | None:
        """Tear everything down (idempotent) and check that nothing of the run is left."""
        if self._stopped:
            return self.info
        self._stopped = True
        t0 = time.monotonic()
        ignored = ignore_signals()
        try:
            if self.net is not None:
                try:
                    if self._far is not None and self._far.mark_lost(self.net) and self.info is not None:
                        self.info.cluster["far"] = self._far.to_dict()  # what is left there is not checked
                    delete_links(self.net.links if self.cluster is None else [], self.run_id)  # far: Mininet's
                    self.net.stop()
                    # A remote controller's stop() leaves its (interactive, SIGTERM-proof) shell.
                    for c in self.net.controllers:
                        c.terminate()
                except Exception as e:  # noqa: BLE001 - teardown goes on; clean_run below catches the rest
                    print(f"netai: Mininet stop failed: {e}; cleaning up by run marks", file=sys.stderr)
            remove_run = getattr(self.host_cls, "remove_run", None)
            if remove_run is not None:  # hosts with more than Mininet's (containers): what the run still holds
                try:
                    remove_run(self.run_id)
                except Exception as e:  # noqa: BLE001 - teardown goes on; clean_run below sweeps by marks
                    print(f"netai: removing the run's containers failed: {e}", file=sys.stderr)
            if self.controller is not None:
                self.controller.stop()
            if self._far is not None:
                self._far.stop()
            if self.state is not None:
                clean_run(self.state)
            if self._ssh_dir is not None:
                shutil.rmtree(self._ssh_dir, ignore_errors=True)
            if self._old_env is None:
                os.environ.pop(ENV_RUN, None)
            else:
                os.environ[ENV_RUN] = self._old_env
            leftovers = self.leftovers()
            if self.info is not None:
                self.info.teardown_s = round(time.monotonic() - t0, 3)
                self.info.leftovers = leftovers
                self.info.teardown_clean = not any(leftovers.values()) and not (self._far and self._far.lost)
        finally:
            restore_signals(ignored)
        return self.info

    def leftovers(self) -> dict[str, list[Any]]:
        """What of this run still exists: processes, bridges, root-namespace interfaces (and its
        underlay namespace in cluster mode)."""
        procs = sorted(marked_processes({self.run_id}))
        bridges = sorted(b for b, rid in tagged_bridges().items() if rid == self.run_id)
        intfs = existing_interfaces(switch_interfaces(self.plan))
        if underlay_exists(self.run_id):
            intfs.append(f"netns {underlay_netns(self.run_id)}")
        return {"processes": procs, "bridges": bridges, "interfaces": intfs}

    def __enter__(self) -> Emulation:
        self._old_handlers = terminate_on_signals()
        try:
            self.start()
        except BaseException:
            restore_signals(self._old_handlers)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.stop()
        finally:
            restore_signals(self._old_handlers)
