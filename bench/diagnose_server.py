"""`diagnose` from a file, from Prometheus and from VictoriaMetrics, at growing cluster sizes.

    python bench/diagnose_server.py                          # 64, 256 and 1,024 nodes; data under /tmp/srv
    python bench/diagnose_server.py --sizes 64 --data DIR    # any sizes, any folder
    python bench/diagnose_server.py --json                   # the rows as JSON

For each size, a cluster of N nodes x 8 GPUs x 8 NICs at 400G, 1 h scraped every 15 s
with one PFC storm (gpunet-simulate, seed 5), is written once to DATA/nN.om.gz, backfilled
once into a Prometheus data folder (gpunet-trace load: promtool) and imported once into a
VictoriaMetrics one; later runs reuse them. Then, one at a time on the otherwise idle
machine, the `diagnose` command (a child process, every stage, the JSON report) reads:

- the file: `diagnose --replay DATA/nN.om.gz`;
- each server, started on its folder for that run alone:
  `diagnose --prometheus URL --since 1h --end <the trace's last sample>`.

Per run: wall time; peak RSS (the child's own, from wait4); the queries and the bytes the
client received (its last progress line); the server's CPU seconds over the run (utime +
stime from /proc/PID/stat before and after: the same measure for both engines); and
whether the findings are the file's (same classes and culprits in the same order, edges
within two windows: increase() extrapolates on the server).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from exporter_vs_node_exporter import cpu_seconds  # noqa: E402  (a process's utime+stime, from /proc)
from procs import Process, free_port, http_get, wait_for  # noqa: E402  (the tests' process helpers)

from gpunet.trace_cli import load, prometheus_command  # noqa: E402
from gpunet.victoria import import_trace, victoria_command  # noqa: E402

SOURCES = ("file", "prometheus", "victoria")
SLACK_S = 120.0  # two windows: 1 h of 15 s scrapes is read in windows of 60 s


def trace_of(data: Path, nodes: int) -> Path:
    trace = data / f"n{nodes}.om.gz"
    if not trace.exists():
        print(f"generating {trace} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "gpunet.simulate.cli", "--nodes", str(nodes), "--gpus", "8", "--nics",
                        "8", "--nic-speed", "400G", "--duration", "1h", "--scrape", "15s", "--seed", "5",
                        "--fault", "pfc_storm:start=20m,dur=10m,nodes=1", "--quiet", str(trace)], check=True, cwd=REPO)
    return trace


def start_server(kind: str, folder: Path) -> tuple[Process, str]:
    port = free_port()
    listen = f"127.0.0.1:{port}"
    command = prometheus_command(folder, listen) if kind == "prometheus" else victoria_command(folder, listen)
    proc = Process(command, folder.parent / f"{folder.name}.log")
    url = f"http://{listen}"
    ready = "/-/ready" if kind == "prometheus" else "/health"
    def up() -> bool:
        if not proc.alive():  # a folder another server holds, say: say why now, not after the timeout
            raise RuntimeError(f"{kind} exited: {proc.log()[-1000:]}")
        return http_get(url + ready)[0] == 200

    try:
        wait_for(up, timeout=600, what=f"{kind} ready")
    except TimeoutError:
        proc.stop()
        raise
    return proc, url


def prepared(data: Path, nodes: int) -> dict:
    """The trace's facts, once its file and both servers' folders exist (made here once)."""
    facts_file = data / f"n{nodes}.json"
    facts = json.loads(facts_file.read_text()) if facts_file.exists() else {}
    trace = trace_of(data, nodes)
    if "prometheus_load_s" not in facts:
        print(f"loading {trace} into Prometheus ...", file=sys.stderr)
        started = time.perf_counter()
        first, last, samples = load(trace, data / f"n{nodes}.tsdb")
        facts |= {"first": first, "last": last, "samples": samples, "prometheus_load_s": time.perf_counter() - started}
        facts_file.write_text(json.dumps(facts))
    if "victoria_load_s" not in facts:
        print(f"importing {trace} into VictoriaMetrics ...", file=sys.stderr)
        started = time.perf_counter()
        proc, url = start_server("victoria", data / f"n{nodes}.vm")
        try:
            import_trace(trace, url)
        finally:
            proc.stop(timeout=120)
        facts["victoria_load_s"] = time.perf_counter() - started
        facts_file.write_text(json.dumps(facts))
    return facts


def run_diagnose(args: list[str], folder: Path) -> dict:
    """The command as a child: wall time, its own peak RSS, the report and the client's counts."""
    out, err = folder / "diagnose.out", folder / "diagnose.err"
    started = time.perf_counter()
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        child = subprocess.Popen([sys.executable, "-m", "diagnoser.cli", *args, "--format", "json"], cwd=REPO,
                                 stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    text = err.read_text()
    if child.returncode != 0:
        raise RuntimeError(f"diagnose {' '.join(args)} exited {child.returncode}: {text[-2000:]}")
    counts = re.search(r"(\d+) queries in all(?:, (\d+) split[^,]*)?, ([\d.]+) MB received", text)
    report = json.loads(out.read_text())
    return {"wall_s": wall, "rss_mb": usage.ru_maxrss / 1024, "report": report,
            "queries": int(counts.group(1)) if counts else None, "splits": int(counts.group(2) or 0) if counts else None,
            "mb_received": float(counts.group(3)) if counts else None,
            "warnings": [line for line in text.splitlines() if "warning" in line]}


def findings(report: dict) -> list[tuple]:
    return [(f["class"], tuple(f["nodes"]), f["start"], f["end"]) for f in report["findings"]]


def agree(a: list[tuple], b: list[tuple], slack: float) -> bool:
    """The same classes naming the same culprits in the same order, each edge within `slack`."""
    return len(a) == len(b) and all(x[:2] == y[:2] and abs(x[2] - y[2]) <= slack and abs(x[3] - y[3]) <= slack
                                    for x, y in zip(a, b))


def measure(data: Path, nodes: int, sources: tuple[str, ...]) -> list[dict]:
    facts = prepared(data, nodes)
    trace = data / f"n{nodes}.om.gz"
    rows = []
    file_found: list[tuple] | None = None
    for source in sources:
        if source == "file":
            run = run_diagnose(["--replay", str(trace)], data)
            server_cpu = None
        else:
            folder = data / (f"n{nodes}.tsdb" if source == "prometheus" else f"n{nodes}.vm")
            proc, url = start_server(source, folder)
            try:
                before = cpu_seconds(proc.pid)
                run = run_diagnose(["--prometheus", url, "--since", "1h", "--end", f"{facts['last']:.3f}"], data)
                server_cpu = cpu_seconds(proc.pid) - before
            finally:
                proc.stop(timeout=60)
        found = findings(run["report"])
        if source == "file":
            file_found = found
        rows.append({"nodes": nodes, "source": source, "samples": facts["samples"], "wall_s": run["wall_s"],
                     "rss_mb": run["rss_mb"], "queries": run["queries"], "splits": run["splits"],
                     "mb_received": run["mb_received"], "server_cpu_s": server_cpu,
                     "findings": [f"{f[0]} {','.join(f[1])}" for f in found],
                     "matches_file": None if file_found is None or source == "file" else
                     agree(file_found, found, SLACK_S), "warnings": run["warnings"]})
        print(f"  {nodes} nodes, {source}: {run['wall_s']:.1f} s, {run['rss_mb']:.0f} MB", file=sys.stderr)
    return rows


def table(rows: list[dict]) -> str:
    def num(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = ["| nodes | source | wall s | s per 100 nodes | peak RSS MB | MB per 100 nodes | queries | split | "
             "MB received | server CPU s | findings | same as file |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['nodes']} | {r['source']} | {r['wall_s']:.1f} | {100 * r['wall_s'] / r['nodes']:.2f} | "
                     f"{r['rss_mb']:.0f} | {100 * r['rss_mb'] / r['nodes']:.0f} | {num(r['queries'], 'd')} | "
                     f"{num(r['splits'], 'd')} | {num(r['mb_received'], '.1f')} | {num(r['server_cpu_s'], '.1f')} | "
                     f"{'; '.join(r['findings']) or 'none'} | "
                     f"{'-' if r['matches_file'] is None else 'yes' if r['matches_file'] else 'NO'} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64,256,1024", help="node counts, comma-separated (default 64,256,1024)")
    p.add_argument("--sources", default=",".join(SOURCES), help="file,prometheus,victoria (default: all three)")
    p.add_argument("--data", default="/tmp/srv", help="folder for traces and server data, kept for reruns")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args()
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    sources = tuple(s for s in args.sources.split(",") if s)
    rows = [row for nodes in (int(n) for n in args.sizes.split(",")) for row in measure(data, nodes, sources)]
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    for r in rows:
        for warning in r["warnings"]:
            print(f"{r['nodes']} nodes, {r['source']}: {warning}")
    return 0 if all(r["matches_file"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
