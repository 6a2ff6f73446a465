#!/usr/bin/env python3
"""gpunet-exporter against prometheus-node-exporter, side by side on this machine.

    python bench/exporter_vs_node_exporter.py [--seconds 30] [--scrapes 1000] [--json]

gpunet-exporter runs over a fixture of an 8-port mlx5 RoCE node (bench/make_fixture.py,
a static snapshot: its counters do not advance) at its default ticks (fast 0.2 s, slow
1 s); node_exporter runs with its default collectors on the live machine. Each runs
alone, one after the other, on loopback, started and stopped here. For each:

  1. warm up (--warmup, 5 s);
  2. idle CPU: utime+stime of the process (all threads, /proc/PID/stat) over --seconds
     of wall time with no scrape at all: the cost of sampling by itself;
  3. scraped CPU: the same over --scraped-seconds while scraped once a second, as
     Prometheus would (0 skips it);
  4. latency: --scrapes sequential GET /metrics on one keep-alive connection, with the
     headers Prometheus 3 sends (Accept below, Accept-Encoding: gzip), timed from
     sending the request to the last byte of the body;
  5. memory: VmRSS at the end, VmHWM (peak RSS) over the whole run.

Then both run at once for --paired-windows windows of --paired-seconds, each scraped once a
second, half a second apart, and the CPU of each is measured over the same window: the
ratio of one such window does not depend on what else the machine did in the minute
between two runs. The median of those ratios is checked against the target too.

Last (--floor-seconds, 20 s), a bare Python thread that only wakes every 0.2 s, as gpunet's
fast lane does: what waking up costs on this machine at the time of the run, which on a VM
changes from hour to hour and weighs on every figure above.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import platform
import queue
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import make_fixture  # noqa: E402

# What Prometheus 3.x sends by default (scrape_protocols OpenMetricsText1.0.0,
# OpenMetricsText0.0.1, PrometheusText1.0.0, PrometheusText0.0.4; UTF-8 names allowed):
# scrape/scrape.go acceptHeader(), config.ScrapeProtocolsHeaders.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                     "application/openmetrics-text;version=0.0.1;q=0.4,"
                     "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
                     "text/plain;version=0.0.4;q=0.2,*/*;q=0.1")
# Prometheus 2.x (2.49+) default, for --accept prom2.
PROMETHEUS2_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,"
                      "application/openmetrics-text;version=0.0.1;q=0.4,"
                      "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
ACCEPTS = {"prom3": PROMETHEUS_ACCEPT, "prom2": PROMETHEUS2_ACCEPT, "text": "text/plain;version=0.0.4"}

NODE_EXPORTER_NAMES = ("/usr/bin/prometheus-node-exporter", "prometheus-node-exporter", "node_exporter")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# Targets (gpunet).
CPU_TARGET_PCT = 1.0
RSS_TARGET_MB = 40.0  # 10^6 bytes (issue 17; it was 60)
CPU_RATIO_TARGET = 0.7  # scraped at 1 Hz, against node_exporter scraped the same way (issue 17; moonshot 0.5)


def wake_floor(interval: float, seconds: float) -> int:
    """CPU ns (schedstat, kernel time included) of a thread that only sleeps until its next
    tick, as a lane does, for `seconds`."""
    measured: list[int] = []

    def schedstat_ns() -> int:
        return int(Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()[0])

    def sleeper() -> None:
        wakes: queue.SimpleQueue[None] = queue.SimpleQueue()  # never put: each get times out, as a lane's
        deadline = time.monotonic()
        start = schedstat_ns()
        for _ in range(round(seconds / interval)):
            deadline += interval
            try:
                wakes.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                pass
        measured.append(schedstat_ns() - start)

    thread = threading.Thread(target=sleeper, name="floor")
    thread.start()
    thread.join()
    return measured[0]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- the process, from /proc ---------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime+stime of the whole process: /proc/PID/stat of the thread group leader sums
    every thread, living and exited (fields 14 and 15, in clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def runtime_ns(pid: int) -> int | None:
    """Sum over the living threads of /proc/PID/task/TID/schedstat (on-CPU ns): finer than
    clock ticks, blind to exited threads. A cross-check of cpu_seconds."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def threads(pid: int) -> int:
    return status_kb(pid, "Threads")


