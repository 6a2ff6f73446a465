"""`diagnose serve` and `diagnose history` as users run them: the real service process on a
loopback port, against a real Prometheus holding a bundled trace moved to end near now
(gpunet.trace.shift_trace), with real HTTP requests. Expected culprits come from the
trace's labels (NAME.labels.json), never from the code under test."""

import base64
import gzip
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from procs import REPO, Process, free_port, http_get, start_prometheus, wait_for

from diagnoser.service.history import FindingRow, History
from gpunet.trace import shift_trace
from gpunet.trace_cli import load, prometheus_command

REPLAY = REPO / "replay_data"
needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                      reason="prometheus/promtool not installed")


def labels_of(name: str) -> dict:
    return json.loads((REPLAY / f"{name}.labels.json").read_text())


def moved(tmp_path: Path, name: str, now_inside_incident: bool) -> tuple[Path, float]:
    """The trace moved so that now lies 2 minutes before its labelled incident ends (the
    finding is still going on at the window's end), or so that it ends now; and the seconds
    it moved by (the labels' times plus them are the moved trace's)."""
    trace = REPLAY / f"{name}.om.gz"
    with gzip.open(trace, "rt") as f:
        last = max(float(line.rsplit(" ", 1)[1]) for line in f if line[0] != "#")
    now = time.time()
    incidents = labels_of(name)["incidents"]
    target = now + (last - incidents[0]["end"]) + 120 if now_inside_incident and incidents else now
    out = tmp_path / f"{name}.om.gz"
    return out, shift_trace(trace, out, target)


def serve_trace(tmp_path: Path, trace: Path) -> tuple[Process, str]:
    """`gpunet-trace load` the trace and serve it with a real Prometheus (as the `served`
    fixture does, keeping the process so that a test can stop it)."""
    data = tmp_path / f"{trace.name}.tsdb"
    load(trace, data)
    args = [a for a in prometheus_command(data, "127.0.0.1:0")[1:] if not a.startswith("--web.listen-address")]
    return start_prometheus(args, tmp_path / f"prom-{trace.name}.log")


def diagnose_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "diagnoser.cli", *args]


def start_service(tmp_path: Path, prometheus: str, *args: str, history: Path | None = None) -> tuple[Process, str]:
    port = free_port()
    proc = Process(diagnose_command("serve", "--prometheus", prometheus, "--listen", f"127.0.0.1:{port}",
                                    "--history", str(history or tmp_path / "history.sqlite"), *args),
                   tmp_path / f"serve-{port}.log", cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(url + "/-/ready")[0] == 200, timeout=60, what="diagnose serve ready")
    except TimeoutError:
        proc.stop()
        raise AssertionError(f"diagnose serve did not become ready:\n{proc.log()}") from None
    return proc, url


