"""bench/cpu.py: the /proc parsing, and a meter over a fake /proc tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bench import cpu

# A real line's shape: comm with a space and a parenthesis, 52 fields.
STAT = (
    "4242 (herald (run) x) S 4200 4242 4242 0 -1 4194560 12345 0 0 0 "
    "1500 300 7 9 20 0 3 0 987654 123456789 4567 18446744073709551615 "
    "1 1 0 0 0 0 0 16781312 16386 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0"
)


def test_parse_stat_reads_times_after_the_last_parenthesis() -> None:
    st = cpu.parse_stat(STAT)
    assert st.pid == 4242
    assert st.comm == "herald (run) x"
    assert st.ppid == 4200
    assert (st.utime, st.stime, st.ticks) == (1500, 300, 1800)
    assert st.starttime == 987654


def test_parse_stat_of_this_process() -> None:
    text = Path(f"/proc/{os.getpid()}/stat").read_text()
    st = cpu.parse_stat(text)
    assert st.pid == os.getpid()
    assert st.ppid == os.getppid()
    assert st.ticks >= 0


@pytest.mark.parametrize(
    "text",
    ["", "4242 herald S 1 2 3", "4242 (herald) S 1 2 3", "x (herald) " + " ".join(["1"] * 50)],
)
def test_parse_stat_rejects_what_the_kernel_does_not_write(text: str) -> None:
    with pytest.raises(cpu.ProcParseError):
        cpu.parse_stat(text)


def test_parse_children() -> None:
    assert cpu.parse_children("12 34 \n") == [12, 34]
    assert cpu.parse_children("") == []
    with pytest.raises(cpu.ProcParseError):
        cpu.parse_children("12 x")


def test_parse_system_busy_leaves_out_idle_and_iowait() -> None:
    text = "cpu  100 5 50 1000 20 3 2 7 40 0\ncpu0 50 2 25 500 10 1 1 3 20 0\nintr 1 2\n"
    busy, total = cpu.parse_system_busy(text)
    assert total == 100 + 5 + 50 + 1000 + 20 + 3 + 2 + 7  # guest is inside user
    assert busy == total - 1000 - 20
    with pytest.raises(cpu.ProcParseError):
        cpu.parse_system_busy("cpu0 1 2 3 4\n")


def _fake_stat(proc: Path, pid: int, ppid: int, utime: int, stime: int, start: int) -> None:
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 6 + [str(start)]
    fields += ["0"] * 30
    (proc / str(pid)).mkdir(exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} (p{pid}) {' '.join(fields)}\n")


def _fake_proc(tmp_path: Path, busy: int, uptime_s: float) -> Path:
    (tmp_path / "stat").write_text(f"cpu  {busy} 0 0 1000 0 0 0 0 0 0\n")
    (tmp_path / "uptime").write_text(f"{uptime_s} 1.0\n")
    return tmp_path


def test_children_from_the_task_files_and_by_scan(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, 0, 10.0)
    _fake_stat(proc, 10, 1, 0, 0, 0)
    _fake_stat(proc, 11, 10, 0, 0, 0)
    _fake_stat(proc, 12, 10, 0, 0, 0)
    (proc / "10" / "task" / "10").mkdir(parents=True)
    (proc / "10" / "task" / "13").mkdir()
    assert cpu.children(10, proc) == [11, 12]  # no children files: scanned by ppid
    (proc / "10" / "task" / "10" / "children").write_text("12 ")
    (proc / "10" / "task" / "13" / "children").write_text("11 ")
    assert cpu.children(10, proc) == [11, 12]
    assert cpu.children(99, proc) == []


def test_meter_counts_the_phase_only_and_processes_that_come_and_go(tmp_path: Path) -> None:
    tck = cpu.clock_ticks()
    proc = _fake_proc(tmp_path, busy=500, uptime_s=100.0)
    _fake_stat(proc, 10, 1, utime=400, stime=100, start=0)  # the daemon, 500 ticks at start
    _fake_stat(proc, 11, 10, utime=50, stime=0, start=5)  # a child already there
    _fake_stat(proc, 20, 1, utime=7, stime=0, start=0)  # a backend, exits mid-phase
    backends = {20}
    meter = cpu.CpuMeter(
        {
            "daemon": cpu.only(10),
            "workers": cpu.kids(10, proc),
            "pg": lambda: sorted(backends),
        },
        proc,
    )
    meter.start()
    _fake_stat(proc, 20, 1, utime=17, stime=0, start=0)
    # a backend opened during the phase (started after it began): all its time counts
    _fake_stat(proc, 21, 1, utime=30, stime=0, start=100 * tck + 1)
    # one that ran before the phase and is only found now: counts from now
    _fake_stat(proc, 22, 1, utime=1000, stime=0, start=0)
    backends |= {21, 22}
    meter.sample()
    for name in ("20", "21", "22"):
        (proc / name / "stat").unlink()  # exited: their last sample stands
        (proc / name).rmdir()
    _fake_stat(proc, 10, 1, utime=600, stime=200, start=0)
    _fake_stat(proc, 11, 10, utime=150, stime=0, start=5)
    _fake_stat(proc, 12, 10, utime=40, stime=10, start=100 * tck + 5)  # a new child
    (proc / "stat").write_text("cpu  900 0 0 1000 0 0 0 0 0 0\n")
    spent = meter.stop()
    assert spent == pytest.approx(
        {"daemon": 300 / tck, "workers": (100 + 50) / tck, "pg": (10 + 30 + 0) / tck}
    )
    assert meter.machine_busy_s == pytest.approx(400 / tck)
    assert meter.pids("workers") == [11, 12]
    assert meter.lifetime()["daemon"] == pytest.approx(800 / tck)
    phase = cpu.Phase(1000, 2.0, spent, meter.machine_busy_s)
    assert phase.us("daemon") == round(300 / tck * 1e6 / 1000, 1)
    assert phase.us("daemon", "workers") == round(450 / tck * 1e6 / 1000, 1)
    assert phase.us("missing") == 0.0
    assert cpu.per_item_us(1.0, 0) == 0.0


def test_cpu_seconds_of_this_process_grows() -> None:
    before = cpu.cpu_seconds(os.getpid())
    deadline = before + 0.05
    for _ in range(200_000):  # bounded: a few seconds at most
        if cpu.cpu_seconds(os.getpid()) >= deadline:
            break
        sum(range(1000))
    assert cpu.cpu_seconds(os.getpid()) > before
    assert cpu.cpu_seconds(2**22 + 12345) == 0.0  # no such process


def test_parse_schedstat() -> None:
    assert cpu.parse_schedstat("1234 567 89\n") == (1234, 567)
    for bad in ("", "12", "x 1 2"):
        with pytest.raises(cpu.ProcParseError):
            cpu.parse_schedstat(bad)


def _fake_waits(proc: Path, pid: int, **waits: int) -> None:
    """Threads ``t<TID>=ns waited`` of ``pid`` (its stat written separately)."""
    for name, ns in waits.items():
        task = proc / str(pid) / "task" / name.removeprefix("t")
        task.mkdir(parents=True, exist_ok=True)
        (task / "schedstat").write_text(f"{ns * 3} {ns} 7\n")


def test_meter_sums_the_threads_wait_for_a_cpu_over_the_phase(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, busy=0, uptime_s=100.0)
    tck = cpu.clock_ticks()
    _fake_stat(proc, 10, 1, utime=0, stime=0, start=0)
    _fake_waits(proc, 10, t10=1_000_000_000, t11=500_000_000)
    _fake_stat(proc, 20, 1, utime=0, stime=0, start=0)  # no schedstat: counts nothing
    daemon = [10]
    meter = cpu.CpuMeter({"daemon": lambda: daemon, "other": cpu.only(20)}, proc)
    meter.start()
    _fake_waits(proc, 10, t10=1_250_000_000, t11=750_000_000)
    # a process that started during the phase: all of its wait is the phase's
    _fake_stat(proc, 30, 10, utime=0, stime=0, start=100 * tck + 1)
    _fake_waits(proc, 30, t30=100_000_000)
    daemon.append(30)
    meter.sample()
    _fake_waits(proc, 10, t10=1_500_000_000, t11=750_000_000)
    meter.stop()
    assert meter.waits == pytest.approx({"daemon": 0.5 + 0.25 + 0.1, "other": 0.0})
    phase = cpu.Phase(100, 2.0, {}, 0.0, meter.waits)
    assert phase.waiting("daemon") == pytest.approx(0.425)
    assert phase.waiting("missing") == 0.0
    assert cpu.Phase(1, 0.0, {}, 0.0, meter.waits).waiting("daemon") == 0.0
    if Path(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat").exists():
        assert cpu.run_queue_wait_ns(os.getpid()) is not None
    assert cpu.run_queue_wait_ns(2**22 + 12345) is None
