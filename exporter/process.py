"""The process_* series every Prometheus client exports (client_python's ProcessCollector:
the same names, help and values), read without importing prometheus_client, which would
cost 7 MB of memory for six numbers, and from the cheapest sources: times(2) and getrlimit(2)
rather than parsing /proc/self/stat and /proc/self/limits on every scrape."""

from __future__ import annotations

import os
import resource

from exporter.exposition import Family

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _start_time() -> float:
    """Seconds since the epoch when this process started: boot time + its start in ticks."""
    try:
        with open("/proc/stat", "rb") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime "))
        with open("/proc/self/stat", "rb") as f:
            return boot + float(f.read().rpartition(b")")[2].split()[19]) / TICKS
    except (OSError, StopIteration, IndexError, ValueError):
        return 0.0


class ProcessMetrics:
    def __init__(self) -> None:
        self._start_time = _start_time()

    def families(self) -> list[Family]:
        """None of them on a system without /proc, as client_python does."""
        try:
            fd = os.open("/proc/self/statm", os.O_RDONLY)
            try:
                size, resident = os.read(fd, 4096).split()[:2]
            finally:
                os.close(fd)
            # Linux 6.2 and later give the count as the folder's size: no listing of the
            # few hundred sysfs files the exporter keeps open (exporter/root.py).
            open_fds = os.stat("/proc/self/fd").st_size or len(os.listdir("/proc/self/fd"))
        except (OSError, ValueError):
            return []
        cpu = os.times()
        max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        out = [self._gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", float(size) * PAGE),
               self._gauge("process_resident_memory_bytes", "Resident memory size in bytes.", float(resident) * PAGE),
               self._gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                           self._start_time),
               Family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
                      (), [(None, (), cpu.user + cpu.system)]),
               self._gauge("process_open_fds", "Number of open file descriptors.", float(open_fds))]
        if max_fds != resource.RLIM_INFINITY:
            out.append(self._gauge("process_max_fds", "Maximum number of open file descriptors.", float(max_fds)))
        return out

    @staticmethod
    def _gauge(name: str, help_: str, value: float) -> Family:
        return Family(name, "gauge", help_, (), [(None, (), value)])
