"""On-call end to end: a PFC storm starts, and within two minutes a page names its cause.

The real parts, on loopback: a simulated cluster's trace (two jobs, 15 s scrapes: a PFC storm
in training/llm-a, training/vision-b healthy) moved in time so that its storm starts a few
seconds after the test has written the history before it; the storm's minutes then written
as they pass, in real time, into two VictoriaMetrics: "data", which `diagnose serve` reads,
and "mon", which also scrapes the service's /metrics and which vmalert evaluates
alerts/gpunet.rules.yml against (built with the service's local address), notifying a real
Alertmanager running deploy/alertmanager/alertmanager.yml with its receivers pointed here:
at the service's webhook, and at a small receiver in this test that records every
notification.

Checked against the trace's own labels (the culprit node, the storm's start, the healthy
job), never against what the service said: the page names the culprit and its report link
opens (HTTP, then headless Chromium) a report naming it too; the victims' symptom alert of the
same job is inhibited by the finding; the healthy job pages nothing; the time from the storm's
start to the page is at most 2 minutes. Then the service killed (SIGKILL) and restarted keeps
its history, and "data" stopped makes the service blind: the blind alert, and no verdict
published as current.

ONCALL_SCREENSHOT=PATH saves the report page, as Chromium shows it, to PATH (how
docs/img/oncall-report.png was taken); ONCALL_TIMES=PATH appends the measured stage
times as one JSON line (docs/oncall.md's figures).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from procs import REPO, Process, free_port, http_get, wait_for

from gpunet.trace import shift_labels, shift_trace
from gpunet.victoria import to_millis, victoria_command

pytestmark = [pytest.mark.prometheus,
              pytest.mark.skipif(not all(shutil.which(t) for t in ("victoria-metrics", "vmalert",
                                                                     "prometheus-alertmanager", "chromium")),
                                 reason="victoria-metrics, vmalert, prometheus-alertmanager or chromium not installed")]

SCRAPE = 15.0  # the trace's scrape interval, and every scrape and evaluation of the stack
# The cluster: the committed jobs2_shared_storm's jobs on separate fabrics (the healthy job
# stays healthy), at 15 s scrapes; the storm 20 minutes in, so the service's 30 minute
# lookback holds 20 minutes of history before it.
SIMULATE = ["--duration", "30m", "--scrape", "15s", "--seed", "204",
            "--job", "llm-a: --nodes 8 --gpus 4 --nics 2 --fault pfc_storm:start=20m,dur=9m",
            "--job", "vision-b: --nodes 6 --gpus 4 --nics 2"]
LEAD = 20.0  # at least this many seconds of live, healthy data between the history's import and the storm
# Where in the diagnoser's minute windows (15 s scrapes: 60 s windows on a fixed grid) the
# storm starts: 5 s after an edge is the worst case, its first whole window of storm ends
# almost a minute later. ONCALL_PHASE=SECONDS measures another.
PHASE = float(os.environ.get("ONCALL_PHASE", "5"))
WINDOW = 60.0
PAGE_DEADLINE = 120.0  # storm start -> the notification that names the cause
MAX_DATA_AGE = "30s"  # the service's --max-data-age and the rules' --diagnoser-max-data-age
DEPLOYMENT = REPO / "deploy/kubernetes/diagnoser-deployment.yaml"


def _deployment_flag(name: str, default: str) -> str:
    """A flag of the example Deployment's `diagnose serve` (its --interval): the test runs
    the service as deployed."""
    deployment = next(d for d in yaml.safe_load_all(DEPLOYMENT.read_text()) if d["kind"] == "Deployment")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return next((a.split("=", 1)[1] for a in c["args"] if a.startswith(f"--{name}=")), default)


def _post(url: str, body: bytes) -> None:
    urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=30).close()


class Feed:
    """Writes a trace's samples into VictoriaMetrics servers: everything older than now at
    once, then each sample when the clock reaches its timestamp, until stopped."""

    def __init__(self, lines: list[tuple[float, bytes]], urls: list[str]):
        self.lines = sorted(lines, key=lambda x: x[0])
        self.urls = list(urls)
        self.next = 0
        self.stopped = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._live, daemon=True)

    def _send(self, upto: float) -> None:
        start = self.next
        while self.next < len(self.lines) and self.lines[self.next][0] <= upto:
            self.next += 1
        if self.next == start:
            return
        body = to_millis(b"".join(line for _, line in self.lines[start:self.next]))
        for url in list(self.urls):
            try:
                _post(url + "/api/v1/import/prometheus", body)
            except OSError as e:  # a server stopped on purpose: the others still get the data
                self.errors.append(f"{url}: {e}")
                self.urls.remove(url)

    def history(self) -> None:
        self._send(time.time())
        for url in self.urls:
            urllib.request.urlopen(url + "/internal/force_flush", timeout=60).close()

    def _live(self) -> None:
        while not self.stopped.wait(1.0):
            self._send(time.time())

    def drop(self, url: str) -> None:
        if url in self.urls:
            self.urls.remove(url)


class Receiver:
    """The test's Alertmanager webhook receiver: an aiohttp server on its own thread that
    keeps every notification with the time it came."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/notify"
        self.notifications: list[tuple[float, dict]] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "the test receiver did not start"

    def _run(self) -> None:
        from aiohttp import web

        async def notify(request: web.Request) -> web.Response:
            self.notifications.append((time.time(), await request.json()))
            return web.Response(text="ok")

        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_post("/notify", notify)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            return runner

        asyncio.set_event_loop(self.loop)
        self.runner = self.loop.run_until_complete(start())
        self.ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def alerts(self, status: str | None = None) -> list[tuple[float, dict]]:
        """(time received, alert) of every alert in every notification, firing or resolved."""
        return [(t, a) for t, n in self.notifications for a in n["alerts"] if status in (None, a["status"])]