def series(url: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample on /metrics, read as plain text."""
    out = []
    for line in http_get(url + "/metrics")[2].decode().splitlines():
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def named(url: str, name: str) -> list[tuple[dict, float]]:
    return [(labels, value) for n, labels, value in series(url) if n == name]


def post(url: str, payload: object) -> tuple[int, str]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    req = urllib.request.Request(url + "/api/v1/alertmanager", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def alert_payload(group_key: str, workload: str | None = None, started: float | None = None) -> dict:
    """An alert group as Alertmanager posts it (webhook version 4, nanosecond times)."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started or time.time() - 120)) + ".123456789Z"
    labels = {"alertname": "GpunetPfcStorm", "severity": "page", **({"workload": workload} if workload else {})}
    return {"version": "4", "receiver": "gpunet-diagnoser", "status": "firing", "groupKey": group_key,
            "truncatedAlerts": 0, "groupLabels": {"alertname": "GpunetPfcStorm"}, "commonLabels": labels,
            "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
            "alerts": [{"status": "firing", "labels": labels, "annotations": {"summary": "storm"},
                        "startsAt": start, "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom/graph",
                        "fingerprint": "0123456789abcdef"}]}


def history(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(diagnose_command("history", *args), cwd=REPO, capture_output=True, text=True, timeout=60)


def runs(url: str, trigger: str, result: str) -> float:
    return next((v for labels, v in named(url, "gpunet_diagnosis_runs_total")
                 if labels == {"trigger": trigger, "result": result}), 0.0)


@needs_prometheus
@pytest.mark.prometheus
def test_pfc_storm_from_metrics_to_history_through_a_kill_and_a_dead_prometheus(tmp_path):
    truth = labels_of("pfc_storm")["incidents"][0]
    trace, offset = moved(tmp_path, "pfc_storm", now_inside_incident=True)
    prometheus_proc, prometheus = serve_trace(tmp_path, trace)
    db = tmp_path / "history.sqlite"
    grafana = AnnotationReceiver()  # Grafana's annotation API, as far as the service uses it
    (tmp_path / "grafana.token").write_text("glsa_test_token\n")
    proc, url = start_service(tmp_path, prometheus, "--interval", "1h", "--grafana-url", grafana.url,
                              "--grafana-token-file", str(tmp_path / "grafana.token"), history=db)

    # The new finding is posted to Grafana once, with the token, where the storm began.
    wait_for(lambda: grafana.posts, timeout=30, what="the Grafana annotation")
    (headers, body), = grafana.posts
    assert headers["Authorization"] == "Bearer glsa_test_token"
    assert truth["class"] in body["tags"] and truth["nodes"][0].split(":")[0] in body["text"], body
    assert abs(body["time"] / 1000 - (truth["start"] + offset)) <= 120, (body["time"], truth["start"] + offset)
    grafana.close()

    # The verdict and the ongoing storm, naming the labelled culprit.
    assert named(url, "gpunet_diagnosis_verdict") == [({"workload": "unattributed", "verdict": "findings"}, 1.0)]
    found = [labels for labels, _ in named(url, "gpunet_diagnosis_finding")]
    assert [(f["class"], f["culprit"]) for f in found] == [(truth["class"], truth["nodes"][0])], found
    info = named(url, "gpunet_diagnosis_finding_info")
    assert len(info) == 1 and info[0][0]["summary"].startswith(f"PFC storm from {truth['nodes'][0].split(':')[0]}")
    assert 0 < named(url, "gpunet_diagnosis_finding_confidence")[0][1] <= 1
    assert named(url, "gpunet_diagnosis_finding_gpu_idle_seconds")[0][1] > 0
    started = named(url, "gpunet_diagnosis_finding_start_timestamp_seconds")[0][1]
    assert started < time.time()
    age = named(url, "gpunet_diagnosis_data_age_seconds")[0][1]
    assert 0 <= age < 35  # the trace's scrapes are 30 s apart

    # The stored report holds what `diagnose --since LOOKBACK --end T` finds for that window.
    listed = json.loads(http_get(url + "/reports?format=json")[2])
    assert len(listed) == 1 and listed[0]["trigger"] == "schedule"
    entry = listed[0]
    stored = json.loads(http_get(f"{url}/reports/{entry['id']}.json")[2])
    cli = subprocess.run(diagnose_command("--prometheus", prometheus, "--since", "1800.000s", "--grafana-url",
                                          grafana.url, "--end", f"{entry['window_end']:.3f}", "--format", "json"),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert stored["findings"] == json.loads(cli.stdout)["findings"]
    assert stored["verdict"] == json.loads(cli.stdout)["verdict"]

    # The pages: HTML, markdown, the list, the newest of the job.
    status, headers, page = http_get(f"{url}/reports/{entry['id']}")
    assert status == 200 and "text/html" in headers["Content-Type"] and truth["nodes"][0].encode() in page
    # with its charts, kept beside the report: the cluster's GPU time and the culprit's against its peers
    assert b'<svg id="gpu-time"' in page and b'<svg id="culprit-1"' in page, page[:3000]
    status, _, markdown = http_get(f"{url}/reports/{entry['id']}.md")
    assert status == 200 and markdown.startswith(b"# gpunet diagnosis") and truth["nodes"][0].encode() in markdown
    status, _, listing = http_get(url + "/reports")
    assert status == 200 and f'href="/reports/{entry["id"]}"'.encode() in listing
    assert http_get(url + "/reports/999")[0] == 404

    # An alert: 202, its report becomes the job's newest; a bad payload: 400 in one line.
    status, text = post(url, alert_payload("{}:{alertname=\"GpunetPfcStorm\"}", "unattributed"))
    assert status == 202, text
    wait_for(lambda: json.loads(http_get(url + "/reports?format=json&job=unattributed")[2])[0]["trigger"] == "alert",
             timeout=60, what="the alert's report")
    newest = json.loads(http_get(url + "/reports?format=json")[2])[0]
    req = urllib.request.Request(url + "/reports/latest?job=unattributed")
    with urllib.request.urlopen(req, timeout=10) as resp:  # follows the 302
        assert resp.url.endswith(f"/reports/{newest['id']}")
    for bad in (b"not json", {"version": "3"}, {**alert_payload("k"), "alerts": "x"}):
        status, text = post(url, bad)
        assert status == 400 and len(text.strip().splitlines()) == 1, text
    codes = {labels["code"]: v for labels, v in named(url, "gpunet_diagnosis_webhook_requests_total")}
    assert codes == {"202": 1.0, "400": 3.0}

    # `diagnose history` prints the findings, and they survive SIGKILL and a restart.
    def printed() -> str:
        result = history("--since", "7d", "--history", str(db))
        assert result.returncode == 0, result.stderr
        return result.stdout
    assert truth["nodes"][0] in printed() and "pfc_storm" in printed()
    as_json = json.loads(history("--since", "7d", "--history", str(db), "--format", "json", "--class",
                                 "pfc_storm").stdout)
    assert len(as_json) == 2 and all(f["culprit"] == truth["nodes"][0] for e in as_json for f in e["findings"])
    os.kill(proc.pid, signal.SIGKILL)
    proc.popen.wait()
    proc.stop()
    assert truth["nodes"][0] in printed()

    # Restarted with a --max-data-age a little above a scrape interval, then Prometheus dies: runs
    # fail (one line each, no traceback), and the verdict is withdrawn once the data is too old.
    max_age = 45
    proc, url = start_service(tmp_path, prometheus, "--interval", "2s", "--max-data-age", f"{max_age:.0f}s",
                              history=db)
    assert len(json.loads(http_get(url + "/reports?format=json")[2])) >= 2  # nothing lost
    wait_for(lambda: runs(url, "schedule", "ok") >= 1, timeout=60, what="a good run")
    assert named(url, "gpunet_diagnosis_verdict")
    prometheus_proc.stop()
    wait_for(lambda: runs(url, "schedule", "error") >= 2, timeout=60, what="failed runs")
    wait_for(lambda: not named(url, "gpunet_diagnosis_verdict"), timeout=120, what="the verdict withdrawn")
    assert named(url, "gpunet_diagnosis_data_age_seconds")[0][1] > max_age - 1
    assert not named(url, "gpunet_diagnosis_finding")
    log = proc.log()
    failures = [line for line in log.splitlines() if "schedule run failed" in line]
    assert len(failures) >= 2 and "Traceback" not in log
    proc.stop()


@needs_prometheus
@pytest.mark.prometheus
def test_a_healthy_trace_publishes_healthy_and_no_finding(tmp_path):
    assert labels_of("healthy_basic")["incidents"] == []
    prometheus_proc, prometheus = serve_trace(tmp_path, moved(tmp_path, "healthy_basic", now_inside_incident=False)[0])
    proc, url = start_service(tmp_path, prometheus, "--interval", "1h", "--config-interval", "10s")
    try:
        assert named(url, "gpunet_diagnosis_verdict") == [({"workload": "unattributed", "verdict": "healthy"}, 1.0)]
        assert named(url, "gpunet_diagnosis_finding") == [] and named(url, "gpunet_diagnosis_finding_info") == []

        # The configuration facts are read before the first run, which audits them and says
        # how old they were; then again every --config-interval, between runs.
        entry = json.loads(http_get(url + "/reports?format=json")[2])[0]
        stored = json.loads(http_get(f"{url}/reports/{entry['id']}.json")[2])
        assert any(re.fullmatch(r"configuration facts read \d+s before the window's end \(the service reads them "
                                r"every 10s\)", note) for note in stored["notes"]), stored.get("notes")

        def config_age() -> float:
            return named(url, "gpunet_diagnosis_config_age_seconds")[0][1]
        wait_for(lambda: config_age() >= 3, timeout=30, what="the configuration snapshot aging")
        older = config_age()
        wait_for(lambda: config_age() < older, timeout=30, what="the configuration read again")
    finally:
        proc.stop()
        prometheus_proc.stop()


class AnnotationReceiver:
    """An HTTP server on loopback that takes POST /api/annotations as Grafana does (200 and an
    id) and keeps each request's headers and JSON body."""

    def __init__(self):
        import http.server

        posts = self.posts = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/api/annotations":
                    posts.append((dict(self.headers), body))
                self.send_response(200 if self.path == "/api/annotations" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"id": 1, "message": "Annotation added"}')

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class SilentServer:
    """A TCP server that accepts and never answers: a Prometheus that hangs."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for s in self.held:
            s.close()


def test_webhook_queue_dedupe_full_and_run_timeout(tmp_path):
    silent = SilentServer()
    try:
        proc, url = start_service(tmp_path, silent.url, "--interval", "1h", "--run-timeout", "3s",
                                  "--webhook-queue", "1")  # ready once the first run timed out
        assert runs(url, "schedule", "timeout") == 1
        # Two workers take two groups of different jobs; the third waits; the fourth finds the queue full.
        assert post(url, alert_payload("a", "job-a"))[0] == 202
        assert post(url, alert_payload("a", "job-a"))[0] == 200  # the same group, running
        assert post(url, alert_payload("b", "job-b"))[0] == 202
        assert post(url, alert_payload("c", "job-a"))[0] == 202  # job-a busy: it waits in the queue
        assert post(url, alert_payload("c", "job-a"))[0] == 200  # the same group, queued
        assert named(url, "gpunet_diagnosis_queue_length") == [({}, 1.0)]
        status, text = post(url, alert_payload("d", "job-d"))
        assert status == 429 and "queue full" in text
        wait_for(lambda: runs(url, "alert", "timeout") >= 3, timeout=30, what="the alert runs to time out")
        assert named(url, "gpunet_diagnosis_queue_length") == [({}, 0.0)]
        assert post(url, alert_payload("a", "job-a"))[0] == 202  # done: the group may come again
        log = proc.log()
        assert log.count("abandoned after 3s") >= 4 and "Traceback" not in log
        assert proc.stop() == 0  # stops at once, a hung run's thread left behind
    finally:
        silent.close()


def test_history_bounded_in_age_and_size(tmp_path):
    db = tmp_path / "h.sqlite"
    h = History(db)
    now = time.time()
    row = FindingRow("pfc_storm", "node-001:9845", "ens1f0np0", 0.9, 100.0, now - 600, now, True, "storm")
    document = json.dumps({"padding": "x" * 20000})
    for k in range(200):
        h.add("job", "schedule", (now - 1800, now), now, "findings", document, [row], created=now - 200 * 3600 + k * 3600)
    assert h.size() > 4_000_000  # the file and its write-ahead log
    assert h.prune(retention=100 * 3600, max_bytes=1 << 30, now=now) == 100  # the older half, by age
    assert min(e.created for e in h.entries(limit=10_000)) >= now - 100 * 3600
    cap = 256 << 10
    h.prune(retention=1e9, max_bytes=cap, now=now)
    left = h.entries(limit=10_000)
    assert 1 <= len(left) < 100 and max(e.created for e in left) == now - 3600  # the newest stays
    assert h.size() <= cap + (64 << 10)  # the file itself shrank
    h.close()
    # Reopened (a restart): what was kept is there, findings and all.
    again = History(db, readonly=True)
    assert [e.findings for e in again.entries(limit=10_000)] == [(row,)] * len(left)


def test_bad_settings_exit_2_in_one_line(tmp_path):
    config = tmp_path / "c.yml"
    config.write_text("intervall: 5s\n")
    cases = [(["serve"], {}, "--prometheus"),
             (["serve", "--prometheus", "http://x", "--interval", "0s"], {}, "--interval"),
             (["serve", "--prometheus", "http://x", "--history-max-bytes", "12"], {}, "--history-max-bytes"),
             (["serve", "--prometheus", "http://x", "--config-interval", "1s"], {}, "--config-interval"),
             (["serve", "--prometheus", "http://x"], {"GPUNET_LOOKBACK": "soon"}, "GPUNET_LOOKBACK"),
             (["serve", "--prometheus", "http://x"], {"GPUNET_INTERVALL": "5s"}, "GPUNET_INTERVAL"),
             (["serve", "--prometheus", "http://x", "--config", str(config)], {}, "'interval'"),
             (["serve", "--prometheus", "ftp://x"], {}, "--prometheus"),
             (["history", "--class", "nonsense"], {}, "--class")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUNET_")}
    for argv, extra, named_flag in cases:
        result = subprocess.run(diagnose_command(*argv), cwd=REPO, capture_output=True, text=True, timeout=60,
                                env={**env, **extra})
        assert result.returncode == 2, (argv, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and named_flag in result.stderr, (argv, result.stderr)


def test_a_corrupt_or_unwritable_history_is_one_line_and_exit_1(tmp_path):
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"this is no database" * 500)
    folder = tmp_path / "ro"
    folder.mkdir()
    for path in (corrupt, tmp_path / "missing-folder" / "h.sqlite"):
        result = subprocess.run(diagnose_command("serve", "--prometheus", "http://127.0.0.1:1", "--listen",
                                                 f"127.0.0.1:{free_port()}", "--history", str(path)),
                                cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and str(path) in result.stderr, result.stderr
    assert corrupt.read_bytes() == b"this is no database" * 500  # left as it was


def test_tls_and_basic_auth_guard_every_endpoint(tmp_path, pki):
    """--web.config.file, the exporter-toolkit format the exporter takes: over TLS, every
    endpoint (the metrics, the webhook, the reports) asks for the password; a wrong one gets
    401, plain HTTP gets no answer."""

    config = tmp_path / "web.yml"
    config.write_text(json.dumps({
        "tls_server_config": {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key")},
        "basic_auth_users": {"alertmanager": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()}}))
    silent = SilentServer()  # its source never answers: the first run times out, then it is ready
    port = free_port()
    proc = Process(diagnose_command("serve", "--prometheus", silent.url, "--listen", f"127.0.0.1:{port}",
                                    "--history", str(tmp_path / "history.sqlite"), "--run-timeout", "2s",
                                    "--web.config.file", str(config)),
                   tmp_path / "serve-tls.log", cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    url = f"https://127.0.0.1:{port}"

    def status(path: str, password: str | None, body: bytes | None = None) -> int:
        headers = {"Content-Type": "application/json"}
        if password is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"alertmanager:{password}".encode()).decode()
        req = urllib.request.Request(url + path, data=body, headers=headers, method="POST" if body else "GET")
        try:
            with urllib.request.urlopen(req, context=context, timeout=10) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        wait_for(lambda: status("/-/ready", "s3cret") == 200, timeout=60, what="diagnose serve ready over TLS")
        for path in ("/metrics", "/reports", "/reports/latest"):
            assert status(path, None) == 401 and status(path, "wrong") == 401, path
        assert status("/metrics", "s3cret") == 200
        assert status("/api/v1/alertmanager", None, json.dumps(alert_payload("k", "job-a")).encode()) == 401
        assert status("/api/v1/alertmanager", "s3cret", json.dumps(alert_payload("k", "job-a")).encode()) == 202
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        proc.stop()
        silent.close()
    assert "Traceback" not in proc.log()
