"""The site containers' CPU group (`orchestrator.runtime.site_cgroup`) on a fake cgroup tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime.site_cgroup import GROUP, V1_SHARES_MAX, V2_WEIGHT_MAX, for_daemon, group_shares


class _Daemon:
    def __init__(self, **info: Any) -> None:
        self._info = info

    def info(self) -> dict[str, Any]:
        return self._info


def _v1(tmp: Path) -> Path:
    for ctrl in ("cpu", "memory", "pids"):
        (tmp / ctrl).mkdir()
    return tmp


def test_the_groups_weight_is_its_sites_cores_in_processes() -> None:
    assert group_shares(14, 1) == 14 * 1024
    assert group_shares(0.5, 1) == 1024  # at least one process
    assert group_shares(14, 2) == 1400
    assert group_shares(10_000, 1) == V1_SHARES_MAX
    assert group_shares(10_000, 2) == V2_WEIGHT_MAX


def test_v1_containers_join_the_group_and_it_goes_with_them(tmp_path: Path) -> None:
    root = _v1(tmp_path)
    group = for_daemon(_Daemon(CgroupDriver="cgroupfs", CgroupVersion="1"), local=True, root=root)
    assert group.join(1.0) == f"/{GROUP}"
    assert group.join(None) == f"/{GROUP}"  # no limit: one core
    assert group.join(2.0) == f"/{GROUP}"
    assert (root / "cpu" / GROUP / "cpu.shares").read_text() == str(4 * 1024)
    assert "cpu.shares 4096 for 4 cores" in group.describe()
    (root / "memory" / GROUP).mkdir()  # docker makes it in every hierarchy
    (root / "cpu" / GROUP / "cpu.shares").unlink()  # a real cgroup's files go with its rmdir; a fake's do not
    group.remove()
    assert not any((root / c / GROUP).exists() for c in ("cpu", "memory", "pids"))


def test_v2_enables_the_controllers_its_containers_need(tmp_path: Path) -> None:
    group = for_daemon(_Daemon(CgroupDriver="cgroupfs", CgroupVersion="2"), local=True, root=tmp_path)
    assert group.join(3.0) == f"/{GROUP}"
    assert (tmp_path / GROUP / "cpu.weight").read_text() == "300"
    assert "+cpu" in (tmp_path / GROUP / "cgroup.subtree_control").read_text()


@pytest.mark.parametrize(("info", "local", "why"), [
    ({"CgroupDriver": "systemd", "CgroupVersion": "2"}, True, "the systemd cgroup driver"),
    ({"CgroupDriver": "cgroupfs", "CgroupVersion": "1"}, False, "a daemon on another machine"),
])
def test_where_the_group_cannot_be_used_the_containers_stay_put_and_the_run_says_why(
        tmp_path: Path, info: dict[str, str], local: bool, why: str) -> None:
    group = for_daemon(_Daemon(**info), local=local, root=_v1(tmp_path))
    assert group.join(1.0) is None
    assert why in group.describe()
    assert not (tmp_path / "cpu" / GROUP).exists()


def test_a_group_that_cannot_be_written_is_given_up_not_fatal(tmp_path: Path) -> None:
    root = _v1(tmp_path)
    group = for_daemon(_Daemon(CgroupDriver="cgroupfs", CgroupVersion="1"), local=True, root=root)
    (root / "cpu" / GROUP).mkdir()
    (root / "cpu" / GROUP / "cpu.shares").mkdir()  # writing it fails
    assert group.join(1.0) is None
    assert "could not be set" in group.describe()