def _simulate(out: Path) -> dict:
    result = subprocess.run([sys.executable, "-m", "gpunet.simulate.multijob", str(out), *SIMULATE], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(out.with_name(out.name.removesuffix(".om.gz") + ".labels.json").read_text())


def _samples(trace: Path) -> list[tuple[float, bytes]]:
    with gzip.open(trace, "rb") as f:
        return [(float(line.rsplit(b" ", 1)[1]), line) for line in f if line.strip() and not line.startswith(b"#")]


def _metrics(url: str) -> str:
    status, _, body = http_get(url + "/metrics", timeout=10)
    return body.decode() if status == 200 else ""


def _series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def _start_victoria(tmp_path: Path, name: str, *extra: str) -> tuple[Process, str]:
    port = free_port()
    # Samples visible to queries at once (by default the newest 30 s are hidden, and answers
    # cached): the service and vmalert judge the newest data, as Prometheus serves it.
    proc = Process(victoria_command(tmp_path / name, f"127.0.0.1:{port}", "-search.latencyOffset=1s",
                                    "-search.disableCache", *extra), tmp_path / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_get(url + "/health")[0] == 200, timeout=30, what=f"victoria-metrics {name}")
    return proc, url


def _serve(tmp_path: Path, port: int, data_url: str, history: Path, log: str) -> Process:
    proc = Process([sys.executable, "-m", "diagnoser.cli", "serve", "--prometheus", data_url,
                    "--listen", f"127.0.0.1:{port}", "--history", str(history),
                    "--interval", _deployment_flag("interval", "60s"),
                    "--max-data-age", MAX_DATA_AGE, "--external-url", f"http://127.0.0.1:{port}"],
                   tmp_path / log, cwd=REPO)
    wait_for(lambda: http_get(f"http://127.0.0.1:{port}/-/healthy")[0] == 200, timeout=60,
             what="diagnose serve healthy")
    return proc


def _alertmanager_config(path: Path, service: str, receiver: str) -> None:
    """deploy/alertmanager/alertmanager.yml with its receivers on loopback: the service's
    webhook, and every people's receiver (pager, tickets, default) at the test's receiver."""
    config = yaml.safe_load((REPO / "deploy/alertmanager/alertmanager.yml").read_text())
    for r in config["receivers"]:
        if r["name"] == "diagnoser":
            (hook,) = r["webhook_configs"]
            hook["url"] = service + urllib.parse.urlparse(hook["url"]).path
        elif r["name"] != "blackhole":
            r["webhook_configs"] = [{"url": receiver, "send_resolved": True}]
    path.write_text(yaml.safe_dump(config))


def _chromium(*args: str) -> subprocess.CompletedProcess:
    # --no-sandbox: the tests run as root, where Chromium's sandbox refuses to start.
    return subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=90)


