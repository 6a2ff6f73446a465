"""gpunet-trace: a trace loads into a real Prometheus, and exports back to the same samples."""

import gzip
import io
import json
import random
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from procs import REPO, free_port, http_get

from gpunet.trace import write_series


def needs_prometheus(test):
    """A test that runs a real Prometheus (and promtool)."""
    test = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                              reason="prometheus/promtool not installed")(test)
    return pytest.mark.prometheus(test)


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


@needs_prometheus
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
    # Not a terminal: no line per family, only the summary (an export this short takes
    # less than a progress interval).
    assert result.stderr.splitlines() == [line for line in result.stderr.splitlines() if line.startswith("wrote ")]
    assert len(result.stderr.splitlines()) == 1, result.stderr


@needs_prometheus
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


@needs_prometheus
def test_unreachable_prometheus_is_one_clear_line(tmp_path):
    port = free_port()  # nothing listens there
    result = gpunet_trace("export", "--prometheus", f"http://user:secret@127.0.0.1:{port}", "--since", "30m",
                          str(tmp_path / "x.om"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect" in lines[0], result.stderr
    assert "secret" not in result.stderr


@needs_prometheus
def test_corrupt_trace_is_refused_with_promtools_reason(tmp_path):
    bad = tmp_path / "bad.om"
    bad.write_text("# TYPE gpunet_nic_up gauge\ngpunet_nic_up{device=\"x\" 1 1767225600\n# EOF\n")
    result = gpunet_trace("load", str(bad), "--data", str(tmp_path / "d"))
    assert result.returncode == 1 and "bad.om" in result.stderr


COMMITTED = sorted((REPO / "replay_data").rglob("*.om.gz"))


@needs_prometheus
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


# --- export's progress -----------------------------------------------------------------------

class Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class Clock:
    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


FAMILIES = 83  # what a real exporter's server held when export printed a line for each


def test_export_progress_off_a_terminal_is_quiet():
    from gpunet.trace_cli import PROGRESS_EVERY_S, Progress

    quick = Stream(tty=False)
    progress = Progress(quick, clock=Clock(0.05))  # 83 families in about 8 s
    for k in range(FAMILIES):
        progress(k + 1, FAMILIES, f"gpunet_family_{k}", 12)
    progress.done()
    assert quick.getvalue() == ""
    slow = Stream(tty=False)
    progress = Progress(slow, clock=Clock(2.0))  # 83 families in about 6 minutes
    for k in range(FAMILIES):
        progress(k + 1, FAMILIES, f"gpunet_family_{k}", 12)
    lines = slow.getvalue().splitlines()
    assert 0 < len(lines) <= FAMILIES * 2.0 / PROGRESS_EVERY_S + 1, lines
    assert all(re.match(r"exported \d+/83 families \(\d+%\)", line) for line in lines), lines


def test_export_progress_on_a_terminal_is_one_line_rewritten():
    from gpunet.trace_cli import Progress

    tty = Stream(tty=True)
    progress = Progress(tty, clock=Clock(0.05))
    for k in range(FAMILIES):
        progress(k + 1, FAMILIES, f"gpunet_family_{k}", 12)
    written = tty.getvalue()
    assert "\n" not in written and written.count("\r") == FAMILIES
    assert written.rsplit("\r", 1)[1].endswith("exported 83/83 families (100%), last gpunet_family_82: 12 series")
    progress.done()
    assert tty.getvalue().endswith("\r\x1b[K")  # cleared for the summary line


def test_a_servers_error_with_control_characters_is_printed_escaped(tmp_path):
    """A server (or a proxy before it) whose error text holds ESC and BEL: the one line says
    it, escaped, and nothing in it reaches the terminal to recolour, retitle or ring it."""
    import http.server
    import threading

    said = "no \x1b[31mentry\x1b[0m\x07 here\x1b]0;owned\x07"

    class Refusing(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            body = json.dumps({"status": "error", "errorType": "bad_data", "error": said}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = gpunet_trace("export", "--prometheus", f"http://127.0.0.1:{server.server_port}", "--since", "1h",
                              str(tmp_path / "x.om.gz"))
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("gpunet-trace: ") and not re.search(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]", line), repr(line)
    assert "no \\x1b[31mentry\\x1b[0m\\x07 here\\x1b]0;owned\\x07" in line, repr(line)
