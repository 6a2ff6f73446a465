"""A scheduled diagnosis (the last 30 minutes) against VictoriaMetrics at 256 to 2,048 nodes,
from the raw series and from the per-node records of alerts/gpunet.rules.yml.

    python bench/diagnose_scale.py                           # 256, 1,024 and 2,048 nodes; data under /tmp/scale
    python bench/diagnose_scale.py --sizes 256 --data DIR    # any sizes, any folder
    python bench/diagnose_scale.py --json                    # the rows as JSON

For each size, a cluster of N nodes x 8 GPUs x 8 NICs at 400G, 35 minutes scraped every 30 s
with one PFC storm (gpunet-simulate, seed 5, the fastest gzip level), is written once to
DATA/nN.om.gz and imported once into a VictoriaMetrics folder; then the records of the group
gpunet.diagnoser.records (the committed alerts/gpunet.rules.yml, that group alone) are
computed over the trace by vmalert's replay mode, which evaluates each rule over the range
through VictoriaMetrics' query API and writes the results back to it (remote write), as a
live vmalert would have. Later runs reuse both.

Then VictoriaMetrics is started on the folder, and `diagnose --since 30m --end <the trace's
last sample>` runs as a child process twice, one run at a time: `--recording-rules off`
(the raw series) and `--recording-rules on` (the records). Per run: wall time; the child's
peak RSS (wait4); the queries and the bytes received (its last progress line); the server's
CPU seconds over the run (utime + stime from /proc/PID/stat); the findings; and whether the
records' findings are the raw series' (same classes naming the same culprits, each edge
within one window of the coarser run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from diagnose_server import findings, run_diagnose, start_server  # noqa: E402  (the server bench's helpers)
from exporter_vs_node_exporter import cpu_seconds  # noqa: E402  (a process's utime+stime, from /proc)

from gpunet.victoria import import_trace  # noqa: E402
from gpunet.window import rfc3339  # noqa: E402

GROUP = "gpunet.diagnoser.records"
RULES = REPO / "alerts" / "gpunet.rules.yml"
SCRAPE = "30s"
SIM_START = 1767225600  # gpunet-simulate's default start, 2026-01-01T00:00:00Z
MINUTES = 35  # the 30 minutes judged, and 5 before them (a counter's growth needs a sample before a window)


def trace_of(data: Path, nodes: int) -> Path:
    trace = data / f"n{nodes}.om.gz"
    if not trace.exists():
        print(f"generating {trace} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "gpunet.simulate.cli", "--nodes", str(nodes), "--gpus", "8", "--nics",
                        "8", "--nic-speed", "400G", "--duration", f"{MINUTES}m", "--scrape", SCRAPE, "--seed", "5",
                        "--fault", "pfc_storm:start=15m,dur=10m,nodes=1", "--compress-level", "1", "--quiet",
                        str(trace)], check=True, cwd=REPO)
    return trace


def trace_span(url: str) -> tuple[float, float]:
    """The first and last sample's time of the trace VictoriaMetrics holds (MetricsQL's
    tfirst/tlast_over_time over a range that holds it all: the simulator starts 2026-01-01)."""
    import urllib.parse
    import urllib.request

    def one(expr: str) -> float:
        query = urllib.parse.urlencode({"query": expr, "time": f"{SIM_START + (MINUTES + 5) * 60}"})
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=120) as answer:
            return float(json.load(answer)["data"]["result"][0]["value"][1])

    span = f"{MINUTES + 10}m"
    return (one(f"min(tfirst_over_time(gpunet_tcp_sent_segments_total[{span}]))"),
            one(f"max(tlast_over_time(gpunet_tcp_sent_segments_total[{span}]))"))


def records_only(folder: Path) -> Path:
    """The committed rule file's group of per-node records, alone (vmalert replays every rule
    it is given)."""
    doc = yaml.safe_load(RULES.read_text())
    out = folder / "diagnoser-records.yml"
    out.write_text(yaml.safe_dump({"groups": [g for g in doc["groups"] if g["name"] == GROUP]}, sort_keys=False))
    return out


def replay_records(url: str, rules: Path, start: float, end: float, log: Path) -> float:
    """vmalert -replay over [start, end]: the records written back into VictoriaMetrics (those
    of an earlier replay deleted first: a sample written twice would count twice)."""
    import urllib.parse
    import urllib.request

    started = time.perf_counter()
    match = urllib.parse.urlencode({"match[]": '{__name__=~"instance:gpunet_.+"}'})
    urllib.request.urlopen(f"{url}/api/v1/admin/tsdb/delete_series?{match}", timeout=600).close()
    with open(log, "wb") as out:
        subprocess.run(["vmalert", f"-rule={rules}", f"-datasource.url={url}", f"-remoteWrite.url={url}",
                        f"-replay.timeFrom={rfc3339(start)}", f"-replay.timeTo={rfc3339(end)}",
                        "-datasource.queryStep=0",  # each group's own interval (the default is 5m)
                        "-replay.rulesDelay=0s", "-replay.maxDatapointsPerQuery=10000", "-replay.disableProgressBar"],
                       stdout=out, stderr=subprocess.STDOUT, check=True, timeout=3600)
    urllib.request.urlopen(url + "/internal/force_flush", timeout=600).close()
    return time.perf_counter() - started


def prepared(data: Path, nodes: int) -> dict:
    facts_file = data / f"n{nodes}.json"
    facts = json.loads(facts_file.read_text()) if facts_file.exists() else {}
    trace = trace_of(data, nodes)
    if "records_s" in facts:
        return facts
    proc, url = start_server("victoria", data / f"n{nodes}.vm")
    try:
        started = time.perf_counter()
        if "import_s" not in facts:
            print(f"importing {trace} into VictoriaMetrics ...", file=sys.stderr)
            import_trace(trace, url)
            facts["import_s"] = time.perf_counter() - started
        first, last = trace_span(url)
        print(f"replaying the records over {trace} (vmalert) ...", file=sys.stderr)
        facts["records_s"] = replay_records(url, records_only(data), first, last, data / f"n{nodes}.vmalert.log")
    finally:
        proc.stop(timeout=120)
    facts |= {"first": first, "last": last}
    facts_file.write_text(json.dumps(facts))
    return facts


def agree(a: list[tuple], b: list[tuple], slack: float) -> bool:
    """The same classes naming the same culprits in the same order, each edge within `slack`."""
    return len(a) == len(b) and all(x[:2] == y[:2] and abs(x[2] - y[2]) <= slack and abs(x[3] - y[3]) <= slack
                                    for x, y in zip(a, b))


def measure(data: Path, nodes: int) -> list[dict]:
    facts = prepared(data, nodes)
    proc, url = start_server("victoria", data / f"n{nodes}.vm")
    rows = []
    try:
        for mode in ("off", "on"):
            before = cpu_seconds(proc.pid)
            run = run_diagnose(["--prometheus", url, "--since", "30m", "--end", f"{facts['last']:.3f}",
                                "--recording-rules", mode], data)
            rows.append({"nodes": nodes, "records": mode == "on", "wall_s": run["wall_s"], "rss_mb": run["rss_mb"],
                         "queries": run["queries"], "mb_received": run["mb_received"],
                         "server_cpu_s": cpu_seconds(proc.pid) - before, "found": findings(run["report"]),
                         "window_s": run["report"].get("window_seconds") or 0.0,
                         "gpu_hours": (run["report"].get("cost") or {}).get("gpu_hours"),
                         "warnings": run["warnings"]})
            print(f"  {nodes} nodes, records {mode}: {run['wall_s']:.1f} s, {run['rss_mb']:.0f} MB", file=sys.stderr)
    finally:
        proc.stop(timeout=60)
    raw, recorded = rows
    slack = 240.0  # one window of the coarser run (records every 1m: windows of 4 minutes)
    recorded["matches_raw"] = agree(raw["found"], recorded["found"], slack)
    raw["matches_raw"] = None
    for r in rows:
        r["findings"] = [f"{f[0]} {','.join(f[1])}" for f in r.pop("found")]
        r["import_s"], r["records_s"] = facts.get("import_s"), facts.get("records_s")
    return rows


def table(rows: list[dict]) -> str:
    def num(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = ["| nodes | read | wall s | peak RSS MB | queries | MB received | server CPU s | GPU-hours | findings | "
             "same as raw |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same = "-" if r["matches_raw"] is None else "yes" if r["matches_raw"] else "NO"
        lines.append(f"| {r['nodes']} | {'records' if r['records'] else 'raw series'} | {r['wall_s']:.1f} | "
                     f"{r['rss_mb']:.0f} | {num(r['queries'], 'd')} | {num(r['mb_received'], '.1f')} | "
                     f"{r['server_cpu_s']:.1f} | {num(r['gpu_hours'], '.1f')} | {'; '.join(r['findings']) or 'none'} | "
                     f"{same} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256,1024,2048", help="node counts, comma-separated (default 256,1024,2048)")
    p.add_argument("--data", default="/tmp/scale", help="folder for traces and server data, kept for reruns")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args()
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    rows = [row for nodes in (int(n) for n in args.sizes.split(",")) for row in measure(data, nodes)]
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    for r in rows:
        for warning in r["warnings"]:
            print(f"{r['nodes']} nodes, records {'on' if r['records'] else 'off'}: {warning}")
    return 0 if all(r["matches_raw"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