def test_a_pfc_storm_pages_its_cause_within_two_minutes(tmp_path):
    trace = tmp_path / "cluster.om.gz"
    truth = _simulate(trace)
    (storm,) = truth["incidents"]
    assert storm["class"] == "pfc_storm"
    healthy_jobs = {j["name"] for j in truth["jobs"]} - {storm["job"]}
    assert healthy_jobs, truth["jobs"]
    # Moved so that the storm starts LEAD seconds after the history is written.
    probe = shift_trace(trace, tmp_path / "probe.om.gz", 0.0)  # -> the trace's newest sample
    newest = -probe
    shifted = tmp_path / "shifted.om.gz"
    earliest = time.time() + LEAD + 15.0  # the import below takes a few seconds
    t0 = (earliest - PHASE) // WINDOW * WINDOW + WINDOW + PHASE
    offset = shift_trace(trace, shifted, newest + (t0 - storm["start"]))
    truth = shift_labels(truth, offset)
    (storm,) = truth["incidents"]
    culprit = storm["nodes"][0]
    culprit_host = culprit.rsplit(":", 1)[0]

    procs: list[Process] = []
    receiver = Receiver()
    feed = None
    try:
        data, data_url = _start_victoria(tmp_path, "vm-data")
        procs.append(data)
        service_port = free_port()
        service = f"http://127.0.0.1:{service_port}"
        scrape = tmp_path / "scrape.yml"
        scrape.write_text(yaml.safe_dump({"scrape_configs": [{
            "job_name": "gpunet-diagnoser", "scrape_interval": f"{SCRAPE:g}s",
            "static_configs": [{"targets": [f"127.0.0.1:{service_port}"]}]}]}))
        mon, mon_url = _start_victoria(tmp_path, "vm-mon", f"-promscrape.config={scrape}")
        procs.append(mon)
        feed = Feed(_samples(shifted), [data_url, mon_url])
        feed.history()
        assert time.time() < storm["start"], "the history took longer than the lead: raise LEAD"
        feed.thread.start()

        history = tmp_path / "diagnoser.sqlite"
        diagnoser = _serve(tmp_path, service_port, data_url, history, "diagnoser.log")
        procs.append(diagnoser)

        rules = tmp_path / "gpunet.rules.yml"
        subprocess.run([sys.executable, str(REPO / "alerts/build.py"), "--diagnoser-url", service,
                        "--diagnoser-max-data-age", MAX_DATA_AGE, "--out", str(rules)], check=True,
                       capture_output=True, timeout=60)
        am_port = free_port()
        am_url = f"http://127.0.0.1:{am_port}"
        am_config = tmp_path / "alertmanager.yml"
        _alertmanager_config(am_config, service, receiver.url)
        am = Process(["prometheus-alertmanager", f"--config.file={am_config}", f"--storage.path={tmp_path / 'am'}",
                      f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                     tmp_path / "alertmanager.log")
        procs.append(am)
        wait_for(lambda: http_get(am_url + "/-/ready")[0] == 200, timeout=30, what="alertmanager ready")
        vmalert_port = free_port()
        procs.append(Process(["vmalert", f"-rule={rules}", f"-datasource.url={mon_url}", f"-notifier.url={am_url}",
                              # its recording rules' series go back to the server it reads
                              f"-remoteWrite.url={mon_url}", f"-evaluationInterval={SCRAPE:g}s",
                              f"-httpListenAddr=127.0.0.1:{vmalert_port}"],
                             tmp_path / "vmalert.log"))
        wait_for(lambda: http_get(f"http://127.0.0.1:{vmalert_port}/health")[0] == 200, timeout=30,
                 what="vmalert")

        # ---- the page: stage by stage, each stage's first sight of the storm's cause
        seen: dict[str, float] = {}

        def finding_for(labels: dict) -> bool:
            return labels.get("alertname") == "GpunetDiagnosisFinding" and labels.get("workload") == storm["job"]

        def watch() -> bool:
            now = time.time()
            if "service" not in seen and any(f'workload="{storm["job"]}"' in s for s in
                                             _series(_metrics(service), "gpunet_diagnosis_finding")):
                seen["service"] = now
            if "vmalert" not in seen:
                body = json.loads(http_get(f"http://127.0.0.1:{vmalert_port}/api/v1/alerts")[2] or b"{}")
                if any(finding_for(a["labels"]) and a["state"] == "firing"
                       for a in (body.get("data") or {}).get("alerts") or []):
                    seen["vmalert"] = now
            if "alertmanager" not in seen and any(finding_for(a["labels"]) for a in
                                                  json.loads(http_get(am_url + "/api/v2/alerts")[2])):
                seen["alertmanager"] = now
            pages = [t for t, a in receiver.alerts("firing") if finding_for(a["labels"])]
            if pages:
                seen["page"] = min(pages)
            return "page" in seen

        try:
            wait_for(watch, timeout=storm["start"] + PAGE_DEADLINE + 60 - time.time(), interval=1.0,
                     what="the page naming the storm's cause")
        except TimeoutError:
            pass  # the assertion below says which stage it reached
        stages = {k: round(v - storm["start"], 1) for k, v in seen.items()}
        if os.environ.get("ONCALL_TIMES"):
            with open(os.environ["ONCALL_TIMES"], "a") as f:
                paged = [{k: a[k] for k in ("labels", "annotations")} for _, a in receiver.alerts("firing")
                         if finding_for(a["labels"])]
                f.write(json.dumps({"phase_s": PHASE, "storm_start": storm["start"], "stages_s": stages,
                                    "page": paged[:1]}) + "\n")
        assert "page" in seen, f"no page naming the cause; stages reached (s after the storm's start): {stages}"
        assert seen["page"] - storm["start"] <= PAGE_DEADLINE, f"too slow: {stages}"

        # ---- what the page says, and where its link leads
        (page, *_) = [a for _, a in receiver.alerts("firing") if finding_for(a["labels"])]
        assert page["labels"]["class"] == storm["class"] and page["labels"]["culprit"] == culprit, page["labels"]
        assert page["labels"]["severity"] == "critical"
        assert culprit_host in page["annotations"]["description"], page["annotations"]
        link = page["annotations"]["report_url"]
        with urllib.request.urlopen(link, timeout=30) as r:  # follows /reports/latest's redirect
            report_url, html = r.geturl(), r.read().decode()
        assert report_url != link and "/reports/" in report_url
        assert culprit_host in html and "PFC" in html, html[:2000]
        dom = _chromium("--dump-dom", report_url)
        assert dom.returncode == 0 and culprit_host in dom.stdout, dom.stderr[-2000:]
        if os.environ.get("ONCALL_SCREENSHOT"):
            shot = Path(os.environ["ONCALL_SCREENSHOT"]).resolve()
            out = _chromium(f"--screenshot={shot}", "--window-size=1280,1600", report_url)
            assert out.returncode == 0 and shot.is_file(), out.stderr[-2000:]

        # ---- a victim of the same job: its symptom alert is muted by the cause. (The rules
        # raise GpunetGpusIdleNetworkBound after 10 minutes of idle GPUs, longer than this
        # test: it is handed to Alertmanager as vmalert would, with the labels the rule
        # gives it, for a node of the job that is not the culprit.)
        job = next(j for j in truth["jobs"] if j["name"] == storm["job"])
        victim = next(n for n in job["nodes"] if n != culprit)
        other = next(j for j in truth["jobs"] if j["name"] in healthy_jobs)["nodes"][0]
        symptoms = [{"labels": {"alertname": "GpunetGpusIdleNetworkBound", "severity": "warning", "job": "gpunet",
                                "instance": node, "workload": workload},
                     "annotations": {"summary": "GPUs wait on a saturated or paused network."}}
                    for node, workload in ((victim, storm["job"]), (other, sorted(healthy_jobs)[0]))]
        request = urllib.request.Request(am_url + "/api/v2/alerts", data=json.dumps(symptoms).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=10).close()

        def symptom_state() -> dict[str, list[str]]:
            got = json.loads(http_get(am_url + "/api/v2/alerts")[2])
            return {a["labels"]["instance"]: a["status"]["inhibitedBy"] for a in got
                    if a["labels"]["alertname"] == "GpunetGpusIdleNetworkBound"}

        try:
            wait_for(lambda: symptom_state().get(victim), timeout=20, what="the victim's alert inhibited")
        except TimeoutError:
            pass
        finding_fingerprints = {a["fingerprint"] for a in json.loads(http_get(am_url + "/api/v2/alerts")[2])
                                if finding_for(a["labels"])}
        state = symptom_state()
        assert state.get(victim) and set(state[victim]) <= finding_fingerprints, state
        assert state.get(other) == [], state  # another job's symptom is not this cause's

        # ---- the healthy job pages nothing
        assert not [a for _, a in receiver.alerts("firing") if a["labels"].get("alertname") == "GpunetDiagnosisFinding"
                    and a["labels"].get("workload") in healthy_jobs], receiver.alerts("firing")

        # ---- SIGKILL and restart: the history is kept
        before = json.loads(http_get(f"{service}/reports?format=json")[2])
        assert before, "no report kept before the kill"
        os.kill(diagnoser.pid, signal.SIGKILL)
        diagnoser.popen.wait(10)
        diagnoser = _serve(tmp_path, service_port, data_url, history, "diagnoser-2.log")
        procs.append(diagnoser)
        after = json.loads(http_get(f"{service}/reports?format=json")[2])
        assert {r["id"] for r in before} <= {r["id"] for r in after}, (before, after)
        status, _, html = http_get(link.replace(urllib.parse.urlparse(link).netloc, f"127.0.0.1:{service_port}"))
        assert status == 200 and culprit_host in html.decode()

        # ---- "data" stopped: the service is blind, says so, and shows no stale verdict
        feed.drop(data_url)
        data.stop()
        stopped = time.time()

        def blind() -> bool:
            got = json.loads(http_get(am_url + "/api/v2/alerts")[2])
            return any(a["labels"]["alertname"] == "GpunetDiagnoserBlind" for a in got)

        wait_for(blind, timeout=180, interval=1.0, what="GpunetDiagnoserBlind in Alertmanager")
        assert time.time() - stopped > 25  # not before the service's own limit (--max-data-age 30s)
        text = _metrics(service)
        assert not _series(text, "gpunet_diagnosis_verdict") and not _series(text, "gpunet_diagnosis_finding"), text
    finally:
        if feed is not None:
            feed.stopped.set()
            if feed.thread.is_alive():
                feed.thread.join(10)
        for p in reversed(procs):
            p.stop()
        receiver.stop()
