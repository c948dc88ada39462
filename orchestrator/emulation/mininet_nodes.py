"""The Mininet classes of a run: its switch, its controller, its shaped links, and the tuning of its hosts.

Layered the Mininet way: each class changes one default of Mininet's own. The switch tags its
bridge with the run id from the moment it is made (`orchestrator.emulation.cleanup` finds it by
that tag); the remote controller skips Mininet's telnet probe; the links' interfaces build the htb
tree the controller hangs each task's class under (`controller.htb`). `tune_hosts` sets what every
emulated host needs before a task runs on it. Mininet is imported only when a run is built.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from controller.htb import (
    BACKGROUND_CLASS,
    BEST_EFFORT_CLASS,
    background_queue,
    base_layout,
    classid,
    delay_leaves,
)
from orchestrator.emulation.cleanup import BRIDGE_TAG
from orchestrator.emulation.link_groups import delete_together
from topologies.plan import IP_PREFIX_LEN

#: TCP's minimum retransmission timeout on the hosts' routes (see `rto_min_route`).
RTO_MIN_MS = 10


class TcBatch:
    """Mixin for Mininet's TCIntf: its tc commands run as one ``tc -batch`` (`run_tc_batch`) where the
    interface is on this machine, one process per interface instead of one shell round trip per
    command (a 14-site bring-up spent 2.7 s in them); a far node's run one by one as Mininet's do."""

    _tc_batch: list[str] | None = None

    def config(self, **params: Any) -> Any:
        """Mininet's TCIntf.config, its commands queued by `tc` and run at the end as one batch."""
        self._tc_batch = [] if not getattr(self.node, "isRemote", False) else None  # type: ignore[attr-defined]
        try:
            result = super().config(**params)  # type: ignore[misc]
        finally:
            batch, self._tc_batch = self._tc_batch, None
        if batch:
            output = run_tc_batch(self.node, batch)  # type: ignore[attr-defined]
            if output:  # what Mininet prints for a command with output
                from mininet.log import error

                error(f"*** Error: {output}")
        return result

    def tc(self, cmd: str, tc: str = "tc") -> str:
        """Queue `cmd` for the interface's batch (see `config`); a ``show`` runs at once."""
        if self._tc_batch is None or " show " in f"{cmd} ":
            out: str = super().tc(cmd, tc)  # type: ignore[misc]
            return out
        self._tc_batch.append(cmd % ("", self))
        return ""


class BatchDeleted:
    """Mixin for Mininet's Intf: one whose pair `delete_links` removed in its batch is only forgotten
    when Mininet deletes it (no ``ip link del`` round trip through its node's shell)."""

    deleted_in_batch = False

    def delete(self) -> None:
        if self.deleted_in_batch:
            self.node.delIntf(self)  # type: ignore[attr-defined]
            self.link = None
            return
        super().delete()  # type: ignore[misc]


#: The switch classes' datapaths: Open vSwitch's kernel module or userspace datapath, or tc filters.
TC_DATAPATH = "tc"


