"""gpunet-trace: a trace loads into a real Prometheus, and exports back to the same samples."""

import gzip
import json
import random
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from procs import REPO, free_port, http_get

from gpunet.trace import write_series

pytestmark = [pytest.mark.prometheus,
              pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                 reason="prometheus/promtool not installed")]
START = 1767225600.0  # 2026-01-01T00:00:00Z


def gpunet_trace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpunet.trace_cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def read_samples(path: Path) -> set[tuple[str, float, float]]:
    """(series text, timestamp, value) of every sample line: an independent, plain reading."""
    opener = gzip.open if path.suffix == ".gz" else open
    out = set()
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("#"):
                continue
            series, value, ts = line.rsplit(" ", 2)
            out.add((series, round(float(ts), 3), float(value)))
    return out


def small_trace(path: Path, nodes: int = 3, minutes: int = 30, seed: int = 7) -> None:
    rng = random.Random(seed)
    ts = [START + 15 * i + rng.uniform(-0.4, 0.4) for i in range(minutes * 4)]
    series = []
    for n in range(nodes):
        base = {"instance": f"node-{n:03d}:9845", "job": "gpunet"}
        for dev in ("ens1f0np0", "ens1f1np1"):
            total, values = rng.uniform(1e12, 1e14), []
            for _ in ts:
                total += rng.uniform(0, 2e10)
                values.append(total)
            series.append(("gpunet_nic_transmit_bytes_total", {**base, "device": dev}, ts, values))
            series.append(("gpunet_nic_up", {**base, "device": dev}, ts, [1.0] * len(ts)))
        for gpu in "01":
            series.append(("gpunet_gpu_busy_seconds_total", {**base, "gpu": gpu}, ts,
                           [0.8 * (t - START) for t in ts]))
    write_series(path, series)


def series_count(url: str, start: float, end: float) -> int:
    q = urllib.parse.urlencode({"match[]": '{__name__=~"gpunet_.*"}', "start": start, "end": end})
    return len(json.loads(http_get(f"{url}/api/v1/series?{q}")[2])["data"])


def test_round_trip_trace_prometheus_export(tmp_path, served):
    trace = tmp_path / "small.om.gz"
    small_trace(trace)
    original = read_samples(trace)
    url = served(trace)
    end = max(t for _, t, _ in original)
    assert series_count(url, START, end) == len({s for s, _, _ in original})
    out = tmp_path / "exported.om.gz"
    result = gpunet_trace("export", "--prometheus", url, "--start", f"{START - 60}", "--end", f"{end + 60}", str(out))
    assert result.returncode == 0, result.stderr
    assert read_samples(out) == original


def test_export_narrowed_by_match(tmp_path, served):
    trace = tmp_path / "small.om.gz"
    small_trace(trace)
    url = served(trace)
    out = tmp_path / "one-node.om"
    result = gpunet_trace("export", "--prometheus", url, "--start", f"{START}", "--end", f"{START + 1800}",
                          "--match", '{instance="node-001:9845"}', str(out))
    assert result.returncode == 0, result.stderr
    samples = read_samples(out)
    assert samples and all('instance="node-001:9845"' in s for s, _, _ in samples)
    assert out.read_text().endswith("# EOF\n")


def test_unreachable_prometheus_is_one_clear_line(tmp_path):
    port = free_port()  # nothing listens there
    result = gpunet_trace("export", "--prometheus", f"http://user:secret@127.0.0.1:{port}", "--since", "30m",
                          str(tmp_path / "x.om"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect" in lines[0], result.stderr
    assert "secret" not in result.stderr


def test_corrupt_trace_is_refused_with_promtools_reason(tmp_path):
    bad = tmp_path / "bad.om"
    bad.write_text("# TYPE gpunet_nic_up gauge\ngpunet_nic_up{device=\"x\" 1 1767225600\n# EOF\n")
    result = gpunet_trace("load", str(bad), "--data", str(tmp_path / "d"))
    assert result.returncode == 1 and "bad.om" in result.stderr


COMMITTED = sorted((REPO / "replay_data").rglob("*.om.gz"))


@pytest.mark.parametrize("trace", COMMITTED, ids=[t.name for t in COMMITTED])
def test_committed_trace_loads_with_every_series(trace, served):
    samples = read_samples(trace)
    expected = {s for s, _, _ in samples}
    first, last = min(t for _, t, _ in samples), max(t for _, t, _ in samples)
    url = served(trace)
    assert series_count(url, first, last) == len(expected)
    # And PromQL works over it: every node has its transmitted bytes.
    q = urllib.parse.urlencode({"query": "count by (instance) (gpunet_nic_transmit_bytes_total)", "time": last})
    result = json.loads(http_get(f"{url}/api/v1/query?{q}")[2])["data"]["result"]
    instances = {s.split('instance="')[1].split('"')[0] for s in expected if s.startswith("gpunet_nic_transmit")}
    assert {r["metric"]["instance"] for r in result} <= instances and result
