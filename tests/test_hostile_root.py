"""A root whose files are hostile or broken: huge, endless (linked to /dev/zero), FIFOs that
never answer, symbolic links to themselves, counters that jump past what a link carries.
The exporter stays within its unit's memory (deploy/systemd: MemoryMax=128M), counts only
what could be true, and `snapshot` finishes with one line per file it skipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tracemalloc

import pytest
from conftest import FIXTURES
from procs import REPO, exporter_command, start_exporter, up, values, wait_for

from exporter.root import MAX_READ, READ_CHUNK, Root, TooBig, read_fd

MEMORY_MAX = 128 << 20  # the unit's MemoryMax
HUGE = 50_000_000
NET = "sys/class/net"


def node(tmp_path, name: str = "h100-8gpu"):
    root = tmp_path / "node"
    shutil.copytree(FIXTURES / name, root)  # links into roce-mlx5 copied as files
    return root


def replace(path, make) -> None:
    """Put `make(path)` (which writes a file, a link or a FIFO at the path it is given) in
    place of what is there."""
    path.unlink()
    make(path)


def ticks(v: dict, tick: str) -> float:
    return v.get(("gpunet_exporter_ticks_total", (("tick", tick),)), 0.0)


def peak_rss(pid: int) -> int:
    """VmHWM: the most the process ever held in memory, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


# --- memory -----------------------------------------------------------------------------------