def mininet_classes(run_id: str, datapath: str = "user") -> tuple[Any, Any, Any]:
    """(switch class, controller class, link class) for Mininet, imported only when needed (the switch:
    Open vSwitch's, or `tc_switch_class`'s with `datapath` ``tc``)."""
    from mininet.link import TCIntf, TCLink
    from mininet.node import OVSSwitch, RemoteController

    default_class = BEST_EFFORT_CLASS if datapath == TC_DATAPATH else BACKGROUND_CLASS
    class NetaiSwitch(OVSSwitch):
        """OVSSwitch whose bridge carries the run's tag from the moment it is created."""

        def bridgeOpts(self) -> str:
            opts: str = super().bridgeOpts()
            return opts + f" external-ids:{BRIDGE_TAG}={run_id}"

    class NetaiController(RemoteController):
        """The remote controller, polled for its /health before any switch starts (`Emulation`).

        Mininet's own check pipes the OpenFlow port into telnet, whose binary HELLO bytes it
        then fails to decode.
        """

        def checkListening(self) -> None:
            return None

    class ShapedIntf(BatchDeleted, TcBatch, TCIntf):
        """TCIntf whose htb tree leaves room for the controller's per-task classes.

        `controller.htb.base_layout`: root qdisc 5:0 (default 5:2), the link class 5:1 at `bw`,
        the background leaf 5:2 (small guarantee, borrows up to `bw`), the best-effort leaf 5:3, the
        ACK leaf 5:4 and their filters; a netem delay goes under 5:2, 5:3 and 5:4 (the controller puts the same delay under each
        task class; best-effort traffic goes without it). Every class has an explicit
        quantum (one MTU frame): at tens of Mbit/s htb's default (rate / r2q) draws a warning,
        which Mininet reports as an error.
        """

        def bwCmds(self, bw: float | None = None, **kwargs: Any) -> tuple[list[str], str]:
            if bw is None or kwargs.get("use_hfsc") or kwargs.get("use_tbf"):
                cmds: list[str]
                cmds, parent = super().bwCmds(bw=bw, **kwargs)
                return cmds, parent
            # Mininet fills in the tc binary and the interface: "%s <args>" % (tc, intf).
            cmds = [" ".join(["%s", *args]) for args in base_layout("%s", float(bw), default_class)]
            return cmds, f" parent {classid(BACKGROUND_CLASS)} "

        @staticmethod
        def delayCmds(parent: str, delay: Any = None, jitter: Any = None, loss: Any = None,
                      max_queue_size: Any = None) -> tuple[list[str], str]:
            """Mininet's netem under the background leaf and the same delay under the best-effort
            and ACK leaves (`controller.htb.delay_leaves`); without a delay, the background's
            short pfifo (`controller.htb.background_queue`)."""
            cmds, out = TCIntf.delayCmds(parent, delay=delay, jitter=jitter, loss=loss, max_queue_size=max_queue_size)
            if parent.split() == ["parent", classid(BACKGROUND_CLASS)]:
                if not cmds:
                    cmds = [" ".join(["%s", *background_queue("%s")])]
                elif delay is not None:
                    cmds = cmds + [" ".join(["%s", *args]) for args in delay_leaves("%s", str(delay))]
            return cmds, out

    link = partial(TCLink, cls1=ShapedIntf, cls2=ShapedIntf)
    return (tc_switch_class() if datapath == TC_DATAPATH else NetaiSwitch), NetaiController, link


def tc_switch_class() -> Any:
    """The tc datapath's Mininet switch class (Mininet imported only when it is needed)."""
    from mininet.node import Switch

    class TcSwitch(Switch):
        """A switch that forwards in the kernel (`controller.tc_flows`): its ports' ingress qdiscs share
        one filter block numbered by its datapath id, which the controller fills. Its ports stay in
        the root namespace, as an Open vSwitch bridge's do, with IPv6 off (nothing of the switch's
        own crosses the links). The OpenFlow options Mininet passes every switch are ignored."""

        def __init__(self, name: str, dpid: str | None = None, **params: Any) -> None:
            for key in ("datapath", "protocols", "failMode"):
                params.pop(key, None)
            super().__init__(name, dpid=dpid, **params)

        def start(self, controllers: Any) -> None:
            block = str(int(self.dpid, 16))
            ports = [intf.name for intf in self.intfList() if intf.name != "lo"]
            for dev in ports:
                disable_ipv6(dev)
            out = run_tc_batch(self, [" ".join(["qdisc", "add", "dev", dev, "ingress_block", block, "ingress"])
                                      for dev in ports])
            if out:
                raise RuntimeError(f"{self.name}: its ingress block could not be made: {out}")

    return TcSwitch


def disable_ipv6(dev: str) -> None:
    """No IPv6 on a root-namespace switch port (no link-local address, no router solicitations)."""
    try:
        with open(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "w") as f:
            f.write("1")
    except OSError:
        pass  # IPv6 not built in: nothing to turn off


