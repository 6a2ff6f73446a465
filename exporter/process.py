"""The process_* series every Prometheus client exports (client_python's ProcessCollector:
the same names, help and values), read from /proc/self without importing prometheus_client,
which would cost 7 MB of memory for six numbers."""

from __future__ import annotations

import os

from exporter.exposition import Family

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _boot_time() -> float:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


class ProcessMetrics:
    def __init__(self) -> None:
        self._boot_time = _boot_time()

    def families(self) -> list[Family]:
        """None of them on a system without /proc, as client_python does."""
        try:
            with open("/proc/self/stat", "rb") as f:
                parts = f.read().rpartition(b")")[2].split()
            with open("/proc/self/limits", "rb") as f:
                max_fds = next((float(line.split()[3]) for line in f if line.startswith(b"Max open files")), None)
            open_fds = len(os.listdir("/proc/self/fd"))
        except (OSError, IndexError, ValueError):
            return []
        out = [self._gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", float(parts[20])),
               self._gauge("process_resident_memory_bytes", "Resident memory size in bytes.", float(parts[21]) * PAGE),
               self._gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                           float(parts[19]) / TICKS + self._boot_time),
               Family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
                      [("process_cpu_seconds_total", (), (), (float(parts[11]) + float(parts[12])) / TICKS)]),
               self._gauge("process_open_fds", "Number of open file descriptors.", float(open_fds))]
        if max_fds is not None:
            out.append(self._gauge("process_max_fds", "Maximum number of open file descriptors.", max_fds))
        return out

    @staticmethod
    def _gauge(name: str, help_: str, value: float) -> Family:
        return Family(name, "gauge", help_, [(name, (), (), value)])
