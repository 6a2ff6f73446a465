"""The Grafana dashboards: well formed, generated, and every panel query returns data on real traces.

Each committed trace is backfilled into its own real Prometheus (gpunet-trace load), and every
panel expression, with Grafana's variables replaced, is evaluated with query_range over the
trace's own time range (backfilled data is old). An expression must parse everywhere and return
data on at least one trace, so that no panel is empty because of a typo or a wrong label.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import urllib.parse

import pytest
from procs import REPO, http_get, start_prometheus

DASHBOARDS = REPO / "dashboards"
FILES = ["gpunet-cluster.json", "gpunet-node.json", "gpunet-exporter.json"]
TRACES = ["pfc_storm.om.gz", "gpu_throttle.om.gz", "network_bandwidth_25g.om.gz", "link_degraded_flap.om.gz",
          "link_degraded_downshift.om.gz", "real/real-bandwidth.om.gz", "jobs3.om.gz"]

# Expressions over series no committed trace holds. Keep this short, with the reason.
NO_DATA_IN_TRACES = {
    "gpunet_nic_pfc_pause_duration_seconds_total": "the simulator models mlx5, whose driver counts no pause duration",
    "gpunet_nic_transmit_discards_total": "neither the simulator nor the veth recordings produce it",
    "gpunet_gpu_xid_errors_total": "no XID in any trace (the panel keeps only codes that occurred)",
    "gpunet_gpu_ecc_errors_total": "GPU health is newer than the traces (fixtures and goldens hold it)",
    "gpunet_gpu_nvlink_errors_total": "as above",
    "gpunet_gpu_remapped_rows": "as above",
    "gpunet_gpu_row_remap_pending": "as above",
    "gpunet_nic_symbol_errors_total": "PHY and IB transmit-wait counters are newer than the traces (goldens hold them)",
    "gpunet_nic_fec_uncorrectable_blocks_total": "as above",
    "gpunet_nic_fec_corrected_bit_errors_total": "as above",
    "gpunet_nic_transmit_wait_ticks_total": "as above",
    "scrape_duration_seconds": "Prometheus' own series: traces hold gpunet_* only",
    "process_": "process_* and up are not gpunet_* series, so traces do not hold them",
    "sum(up{": "as above",
}

SUBSTITUTIONS = {"$__rate_interval": "2m", "$__interval": "1m", "$__range": "10m",
                 "$instance": ".*", "$device": ".*", "$gpu": ".*", "$job": ".*", "$cluster": ".*",
                 "${datasource}": "prometheus"}


def load_build():
    spec = importlib.util.spec_from_file_location("dashboards_build", DASHBOARDS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboards() -> dict[str, dict]:
    return {name: json.loads((DASHBOARDS / name).read_text(encoding="utf-8")) for name in FILES}


def panels(dash: dict):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def substitute(expr: str) -> str:
    for k, v in SUBSTITUTIONS.items():
        expr = expr.replace(k, v)
    assert "$" not in expr, f"unknown variable left in {expr!r}"
    return expr


def all_exprs() -> list[tuple[str, str, str]]:
    out = []
    for name, dash in dashboards().items():
        for p in panels(dash):
            for t in p.get("targets", []):
                out.append((name, p["title"], t["expr"]))
    return out


def test_dashboards_are_well_formed():
    for name, dash in dashboards().items():
        assert dash["schemaVersion"] >= 36 and dash["uid"] and dash["title"], name
        vars_ = {v["name"]: v for v in dash["templating"]["list"]}
        assert vars_["datasource"]["type"] == "datasource" and vars_["datasource"]["query"] == "prometheus", name
        for v in ("cluster", "job", "instance", "device", "gpu"):
            assert vars_[v]["type"] == "query", (name, v)
            assert vars_[v]["query"].startswith("label_values("), (name, v)
            assert vars_[v]["datasource"]["uid"] == "${datasource}", (name, v)
            # The node drill-down opens on one node; elsewhere every variable can be "All".
            one = name == "gpunet-node.json" and v == "instance"
            assert vars_[v]["multi"] != one and vars_[v]["includeAll"] != one, (name, v)
        ids = set()
        for p in panels(dash):
            assert p["id"] not in ids, (name, p["title"])
            ids.add(p["id"])
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (name, p["title"])
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, p["title"])
            assert p["targets"], (name, p["title"])
            for t in p["targets"]:
                assert t["expr"].strip() and t["datasource"]["uid"] == "${datasource}", (name, p["title"])
                # panels follow the selection: every gpunet selector filters by node
                for selector in re.findall(r"gpunet_\w+\{[^}]*\}", t["expr"]):
                    assert 'instance=~"$instance"' in selector, (name, p["title"], selector)


def test_every_panel_has_a_unit_and_says_what_it_shows():
    for name, dash in dashboards().items():
        for p in panels(dash):
            if p["type"] == "row":
                continue
            assert p["fieldConfig"]["defaults"].get("unit"), (name, p["title"], "no unit")
            assert len(p.get("description", "")) > 20, (name, p["title"], "no description")


def test_every_query_follows_the_cluster_and_job_variables():
    for dash, title, expr in all_exprs():
        if "$job" in expr:
            assert "$cluster" in expr, (dash, title, expr)


def test_nodes_link_to_the_node_drill_down_with_the_time_range():
    """On the cluster and exporter dashboards, each panel whose series are nodes links each
    of them to the node dashboard, selecting that node, keeping cluster, job and time."""
    linked = 0
    for name, dash in dashboards().items():
        if name == "gpunet-node.json":
            continue
        for p in panels(dash):
            per_node = any("{{instance}}" in t.get("legendFormat", "") for t in p.get("targets", []))
            if p["type"] in ("timeseries", "bargauge") and per_node:
                (link,) = p["fieldConfig"]["defaults"]["links"]
                url = link["url"]
                assert url.startswith("/d/gpunet-node?"), (name, p["title"])
                assert "var-instance=${__field.labels.instance}" in url and "${__url_time_range}" in url
                assert "var-cluster=${cluster}" in url and "var-job=${job}" in url
                linked += 1
    assert linked >= 8, linked


def test_firing_alerts_are_annotations_on_every_dashboard():
    for name, dash in dashboards().items():
        (alerts,) = [a for a in dash["annotations"]["list"] if "ALERTS" in a.get("target", {}).get("expr", "")]
        assert alerts["enable"] and 'alertname=~"Gpunet.*"' in alerts["target"]["expr"], name
        assert 'alertstate="firing"' in alerts["target"]["expr"], name


def test_the_diagnoser_services_findings_are_annotations_on_every_dashboard():
    """The series `diagnose serve` publishes for each ongoing finding, on its culprit nodes."""
    for name, dash in dashboards().items():
        (found,) = [a for a in dash["annotations"]["list"]
                    if "gpunet_diagnosis_finding" in a.get("target", {}).get("expr", "")]
        assert found["enable"] and 'culprit=~"$instance"' in found["target"]["expr"], name
        assert "{{class}}" in found["target"]["titleFormat"] and "{{culprit}}" in found["target"]["textFormat"], name


def test_committed_json_is_the_generator_output():
    build = load_build()
    for name, make in build.DASHBOARDS.items():
        assert (DASHBOARDS / name).read_text(encoding="utf-8") == build.render(make), \
            f"dashboards/{name} is stale: run python dashboards/build.py"
    assert sorted(build.DASHBOARDS) == sorted(FILES)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One real Prometheus per trace, loaded with gpunet-trace load: [(trace, url, first, last)]."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("prometheus/promtool not installed")
    from concurrent.futures import ThreadPoolExecutor

    from gpunet.trace_cli import load, prometheus_command

    tmp = tmp_path_factory.mktemp("dash")
    traces = [REPO / "replay_data" / t for t in TRACES]
    with ThreadPoolExecutor(len(traces)) as pool:
        ranges = list(pool.map(lambda tr: load(tr, tmp / f"{tr.name}.tsdb")[:2], traces))
    procs, out = [], []
    try:
        for trace, (first, last) in zip(traces, ranges):
            data = tmp / f"{trace.name}.tsdb"
            args = [a for a in prometheus_command(data, "127.0.0.1:0")[1:] if not a.startswith("--web.listen-address")]
            proc, url = start_prometheus(args, tmp / f"prom-{trace.name}.log")
            procs.append(proc)
            out.append((trace.name, url, first, last))
        yield out
    finally:
        for p in procs:
            p.stop()


def query_range(url: str, expr: str, start: float, end: float) -> tuple[int, dict]:
    q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "60"})
    status, _, body = http_get(f"{url}/api/v1/query_range?{q}", timeout=30)
    return status, json.loads(body)


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_every_panel_query_parses_and_returns_data_on_some_trace(servers):
    empty, broken, allowed_used = [], [], set()
    for dash, title, expr in all_exprs():
        q = substitute(expr)
        found = False
        for _trace, url, first, last in servers:
            status, doc = query_range(url, q, first, last)
            if status != 200 or doc.get("status") != "success":
                broken.append(f"{dash} / {title}: {q}\n  -> {doc.get('error')}")
                break
            if any(r.get("values") for r in doc["data"]["result"]):
                found = True
                break
        else:
            if not found:
                allowed = [k for k in NO_DATA_IN_TRACES if k in expr]
                if allowed:
                    allowed_used.update(allowed)
                else:
                    empty.append(f"{dash} / {title}: {q}")
    assert not broken, "queries that do not parse or fail:\n" + "\n".join(broken)
    assert not empty, "queries that return no data on any trace:\n" + "\n".join(empty)
    unused = set(NO_DATA_IN_TRACES) - allowed_used
    assert not unused, f"allow-list entries no longer needed (a trace now holds them): {sorted(unused)}"


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_cluster_overview_points_at_the_pfc_storm_culprit(servers):
    """The 'top nodes by transmitted pauses' panel names the storm's culprit (node-011) first."""
    (name, url, first, last), = [s for s in servers if s[0] == "pfc_storm.om.gz"]
    culprit = json.loads((REPO / "replay_data" / "pfc_storm.labels.json").read_text())["incidents"][0]
    dash = dashboards()["gpunet-cluster.json"]
    (panel,) = [p for p in panels(dash) if p["title"] == "Top nodes by transmitted PFC pauses (time range)"]
    t = (culprit["start"] + culprit["end"]) / 2
    expr = substitute(panel["targets"][0]["expr"])
    status, doc = query_range(url, expr, t, t)
    assert status == 200, doc
    top = max(doc["data"]["result"], key=lambda r: float(r["values"][-1][1]))
    assert top["metric"]["instance"] in culprit["nodes"]