def run_tc_batch(node: Any, commands: list[str]) -> str:
    """Run tc `commands` (each without the leading ``tc``) as one ``tc -force -batch`` in `node`'s
    network namespace; returns what it printed (nothing when every command succeeded)."""
    proc = node.popen(["tc", "-force", "-batch", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate("".join(c.strip() + "\n" for c in commands), timeout=60)
    return str(out).strip()


def delete_links(links: list[Any], run_id: str) -> None:
    """Every link's veth pair removed at once before Mininet stops them: an end of each that lives in
    the root namespace (its peer goes with it), deleted with the others as one interface group
    (`orchestrator.emulation.link_groups`), where Mininet deletes one interface at a time. Both ends of
    a pair that is gone are marked ``deleted_in_batch`` (`BatchDeleted`); a link with no end here (a
    far node's), or one that stays, is left to Mininet."""
    ends: dict[str, Any] = {}
    for link in links:
        for intf in (link.intf1, link.intf2):
            node = getattr(intf, "node", None)
            if node is not None and not node.inNamespace and not getattr(node, "isRemote", False):
                ends[intf.name] = link
                break
    stayed = set(delete_together(list(ends), run_id))
    for name, link in ends.items():
        if name not in stayed:
            link.intf1.deleted_in_batch = link.intf2.deleted_in_batch = True


def static_arp(hosts: list[Any]) -> None:
    """Mininet's ``staticArp`` (each host a permanent neighbour entry for every other), one ``ip -batch``
    per host instead of a shell round trip per pair (0.34 s on 14 sites)."""
    for src in hosts:
        lines = [f"neigh replace {dst.IP()} lladdr {dst.MAC()} dev {src.defaultIntf()} nud permanent\n"
                 for dst in hosts if dst is not src]
        proc = src.popen(["ip", "-batch", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate("".join(lines), timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{src.name}: its static ARP entries could not be set: {str(out).strip()}")


def tune_hosts(hosts: list[Any], *, segmentation_offload: bool = True) -> None:
    """What every emulated host needs: no IPv6, and a short TCP minimum retransmission timeout
    (`rto_min_route`); with `segmentation_offload` False, no TSO or GSO on its interface
    (`no_segmentation_offload`). Each command runs on every host at once: a far host's is an SSH
    session of its own (about 0.3 s), and one host after another, a cluster's took seconds."""
    for host in hosts:  # IPv6 neighbour discovery would only be dropped by the table-miss entry
        host.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1")
    with_intf = [h for h in hosts if h.defaultIntf() is not None]
    on_each(with_intf, rto_min_route, "setting rto_min")
    if not segmentation_offload:
        on_each(with_intf, no_segmentation_offload, "turning segmentation offload off")


#: How long every host's command of `on_each` may take, from the moment they all started.
ON_EACH_TIMEOUT_S = 10.0


def on_each(hosts: list[Any], argv_of: Callable[[Any], list[str]], what: str, *,
            timeout_s: float = ON_EACH_TIMEOUT_S) -> None:
    """Run ``argv_of(host)`` on every one of `hosts` at once, then wait for all, each up to `timeout_s`
    after they started (one still running then is killed and reaped); the failures, each with its
    host's name and the command's error, are raised together once every command ended."""
    procs = [(h, h.popen(argv_of(h), stdout=subprocess.PIPE, stderr=subprocess.PIPE)) for h in hosts]
    deadline = time.monotonic() + timeout_s
    failed = []
    for host, proc in procs:
        try:
            _out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # past the deadline: only a command still running has failed
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
                failed.append(f"{host.name}: {what} did not end within {timeout_s:g} s")
                continue
            _out, err = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"{host.name}: {what} failed: {err.decode(errors='replace').strip()}")
    if failed:
        raise RuntimeError("; ".join(failed))


def no_segmentation_offload(host: Any) -> list[str]:
    """The command turning TSO and GSO off on the host's interface, checksum offload left on.

    On the tc datapath a host's TCP segments cross the switches as the host sent them (no
    re-segmentation on the way), and htb charges a GSO super-packet of up to 64 KB as one: it leaves
    when the class has any token, so a whole small model would cross an idle link at once. Segments of
    one frame each keep htb's burst what `controller.htb.burst_bytes` says.
    """
    return ["ethtool", "-K", str(host.defaultIntf()), "tso", "off", "gso", "off"]


def rto_min_route(host: Any) -> list[str]:
    """The command setting TCP's minimum retransmission timeout on the host's route to the emulated
    network.

    Linux's default (200 ms) is meant for WAN round trips; here they are below a millisecond, so
    one lost tail segment of a small message cost a round 200-300 ms (measured: the round's
    largest/median ratio up to 70 on NSFNET with background load). Data-centre fabrics lower it
    the same way, per route. It is wall time at every time dilation: a segment the host drops
    (a queue overflowing while the host is busy) is the instrument's, and costs 10 ms / K of
    emulated time. Scaled with K (10 x K ms of wall time), paper.yaml's claim point beside a busy
    loop at K = 64 retransmitted 0.12 % of mst's bytes and one round took 34.6 ms of emulated time
    against its task's 11-13 (docs/fidelity.md, "Shaping").
    """
    return ["ip", "route", "replace", f"10.0.0.0/{IP_PREFIX_LEN}", "dev", str(host.defaultIntf()), "proto",
            "kernel", "scope", "link", "src", str(host.IP()), "rto_min", f"{RTO_MIN_MS}ms"]