class CpuWindow:
    def __init__(self, pid: int):
        self.pid = pid
        self.t0, self.c0, self.n0 = time.monotonic(), cpu_seconds(pid), runtime_ns(pid)

    def result(self) -> dict:
        wall = time.monotonic() - self.t0
        cpu = cpu_seconds(self.pid) - self.c0
        n1 = runtime_ns(self.pid)
        out = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "cpu_pct": round(100 * cpu / wall, 3)}
        if self.n0 is not None and n1 is not None:
            out["cpu_pct_schedstat"] = round(100 * (n1 - self.n0) / 1e9 / wall, 3)
        return out


# --- HTTP ------------------------------------------------------------------------------------
class Scraper:
    def __init__(self, port: int, accept: str):
        self.port = port
        self.headers = {"Accept": accept, "Accept-Encoding": "gzip", "User-Agent": "Prometheus/3.4.0",
                        "X-Prometheus-Scrape-Timeout-Seconds": "10"}
        self.conn: http.client.HTTPConnection | None = None
        self.reconnects = 0

    def get(self) -> tuple[float, int, bytes, dict[str, str]]:
        """(seconds, status, raw body, headers) of one GET /metrics."""
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                self.conn.connect()
                self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.reconnects += 1
            try:
                t0 = time.perf_counter()
                self.conn.request("GET", "/metrics", headers=self.headers)
                resp = self.conn.getresponse()
                body = resp.read()
                dt = time.perf_counter() - t0
                if resp.will_close:
                    self.close()
                return dt, resp.status, body, {k.lower(): v for k, v in resp.getheaders()}
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def decode(body: bytes, headers: dict[str, str]) -> str:
    if headers.get("content-encoding") == "gzip":
        body = gzip.decompress(body)
    return body.decode("utf-8", "replace")


def count_samples(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, port: int, accept: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    scraper = Scraper(port, accept)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before serving")
        try:
            _, status, _, _ = scraper.get()
            if status == 200:
                scraper.close()
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"not serving on 127.0.0.1:{port} after {timeout:.0f} s")


# --- one exporter ----------------------------------------------------------------------------
def measure(name: str, argv: list[str], port: int, args: argparse.Namespace, stderr_path: Path) -> dict:
    accept = ACCEPTS[args.accept]
    log(f"{name}: starting {' '.join(argv)}")
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd=REPO,
                                start_new_session=True)
    result: dict = {"name": name, "command": argv, "pid": proc.pid}
    try:
        t_start = time.monotonic()
        wait_ready(proc, port, accept)
        result["startup_s"] = round(time.monotonic() - t_start, 3)
        log(f"{name}: serving after {result['startup_s']} s; warming up {args.warmup} s")
        time.sleep(args.warmup)

        log(f"{name}: idle CPU over {args.seconds} s (no scrapes)")
        window = CpuWindow(proc.pid)
        time.sleep(args.seconds)
        result["cpu_idle"] = window.result()
        result["rss_after_idle_kb"] = status_kb(proc.pid, "VmRSS")

        scraper = Scraper(port, accept)
        if args.scraped_seconds > 0:
            log(f"{name}: CPU over {args.scraped_seconds} s scraped once a second")
            window = CpuWindow(proc.pid)
            t_next = time.monotonic()
            end = t_next + args.scraped_seconds
            hz_lat = []
            while True:
                t_next += 1.0
                if t_next > end:
                    break
                hz_lat.append(scraper.get()[0])
                time.sleep(max(0.0, t_next - time.monotonic()))
            time.sleep(max(0.0, end - time.monotonic()))
            result["cpu_scraped_1hz"] = {**window.result(), "scrapes": len(hz_lat),
                                         "latency": latency_summary(hz_lat) if hz_lat else None}

        log(f"{name}: {args.scrapes} sequential scrapes")
        window = CpuWindow(proc.pid)
        latencies, statuses, sizes = [], {}, []
        first = last = None
        for _i in range(args.scrapes):
            dt, status, body, headers = scraper.get()
            latencies.append(dt)
            statuses[status] = statuses.get(status, 0) + 1
            sizes.append(len(body))
            if first is None:
                first = (body, headers)
            last = (body, headers)
        burst = window.result()
        body_text = decode(*last)
        result["scrape"] = latency_summary(latencies) | {
            "statuses": {str(k): v for k, v in statuses.items()},
            "content_type": last[1].get("content-type", ""), "content_encoding": last[1].get("content-encoding", ""),
            "body_bytes_wire": sizes[-1], "body_bytes_wire_mean": round(statistics.mean(sizes)),
            "body_bytes": len(body_text.encode()), "samples": count_samples(body_text),
            "cpu_during_burst": burst, "reconnects": scraper.reconnects,
        }
        if args.spaced_scrapes > 0:
            # Scrapes further apart than the fast tick: gpunet renders each one afresh (its
            # body is cached only until the next tick publishes), as under a real Prometheus.
            log(f"{name}: {args.spaced_scrapes} scrapes {args.spaced_interval} s apart")
            spaced = []
            for _i in range(args.spaced_scrapes):
                time.sleep(args.spaced_interval)
                spaced.append(scraper.get()[0])
            result["scrape_spaced"] = latency_summary(spaced) | {"interval_s": args.spaced_interval}
        scraper.close()
        result["rss_end_kb"] = status_kb(proc.pid, "VmRSS")
        result["hwm_kb"] = status_kb(proc.pid, "VmHWM")
        result["threads"] = threads(proc.pid)
        if name == "gpunet-exporter":
            result["self"] = gpunet_self_metrics(body_text)
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with status {proc.returncode} during the run")
    finally:
        stop(proc)
    return result


