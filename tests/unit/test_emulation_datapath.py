"""The datapath choice is checked against the kernel before anything starts (no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.emulation import network
from orchestrator.emulation.kernel import KernelFeatures
from orchestrator.emulation.network import Emulation, EmulationError
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan


def small_plan() -> EmulationPlan:
    links = [{"a": "A", "b": "B", "capacity_mbps": 10.0, "wavelengths": 1, "length_km": 100.0}]
    return EmulationPlan.from_model(NetworkModel.build("ab", [{"name": "A"}, {"name": "B"}], links))


@pytest.fixture
def kernel_without_openvswitch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(network, "probe_kernel", lambda: KernelFeatures(ovs_kernel_datapath=False, netem=True))
    monkeypatch.setattr(network, "clear_the_way", lambda names, log=None: {})


def test_the_kernel_datapath_without_the_module_is_refused_before_anything_starts(
    kernel_without_openvswitch: None,
) -> None:
    emu = Emulation(small_plan(), datapath="kernel")

    with pytest.raises(EmulationError, match="no openvswitch module"):
        emu.start()
    assert emu.controller is None and emu.state is None and emu.net is None


def test_a_host_without_modprobe_has_no_kernel_datapath_rather_than_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """A fresh container has no kmod: probing the kernel says "no module", it does not raise."""
    from orchestrator.emulation import kernel

    asked: list[list[str]] = []

    def run(argv: list[str], **kwargs: object) -> object:
        asked.append(argv)
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    monkeypatch.setattr(kernel.subprocess, "run", run)
    monkeypatch.setattr(kernel, "Path", lambda path: Path(tmp_path / "no-such-module"))
    features = kernel.probe_kernel()
    assert features == KernelFeatures(ovs_kernel_datapath=False, netem=False)
    assert asked[0] == ["modprobe", "-q", "openvswitch"]
