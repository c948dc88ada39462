"""`compute.servers` entries (`orchestrator.runtime.remote`): checked before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from orchestrator.runtime.remote import check_ssh_url, parse_servers


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    key, known = tmp_path / "key", tmp_path / "known_hosts"
    key.write_text("not read here\n")
    known.write_text("")
    return key, known


def entry(files: tuple[Path, Path], **changes: object) -> dict[str, object]:
    key, known = files
    return {"sites": ["Boulder"], "docker": "ssh://root@192.0.2.7:2222", "key": str(key),
            "known_hosts": str(known), **changes}


def test_a_server_entry_is_read_with_its_files_resolved(files: tuple[Path, Path], tmp_path: Path) -> None:
    [server] = parse_servers([entry(files, key="key", known_hosts="known_hosts")], base_dir=tmp_path)
    assert server.sites == ("Boulder",) and server.docker == "ssh://root@192.0.2.7:2222"
    assert server.key == str(files[0].resolve()) and server.known_hosts == str(files[1].resolve())


@pytest.mark.parametrize(("change", "message"), [
    ({"docker": "tcp://192.0.2.7:2375"}, "must be an ssh:// URL"),
    ({"docker": "ssh://root:secret@192.0.2.7"}, "may not carry a password"),
    ({"docker": "ssh://192.0.2.7"}, "must be ssh://user@host"),
    ({"docker": "ssh://root@192.0.2.7:99999"}, "port"),
    ({"docker": "ssh://root@192.0.2.7/var/run"}, "must be ssh://user@host"),
    ({"key": "/nonexistent/key"}, "is not a readable file"),
    ({"known_hosts": "/nonexistent/known_hosts"}, "is not a readable file"),
    ({"sites": []}, "non-empty list of site names"),
    ({"sites": "Boulder"}, "non-empty list of site names"),
    ({"password": "x"}, "unknown key 'password'"),
])
def test_bad_entries_are_refused_with_the_reason(files: tuple[Path, Path], change: dict[str, object],
                                                 message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_servers([entry(files, **change)])
    assert "secret" not in str(err.value)


def test_a_site_given_to_two_servers_is_refused(files: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError, match="'Boulder' is given to two servers"):
        parse_servers([entry(files), entry(files, docker="ssh://root@192.0.2.8")])


def test_check_ssh_url_accepts_user_host_and_port() -> None:
    parts = check_ssh_url("ssh://netai@example.org:2200", where="docker")
    assert (parts.username, parts.hostname, parts.port) == ("netai", "example.org", 2200)


def test_the_config_key_round_trips_and_needs_the_emulation(files: tuple[Path, Path]) -> None:
    raw = {"name": "r", "topology": "sndlib/nobel-us", "compute": {"servers": [entry(files)]}}
    cfg = parse_config(raw)
    assert [s.sites for s in cfg.remote_servers] == [("Boulder",)]
    assert parse_config(cfg.to_dict()) == cfg
    assert parse_config({"name": "r", "topology": "sndlib/nobel-us"}).to_dict()["compute"] == {
        "cost": "counted", "core_gflops": 10.0, "step_overhead_us": 250.0, "round_overhead_ms": 1.0}
    with pytest.raises(ConfigError, match="needs engine: emulation"):
        parse_config({**raw, "engine": "simulation"})
    with pytest.raises(ConfigError, match=r"unknown key compute\.cluster"):
        parse_config({**raw, "compute": {"servers": [], "cluster": True}})
