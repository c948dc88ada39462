"""An interrupt inside ``containers.run`` leaves a container its host never knew of: the run's
teardown removes it by the run's label, through every client the host class used."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("mininet.node")

from orchestrator.runtime.containers import RUN_LABEL
from orchestrator.runtime.docker_host import DockerWorkerHost


class FakeContainer:
    def __init__(self, daemon: FakeDaemon, labels: dict[str, str]) -> None:
        self.daemon, self.labels = daemon, labels

    def remove(self, force: bool = False) -> None:
        assert force
        self.daemon.made.remove(self)


class FakeDaemon:
    """What `remove_containers` asks of a Docker client: ``containers.list(all, filters)``."""

    def __init__(self) -> None:
        self.made: list[FakeContainer] = []
        self.containers = self

    def list(self, all: bool, filters: dict[str, str]) -> list[FakeContainer]:
        key, _, value = filters["label"].partition("=")
        return [c for c in self.made if key in c.labels and (not value or c.labels[key] == value)]

    def run(self, image: str, **kwargs: Any) -> Any:
        self.made.append(FakeContainer(self, kwargs["labels"]))
        raise KeyboardInterrupt  # Ctrl-C after the daemon made it, before the host knew it


def test_a_container_made_as_the_interrupt_landed_is_removed_by_the_runs_label(monkeypatch: pytest.MonkeyPatch) -> None:
    daemon, other = FakeDaemon(), FakeDaemon()
    monkeypatch.setattr(DockerWorkerHost, "clients", {})
    other.made.append(FakeContainer(other, {RUN_LABEL: "another-run"}))
    DockerWorkerHost.clients[id(other)] = other
    host = DockerWorkerHost.__new__(DockerWorkerHost)  # the fields startShell reads, no Mininet node
    host.dclient, host.image, host.run_id, host.name = daemon, "img", "run-1", "h1"
    host.cpus = host.memory_mb = host.log_dir = host.ctl_dir = None
    host.container = None
    with pytest.raises(KeyboardInterrupt):
        host.startShell()
    assert host.container is None and len(daemon.made) == 1  # made, and unknown to its host

    assert DockerWorkerHost.remove_run("run-1") == 1
    assert daemon.made == [] and len(other.made) == 1, "only the run's own containers go"


class SlowContainer:
    """A container whose removal takes a while, as the daemon's kill and unmount do."""

    def __init__(self, log: list[str], name: str, gate: threading.Event) -> None:
        self.log, self.name, self.gate = log, name, gate

    def remove(self, force: bool = False) -> None:
        assert force
        assert self.gate.wait(5.0), "removals did not run side by side"
        self.log.append(self.name)


def _host(name: str, container: Any) -> DockerWorkerHost:
    host = DockerWorkerHost.__new__(DockerWorkerHost)  # no Mininet node: no shell, nothing to clean
    host.name, host.shell, host.container = name, None, container
    return host


def test_terminate_removes_containers_side_by_side_and_remove_run_waits_for_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DockerWorkerHost, "clients", {})
    monkeypatch.setattr(DockerWorkerHost, "removing", [])
    removed: list[str] = []
    gate = threading.Event()
    hosts = [_host(f"h{i}", SlowContainer(removed, f"h{i}", gate)) for i in range(3)]
    for h in hosts:  # as Mininet's stop does: one host after another
        h.terminate()
    assert all(h.container is None for h in hosts) and removed == []
    assert len(DockerWorkerHost.removing) == 3, "each removal runs on its own thread"
    gate.set()

    assert DockerWorkerHost.remove_run("run-1") == 0  # nothing left under the label
    assert sorted(removed) == ["h0", "h1", "h2"], "remove_run returned only once every removal was done"
    assert DockerWorkerHost.removing == []


def test_a_removal_that_fails_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Gone:
        def remove(self, force: bool = False) -> None:
            raise RuntimeError("no such container")

    monkeypatch.setattr(DockerWorkerHost, "clients", {})
    monkeypatch.setattr(DockerWorkerHost, "removing", [])
    _host("h1", Gone()).terminate()
    assert DockerWorkerHost.remove_run("run-1") == 0
