"""What `diagnose serve` costs: its CPU and memory over --minutes of 1-minute scheduled runs
against VictoriaMetrics, beside the same diagnoses run one by one as `diagnose --since 30m`
processes.

    python bench/diagnose_service_cost.py                          # 256 nodes, 60 minutes; data under /tmp/scale
    python bench/diagnose_service_cost.py --minutes 15             # a shorter look
    python bench/diagnose_service_cost.py --nodes 2048 --minutes 5 --config-interval 2m   # a run's time at scale

The cluster (N nodes x 8 GPUs x 8 NICs, 35 minutes with a PFC storm, and its per-node
records) is bench/diagnose_scale.py's, made once under DATA and reused. Its data lies in the
past, so the service is started with its clock held at the trace's last sample (the runner
module's time.time(), in this process only: every scheduled run judges the 30 minutes that
end there, as `diagnose --end` would; the schedule itself keeps real time). The service
runs every --interval and reads the configuration facts every --config-interval; its
utime+stime and RSS (VmRSS, VmHWM: /proc/PID/status) are sampled every 5 s, and each run's
duration is read from gpunet_diagnosis_run_duration_seconds. Then as many runs of the
command as the service made, one at a time: each process's CPU and peak RSS (wait4).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from diagnose_scale import prepared  # noqa: E402  (the cluster's trace, import and records)
from diagnose_server import start_server  # noqa: E402
from exporter_vs_node_exporter import cpu_seconds  # noqa: E402
from procs import Process, free_port, http_get, wait_for  # noqa: E402

from gpunet.window import parse_duration  # noqa: E402

SAMPLE_S = 5.0


def serve_at(end: float, argv: list[str]) -> int:
    """`diagnose serve argv` with the runner's clock held at `end` (this process only)."""
    import types

    from diagnoser.service import runner
    from diagnoser.service.cli import serve_main

    runner.time = types.SimpleNamespace(time=lambda: end, monotonic=time.monotonic)  # type: ignore[assignment]
    return serve_main(argv)


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def metric_values(url: str) -> dict[str, float]:
    """The service's own series: run durations (sum, count) and run counts by result."""
    text = http_get(url + "/metrics")[2].decode()
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r'(gpunet_diagnosis_(?:run_duration_seconds_(?:sum|count)|runs_total|config_age_seconds))'
                         r'(\{[^}]*\})? (\S+)', line)
        if m and ('trigger="schedule"' in (m.group(2) or "") or m.group(1) == "gpunet_diagnosis_config_age_seconds"):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def measure_service(url: str, end: float, minutes: float, interval: str, config_interval: str,
                    work: Path) -> dict:
    port = free_port()
    service_url = f"http://127.0.0.1:{port}"
    argv = ["--prometheus", url, "--listen", f"127.0.0.1:{port}", "--history", str(work / "history.sqlite"),
            "--interval", interval, "--lookback", "30m", "--config-interval", config_interval,
            "--run-timeout", "120s", "--max-data-age", "7d"]
    proc = Process([sys.executable, __file__, "--serve-at", f"{end:.3f}", "--", *argv], work / "serve.log", cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    durations: list[float] = []
    samples: list[tuple[float, float, int]] = []  # (seconds since start, CPU s, RSS KiB)
    started = time.monotonic()
    try:
        wait_for(lambda: http_get(service_url + "/-/healthy")[0] == 200, timeout=120, what="diagnose serve up")
        last_sum = last_count = 0.0
        while time.monotonic() - started < minutes * 60:
            time.sleep(SAMPLE_S)
            samples.append((time.monotonic() - started, cpu_seconds(proc.pid), status_kib(proc.pid)["VmRSS"]))
            values = metric_values(service_url)
            total = values.get('gpunet_diagnosis_run_duration_seconds_sum{trigger="schedule"}', 0.0)
            count = values.get('gpunet_diagnosis_run_duration_seconds_count{trigger="schedule"}', 0.0)
            if count > last_count:  # one run ended since the last sample (runs are a minute apart)
                durations.append((total - last_sum) / (count - last_count))
                last_sum, last_count = total, count
        cpu, kib = cpu_seconds(proc.pid), status_kib(proc.pid)
        values = metric_values(service_url)
    finally:
        proc.stop(timeout=30)
    ok = values.get('gpunet_diagnosis_runs_total{result="ok",trigger="schedule"}', 0.0)
    failed = sum(v for k, v in values.items() if "runs_total" in k and 'result="ok"' not in k)
    log = proc.log()
    configs = log.count("configuration read")  # failures only: a good read says nothing
    return {"runs": int(ok), "failed": int(failed), "cpu_s": cpu, "peak_rss_mb": kib["VmHWM"] / 1024,
            "rss_mb": kib["VmRSS"] / 1024, "durations": durations, "samples": samples,
            "config_failures": configs, "minutes": (time.monotonic() - started) / 60}


def measure_cli(url: str, end: float, runs: int, work: Path) -> dict:
    cpu, rss, walls = [], [], []
    for _ in range(runs):
        began = time.perf_counter()
        with open(work / "cli.out", "wb") as out, open(work / "cli.err", "wb") as err:
            child = subprocess.Popen([sys.executable, "-m", "diagnoser.cli", "--prometheus", url, "--since", "30m",
                                      "--end", f"{end:.3f}", "--format", "json"], cwd=REPO, stdout=out, stderr=err)
            _, status, usage = os.wait4(child.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"diagnose exited {status}: {(work / 'cli.err').read_text()[-2000:]}")
        walls.append(time.perf_counter() - began)
        cpu.append(usage.ru_utime + usage.ru_stime)
        rss.append(usage.ru_maxrss / 1024)
    return {"runs": runs, "cpu_s": sum(cpu), "peak_rss_mb": max(rss), "durations": walls, "cpu_per_run": cpu}


def table(nodes: int, service: dict, cli: dict) -> str:
    def spread(xs: list[float]) -> str:
        return f"{statistics.median(xs):.1f} / {max(xs):.1f}" if xs else "-"

    s_runs, c_runs = max(service["runs"], 1), max(cli["runs"], 1)
    return "\n".join([
        f"{nodes} nodes, {service['minutes']:.0f} minutes of scheduled runs every minute",
        "| | runs | CPU s in all | CPU s per run | peak RSS MB | run s, median / max |",
        "|---|---|---|---|---|---|",
        f"| diagnose serve | {service['runs']} | {service['cpu_s']:.1f} | {service['cpu_s'] / s_runs:.1f} | "
        f"{service['peak_rss_mb']:.0f} (now {service['rss_mb']:.0f}) | {spread(service['durations'])} |",
        f"| diagnose, one process a run | {cli['runs']} | {cli['cpu_s']:.1f} | {cli['cpu_s'] / c_runs:.1f} | "
        f"{cli['peak_rss_mb']:.0f} | {spread(cli['durations'])} |"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=256)
    p.add_argument("--minutes", type=float, default=60.0, help="how long the service runs (default 60)")
    p.add_argument("--interval", default="60s", help="the service's --interval (default 60s)")
    p.add_argument("--config-interval", default="10m", help="the service's --config-interval (default 10m)")
    p.add_argument("--cli-runs", type=int, default=None, help="command runs (default: as many as the service made)")
    p.add_argument("--data", default="/tmp/scale", help="folder of bench/diagnose_scale.py's data, kept for reruns")
    p.add_argument("--json", action="store_true")
    p.add_argument("--serve-at", type=float, default=None, help=argparse.SUPPRESS)  # the child: see serve_at
    args, rest = p.parse_known_args()
    if args.serve_at is not None:
        return serve_at(args.serve_at, [a for a in rest if a != "--"])
    parse_duration(args.interval), parse_duration(args.config_interval)
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    facts = prepared(data, args.nodes)
    proc, url = start_server("victoria", data / f"n{args.nodes}.vm")
    try:
        with tempfile.TemporaryDirectory(prefix="service-cost-") as tmp:
            work = Path(tmp)
            service = measure_service(url, facts["last"], args.minutes, args.interval, args.config_interval, work)
            cli = measure_cli(url, facts["last"], args.cli_runs or max(service["runs"], 1), work)
    finally:
        proc.stop(timeout=60)
    if args.json:
        print(json.dumps({"nodes": args.nodes, "service": service, "cli": cli}, indent=1))
    else:
        print(table(args.nodes, service, cli))
        print("service RSS MB by minute: " + ", ".join(
            f"{rss / 1024:.0f}" for t, _, rss in service["samples"] if int(t) % 60 < SAMPLE_S))
        print("service run s: " + ", ".join(f"{d:.1f}" for d in service["durations"]))
    return 0 if service["failed"] == 0 and service["runs"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
