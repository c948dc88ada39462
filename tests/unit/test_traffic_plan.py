"""Background traffic planning: pairs from the demand matrix, rates scaled to the target load."""

from __future__ import annotations

import pytest

from orchestrator.emulation.background import BackgroundConfig, demand_matrix, on_off_periods, plan_background
from topologies.loaders import load
from topologies.plan import EmulationPlan


def peak_utilisation(flows, plan: EmulationPlan) -> float:  # type: ignore[no-untyped-def]
    rate = {frozenset((ln.a, ln.b)): ln.emulated_mbps for ln in plan.links}
    load_: dict[tuple[str, str], float] = {}
    for f in flows:
        for u, v in zip(f.path, f.path[1:], strict=False):
            load_[(u, v)] = load_.get((u, v), 0.0) + f.rate_mbps
    return max(x / rate[frozenset(k)] for k, x in load_.items())


@pytest.mark.parametrize("pattern", ["demand-matrix", "constant", "poisson"])
@pytest.mark.parametrize("target", [0.1, 0.3, 0.8])
def test_most_loaded_link_carries_the_target_load(pattern: str, target: float) -> None:
    model = load("sndlib/nobel-us")
    plan = EmulationPlan.from_model(model)
    cfg = BackgroundConfig(pattern=pattern, load=target, pairs=8)

    flows = plan_background(model, plan, cfg, topology="sndlib/nobel-us", seed=4)

    assert len(flows) == 8
    assert peak_utilisation(flows, plan) == pytest.approx(target)
    assert len({f.port for f in flows}) == 8
    for f in flows:
        assert f.src != f.dst and f.path[0] == f.src and f.path[-1] == f.dst


def test_demand_matrix_pattern_takes_the_largest_demands() -> None:
    model = load("sndlib/nobel-us")
    demands = demand_matrix("sndlib/nobel-us", model)
    plan = EmulationPlan.from_model(model)

    flows = plan_background(model, plan, BackgroundConfig(pairs=5), topology="sndlib/nobel-us", seed=0)

    top = sorted(demands.values(), reverse=True)[:5]
    assert sorted((demands[(f.src, f.dst)] for f in flows), reverse=True) == top
    # rates are proportional to the demands
    ratios = {round(f.rate_mbps / demands[(f.src, f.dst)], 9) for f in flows}
    assert len(ratios) == 1


def test_topology_without_matrix_weighs_pairs_equally() -> None:
    model = load("ring:5")

    demands = demand_matrix("ring:5", model)

    assert len(demands) == 20 and set(demands.values()) == {1.0}


def test_on_off_periods_are_seeded_with_the_configured_means() -> None:
    cfg = BackgroundConfig(pattern="poisson", mean_on_s=2.0, mean_off_s=0.5)

    periods = on_off_periods(cfg, 3, 4000)

    assert periods == on_off_periods(cfg, 3, 4000)
    assert sum(p[0] for p in periods) / 4000 == pytest.approx(2.0, rel=0.08)
    assert sum(p[1] for p in periods) / 4000 == pytest.approx(0.5, rel=0.08)


def test_a_server_counts_as_up_only_once_it_listens_on_its_address() -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys

    from orchestrator.emulation.background import listening, wait_listening

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        port = srv.getsockname()[1]
        assert not listening(os.getpid(), "127.0.0.1", port)  # bound, not listening yet
        srv.listen()
        assert listening(os.getpid(), "127.0.0.1", port)
        assert not listening(os.getpid(), "127.0.0.2", port) and not listening(os.getpid(), "127.0.0.1", port + 1)
        with socket.create_connection(("127.0.0.1", port)) as c:  # a connected socket is not a listener
            assert not listening(os.getpid(), "127.0.0.1", c.getsockname()[1])
    assert not listening(os.getpid(), "127.0.0.1", port)

    with socket.socket() as srv:  # listening in this namespace, but not a socket of that process
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert listening(os.getpid(), "127.0.0.1", srv.getsockname()[1])
            assert not listening(other.pid, "127.0.0.1", srv.getsockname()[1])
        finally:
            other.kill()
            other.wait()
    # a socket of a process the given one started counts (a wrapper that forks its server)
    wrapper = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                                "'import socket, sys, time; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); "
                                "print(s.getsockname()[1], flush=True); time.sleep(30)'])"], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert wrapper.stdout is not None
        child_port = int(wrapper.stdout.readline())
        assert listening(wrapper.pid, "127.0.0.1", child_port)
    finally:
        os.killpg(wrapper.pid, signal.SIGKILL)  # the wrapper and its server
        wrapper.wait()

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(RuntimeError, match=r"iperf3 server h9 \(10\.0\.0\.9:5201\) exited with 0 before listening"):
        wait_listening([(gone, "10.0.0.9", 5201, "h9")])
    quiet = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(RuntimeError, match=r"did not listen within 0.2 s"):
            wait_listening([(quiet, "10.0.0.9", 5201, "h9")], timeout_s=0.2)
    finally:
        quiet.kill()
        quiet.wait()
