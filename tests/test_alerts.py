"""The alert rules (alerts/gpunet.rules.yml), proven with promtool and on the committed traces.

promtool checks the rule file and runs its unit tests (alerts/tests/*.yml). Then every
committed trace is loaded into its own real Prometheus (gpunet-trace load), one server per
trace for the whole module, each started with the rule file so that Prometheus itself
parses it. Every rule's expression (recording rules inlined, since backfilled data is too
old for the rule manager to evaluate) is evaluated with /api/v1/query_range over the
trace's own time range, without `for`: each must evaluate, return data on some trace, fire
on the incidents it is meant for with the culprit's instance, and stay silent on healthy
traces.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
from procs import REPO, http_get, start_prometheus

pytestmark = [pytest.mark.prometheus,
              pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                 reason="prometheus/promtool not installed")]

RULES = REPO / "alerts" / "gpunet.rules.yml"
RULE_TESTS = sorted((REPO / "alerts" / "tests").glob("*.yml"))
REPLAY = REPO / "replay_data"
TRACES = {p.name.removesuffix(".om.gz"): p for p in [*REPLAY.glob("*.om.gz"), *(REPLAY / "real").glob("*.om.gz")]}

# Metrics that some rule uses but that no committed trace holds: `up` is Prometheus' own
# (traces hold gpunet_* only); the traces were recorded before the exporter exported these
# extras. The rules using them are proven by the promtool unit tests instead. The test
# below checks that they really are absent, so that this list is shortened when traces are
# re-recorded.
# (The simulator emits the configuration gauges, healthy; bonds only with a bond config fault.)
NOT_IN_TRACES = {"up", "gpunet_gpu_xid_errors_total", "gpunet_nic_fabric", "gpunet_bond_member_up",
                 # GPU and PHY health are newer than the traces (fixtures, goldens and promtool tests hold them)
                 "gpunet_gpu_row_remap_failed", "gpunet_gpu_row_remap_pending", "gpunet_gpu_ecc_errors_total",
                 "gpunet_gpu_nvlink_errors_total", "gpunet_nic_symbol_errors_total",
                 "gpunet_nic_fec_uncorrectable_blocks_total",
                 # the diagnoser service's own series (`diagnose serve`), never in an exporter's trace
                 "gpunet_diagnosis_finding", "gpunet_diagnosis_finding_info", "gpunet_diagnosis_data_age_seconds",
                 "gpunet_diagnosis_last_success_timestamp_seconds"}

# Healthy traces where an alert rightly fires: in healthy_confounders one node's GPU
# collector fails all along (the "missing GPU series" confounder), which is what
# GpunetCollectorDown is for; its job is healthy, no other alert may fire. No diagnoser
# service runs beside a trace's server: GpunetDiagnoserBlind rightly says none reports.
HEALTHY_EXCEPT = {"healthy_basic": {"GpunetDiagnoserBlind"}, "healthy_join_leave": {"GpunetDiagnoserBlind"},
                  "healthy_confounders": {"GpunetCollectorDown", "GpunetDiagnoserBlind"}}


def promtool(*args: str) -> subprocess.CompletedProcess:
    # Every unit test file at once takes a minute on a busy 2-core machine: the bound is for a hang.
    return subprocess.run(["promtool", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_promtool_check_rules_is_clean():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "WARNING" not in (result.stdout + result.stderr).upper()


def test_promtool_unit_tests_cover_every_alert_firing_and_silent():
    assert RULE_TESTS, "no promtool unit tests in alerts/tests/"
    result = promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    # Every alert has at least one test case where it fires and one where it stays silent.
    alerts = set(re.findall(r"^\s*- alert:\s*(\S+)", RULES.read_text(), re.M))
    firing, silent = set(), set()
    for path in RULE_TESTS:
        # An alert_rule_test entry: "- eval_time: ...\n  alertname: X\n  exp_alerts: [...]"
        for name, exp in re.findall(r"alertname:\s*(\S+)\s*\n\s*exp_alerts:\s*(\[\]|\n)", path.read_text()):
            (silent if exp == "[]" else firing).add(name)
    assert alerts - firing == set(), "alerts without a firing test case"
    assert alerts - silent == set(), "alerts without a not-firing test case"


def _build_module():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("alerts_build", REPO / "alerts" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _runbook_anchors() -> set[str]:
    """docs/runbook.md's section anchors, as GitHub and GitLab make them from headings."""
    runbook = (REPO / "docs" / "runbook.md").read_text()
    return {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{2,3} (.+)$", runbook, re.M)}


def test_every_alert_has_its_runbook_section():
    runbook = (REPO / "docs" / "runbook.md").read_text()
    anchors = _runbook_anchors()
    text = RULES.read_text()
    alerts = re.findall(r"^\s*- alert:\s*(\S+)", text, re.M)
    base = _build_module().Settings().runbook_url_base  # the default build's
    assert base == "docs/runbook.md" and (REPO / base).is_file()
    urls = re.findall(r'runbook_url:\s*"' + re.escape(base) + '#([^"]+)"', text)
    assert len(urls) == len(alerts) == len(re.findall(r"runbook_url:", text))
    assert [a.lower() for a in alerts] == urls
    # A name used twice is one alert at two severities (the mixins' way: GpunetDiagnosisFinding
    # by class); otherwise every alert is its own.
    severities = re.findall(r"^\s*- alert:\s*(\S+)(?:.|\n)*?severity: (\w+)", text, re.M)
    assert len(severities) == len(alerts) and len(set(severities)) == len(severities), severities
    assert set(urls) <= anchors, set(urls) - anchors
    for alert in alerts:  # each section says why its threshold is where it is
        section = runbook.split(f"## {alert}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Means.**", "**Threshold.**", "**Check.**", "**Do.**"):
            assert part in section, (alert, part)
    # every rule carries a mixin severity, a static summary, and a description that names the node
    # (the diagnoser's findings: the culprit node it names)
    for block in re.split(r"^\s*- alert:", text, flags=re.M)[1:]:
        assert re.search(r"severity: (critical|warning|info)\n", block), block
        summary = re.search(r'summary: "(.*)"', block).group(1)
        assert "{{" not in summary, block
        assert "description:" in block and ("{{ $labels.instance }}" in block or "{{ $labels.culprit }}" in block), \
            block


def test_the_committed_rules_are_the_default_build(tmp_path):
    import sys

    build = subprocess.run([sys.executable, str(REPO / "alerts" / "build.py"), "--check"], capture_output=True,
                           text=True, timeout=60)
    assert build.returncode == 0, build.stderr


def test_a_build_with_other_settings_holds_them_everywhere(tmp_path):
    """Another job selector, cluster label, rate interval and runbook base: every series
    selector carries the selector, every join names the cluster label, and promtool accepts it."""
    import sys

    out = tmp_path / "rules.yml"
    subprocess.run([sys.executable, str(REPO / "alerts" / "build.py"), "--selector", 'job="gpu-nodes"',
                    "--cluster-label", "region", "--rate-interval", "2m", "--runbook-url-base",
                    "https://wiki.example.com/runbook", "--out", str(out)], check=True, capture_output=True, timeout=60)
    import yaml

    text = out.read_text()
    assert promtool("check", "rules", str(out)).returncode == 0
    exprs = "\n".join(rule["expr"] for group in yaml.safe_load(text)["groups"] for rule in group["rules"])
    selectors = re.findall(r"\b(gpunet_\w+|up)(\{[^}]*\}|\[|\)|\s|$)", exprs)
    raw = [name for name, after in selectors if not after.startswith("{") and ":" not in name]
    assert not raw, f"series without the selector: {raw}"
    # the exporters' series carry --selector, the diagnoser service's its own (--diagnoser-selector)
    diagnoser = [(name, sel) for name, sel in selectors if 'job="gpunet-diagnoser"' in sel]
    assert diagnoser and all(name.startswith("gpunet_diagnosis_") or name == "up" for name, _ in diagnoser)
    assert all('job="gpu-nodes"' in sel for name, sel in selectors if sel.startswith("{") and (name, sel) not in diagnoser)
    assert "cluster" not in exprs and exprs.count("on (region, job, instance") >= 5
    assert "[5m]" not in text and "rate2m" in text and "https://wiki.example.com/runbook#gpunetpfcstorm" in text


# ---------------------------------------------------------------- on the committed traces

def _query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step})
    status, _, body = http_get(f"{url}/api/v1/query_range?{params}", timeout=30)
    doc = json.loads(body)
    assert status == 200 and doc["status"] == "success", f"{expr}: {body[:500]!r}"
    return doc["data"]["result"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{trace name: (url, first, last)}: one Prometheus per committed trace, with the rules loaded."""
    from gpunet.trace_cli import load, prometheus_command

    base = tmp_path_factory.mktemp("alert-traces")

    def backfill(item):
        name, path = item
        data = base / f"{name}.tsdb"
        first, last, _ = load(path, data)
        return name, data, first, last

    with ThreadPoolExecutor(8) as pool:
        loaded = list(pool.map(backfill, sorted(TRACES.items())))

    def serve(item):
        name, data, first, last = item
        args = [a for a in prometheus_command(data, "127.0.0.1:0")[1:] if not a.startswith("--web.listen-address")]
        config = data / "prometheus.yml"  # written by prometheus_command; add the rule file
        config.write_text(json.dumps({**json.loads(config.read_text()), "rule_files": [str(RULES)]}))
        proc, url = start_prometheus(args, base / f"{name}.log")
        return name, proc, url, first, last

    with ThreadPoolExecutor(8) as pool:
        started = list(pool.map(serve, loaded))
    try:
        yield {name: (url, first, last) for name, _, url, first, last in started}
    finally:
        for _, proc, *_ in started:
            proc.stop()


def inline(expr: str, recorded: dict[str, str]) -> str:
    """A rule's expression with the recording rules it uses written out (backfilled data is
    too old for Prometheus' rule manager: the recorded series do not exist)."""
    for name, body in recorded.items():
        expr = re.sub(re.escape(name) + r"(?![\w:])", lambda _, body=body: f"({body})", expr)
    return expr


@pytest.fixture(scope="module")
def rules(servers):
    """[(kind, name, expr with recording rules inlined)] in file order, as Prometheus parsed them."""
    url = next(iter(servers.values()))[0]
    status, _, body = http_get(f"{url}/api/v1/rules")
    assert status == 200, body
    recorded: dict[str, str] = {}
    out = []

    # The API lists groups by name, not in file order: recording rules first, each inlining
    # the ones defined before it, then the alerts.
    listed = [rule for group in json.loads(body)["data"]["groups"] for rule in group["rules"]]
    for kind in ("recording", "alerting"):
        for rule in listed:
            assert rule.get("health") != "err", rule
            if rule["type"] == kind:
                expr = inline(rule["query"], recorded)
                if kind == "recording":
                    recorded[rule["name"]] = expr
                out.append((kind, rule["name"], expr))
    names = {name for _, name, _ in out}
    assert names >= set(re.findall(r"^\s*- (?:alert|record):\s*(\S+)", RULES.read_text(), re.M))
    return out


def _step(first: float, last: float) -> float:
    return max(5.0, round((last - first) / 120))


@pytest.fixture(scope="module")
def evaluations(servers, rules):
    """{(trace, rule name): query_range result over the whole trace}, the `for` clause left out."""
    jobs = [(trace, name, expr) for trace in servers for _, name, expr in rules]

    def run(job):
        trace, name, expr = job
        url, first, last = servers[trace]
        return (trace, name), _query_range(url, expr, first, last, _step(first, last))

    with ThreadPoolExecutor(16) as pool:
        return dict(pool.map(run, jobs))


def _measured(expr: str) -> str:
    """`X > 10` -> `X`: what a simple threshold alert compares."""
    return re.sub(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.e+-]+\s*$", "", expr.strip())


def test_every_rule_evaluates_and_returns_data_on_some_trace(servers, rules, evaluations):
    problems = []
    for kind, name, expr in rules:
        if any(evaluations[(trace, name)] for trace in servers):
            continue
        if kind == "recording":
            problems.append(f"recording rule {name} returns no data on any trace")
            continue
        # An alert that fires on no trace: what it measures must have data somewhere,
        # unless it is built only on metrics no committed trace holds.
        measured = _measured(expr)
        if measured != expr and any(_query_range(url, measured, first, last, _step(first, last))
                                    for url, first, last in servers.values()):
            continue
        # A condition no trace meets (a configuration mistake the traces do not hold): each
        # metric it reads must still be in some trace, or be known to be in none.
        metrics = set(re.findall(r"\b(gpunet_[a-z0-9_]+|up)\b\s*[{\[]", expr)) - NOT_IN_TRACES
        absent = {m for m in metrics if not any(_query_range(url, f"group({m})", first, last, _step(first, last))
                                                for url, first, last in servers.values())}
        if absent:
            problems.append(f"alert {name} ({expr}) fires on no trace and reads metrics no trace holds: {absent}")
    assert problems == [], "\n".join(problems)


def test_metrics_missing_from_traces_are_really_missing(servers):
    for trace, (url, first, last) in servers.items():
        for metric in NOT_IN_TRACES:
            if metric == "up":
                continue  # never in a trace: Prometheus makes it when it scrapes
            assert _query_range(url, metric, first, last, 60) == [], \
                f"{trace} now holds {metric}: remove it from NOT_IN_TRACES"


def _labels(trace: str) -> list[dict]:
    path = TRACES[trace]
    return json.loads(path.with_name(path.name.removesuffix(".om.gz") + ".labels.json").read_text())["incidents"]


def _firing(evaluations, trace: str, alert: str) -> dict[str, list[float]]:
    """{instance: [times the alert expression returned it]}."""
    out: dict[str, list[float]] = {}
    for series in evaluations[(trace, alert)]:
        # (no instance: an absent() alert, GpunetDiagnoserBlind's "no diagnoser at all")
        out.setdefault(series["metric"].get("instance", ""), []).extend(float(t) for t, _ in series["values"])
    return out


# (trace, alert, index of the incident in the labels file, localised)
INCIDENT_ALERTS = [
    ("pfc_storm", "GpunetPfcStorm", 0, True),
    ("two_incidents", "GpunetPfcStorm", 0, True),
    ("link_degraded_flap", "GpunetLinkFlapping", 0, True),
    ("two_incidents_overlapping", "GpunetLinkFlapping", 1, True),
    ("link_degraded_downshift", "GpunetLinkSpeedBelowPeers", 0, True),
    ("gpu_throttle", "GpunetGpuThrottled", 0, True),
    ("two_incidents", "GpunetGpuThrottled", 1, True),
    ("packet_loss_link", "GpunetRdmaLossEvents", 0, False),  # the lossy port and its ring neighbours
    ("network_bandwidth_25g", "GpunetGpusIdleNetworkBound", 0, False),
    ("network_congestion", "GpunetNetworkCongestion", 0, False),
    ("network_congestion_no_ecn", "GpunetPfcReceivePressure", 0, False),
    ("network_congestion_ib", "GpunetInfinibandCongestion", 0, False),
    ("real-loss", "GpunetTcpRetransmitRatio", 0, False),
]


@pytest.mark.parametrize("trace,alert,index,localised", INCIDENT_ALERTS,
                         ids=[f"{t}-{a}" for t, a, _, _ in INCIDENT_ALERTS])
def test_alert_fires_on_its_incident_with_the_culprit(evaluations, trace, alert, index, localised):
    incident = _labels(trace)[index]
    firing = _firing(evaluations, trace, alert)
    assert firing, f"{alert} silent on {trace}"
    culprits = set(incident["nodes"])
    if localised:
        assert set(firing) == culprits, f"{alert} on {trace} names {sorted(firing)}, culprits {sorted(culprits)}"
    elif culprits:
        assert culprits <= set(firing), f"{alert} on {trace} misses culprits {sorted(culprits - set(firing))}"
    # It fires during the incident (rate windows lag by up to 10 min), not before it.
    times = [t for ts in firing.values() for t in ts]
    assert min(times) >= incident["start"] - 60 and min(times) <= incident["end"], (trace, alert, min(times))
    if alert == "GpunetGpusIdleNetworkBound":  # not localised: every node waits on the slow links
        assert len(firing) >= 4, f"only {sorted(firing)} idle on the saturated network of {trace}"


@pytest.mark.parametrize("trace", sorted(HEALTHY_EXCEPT))
def test_alerts_stay_silent_on_healthy_traces(rules, evaluations, trace):
    assert _labels(trace) == []
    fired = {name: sorted(_firing(evaluations, trace, name))
             for kind, name, _ in rules if kind == "alerting" and evaluations[(trace, name)]}
    assert set(fired) == HEALTHY_EXCEPT[trace], fired


def test_runbook_links_resolve_under_the_base_or_pattern_given(tmp_path):
    """Built with where the user hosts docs/runbook.md (a base, or the mixins' URL pattern),
    every runbook_url is that address and one of the runbook's sections; nothing in alerts/
    or deploy/ points at a made-up repository."""
    import sys

    anchors = _runbook_anchors()
    for flag, value, prefix in (("--runbook-url-base", "https://docs.example.org/ops/runbook.md",
                                 "https://docs.example.org/ops/runbook.md#"),
                                ("--runbook-url-pattern", "https://wiki.example.org/gpunet/%s",
                                 "https://wiki.example.org/gpunet/")):
        out = tmp_path / "rules.yml"
        subprocess.run([sys.executable, str(REPO / "alerts" / "build.py"), flag, value, "--out", str(out)],
                       check=True, capture_output=True, timeout=60)
        urls = re.findall(r'runbook_url: "([^"]+)"', out.read_text())
        assert urls and all(u.startswith(prefix) and u[len(prefix):] in anchors for u in urls), urls
    bad = subprocess.run([sys.executable, str(REPO / "alerts" / "build.py"), "--runbook-url-pattern",
                          "https://wiki.example.org/gpunet", "--out", str(tmp_path / "x.yml")], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "%s" in bad.stderr
    for path in [*(REPO / "alerts").rglob("*"), *(REPO / "deploy").rglob("*")]:
        if path.is_file():
            assert "github.com/gpunet/gpunet" not in path.read_text(errors="replace"), path