class Side(NamedTuple):
    """One exporter of a side-by-side run."""

    name: str
    argv: list[str]
    port: int
    cwd: Path = REPO
    env: dict[str, str] | None = None


def side_by_side(sides: list[Side], accept: str, warmup: float, windows: int, seconds: float, work: Path,
                 scrape_warmup: bool = False) -> list[list[float]]:
    """Every side at once, each scraped once a second (1/len(sides) of a second apart), and
    the CPU (% of a core) of each over the same windows: [[side 0, side 1, ...] per window].
    `scrape_warmup`: scraped through the warm-up too (gpunet then knows the scrapes' rhythm
    from the first window on)."""
    procs: list[subprocess.Popen] = []
    try:
        for side in sides:
            with open(work / f"side-{side.name}.log", "wb") as err:
                procs.append(subprocess.Popen(side.argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                              cwd=side.cwd, env=side.env, start_new_session=True))
            wait_ready(procs[-1], side.port, accept)
        scrapers = [Scraper(side.port, accept) for side in sides]

        def scrape_for(length: float) -> None:
            t_next = time.monotonic()
            end = t_next + length
            while t_next + 1.0 <= end:
                for i, scraper in enumerate(scrapers):
                    time.sleep(max(0.0, t_next + i / len(scrapers) - time.monotonic()))
                    scraper.get()
                t_next += 1.0
            time.sleep(max(0.0, end - time.monotonic()))

        if scrape_warmup:
            scrape_for(warmup)
        else:
            time.sleep(warmup)
        rows = []
        for _ in range(windows):
            cpu = [CpuWindow(p.pid) for p in procs]
            scrape_for(seconds)
            # On-CPU nanoseconds where the kernel gives them: a 30 s window at 1% is only 30 clock ticks.
            rows.append([r.get("cpu_pct_schedstat", r["cpu_pct"]) for r in (w.result() for w in cpu)])
        for scraper in scrapers:
            scraper.close()
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with status {p.returncode} during the windows")
        return rows
    finally:
        for p in procs:
            stop(p)


