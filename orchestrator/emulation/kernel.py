"""What the running kernel offers the emulation: the OVS kernel datapath and netem.

`probe_kernel` looks (it loads the openvswitch module if it can, and tries a netem qdisc in a
throwaway network namespace); `warn_no_delay` says once per process that link delays are not
emulated, so results record ``delay_emulated = False`` knowingly. It starts nothing that outlives
the probe.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_delay_warning_given = False
#: The datapaths a run can ask for: Open vSwitch's kernel module (``kernel``), its userspace datapath
#: (``user``), tc filters in the kernel (``tc``, `controller.tc_flows`), or ``auto``
#: (`orchestrator.emulation.network.choose_datapath`).
KERNEL, USER, TC = "kernel", "user", "tc"
DATAPATHS = ("auto", KERNEL, USER, TC)


class DatapathUnavailable(RuntimeError):
    """The datapath asked for is not one this kernel (or this mode) can give."""


@dataclass(frozen=True)
class KernelFeatures:
    """What the running kernel offers the emulation."""

    ovs_kernel_datapath: bool
    netem: bool


#: The probe's throwaway namespaces: ``netai-probe-<pid of the process that made it>``.
PROBE_PREFIX = "netai-probe-"
NETNS_DIR = Path("/run/netns")


def _ip_netns_del(ns: str) -> bool:
    try:
        return subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def delete_stale_probes(netns_dir: Path = NETNS_DIR) -> list[str]:
    """Delete the probe namespaces whose process is gone (one killed mid-probe cannot delete its own);
    the names deleted. A namespace whose pid now names another process is left to that pid's own
    probe, which deletes a namespace of its name before it makes one."""
    stale = []
    for ns in sorted(p.name for p in netns_dir.glob(PROBE_PREFIX + "*")) if netns_dir.is_dir() else []:
        pid = ns[len(PROBE_PREFIX):]
        if re.fullmatch(r"[0-9]+", pid) and not Path(f"/proc/{pid}").exists() and _ip_netns_del(ns):
            stale.append(ns)
    return stale


def _netem_available() -> bool:
    """Try a netem qdisc on a veth inside a throwaway network namespace of this process's own
    (``netai-probe-<pid>``), made, used and deleted with argument lists; first the namespaces of
    probes whose process was killed are deleted, and one of this name (a killed probe's, whose pid
    this process now has)."""
    ns = f"{PROBE_PREFIX}{os.getpid()}"
    steps = (["ip", "-n", ns, "link", "add", "netai-p0", "type", "veth", "peer", "name", "netai-p1"],
             ["tc", "-n", ns, "qdisc", "add", "dev", "netai-p0", "root", "netem", "delay", "1ms"])
    try:
        delete_stale_probes()
        if (NETNS_DIR / ns).exists():
            _ip_netns_del(ns)
        if subprocess.run(["ip", "netns", "add", ns], capture_output=True, timeout=10, check=False).returncode:
            return False
        try:
            return all(subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0
                       for argv in steps)
        finally:
            _ip_netns_del(ns)
    except (OSError, subprocess.TimeoutExpired):
        return False


def probe_kernel() -> KernelFeatures:
    """Probe for the OVS kernel datapath (module loaded or loadable) and for netem."""
    ovs_kernel = Path("/sys/module/openvswitch").exists()
    if not ovs_kernel:
        try:  # a host without kmod (a fresh container) has no modprobe: the module is not loadable
            subprocess.run(["modprobe", "-q", "openvswitch"], capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
        ovs_kernel = Path("/sys/module/openvswitch").exists()
    return KernelFeatures(ovs_kernel_datapath=ovs_kernel, netem=_netem_available())



def warn_no_delay(delay_emulated: bool) -> None:
    """Say once per process that link delays are not emulated (the kernel has no netem)."""
    global _delay_warning_given
    if not delay_emulated and not _delay_warning_given:
        _delay_warning_given = True
        # Not through `logging`: Mininet installs a handler on every logger that drops newlines.
        print(
            "netai: warning: the kernel has no netem: link delays are NOT emulated "
            "(results record delay_emulated=false)",
            file=sys.stderr,
        )


def choose_datapath(choice: str, features: KernelFeatures, *, cluster: bool = False) -> str:
    """The datapath a run uses: `choice` if this kernel can give it; for ``auto``, Open vSwitch's
    kernel module where the kernel has it, else the tc datapath (the userspace datapath in cluster
    mode, whose tunnel ports are Open vSwitch's).

    Raises
    ------
    DatapathUnavailable
        `choice` is ``kernel`` without the openvswitch module, or ``tc`` in cluster mode.
    """
    if choice == KERNEL and not features.ovs_kernel_datapath:
        # Else Mininet adds bridges that ovs-vswitchd cannot open, and the run only times out
        # waiting for switches that never connect.
        raise DatapathUnavailable(
            "the kernel datapath was asked for, but this kernel has no openvswitch module "
            "(modprobe openvswitch failed): use datapath 'auto', 'tc' or 'user'")
    if choice == TC and cluster:
        raise DatapathUnavailable("the tc datapath does not run in cluster mode (its tunnels are Open vSwitch "
                             "ports): use datapath 'auto' or 'user'")
    if choice != "auto":
        return choice
    if features.ovs_kernel_datapath:
        return KERNEL
    return USER if cluster else TC


def datapath_problem(choice: str, *, cluster: bool = False) -> str | None:
    """Why this host cannot give datapath `choice` (None: it can), probing the kernel."""
    try:
        choose_datapath(choice, probe_kernel(), cluster=cluster)
    except DatapathUnavailable as e:
        return str(e)
    return None
