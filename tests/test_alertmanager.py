"""The Alertmanager example (deploy/alertmanager/alertmanager.yml): amtool accepts it, its
routes send each severity where it belongs, and on the bundled PFC storm trace, with every
alert that the rules raise during the storm handed to a real Alertmanager, only the storm
pages: its victims' alerts are inhibited."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request

import pytest
import yaml
from procs import REPO, Process, free_port, http_get, start_prometheus, wait_for
from test_alerts import inline

pytestmark = pytest.mark.skipif(not (shutil.which("amtool") and shutil.which("prometheus-alertmanager")
                                     and shutil.which("prometheus")),
                                reason="amtool, Alertmanager or Prometheus not installed")

CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RULES = REPO / "alerts" / "gpunet.rules.yml"
STORM = REPO / "replay_data" / "pfc_storm.om.gz"


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["amtool", *args], capture_output=True, text=True, timeout=60)


def test_amtool_accepts_the_configuration():
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("labels, receiver", [
    # symptoms: to the diagnoser service and to people
    (["severity=critical", "alertname=GpunetPfcStorm"], "diagnoser,pager"),
    (["severity=warning", "alertname=GpunetPfcReceivePressure"], "diagnoser,tickets"),
    (["severity=warning", "alertname=GpunetGpusIdleNetworkBound", "workload=training/llm-a"], "diagnoser,tickets"),
    # not symptoms of a job's network: to people only
    (["severity=critical", "alertname=GpunetGpuXidErrors", "xid=79"], "pager"),
    (["severity=info", "alertname=GpunetGpuXidOther", "xid=13"], "blackhole"),
    # the diagnosis: a stalling cause pages, a slowing one is a ticket; never back to the service
    (["severity=critical", "alertname=GpunetDiagnosisFinding", "workload=training/llm-a", "class=pfc_storm"], "pager"),
    (["severity=warning", "alertname=GpunetDiagnosisFinding", "workload=vision-b", "class=straggler"], "tickets"),
    (["severity=warning", "alertname=GpunetDiagnoserBlind"], "tickets"),
    (["severity=warning", "alertname=GpunetDiagnoserDown"], "tickets"),
    (["alertname=SomethingElse"], "default"),
])
def test_routes_send_each_severity_where_it_belongs(labels, receiver):
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receiver}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_diagnoser_webhook_is_the_services_endpoint_and_hears_resolutions():
    receivers = {r["name"]: r for r in yaml.safe_load(CONFIG.read_text())["receivers"]}
    (hook,) = receivers["diagnoser"]["webhook_configs"]
    assert hook["url"].endswith("/api/v1/alertmanager") and hook["send_resolved"] is True


def test_every_severity_the_rules_use_has_a_route():
    severities = {rule["labels"]["severity"] for group in yaml.safe_load(RULES.read_text())["groups"]
                  for rule in group["rules"] if "alert" in rule}
    routed = {m.split("=")[1].strip('"') for r in yaml.safe_load(CONFIG.read_text())["route"]["routes"]
              for m in r["matchers"] if m.startswith("severity=")}
    assert severities <= routed, severities - routed


def test_on_the_storm_trace_only_the_storm_pages(tmp_path):
    from gpunet.trace_cli import load, prometheus_command

    incident = json.loads(STORM.with_name("pfc_storm.labels.json").read_text())["incidents"][0]
    data = tmp_path / "storm.tsdb"
    load(STORM, data)
    args = [a for a in prometheus_command(data, "127.0.0.1:0")[1:] if not a.startswith("--web.listen-address")]
    prom, prom_url = start_prometheus(args, tmp_path / "prometheus.log")
    am_port = free_port()
    am = Process(["prometheus-alertmanager", f"--config.file={CONFIG}", f"--storage.path={tmp_path / 'am'}",
                  f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                 tmp_path / "alertmanager.log")
    am_url = f"http://127.0.0.1:{am_port}"
    try:
        wait_for(lambda: http_get(am_url + "/-/ready")[0] == 200, what="alertmanager ready")
        # Every alert whose condition holds in the storm's last minute, `for` left out (the
        # worst case: pending alerts count as firing), with the labels and annotations its
        # rule gives it.
        at = incident["end"] - 60
        recorded: dict[str, str] = {}
        alerts = []
        for group in yaml.safe_load(RULES.read_text())["groups"]:
            for rule in group["rules"]:
                expr = inline(rule["expr"], recorded)
                if "record" in rule:
                    recorded[rule["record"]] = expr
                    continue
                query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
                status, _, body = http_get(f"{prom_url}/api/v1/query?{query}", timeout=30)
                assert status == 200, body[:300]
                for series in json.loads(body)["data"]["result"]:
                    labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
                    alerts.append({"labels": {**labels, "alertname": rule["alert"], **rule["labels"]},
                                   "annotations": {"summary": rule["annotations"]["summary"]}})
        names = {a["labels"]["alertname"] for a in alerts}
        assert "GpunetPfcStorm" in names and len(names) > 1, names  # the storm, and its victims' alerts
        request = urllib.request.Request(am_url + "/api/v2/alerts", data=json.dumps(alerts).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200

        def shown(inhibited: bool) -> list[dict]:
            flag = "true" if inhibited else "false"
            return json.loads(http_get(f"{am_url}/api/v2/alerts?active=true&silenced=false&inhibited={flag}")[2])

        wait_for(lambda: len(shown(True)) == len(alerts), what="alertmanager took every alert")

        def paging() -> set[tuple[str, str | None]]:
            left = [a for a in shown(False) if not a["status"]["inhibitedBy"]]
            return {(a["labels"]["alertname"], a["labels"].get("instance")) for a in left
                    if a["labels"]["severity"] == "critical"}

        # The inhibitor learns the taken alerts a moment later (it subscribes to them): until
        # it has a storm alert the victims' critical alerts page too. One storm alert of the
        # cluster inhibits every victim alert in it (equal: [cluster]), and inhibition only grows.
        expected = {("GpunetPfcStorm", node) for node in incident["nodes"]}
        try:
            wait_for(lambda: paging() == expected, what="only the storm's alerts paging")
        except TimeoutError:
            pass  # the assertion below says what pages
        paged = paging()
        assert paged == expected, paged
        inhibited = [a for a in shown(True) if a["status"]["inhibitedBy"]]
        assert inhibited, "the victims' alerts were not inhibited"
        assert {a["labels"]["alertname"] for a in inhibited} <= {"GpunetPfcReceivePressure",
                                                                 "GpunetGpusIdleNetworkBound",
                                                                 "GpunetNetworkCongestion"}
        victims = {a["labels"]["instance"] for a in inhibited}
        assert len(victims) >= 6, victims  # the storm's pauses reached most of the 12 nodes
    finally:
        am.stop()
        prom.stop()


def _start_alertmanager(tmp_path, config=CONFIG) -> tuple[Process, str]:
    port = free_port()
    am = Process(["prometheus-alertmanager", f"--config.file={config}", f"--storage.path={tmp_path / 'am'}",
                  f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                 tmp_path / "alertmanager.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(url + "/-/ready")[0] == 200, what="alertmanager ready")
    except TimeoutError:
        am.stop()
        raise AssertionError(f"alertmanager did not start:\n{am.log()}") from None
    return am, url


def test_a_diagnosed_cause_mutes_its_own_jobs_symptoms_only(tmp_path):
    """A GpunetDiagnosisFinding of training/llm-a: the symptom alerts of llm-a's nodes are
    inhibited by it; another job's, and a node without a workload, still notify."""
    am, url = _start_alertmanager(tmp_path)
    finding = {"alertname": "GpunetDiagnosisFinding", "severity": "critical", "cluster": "c1",
               "workload": "training/llm-a", "class": "pfc_storm", "culprit": "node-003:9845",
               "job": "gpunet-diagnoser", "instance": "diag:9846"}
    victims = [{"alertname": name, "severity": "warning", "cluster": "c1", "job": "gpunet",
                "instance": instance, **({"workload": workload} if workload else {})}
               for name, instance, workload in [
                   ("GpunetGpusIdleNetworkBound", "node-001:9845", "training/llm-a"),
                   ("GpunetPfcReceivePressure", "node-004:9845", "training/llm-a"),
                   ("GpunetGpusIdleNetworkBound", "node-020:9845", "vision-b"),  # another job
                   ("GpunetGpusIdleNetworkBound", "node-030:9845", None),  # no workload known
               ]]
    other_cluster = {**victims[0], "cluster": "c2", "instance": "node-001:9845"}
    alerts = [{"labels": labels, "annotations": {"summary": "s"}} for labels in [finding, *victims, other_cluster]]
    try:
        request = urllib.request.Request(url + "/api/v2/alerts", data=json.dumps(alerts).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200

        def state() -> dict[tuple[str, str], list[str]]:
            got = json.loads(http_get(f"{url}/api/v2/alerts?active=true&inhibited=true")[2])
            return {(a["labels"]["cluster"], a["labels"]["alertname"], a["labels"].get("instance")):
                    a["status"]["inhibitedBy"] for a in got}

        muted = {("c1", "GpunetGpusIdleNetworkBound", "node-001:9845"), ("c1", "GpunetPfcReceivePressure", "node-004:9845")}

        def settled() -> bool:
            s = state()
            return len(s) == len(alerts) and {k for k, v in s.items() if v} >= muted
        try:
            wait_for(settled, what="the finding inhibiting its job's symptoms")
        except TimeoutError:
            pass  # the assertions below say what differs
        s = state()
        assert {k for k, v in s.items() if v} == muted, s
        fingerprint = next(a["fingerprint"] for a in json.loads(http_get(f"{url}/api/v2/alerts")[2])
                           if a["labels"]["alertname"] == "GpunetDiagnosisFinding")
        assert all(v == [fingerprint] for k, v in s.items() if k in muted), s
        assert s[("c2", "GpunetGpusIdleNetworkBound", "node-001:9845")] == []  # another cluster's same job
    finally:
        am.stop()
