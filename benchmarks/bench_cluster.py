"""Links across machines against links within one, measured in one run and printed as ratios.

A line A - B - C - D at 30 Mbit/s (emulated 1:1): B's switch on a test machine (a container on an
internal Docker network, `tests/integration/machines.py`), the rest here, so A - B and B - C are
VXLAN tunnels over the underlay and C - D is a veth pair. A, C and D are compute sites.

- throughput / link rate: iperf3 (TCP, 8 s) from A to C (two tunnel links) and from C to D (one
  local link), each over the links' emulated rate;
- per-hop latency: the median ping round trip A -> C (two tunnel hops) and C -> D (one local hop),
  and each per hop (the hosts' share of a round trip counts once per path, so the two-hop path's
  per-hop figure carries half of it); no propagation delay is configured: what is measured is the
  machinery's;
- isolation across tunnels: a task from A to C and D, its reservation on both tunnels; its
  broadcast time with iperf3 saturating A -> C on the background route, over the same without
  (target <= 1.15).

Usage: ``sudo .venv/bin/python benchmarks/bench_cluster.py`` (needs root, Open vSwitch, Docker and
the netai-machine image: scripts/build_machine_image.sh). Runs one Mininet: wrap it in the lock.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.flows import BEST_EFFORT  # noqa: E402
from orchestrator.emulation.background import wait_listening  # noqa: E402
from orchestrator.emulation.cluster import parse_cluster  # noqa: E402
from orchestrator.emulation.network import Emulation  # noqa: E402
from orchestrator.runtime.backends import open_backend  # noqa: E402
from orchestrator.runtime.compute import ComputeManager, check_model  # noqa: E402
from orchestrator.runtime.task_runner import FLOptions, run_task  # noqa: E402
from orchestrator.runtime.timing import task_timing  # noqa: E402
from orchestrator.scheduling import NetworkState, get_scheduler  # noqa: E402
from orchestrator.scheduling.cost import emulated_rate  # noqa: E402
from orchestrator.scheduling.tasks import Task  # noqa: E402
from tests.integration.machines import started_machines  # noqa: E402
from topologies.loaders import load  # noqa: E402
from topologies.plan import EmulationPlan  # noqa: E402

LINE = """\
name: line-4
defaults: {wavelengths: 4, wavelength_mbps: 10000}
sites: [{name: A}, {name: B}, {name: C}, {name: D}]
links:
  - {a: A, b: B, length_km: 1}
  - {a: B, b: C, length_km: 1}
  - {a: C, b: D, length_km: 1}
"""
RATE_MBPS = 30
MODEL_ARGS = {"hidden": 400, "layers": 2}


def _iperf(emu: Emulation, a: str, b: str, port: int, seconds: int = 8) -> float:
    """Mbit/s received by b from a (one TCP stream)."""
    server = emu.host(b).popen(["iperf3", "-s", "-1", "-p", str(port), "-B", emu.host(b).IP()])
    wait_listening([(server, emu.host(b).IP(), port, b)])
    out = emu.host(a).popen(["iperf3", "-c", emu.host(b).IP(), "-p", str(port), "-t", str(seconds), "-J"],
                            stdout=subprocess.PIPE).communicate(timeout=seconds + 30)[0]
    server.wait(timeout=10)
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 1e6


def _ping_ms(emu: Emulation, a: str, b: str, count: int = 20) -> float:
    out = emu.host(a).cmd("ping", "-c", str(count), "-i", "0.05", emu.host(b).IP())
    rtts = [float(x) for x in re.findall(r"time=([0-9.]+) ms", out)]
    if len(rtts) < count // 2:
        raise RuntimeError(f"ping {a} -> {b} lost most replies: {out[-300:]}")
    return statistics.median(rtts)


def _broadcast_s(emu: Emulation, manager: ComputeManager, model: Any, schedule: Any, log_name: str) -> float:
    timing = task_timing(model, schedule, check_model("mlp", MODEL_ARGS), rate=emulated_rate(emu.plan),
                         train_allowance_s=30.0)
    res = run_task(schedule, manager=manager, log_dir=manager.task_dir(log_name), timing=timing,
                   options=FLOptions(model="mlp", model_args=MODEL_ARGS, rounds=3, local_epochs=1))
    return statistics.median(r.broadcast_all_s for r in res.rounds)


def _isolation(emu: Emulation, manager: ComputeManager, model: Any) -> float:
    demand = min(ln.wavelength_mbps for ln in model.iter_links())  # one lightpath: its htb class
    task = Task(id=1, global_site="A", local_sites=("C", "D"), rounds=3, demand_mbps=demand,
                model_bytes=check_model("mlp", MODEL_ARGS))
    schedule = get_scheduler("spff").schedule(NetworkState(model), task)
    emu.install_task(schedule)
    try:
        quiet = _broadcast_s(emu, manager, model, schedule, "quiet")
        emu.client.set_background([["A", "C"]])
        server = emu.host("C").popen(["iperf3", "-s", "-1", "-p", "5400", "-B", emu.host("C").IP()])
        wait_listening([(server, emu.host("C").IP(), 5400, "C")])
        client = emu.host("A").popen(["iperf3", "-c", emu.host("C").IP(), "-p", "5400", "-t", "60", "-P", "4"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            busy = _broadcast_s(emu, manager, model, schedule, "busy")
        finally:
            for p in (client, server):
                p.kill()
                p.wait()
    finally:
        emu.client.remove_task(1)
    return busy / quiet


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="netai-bench-cluster-") as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "line.yaml").write_text(LINE)
        model = load(str(tmp / "line.yaml"), compute_sites=["A", "C", "D"])
        plan = EmulationPlan.from_model(model, max_link_mbps=RATE_MBPS)
        with started_machines(1, tmp / "machines") as machines:
            (m1,) = machines.machines
            spec = parse_cluster({"servers": ["localhost", m1.server_entry() | {"sites": ["B"]}]})
            with Emulation(plan, log_dir=tmp / "emulation", connectivity=BEST_EFFORT, cluster=spec) as emu:
                manager = ComputeManager(open_backend("process", emu, log_root=tmp / "workers"), ["A", "C", "D"])
                with manager:
                    tunnel = _iperf(emu, "A", "C", 5301) / RATE_MBPS
                    local = _iperf(emu, "C", "D", 5302) / RATE_MBPS
                    rtt_tunnel = _ping_ms(emu, "A", "C")
                    rtt_local = _ping_ms(emu, "C", "D")
                    ratio = _isolation(emu, manager, model)
    print(f"cluster links ({RATE_MBPS} Mbit/s, userspace datapath, one test machine): throughput / link rate: "
          f"tunnel {tunnel:.2f}, local {local:.2f}; median ping round trip: A -> C (two tunnel hops) "
          f"{rtt_tunnel:.2f} ms, {rtt_tunnel / 2:.2f} ms per hop; C -> D (one local hop) {rtt_local:.2f} ms "
          f"(per hop, tunnel / local {rtt_tunnel / 2 / rtt_local:.2f}; the hosts' share counts once per path)")
    print(f"isolation across two tunnel links (spff, reserved one lightpath): broadcast with saturating "
          f"iperf3 / without: {ratio:.2f} (target <= 1.15)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