def paired(gpunet_argv: list[str], g_port: int, ne_argv: list[str], n_port: int, args: argparse.Namespace,
           work: Path) -> dict:
    """Both exporters at once, each scraped once a second (half a second apart), their CPU
    measured over the same windows: whatever else the machine does weighs on both alike, so
    the ratio of one window is steadier than that of two runs a minute apart."""
    log(f"paired: both running; warming up {args.warmup} s, then {args.paired_windows} windows of "
        f"{args.paired_seconds} s, both scraped once a second")
    rows = side_by_side([Side("gpunet-exporter", gpunet_argv, g_port), Side("node_exporter", ne_argv, n_port)],
                        ACCEPTS[args.accept], args.warmup, args.paired_windows, args.paired_seconds, work)
    windows = [{"gpunet_pct": g, "node_exporter_pct": n, "ratio": round(g / n, 3) if n > 0 else None}
               for g, n in rows]
    ratios = [w["ratio"] for w in windows if w["ratio"] is not None]
    return {"windows": windows, "median_ratio": round(statistics.median(ratios), 3) if ratios else None}


def latency_summary(latencies: list[float]) -> dict:
    lat = sorted(latencies)
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    return {"count": len(lat), "median_ms": round(1e3 * statistics.median(lat), 3), "p90_ms": round(1e3 * q[89], 3),
            "p99_ms": round(1e3 * q[98], 3), "max_ms": round(1e3 * lat[-1], 3), "min_ms": round(1e3 * lat[0], 3)}


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def gpunet_self_metrics(text: str) -> dict:
    """The exporter's own view: tick counts, late ticks, collector errors and durations."""
    out: dict = {"ticks": {}, "ticks_late": {}, "collector_errors": {}, "collector_duration_ms": {}}
    keys = {"gpunet_exporter_ticks_total": "ticks", "gpunet_exporter_ticks_late_total": "ticks_late",
            "gpunet_exporter_collector_errors_total": "collector_errors",
            "gpunet_exporter_collector_duration_seconds": "collector_duration_ms"}
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, _, rest = line.partition("{")
        key = keys.get(name)
        if key is None:
            continue
        label = rest.split('"')[1]
        value = float(rest.rpartition("}")[2].split()[0])
        out[key][label] = round(value * 1e3, 3) if key == "collector_duration_ms" else value
    return out


# --- report ----------------------------------------------------------------------------------
def machine() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version()}


# A fixed piece of pure-Python work (calls, tuples, dicts, floats, as the exporter's ticks
# do), timed in the interpreter that runs gpunet: which kind of CPython build it is. The
# container image's python:3.11-slim is built with PGO and LTO, a default pyenv build is
# not (the exporter's ticks cost a quarter more on it, the whole exporter an eighth). Best
# of 30 in each of 3 processes: on this VM one process of either build may run it at twice
# the time of the next, so the spread between processes is part of the answer.
INTERPRETER_PROBE = """
import time
def work():
    d = {}
    for i in range(50000):
        t = (i, str(i & 255), float(i))
        d[t[1]] = d.get(t[1], 0.0) + t[2]
    return d
best = min(((time.perf_counter(), work(), time.perf_counter()) for _ in range(30)), key=lambda r: r[2] - r[0])
print(round(1e3 * (best[2] - best[0]), 2))
"""
PROBE_PROCESSES = 3


