"""A far server's run folder brought back at the end (`orchestrator.runtime.far_servers.unpack_tree`):
every member validated before anything is written."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from orchestrator.runtime import far_servers
from orchestrator.runtime.far_servers import unpack_tree


def archive(*members: tuple[str, bytes | None, bytes]) -> bytes:
    """A tar of (name, file content or None for a folder, type) members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def test_a_run_folder_comes_back_file_for_file(tmp_path: Path) -> None:
    events = b'{"event": "ready", "t": 5.0}\n'
    data = archive((".", None, tarfile.DIRTYPE), ("./workers", None, tarfile.DIRTYPE),
                   ("./workers/tasks/t1/r2.events.jsonl", events, tarfile.REGTYPE),
                   ("./ctl", None, tarfile.DIRTYPE))

    written = unpack_tree(data, tmp_path / "far" / "m1")

    assert written == [tmp_path / "far" / "m1" / "workers" / "tasks" / "t1" / "r2.events.jsonl"]
    assert written[0].read_bytes() == events
    assert (tmp_path / "far" / "m1" / "ctl").is_dir()


@pytest.mark.parametrize("member", [
    ("../escape.txt", b"x", tarfile.REGTYPE),
    ("./a/../../escape.txt", b"x", tarfile.REGTYPE),
    ("/etc/escape.txt", b"x", tarfile.REGTYPE),
    ("./link", None, tarfile.SYMTYPE),
    ("./fifo", None, tarfile.FIFOTYPE),
], ids=["parent", "nested parent", "absolute", "symlink", "fifo"])
def test_a_member_that_could_leave_the_folder_refuses_the_whole_archive(tmp_path: Path,
                                                                         member: tuple[str, bytes | None, bytes]) -> None:
    data = archive(("./ok.txt", b"fine", tarfile.REGTYPE), member)

    with pytest.raises(ValueError, match="refused archive member"):
        unpack_tree(data, tmp_path / "dest")
    assert not (tmp_path / "dest").exists(), "nothing written before every member was checked"
    assert not (tmp_path / "escape.txt").exists()


def test_an_archive_over_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(far_servers, "MAX_FETCH_BYTES", 1000)
    data = archive(("./big.bin", b"0" * 4000, tarfile.REGTYPE))

    with pytest.raises(ValueError, match="more than 1000"):
        unpack_tree(data, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