def test_readme_shows_the_committed_screenshot():
    png = REPO / "docs" / "img" / "cluster-overview-pfc-storm.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 300_000
    assert "docs/img/cluster-overview-pfc-storm.png" in (REPO / "README.md").read_text()


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                    reason="prometheus/promtool not installed")
def test_screenshot_renders_from_the_dashboard_queries(tmp_path):
    pytest.importorskip("matplotlib")
    import subprocess

    out = tmp_path / "shot.png"
    result = subprocess.run([sys.executable, str(REPO / "bench" / "render_dashboard.py"), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 50_000 < out.stat().st_size < 300_000


# Grafana's published dashboard types (the @grafana/schema npm package), checked by the
# TypeScript compiler: pinned, installed once into .cache/ (scripts/test installs them too).
GRAFANA_SCHEMA = ("@grafana/schema@13.2.3", "typescript@7.0.2")
SCHEMA_CACHE = REPO / ".cache" / "grafana-schema"
JSON_TYPE = """import type { Dashboard, DataQuery } from "@grafana/schema";
// JSON as Grafana stores it: string enums as their values; a query carries its data source's own fields.
type Json<T> = T extends DataQuery ? { [K in keyof T]: Json<T[K]> } & { [key: string]: unknown }
  : T extends string ? `${T}` : T extends Array<infer U> ? Array<Json<U>>
  : T extends object ? { [K in keyof T]: Json<T[K]> } : T;
"""


def typecheck(docs: dict[str, dict]) -> subprocess.CompletedProcess:
    if not (SCHEMA_CACHE / "node_modules" / "@grafana" / "schema").exists():
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(SCHEMA_CACHE), *GRAFANA_SCHEMA],
                       check=True, capture_output=True, timeout=300)
    # __requires is import metadata for Grafana's import dialog, not part of the dashboard model.
    body = "\n".join(f"export const {name.replace('-', '_').removesuffix('.json')}: Json<Dashboard> = "
                     f"{json.dumps({k: v for k, v in doc.items() if k != '__requires'}, indent=1)};"
                     for name, doc in docs.items())
    (SCHEMA_CACHE / "check.ts").write_text(JSON_TYPE + body + "\n")
    (SCHEMA_CACHE / "tsconfig.json").write_text(json.dumps({"compilerOptions": {
        "strict": True, "noEmit": True, "module": "esnext", "moduleResolution": "bundler", "target": "es2020"},
        "files": ["check.ts"]}))
    return subprocess.run(["node", str(SCHEMA_CACHE / "node_modules" / "typescript" / "bin" / "tsc"), "-p",
                           str(SCHEMA_CACHE / "tsconfig.json")], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("npm") is None or shutil.which("node") is None, reason="node/npm not installed")
def test_dashboards_match_grafanas_published_dashboard_types():
    result = typecheck(dashboards())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    # ...and the check can fail: a misspelt key and a wrong value type are caught.
    broken = json.loads(json.dumps(dashboards()["gpunet-node.json"]))
    broken["panels"][1]["titel"] = broken["panels"][1].pop("title")
    broken["refresh"] = 30
    result = typecheck({"gpunet-node.json": broken})
    assert result.returncode != 0 and "titel" in result.stdout and result.stdout.count("error TS") == 2, result.stdout