def interpreter(python: str) -> dict:
    """Path, version and the probe's times (ms, best of 30, in each of PROBE_PROCESSES
    processes) of a Python, and whether it can run gpunet-exporter from this checkout (its
    dependencies installed)."""
    def run(code: str) -> str:
        return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                              check=True).stdout.strip()
    try:
        version = run("import platform; print(platform.python_implementation(), platform.python_version())")
        run("import aiohttp, exporter.cli")
        probe_ms = sorted(float(run(INTERPRETER_PROBE)) for _ in range(PROBE_PROCESSES))
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        lines = e.stderr.strip().splitlines() if isinstance(e, subprocess.CalledProcessError) and e.stderr else []
        detail = lines[-1] if lines else e
        raise RuntimeError(f"{python} cannot run gpunet-exporter from {REPO}: {detail} (make a venv with it and "
                           f"`pip install -e {REPO}`)") from None
    return {"path": python, "version": version, "probe_ms": probe_ms}


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine makes every figure noisier."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def verdicts(g: dict, n: dict, pairs: dict | None = None) -> list[tuple[str, str, bool]]:
    out = [(f"gpunet idle CPU < {CPU_TARGET_PCT:g}% of one core", f"{g['cpu_idle']['cpu_pct']:.2f}%",
            g["cpu_idle"]["cpu_pct"] < CPU_TARGET_PCT)]
    if "cpu_scraped_1hz" in g:
        out.append((f"gpunet CPU scraped at 1 Hz < {CPU_TARGET_PCT:g}% (informational)",
                    f"{g['cpu_scraped_1hz']['cpu_pct']:.2f}%", g["cpu_scraped_1hz"]["cpu_pct"] < CPU_TARGET_PCT))
    if "cpu_scraped_1hz" in g and "cpu_scraped_1hz" in n and n["cpu_scraped_1hz"]["cpu_pct"] > 0:
        ratio = g["cpu_scraped_1hz"]["cpu_pct"] / n["cpu_scraped_1hz"]["cpu_pct"]
        out.append((f"gpunet CPU scraped at 1 Hz <= {CPU_RATIO_TARGET:g}x node_exporter's",
                    f"{ratio:.2f}x ({g['cpu_scraped_1hz']['cpu_pct']:.2f}% vs {n['cpu_scraped_1hz']['cpu_pct']:.2f}%)",
                    ratio <= CPU_RATIO_TARGET))
    if pairs and pairs.get("median_ratio") is not None:
        shown = ", ".join(f"{w['ratio']:.2f}" for w in pairs["windows"] if w["ratio"] is not None)
        out.append((f"gpunet CPU scraped at 1 Hz <= {CPU_RATIO_TARGET:g}x node_exporter's, both at once "
                    f"(median of {len(pairs['windows'])} windows)", f"{pairs['median_ratio']:.2f}x ({shown})",
                    pairs["median_ratio"] <= CPU_RATIO_TARGET))
    out.append((f"gpunet RSS < {RSS_TARGET_MB:g} MB (end)", f"{g['rss_end_kb'] * 1024 / 1e6:.1f} MB",
                g["rss_end_kb"] * 1024 / 1e6 < RSS_TARGET_MB))
    out.append((f"gpunet peak RSS (VmHWM) < {RSS_TARGET_MB:g} MB", f"{g['hwm_kb'] * 1024 / 1e6:.1f} MB",
                g["hwm_kb"] * 1024 / 1e6 < RSS_TARGET_MB))
    out.append(("gpunet p99 scrape < node_exporter p99",
                f"{g['scrape']['p99_ms']:.2f} ms vs {n['scrape']['p99_ms']:.2f} ms",
                g["scrape"]["p99_ms"] < n["scrape"]["p99_ms"]))
    if "scrape_spaced" in g and "scrape_spaced" in n:
        out.append(("gpunet p99 < node_exporter p99, scrapes spaced past the fast tick (informational)",
                    f"{g['scrape_spaced']['p99_ms']:.2f} ms vs {n['scrape_spaced']['p99_ms']:.2f} ms",
                    g["scrape_spaced"]["p99_ms"] < n["scrape_spaced"]["p99_ms"]))
    return out