def test_memory_stays_within_the_unit_whatever_the_files_hold(tmp_path):
    """Each file refused by the read cap (or parsed within it) costs about what the cap holds,
    not what the file holds: before, a 50 MB attribute or ethtool file took the exporter to
    430 MB, /dev/zero to 606 MB, a 50 MB nvml.json to 131 MB."""
    root = node(tmp_path)
    replace(root / NET / "ens1f0np0/statistics/tx_bytes", lambda p: p.write_bytes(b"7" * HUGE))
    replace(root / NET / "ens1f1np1/statistics/rx_bytes", lambda p: p.symlink_to("/dev/zero"))
    replace(root / "ethtool/ens1f0np0.txt", lambda p: p.write_bytes(b"     rx_bytes_phy: 1\n" * (HUGE // 21)))
    replace(root / "ethtool/ens1f1np1.txt", lambda p: p.symlink_to("/dev/zero"))
    doc = json.loads((root / "nvml.json").read_text())
    replace(root / "nvml.json", lambda p: p.write_text(json.dumps({**doc, "pad": "x" * HUGE})))
    # Within the cap, what parses into the most: garbage pairs of lines and a list of empty objects.
    replace(root / "proc/net/snmp", lambda p: p.write_bytes(b"Tcp: a\nTcp: \n" * (MAX_READ // 14)))
    replace(root / "dcb/ens1f0np0.pfc.json", lambda p: p.write_text("[" + "{}," * (MAX_READ // 3 - 1) + "{}]"))
    proc, url = start_exporter(tmp_path, "--root", str(root), "--fast-interval", "0.05", "--slow-interval", "0.1",
                               "--config-interval", "0.1", "--slow-read", "every-tick")
    try:
        first = wait_for(lambda: (v := values(url)) and ticks(v, "slow") >= 2 and v, what="the first ticks")
        wait_for(lambda: ticks(v := values(url), "slow") >= ticks(first, "slow") + 30
                 and ticks(v, "fast") >= ticks(first, "fast") + 60, timeout=60, what="many more ticks")
        peak = peak_rss(proc.pid)
        log = proc.log()
    finally:
        proc.stop()
    assert peak < MEMORY_MAX, f"peak RSS {peak >> 20} MB"
    for rel in (f"{NET}/ens1f0np0/statistics/tx_bytes", f"{NET}/ens1f1np1/statistics/rx_bytes",
                "ethtool/ens1f0np0.txt", "ethtool/ens1f1np1.txt", "nvml.json"):
        assert f"{root / rel}: holds over 1 MiB: not read" in log, rel
    assert "Traceback" not in log


def test_a_read_takes_at_most_the_cap_of_an_endless_file(tmp_path):
    """/dev/zero through a counter's link: MAX_READ + 1 bytes read, in chunks, and let go."""
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys/tx_bytes").symlink_to("/dev/zero")
    tracemalloc.start()
    try:
        with pytest.raises(TooBig, match="holds over 1 MiB"):
            Root(tmp_path).read_int("sys/tx_bytes")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_READ + 4 * READ_CHUNK, peak


def test_a_regular_file_over_the_cap_is_refused_by_its_size_after_one_chunk(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"1" * (MAX_READ + 10))
    fd = os.open(big, os.O_RDONLY)
    try:
        with pytest.raises(TooBig):
            read_fd(fd, str(big))
        assert os.lseek(fd, 0, os.SEEK_CUR) == READ_CHUNK
    finally:
        os.close(fd)
    big.write_bytes(b"1" * MAX_READ)  # the cap itself is read
    assert len(Root(tmp_path).read_text("big")) == MAX_READ


# --- a counter that jumps past what its link carries -------------------------------------------

def write_atomically(path, text: str) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def series(v: dict, name: str, device: str) -> float | None:
    return v.get((name, (("device", device),)))


@pytest.mark.parametrize("device, rel, line, metrics, collectors", [
    # eno1 (igb) is read from the kernel's statistics, on the wire and by the netdev collector.
    ("eno1", f"{NET}/eno1/statistics/tx_bytes", None,
     ("gpunet_nic_transmit_bytes_total", "gpunet_nic_netdev_transmit_bytes_total"), ("wire", "netdev")),
    # ens1f0np0 (mlx5) from the driver's physical-port counter.
    ("ens1f0np0", "ethtool/ens1f0np0.txt", "tx_bytes_phy", ("gpunet_nic_transmit_bytes_total",), ("wire",)),
])
def test_one_absurd_reading_is_not_counted(tmp_path, device, rel, line, metrics, collectors):
    """The source holds 1e25 for a while, then its real value again: the counter stood still
    meanwhile and goes on from where it was, with one warning per collector that names the
    file and the value (before, it stayed at about 1e25 until a restart)."""
    root = node(tmp_path, "roce-mlx5")
    path = root / rel
    original = path.read_text()

    def holding(value: int) -> str:
        if line is None:
            return f"{value}\n"
        return "".join(f"     {line}: {value}\n" if row.strip().startswith(f"{line}:") else row
                       for row in original.splitlines(keepends=True))

    real = int(original) if line is None else next(int(r.split(":")[1]) for r in original.splitlines()
                                                    if r.strip().startswith(f"{line}:"))
    proc, url = start_exporter(tmp_path, "--root", str(root), "--no-gpu", "--fast-interval", "0.1",
                               "--slow-interval", "0.2", "--slow-read", "every-tick")
    try:
        wait_for(lambda: all(series(values(url), m, device) == real for m in metrics), what="the real value")
        write_atomically(path, holding(10**25))
        wait_for(lambda: all(up(values(url), c) == 0 for c in collectors), what="each collector to read it")
        assert all(series(values(url), m, device) == real for m in metrics)  # standing still meanwhile
        write_atomically(path, holding(real + 1000))
        wait_for(lambda: all(series(v := values(url), m, device) == real + 1000 for m in metrics)
                 and all(up(v, c) == 1 for c in collectors), what="the counter going on from its last value")
        log = proc.log()
    finally:
        proc.stop()
    # One warning, however many ticks and collectors read it (the sampler logs a problem once).
    warned = [line for line in log.splitlines() if "WARNING" in line]
    assert len(warned) == 1 and f"{path}" in warned[0], warned
    assert "read 1e+25, more than any 64-bit counter holds: not counted" in warned[0]


# --- snapshot ----------------------------------------------------------------------------------

def test_snapshot_skips_fifos_loops_and_endless_files_with_one_line_each(tmp_path):
    """FIFOs where a read would block (discovery's speed, the driver statistics, /proc), a
    symbolic link to itself, a counter linked to /dev/zero and a huge one: each is skipped
    with one line naming it, the rest is written, in seconds (before: still running at 30 s
    on a FIFO, a traceback on the loop)."""
    root = node(tmp_path, "roce-mlx5")
    fifos = ["ethtool/ens1f0np0.txt", f"{NET}/ens1f1np1/speed", "proc/net/snmp", f"{NET}/ens1f0np0/statistics/tx_bytes"]
    for rel in fifos:
        replace(root / rel, os.mkfifo)
    (root / NET / "loop0").symlink_to("loop0")
    replace(root / NET / "ens1f0np0/mtu", lambda p: p.symlink_to("/dev/zero"))
    replace(root / NET / "eno1/statistics/rx_bytes", lambda p: p.write_bytes(b"7" * HUGE))
    out = tmp_path / "snap"
    started = time.monotonic()
    result = subprocess.run(exporter_command("--root", str(root), "snapshot", str(out)), cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert took < 20, took  # two reads that hang, each set aside after its time limit
    skipped = [line for line in result.stderr.splitlines() if "snapshot: skipped" in line]
    hostile = [*fifos, f"{NET}/loop0", f"{NET}/ens1f0np0/mtu", f"{NET}/eno1/statistics/rx_bytes"]
    for rel in hostile:
        assert len([line for line in skipped if f"skipped {root / rel}:" in line]) == 1, (rel, skipped)
    assert len(skipped) == len(hostile), skipped
    assert (out / NET / "ens1f0np0/statistics/rx_bytes").read_text() == \
        (root / NET / "ens1f0np0/statistics/rx_bytes").read_text()


def test_snapshot_of_a_clean_node_skips_nothing(tmp_path):
    result = subprocess.run([sys.executable, "-m", "exporter", "--root", str(FIXTURES / "roce-mlx5"), "snapshot",
                             str(tmp_path / "snap")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "skipped" not in result.stderr, result.stderr
