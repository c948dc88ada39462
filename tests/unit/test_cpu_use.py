"""Where the host's CPU went, by component, from a fake /proc (`orchestrator.emulation.cpu_use`)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.emulation.cpu_use import CLK_TCK, CpuAccount, classify, host_busy, host_ticks

BOOT_TICKS = 100_000


def _proc(root: Path, pid: int, comm: str, cmdline: str, ticks: int, start: int) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    rest = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 6 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode())


def _host(root: Path, busy: int, softirq: int) -> None:
    # user nice system idle iowait irq softirq steal
    (root / "stat").write_text(f"cpu  {busy - softirq} 0 0 500000 0 0 {softirq} 0 0 0\n")
    (root / "uptime").write_text(f"{BOOT_TICKS / CLK_TCK:.2f} 0.0\n")


def test_each_process_is_counted_in_its_component_from_the_accounts_start(tmp_path: Path) -> None:
    _host(tmp_path, busy=1000, softirq=100)
    _proc(tmp_path, 10, "python3", "python -m workers.site_server --site A", 500, start=10)  # before the account
    _proc(tmp_path, 11, "ovs-vswitchd", "ovs-vswitchd unix:...", 7000, start=5)
    _proc(tmp_path, 12, "bash", "bash", 900, start=5)
    account = CpuAccount("run", proc=tmp_path, own_pid=99)
    _proc(tmp_path, 10, "python3", "python -m workers.site_server --site A", 500 + 2 * CLK_TCK, start=10)
    _proc(tmp_path, 11, "ovs-vswitchd", "ovs-vswitchd unix:...", 7000 + CLK_TCK, start=5)
    _proc(tmp_path, 13, "iperf3", "iperf3 -c 10.0.0.2", CLK_TCK // 2, start=BOOT_TICKS + 10)  # started later: whole
    _proc(tmp_path, 12, "bash", "bash", 900 + 3 * CLK_TCK, start=5)  # not the run's: in "other"
    _host(tmp_path, busy=1000 + 8 * CLK_TCK, softirq=100 + CLK_TCK)
    account.sample()

    got = account.seconds()

    assert got["site servers"] == 2.0 and got["switches"] == 1.0 and got["background"] == 0.5
    assert got["kernel forwarding"] == 1.0
    assert got["other"] == 8.0 - 2.0 - 1.0 - 0.5 - 1.0  # the host's busy time not named
    assert account.environment()["cpu_s_site_servers"] == 2.0


def test_a_pid_reused_by_a_new_process_starts_from_zero(tmp_path: Path) -> None:
    _host(tmp_path, busy=0, softirq=0)
    _proc(tmp_path, 20, "iperf3", "iperf3 -s", 5 * CLK_TCK, start=BOOT_TICKS + 1)
    account = CpuAccount("run", proc=tmp_path, own_pid=99)
    _proc(tmp_path, 20, "iperf3", "iperf3 -s", CLK_TCK, start=BOOT_TICKS + 50)  # another process, same pid
    account.sample()
    assert account.seconds()["background"] == 5.0 + 1.0


def test_what_each_command_is() -> None:
    assert classify("python3", "python -m workers.forkserver --socket x") == "site servers"
    assert classify("tc", "tc -batch -") == "controller"
    assert classify("python3", "/venv/bin/python /venv/bin/osken-manager controller.app") == "controller"
    assert classify("sshd", "sshd: root") is None


def test_the_hosts_busy_share_counts_every_cpu_state_but_idle_and_iowait(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice (guest time is inside user's)
    (tmp_path / "stat").write_text("cpu  100 10 50 700 40 5 20 3 99 99\ncpu0 1 1 1 1 1 1 1 1 0 0\n")

    assert host_busy(tmp_path) == (188, 928)
    assert host_ticks(tmp_path) == (188, 20)
    assert host_busy(tmp_path / "missing") is None