def table(report: dict) -> str:
    g, n = report["gpunet"], report["node_exporter"]
    mb = lambda kb: f"{kb * 1024 / 1e6:.1f}"  # noqa: E731
    rows = [
        ("", "gpunet-exporter", "node_exporter"),
        ("what it reads", f"fixture, {report['fixture']['ports']} mlx5 RoCE ports" if report["fixture"]["ports"]
         else "fixture given with --root", "live machine, default collectors"),
        ("startup to first /metrics (s)", f"{g['startup_s']:.2f}", f"{n['startup_s']:.2f}"),
        (f"CPU idle, no scrapes (% of a core, {report['args']['seconds']:g} s)",
         f"{g['cpu_idle']['cpu_pct']:.2f}", f"{n['cpu_idle']['cpu_pct']:.2f}"),
        ("  same, from schedstat ns", f"{g['cpu_idle'].get('cpu_pct_schedstat', float('nan')):.2f}",
         f"{n['cpu_idle'].get('cpu_pct_schedstat', float('nan')):.2f}"),
    ]
    if "cpu_scraped_1hz" in g:
        rows.append((f"CPU scraped at 1 Hz (% of a core, {report['args']['scraped_seconds']:g} s)",
                     f"{g['cpu_scraped_1hz']['cpu_pct']:.2f}", f"{n['cpu_scraped_1hz']['cpu_pct']:.2f}"))
    for i, w in enumerate(report.get("paired", {}).get("windows", []), 1):
        rows.append((f"CPU scraped at 1 Hz, both at once, window {i} (%, {report['args']['paired_seconds']:g} s)",
                     f"{w['gpunet_pct']:.2f}", f"{w['node_exporter_pct']:.2f}"))
    rows += [
        ("RSS at end (MB)", mb(g["rss_end_kb"]), mb(n["rss_end_kb"])),
        ("peak RSS, VmHWM (MB)", mb(g["hwm_kb"]), mb(n["hwm_kb"])),
        ("threads", str(g["threads"]), str(n["threads"])),
        (f"/metrics latency median (ms, {g['scrape']['count']} back-to-back)",
         f"{g['scrape']['median_ms']:.2f}", f"{n['scrape']['median_ms']:.2f}"),
        ("/metrics latency p90 (ms)", f"{g['scrape']['p90_ms']:.2f}", f"{n['scrape']['p90_ms']:.2f}"),
        ("/metrics latency p99 (ms)", f"{g['scrape']['p99_ms']:.2f}", f"{n['scrape']['p99_ms']:.2f}"),
        ("/metrics latency max (ms)", f"{g['scrape']['max_ms']:.2f}", f"{n['scrape']['max_ms']:.2f}"),
    ]
    if "scrape_spaced" in g and "scrape_spaced" in n:
        gs, ns = g["scrape_spaced"], n["scrape_spaced"]
        rows += [
            (f"latency, scrapes {gs['interval_s']:g} s apart: median (ms, {gs['count']})",
             f"{gs['median_ms']:.2f}", f"{ns['median_ms']:.2f}"),
            ("  p99 (ms)", f"{gs['p99_ms']:.2f}", f"{ns['p99_ms']:.2f}"),
            ("  max (ms)", f"{gs['max_ms']:.2f}", f"{ns['max_ms']:.2f}"),
        ]
    rows += [
        ("CPU during back-to-back scrapes (% of a core)", f"{g['scrape']['cpu_during_burst']['cpu_pct']:.1f}",
         f"{n['scrape']['cpu_during_burst']['cpu_pct']:.1f}"),
        ("samples per scrape", str(g["scrape"]["samples"]), str(n["scrape"]["samples"])),
        ("body bytes (uncompressed)", str(g["scrape"]["body_bytes"]), str(n["scrape"]["body_bytes"])),
        ("body bytes on the wire", f"{g['scrape']['body_bytes_wire']} ({g['scrape']['content_encoding'] or 'identity'})",
         f"{n['scrape']['body_bytes_wire']} ({n['scrape']['content_encoding'] or 'identity'})"),
        ("content type", g["scrape"]["content_type"].split(";")[0], n["scrape"]["content_type"].split(";")[0]),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    lines.insert(1, "-" * len(lines[0]))
    m = report["machine"]
    py, harness = report["gpunet_python"], report["harness_python"] or report["gpunet_python"]
    head = [f"machine: {m['nproc']} CPUs, {m['cpu_model']}, Linux {m['kernel']}, Python {m['python']}",
            f"gpunet-exporter's Python: {py['path']} ({py['version']}): a fixed pure-Python loop in "
            f"{probe_range(py)} ms"
            + ("" if harness["path"] == py["path"] else
               f" (this benchmark's own, {harness['path']}: {probe_range(harness)} ms)")
            + f" (best of 30, in each of {PROBE_PROCESSES} processes; lower is faster)",
            f"node_exporter: {report['node_exporter_version']}",
            "load average (1, 5, 15 min) at start / between the two / end: "
            + " / ".join(report["loadavg"].get(k, "?") for k in ("start", "between", "end")),
            *([f"the floor, at the end: a bare Python thread waking every 0.2 s costs {report['floor']['pct']:.3f}% "
               f"of a core, {report['floor']['us_per_wake']} us a wake (what waking up costs on this machine "
               "now; both exporters pay it)"] if "floor" in report else []),
            f"fixture: {report['fixture']['path']} ({report['fixture']['how']}); STATIC snapshot: its counters do "
            "not advance while the benchmark runs, so parse caches stay warm and every rate is zero.",
            f"Accept: {ACCEPTS[report['args']['accept']]}  Accept-Encoding: gzip", ""]
    tail = ["", "targets:"]
    for label, value, ok in report["verdicts"]:
        tail.append(f"  {'PASS' if ok else 'FAIL'}  {label}: {value}")
    s = g.get("self", {})
    if s:
        tail += ["", f"gpunet self-metrics at the end: ticks {s['ticks']}, late {s['ticks_late']}, "
                     f"collector errors {sum(s['collector_errors'].values()):g}",
                 "  last collector durations (ms): "
                 + ", ".join(f"{k} {v:.2f}" for k, v in sorted(s["collector_duration_ms"].items()))]
    return "\n".join(head + lines + tail)


def probe_range(python: dict) -> str:
    low, high = python["probe_ms"][0], python["probe_ms"][-1]
    return f"{low:g}" if low == high else f"{low:g} to {high:g}"


def node_exporter_binary(explicit: str | None) -> str | None:
    for cand in ([explicit] if explicit else NODE_EXPORTER_NAMES):
        path = shutil.which(cand) if cand else None
        if path:
            return path
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--seconds", type=float, default=30.0, help="idle CPU window, no scrapes (default 30)")
    p.add_argument("--scraped-seconds", type=float, default=30.0,
                   help="CPU window while scraped once a second (default 30; 0 skips it)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds after the first scrape answers (default 5)")
    p.add_argument("--paired-windows", type=int, default=3,
                   help="then windows with both exporters running and scraped at once, CPU of each over the "
                        "same window (default 3; 0 skips them)")
    p.add_argument("--paired-seconds", type=float, default=30.0, help="length of a paired window (default 30)")
    p.add_argument("--scrapes", type=int, default=1000, help="sequential scrapes for latency (default 1000)")
    p.add_argument("--spaced-scrapes", type=int, default=100,
                   help="extra scrapes, --spaced-interval apart, for the latency of a freshly rendered body "
                        "(default 100; 0 skips them)")
    p.add_argument("--spaced-interval", type=float, default=0.25,
                   help="seconds between spaced scrapes; above gpunet's fast tick (default 0.25)")
    p.add_argument("--accept", choices=sorted(ACCEPTS), default="prom3",
                   help="Accept header: prom3 (Prometheus 3 default, default), prom2, text")
    p.add_argument("--root", help="gpunet fixture root to use instead of generating one")
    p.add_argument("--ports", type=int, default=8, help="ports of the generated fixture (default 8)")
    p.add_argument("--channels", type=int, default=32, help="channels per port in its ethtool -S (default 32)")
    p.add_argument("--no-gpus", action="store_true",
                   help="generate the fixture without nvml.json: gpunet then runs no GPU collectors "
                        "(by default the node has 8 GPUs, read from nvml.json)")
    p.add_argument("--gpunet-args", default="", metavar="ARGS",
                   help="extra arguments for gpunet-exporter, e.g. --gpunet-args='--fast-interval 0.5'")
    p.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="the Python that runs gpunet-exporter (default: this one). The container image's CPython "
                        "is built with PGO and LTO; on a build without them (pyenv's default) the exporter costs "
                        "an eighth more CPU: bench/README.md says how to make a venv with the system's optimized "
                        "Python")
    p.add_argument("--node-exporter", help="node_exporter binary (default /usr/bin/prometheus-node-exporter)")
    p.add_argument("--floor-seconds", type=float, default=20.0,
                   help="at the end, seconds of a bare Python thread waking every 0.2 s, as gpunet's fast lane does: "
                        "what a wake costs on this machine at the time of the run (0 skips; default 20)")
    p.add_argument("--keep", action="store_true", help="keep the generated fixture and the exporters' logs")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    p.add_argument("--save", metavar="FILE", help="also write the JSON results to FILE")
    args = p.parse_args(argv)
    # A SIGTERM to the benchmark still stops the exporters (the finally blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    ne = node_exporter_binary(args.node_exporter)
    if ne is None:
        print("exporter_vs_node_exporter: prometheus-node-exporter not found (looked for "
              f"{args.node_exporter or ', '.join(NODE_EXPORTER_NAMES)})"
              "; install it: apt-get install prometheus-node-exporter",
              file=sys.stderr)
        return 2
    try:
        ne_version = subprocess.run([ne, "--version"], capture_output=True, text=True, timeout=10)
        ne_version = (ne_version.stdout + ne_version.stderr).splitlines()[0].strip()
    except (OSError, subprocess.TimeoutExpired, IndexError):
        ne_version = "unknown"

    work = Path(tempfile.mkdtemp(prefix="gpunet-bench-"))
    try:
        if args.root:
            root, how, ports = Path(args.root).resolve(), "given with --root", None
        else:
            root = work / "node"
            root.mkdir()
            n_files = make_fixture.generate(root, args.ports, args.channels, gpus=not args.no_gpus)
            how = (f"bench/make_fixture.py, {n_files} files, {args.channels} channels per port, "
                   + ("no GPUs" if args.no_gpus else f"{args.ports} GPUs in nvml.json"))
            ports = args.ports
            log(f"fixture: {n_files} files in {root}")

        g_port, n_port = free_port(), free_port()
        gpunet_argv = [args.python, "-m", "exporter", "--root", str(root), "--listen", f"127.0.0.1:{g_port}",
                       *shlex.split(args.gpunet_args)]
        ne_argv = [ne, f"--web.listen-address=127.0.0.1:{n_port}"]
        report = {"machine": machine(), "node_exporter_version": ne_version,
                  "gpunet_python": interpreter(args.python),
                  "harness_python": interpreter(sys.executable) if args.python != sys.executable else None,
                  "fixture": {"path": str(root), "how": how, "ports": ports, "static": True},
                  "args": vars(args)}
        report["loadavg"] = {"start": loadavg()}
        report["gpunet"] = measure("gpunet-exporter", gpunet_argv, g_port, args, work / "gpunet.log")
        report["loadavg"]["between"] = loadavg()
        report["node_exporter"] = measure("node_exporter", ne_argv, n_port, args, work / "node_exporter.log")
        if args.paired_windows > 0:
            report["paired"] = paired(gpunet_argv, g_port, ne_argv, n_port, args, work)
        report["loadavg"]["end"] = loadavg()
        if args.floor_seconds > 0:
            # A wake's cost on a VM changes from hour to hour (112 and 247 us the same day here),
            # and both exporters pay it: it says what state the machine was in.
            ns = wake_floor(0.2, args.floor_seconds)
            report["floor"] = {"pct": round(100 * ns / 1e9 / args.floor_seconds, 3),
                               "us_per_wake": round(ns / 1e3 / (args.floor_seconds / 0.2))}
        report["verdicts"] = verdicts(report["gpunet"], report["node_exporter"], report.get("paired"))
    except RuntimeError as e:
        print(f"exporter_vs_node_exporter: {e}", file=sys.stderr)
        for logname in ("gpunet.log", "node_exporter.log"):
            path = work / logname
            if path.exists() and path.stat().st_size:
                print(f"--- {logname} (last lines)", file=sys.stderr)
                print("\n".join(path.read_text(errors="replace").splitlines()[-20:]), file=sys.stderr)
        return 1
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    text = table(report)
    report["verdicts"] = [{"target": t, "value": v, "pass": ok} for t, v, ok in report["verdicts"]]
    if args.save:
        Path(args.save).write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
