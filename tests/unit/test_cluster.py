"""Cluster mode's pure parts: the config entry, where sites go, and commands sent over SSH."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation.cluster import (
    LOCAL,
    parse_cluster,
    place_sites,
    placement_report,
    remote_command,
    ssh_argv,
)
from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from topologies.loaders import load
from topologies.plan import EmulationPlan

TWO_TRIANGLES = """\
name: two-triangles
defaults: {wavelengths: 8, wavelength_mbps: 10000}
sites: [{name: A1}, {name: A2}, {name: A3}, {name: B1}, {name: B2}, {name: B3}]
links:
  - {a: A1, b: A2, length_km: 10}
  - {a: A2, b: A3, length_km: 10}
  - {a: A3, b: A1, length_km: 10}
  - {a: B1, b: B2, length_km: 10}
  - {a: B2, b: B3, length_km: 10}
  - {a: B3, b: B1, length_km: 10}
  - {a: A1, b: B1, length_km: 10, wavelengths: 1}
  - {a: A3, b: B3, length_km: 10, wavelengths: 1}
"""


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "id_test").write_text("not a real key\n")
    (tmp_path / "known_hosts").write_text("[127.0.0.1]:2222 ssh-ed25519 AAAA\n")
    return {"key": str(tmp_path / "id_test"), "known_hosts": str(tmp_path / "known_hosts")}


def _raw(files: dict[str, str], **entry: Any) -> dict[str, Any]:
    return {"servers": [LOCAL, {"ssh": "root@127.0.0.1:2222", **files, **entry}]}


def test_a_cluster_entry_is_read_with_its_files(files: dict[str, str]) -> None:
    spec = parse_cluster(_raw(files))

    assert spec is not None
    local, far = spec.servers
    assert local.local and not far.local
    assert (far.user, far.host, far.port, far.key) == ("root", "127.0.0.1", 2222, files["key"])
    assert parse_cluster(spec.to_dict()) == spec
    argv = ssh_argv(far, Path("/tmp/x"))
    assert argv[argv.index("-i") + 1] == files["key"] and "StrictHostKeyChecking=yes" in argv
    assert f"UserKnownHostsFile={files['known_hosts']}" in argv and "IdentitiesOnly=yes" in argv
    assert argv[argv.index("-F") + 1] == "/dev/null", "no ssh_config adds identities, forwardings or proxies"


@pytest.mark.parametrize(("change", "message"), [
    ({"ssh": "root@0.0.0.0"}, "not a server's address"),
    ({"ssh": "root:secret@127.0.0.1"}, "user@ip"),
    ({"ssh": "root@example.org"}, "user@ip"),
    ({"ssh": "root@127.0.0.1:70000"}, "out of range"),
    ({"key": "/nonexistent/key"}, "not a readable file"),
    ({"password": "x"}, "unknown key 'password'"),
])
def test_a_bad_server_entry_is_refused(files: dict[str, str], change: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cluster(_raw(files, **change))


def test_a_key_path_ssh_would_split_is_refused(tmp_path: Path, files: dict[str, str]) -> None:
    spaced = tmp_path / "my key"
    spaced.write_text("x\n")
    with pytest.raises(ConfigError, match="spaces, quotes or '%'"):
        parse_cluster(_raw(files, key=str(spaced)))


def test_the_cluster_needs_localhost_first_and_distinct_servers(files: dict[str, str]) -> None:
    far = {"ssh": "root@127.0.0.1:2222", **files}
    with pytest.raises(ConfigError, match="must be localhost"):
        parse_cluster({"servers": [far, LOCAL]})
    with pytest.raises(ConfigError, match="at least two"):
        parse_cluster({"servers": [LOCAL]})
    with pytest.raises(ConfigError, match="given twice"):
        parse_cluster({"servers": [LOCAL, far, far]})
    missing = {"ssh": "root@127.0.0.1:2222", "key": files["key"]}
    with pytest.raises(ConfigError, match="known_hosts is required"):
        parse_cluster({"servers": [LOCAL, missing]})


def test_an_experiment_config_takes_a_cluster_and_runs_it_with_the_process_backend(files: dict[str, str]) -> None:
    cfg = parse_config({"name": "x", "emulation": {"cluster": _raw(files)}})

    assert cfg.emulation.backend == "process" and cfg.emulation.cluster is not None
    assert parse_config(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="not docker"):
        parse_config({"name": "x", "emulation": {"backend": "docker", "cluster": _raw(files)}})
    with pytest.raises(ConfigError, match="needs engine: emulation"):
        parse_config({"name": "x", "engine": "simulation", "emulation": {"cluster": _raw(files)}})
    assert "cluster" not in parse_config({"name": "x"}).to_dict()["emulation"]


def test_placement_keeps_the_heavy_links_inside_a_server(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(TWO_TRIANGLES)
    plan = EmulationPlan.from_model(load(path))

    placement = place_sites(plan, [LOCAL, "far"])
    report = placement_report(plan, placement, [LOCAL, "far"])

    assert sorted(map(sorted, report.servers.values())) == [["A1", "A2", "A3"], ["B1", "B2", "B3"]]
    assert sorted(map(sorted, report.cut)) == [["A1", "B1"], ["A3", "B3"]], "only the two light links are cut"
    assert report.cut_mbps == pytest.approx(2 * min(ln.emulated_mbps for ln in plan.links))


@pytest.mark.parametrize("servers", [2, 3, 4])
def test_placement_places_every_site_once_in_even_shares(servers: int) -> None:
    plan = EmulationPlan.from_model(load("sndlib/germany50"))
    names = [LOCAL, *(f"s{i}" for i in range(1, servers))]

    placement = place_sites(plan, names)

    sizes = [list(placement.values()).count(n) for n in names]
    assert set(placement) == {sw.site for sw in plan.switches}
    assert max(sizes) - min(sizes) <= 1, sizes
    assert place_sites(plan, names) == placement, "deterministic"


def test_a_command_sent_over_ssh_is_split_back_exactly_with_the_run_mark() -> None:
    awkward = ["python", "-c", "print(1)", "$(touch pwned);", "a b", "'quoted'", "São Paulo"]
    env = {"PYTHONPATH": "/p q", "HOME": "/root", "NETAI_X": "1", "BAD NAME": "x"}

    line = remote_command(awkward, run_id="r1", env=env, cwd="/work dir")
    argv = shlex.split(line)

    assert argv[:3] == ["env", "-C", "/work dir"]
    assert argv[-len(awkward):] == awkward
    assigned = dict(a.split("=", 1) for a in argv[3:-len(awkward)])
    assert assigned["NETAI_RUN"] == "r1" and assigned["PYTHONPATH"] == "/p q" and assigned["NETAI_X"] == "1"
    assert "BAD NAME" not in assigned
    assert shlex.split(remote_command(["true"], run_id="r1", sudo=True))[:3] == ["sudo", "-n", "-E"], "never a prompt"
