"""The same answer from --replay FILE and from real Prometheus and VictoriaMetrics servers
loaded with the same trace: the same findings at the same times, naming the same culprits,
with the same GPU-hours and the same window judged."""

import json
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from test_diagnoser import REPO, TRACES, diagnose
from test_trace_cli import read_samples

pytestmark = pytest.mark.prometheus


def findings(*args: str) -> tuple[dict, list[tuple]]:
    result = diagnose(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    return doc, sorted((f["class"], tuple(f["nodes"]), f["start"], f["end"], f.get("gpu_hours_idle"), f["confidence"])
                       for f in doc["findings"])


def assert_server_agrees_with_file(trace, url: str) -> None:
    start, end = window(trace)
    file_doc, from_file = findings("--replay", str(trace), "--start", start, "--end", end)
    server_doc, from_server = findings("--prometheus", url, "--start", start, "--end", end)
    assert from_server == from_file
    for key in ("start", "end", "judged", "nodes", "gpus", "verdict"):
        assert server_doc[key] == file_doc[key], key
    assert server_doc["gpu_idle_fraction"] == pytest.approx(file_doc["gpu_idle_fraction"], abs=0.001)
    assert ("cost" in server_doc) == ("cost" in file_doc)
    # A node that joins inside the range counts from its first whole window on the server (the
    # part of a window after its first sample is in the file's count): 0.2% of healthy_join_leave.
    for key in ("gpu_hours", "gpu_hours_idle", "gpu_hours_lost_to_findings") if "cost" in file_doc else ():
        assert server_doc["cost"][key] == pytest.approx(file_doc["cost"][key], abs=0.011, rel=0.005), key
    # The capacity advice measures the same traffic both ways (bursts and line-rate time
    # summed on the server).
    a, b = file_doc.get("capacity"), server_doc.get("capacity")
    assert (a is None) == (b is None), (a, b)
    if a:
        for key in ("gpu_idle_saturated_fraction", "saturated_time_fraction"):
            if a[key] is not None:
                assert b[key] == pytest.approx(a[key], abs=0.005), (key, a, b)
        if "bursts_per_second" in a:
            assert b["bursts_per_second"] == pytest.approx(a["bursts_per_second"], rel=0.02), (a, b)


def window(trace):
    stamps = [t for _, t, _ in read_samples(trace)]
    return f"{min(stamps):.3f}", f"{max(stamps):.3f}"


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
@pytest.mark.parametrize("trace", TRACES, ids=[t.name for t in TRACES])
def test_prometheus_gives_the_replays_findings(trace, served):
    assert_server_agrees_with_file(trace, served(trace))


VM_TRACES = [t for t in TRACES if t.name in ("pfc_storm.om.gz", "two_incidents.om.gz", "link_degraded_flap.om.gz",
                                              "packet_loss_tcp.om.gz", "healthy_confounders.om.gz",
                                              "real-loss.om.gz")]


@pytest.mark.skipif(shutil.which("victoria-metrics") is None, reason="victoria-metrics not installed")
@pytest.mark.parametrize("trace", VM_TRACES, ids=[t.name for t in VM_TRACES])
def test_victoriametrics_gives_the_replays_findings(trace, victoria):
    assert_server_agrees_with_file(trace, victoria(trace))


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
@pytest.mark.parametrize("server", ["prometheus", "victoria"])
def test_a_window_without_data_says_where_the_data_is(server, served, victoria, request):
    """`--since 1h` against a server that holds a trace of long ago: the one-line error gives
    the asked window and where the data is, in RFC 3339."""
    if server == "victoria" and shutil.which("victoria-metrics") is None:
        pytest.skip("victoria-metrics not installed")
    trace = next(t for t in TRACES if t.name == "pfc_storm.om.gz")
    url = (served if server == "prometheus" else victoria)(trace)
    result = diagnose("--prometheus", url, "--since", "1h")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    first, last = (datetime.fromtimestamp(float(t), UTC) for t in window(trace))
    found = re.search(r"from about (\S+) to (\S+)", line)
    if server == "victoria" and not found:  # its index answers long ranges whatever the range
        assert "at other times" in line, line
        return
    assert found, line
    start, end = (datetime.fromisoformat(t.replace("Z", "+00:00")) for t in found.groups())
    # as fine as the storage blocks: Prometheus' backfilled blocks are 2 h, VictoriaMetrics' index a day
    slack = timedelta(hours=3 if server == "prometheus" else 25)
    assert start <= first and first - start <= slack, (line, first)
    assert end >= last and end - last <= slack, (line, last)


CONFIRMED = ["pfc_storm.om.gz", "two_incidents.om.gz", "link_degraded_flap.om.gz", "packet_loss_tcp.om.gz",
             "gpu_throttle.om.gz", "network_bandwidth_25g.om.gz", "network_congestion.om.gz", "straggler_trickle.om.gz",
             "host_bound.om.gz", "network_congestion_no_ecn.om.gz", "network_congestion_ib.om.gz"]


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
@pytest.mark.parametrize("name", CONFIRMED)
def test_each_findings_promql_shows_its_culprits_on_the_server(name, served):
    """What on-call pastes into their Prometheus: every finding's `promql`, evaluated over the
    finding's span on a real Prometheus holding the trace, returns data, with a series for
    each culprit; and the Grafana link points at the node dashboard, the culprits and the span."""
    import urllib.parse

    from procs import http_get

    trace = next(t for t in TRACES if t.name == name)
    result = diagnose("--replay", str(trace), "--format", "json", "--grafana-url", "https://grafana.example.com")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)["findings"]
    assert found
    url = served(trace)
    for f in found:
        query = urllib.parse.urlencode({"query": f["promql"], "start": f["start"], "end": f["end"], "step": 30})
        status, _, body = http_get(f"{url}/api/v1/query_range?{query}", timeout=30)
        doc = json.loads(body)
        assert status == 200 and doc["status"] == "success", (f["promql"], body[:300])
        shown = {r["metric"].get("instance") for r in doc["data"]["result"] if r["values"]}
        assert set(f["nodes"]) <= shown and shown, (f["class"], f["nodes"], shown, f["promql"])
        link = urllib.parse.urlsplit(f["grafana_url"])
        params = urllib.parse.parse_qs(link.query)
        assert link.path == ("/d/gpunet-node" if f["nodes"] else "/d/gpunet-cluster")
        assert params.get("var-instance", []) == f["nodes"]
        assert int(params["from"][0]) <= f["start"] * 1000 < f["end"] * 1000 <= int(params["to"][0])


def test_unreachable_prometheus_is_one_line():
    from procs import free_port
    result = diagnose("--prometheus", f"http://admin:hunter2@127.0.0.1:{free_port()}", "--since", "1h")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "cannot connect" in result.stderr
    assert "hunter2" not in result.stderr


@pytest.fixture
def secured(tmp_path):
    """A Prometheus behind TLS and basic auth (exporter-toolkit's web config), with a trace."""
    import subprocess as sp

    import bcrypt
    from procs import Process, free_port, wait_for

    from gpunet.trace_cli import prometheus_command

    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    sp.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
           check=True, capture_output=True)
    hashed = bcrypt.hashpw(b"s3cret-pass", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(json.dumps({"tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
                               "basic_auth_users": {"oncall": hashed}}))
    trace = TRACES[[t.name for t in TRACES].index("pfc_storm.om.gz")]
    data = tmp_path / "tsdb"
    assert sp.run([sys.executable, "-m", "gpunet.trace_cli", "load", str(trace), "--data", str(data)],
                  capture_output=True).returncode == 0
    port = free_port()
    proc = Process(prometheus_command(data, f"127.0.0.1:{port}") + [f"--web.config.file={web}"],
                   tmp_path / "prom.log")
    import socket
    wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True, what="prometheus")
    yield f"https://127.0.0.1:{port}", cert, trace
    proc.stop()


def test_tls_and_basic_auth(secured, monkeypatch):
    url, cert, trace = secured
    start, end = window(trace)
    monkeypatch.setenv("GPUNET_PROMETHEUS_PASSWORD", "s3cret-pass")
    ok = diagnose("--prometheus", url, "--ca-file", str(cert), "--basic-auth-user", "oncall", "--start", start,
                  "--end", end, "--format", "json")
    assert ok.returncode == 0, ok.stderr
    assert [f["class"] for f in json.loads(ok.stdout)["findings"]] == ["pfc_storm"]

    monkeypatch.setenv("GPUNET_PROMETHEUS_PASSWORD", "wrong")
    refused = diagnose("--prometheus", url, "--ca-file", str(cert), "--basic-auth-user", "oncall", "--since", "1h")
    assert refused.returncode == 1 and "unauthorised" in refused.stderr and "wrong" not in refused.stderr

    untrusted = diagnose("--prometheus", url, "--basic-auth-user", "oncall", "--since", "1h")
    assert untrusted.returncode == 1 and len(untrusted.stderr.strip().splitlines()) == 1
    assert "certificate" in untrusted.stderr.lower()


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
@pytest.mark.parametrize("name", ["two_incidents.om.gz", "packet_loss_link.om.gz", "network_congestion.om.gz"])
def test_both_sources_give_the_same_frame(served, name):
    """One mapping of metrics to columns (diagnoser/model/columns.py) drives the trace reader
    and the PromQL: on the same trace and window, every column both fill agrees, cell by
    cell, up to the server's extrapolation at a counter's edges."""
    import numpy as np
    from test_diagnoser import REPO

    from diagnoser.model.columns import COLUMNS
    from diagnoser.sources import Source, read_frame

    trace = REPO / "replay_data" / name
    start, end = window(trace)
    from_file = read_frame(Source(replay=str(trace), start=start, end=end))
    from_server = read_frame(Source(prometheus=served(trace), start=start, end=end))
    assert from_file.instances == from_server.instances and from_file.step == from_server.step
    assert np.array_equal(from_file.windows, from_server.windows)
    columns = sorted({col.column + suffix for col in COLUMNS if col.how == "increase" and col.table != "nic"
                      for suffix in (col.split_values.values() if col.split_by else [""])}
                     | {"tx_bytes", "rx_bytes", "pfc_tx", "pfc_rx", "saturated", "capacity", "gpus"})
    # Counters that grow steadily agree window by window; a counter that jumps (pauses,
    # retransmits, idle in a rare state) agrees only over many windows: increase() scales a
    # jump inside its range by range / sampled span (4/3 for 4 scrapes a window) and
    # misses the one across the range's start, which cancel on average.
    steady = {"busy", "tx_bytes", "rx_bytes", "tcp_sent", "capacity", "gpus", "saturated", "state_saturated",
              "state_active", "state_quiet"}
    checked = 0
    for column in columns:
        a = from_file.node[column].unstack("instance").iloc[1:-1]  # edges: the server extrapolates
        b = from_server.node[column].unstack("instance").iloc[1:-1]
        both = np.isfinite(a.to_numpy()) & np.isfinite(b.to_numpy())
        if not both.any():
            continue
        x, y = a.to_numpy()[both], b.to_numpy()[both]
        if column in steady:
            close = np.abs(x - y) <= 0.05 * np.abs(x) + 0.01 * np.abs(x).max()
            assert close.mean() >= 0.8, (column, float(close.mean()))
        # over the range, up to the counting noise of rare events (a few dozen pauses)
        assert abs(x.sum() - y.sum()) <= 0.1 * abs(x.sum()) + 2 * np.sqrt(abs(x.sum())), (column, x.sum(), y.sum())
        checked += 1
    assert checked >= 12, checked  # the test saw the columns, not an empty frame


@pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("victoria-metrics") is None,
                    reason="prometheus or victoria-metrics not installed")
@pytest.mark.parametrize("server, limits", [
    ("prometheus", ("--query.max-samples=3000",)),  # the default is 50,000,000
    # samples per query (default 1e9) and points per series (default 30,000: fewer nodes do not help)
    ("victoria", ("-search.maxSamplesPerQuery=6000", "-search.maxPointsPerTimeseries=8")),
])
def test_a_query_over_a_servers_limit_is_split_and_gives_the_same_frame(server, limits, served, victoria):
    """A server started with lowered query limits refuses the diagnoser's queries for the
    whole cluster: each refused query is halved (by nodes, or by time where the limit is on
    points per series) until it passes, a warning names the split, and the frame is the one
    the same server gives with its default limits."""
    import pandas as pd

    from diagnoser.sources import Source, read_frame

    trace = next(t for t in TRACES if t.name == "pfc_storm.om.gz")
    start, end = window(trace)
    serve = served if server == "prometheus" else victoria
    whole = read_frame(Source(prometheus=serve(trace), start=start, end=end))
    said: list[str] = []
    split = read_frame(Source(prometheus=serve(trace, *limits), start=start, end=end), said.append)
    warnings = [m for m in said if m.startswith("warning: the server refused a query over its limit")]
    assert any("nodes into groups" in m for m in warnings), said
    if server == "victoria":
        assert any("maxPointsPerTimeseries" in m and "windows into" in m for m in warnings), said
    assert re.search(r"queries in all, \d+ split to fit the server's limits", said[-1]), said[-1]
    tables = [(whole, split, name) for name in ("node", "nic", "gpu", "fine", "node_fine", "workloads", "nccl")]
    tables += [(whole.config, split.config, name) for name in ("nic", "gpu", "pfc", "ecn", "link_pause", "bond")]
    for a, b, name in tables:
        pd.testing.assert_frame_equal(getattr(a, name).sort_index(), getattr(b, name).sort_index(), check_like=True,
                                      rtol=1e-9, obj=name)
    assert split.gpu_seconds == pytest.approx(whole.gpu_seconds, rel=1e-9)
    assert (split.fabric_speed_median == whole.fabric_speed_median).all()


def short_trace(tmp_path, seconds: int) -> tuple[Path, float, float]:
    """A cluster scraped every 5 s for `seconds`: what a Prometheus that has just started holds."""
    trace = tmp_path / f"short-{seconds}.om.gz"
    subprocess.run([sys.executable, "-m", "gpunet.simulate.cli", "--nodes", "4", "--duration", f"{seconds}s",
                    "--scrape", "5", "--seed", "3", "--quiet", str(trace)], check=True, timeout=120, cwd=REPO)
    stamps = [t for _, t, _ in read_samples(trace)]
    return trace, min(stamps), max(stamps)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_a_server_that_has_just_started_is_judged_on_what_it_holds(tmp_path, served):
    """85 s of 5 s scrapes and `--since 5m`: the scrape interval the data shows (not the range
    over the sample count), a grid fitted to it, the window cut to the data, and advice that
    can be followed (a time when enough data will exist, not a longer window the server
    cannot supply); no library warning on stderr. The same from the file."""
    trace, first, last = short_trace(tmp_path, 85)
    url = served(trace)
    window = ("--start", f"{last - 300:.3f}", "--end", f"{last + 2:.3f}")
    result = diagnose("--prometheus", url, *window, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "inconclusive"
    assert abs(doc["start"] - first) < 1.0  # judged on the part the server holds
    [reason] = [r for r in doc["inconclusive_reasons"] if "grid" in r]
    assert "scrapes every 5 s" in reason and "20 s grid" in reason, reason
    when = re.search(r"diagnose again once \d+ minutes of data exist, after (\S+)$", reason)
    assert when, reason
    ready = datetime.fromisoformat(when.group(1).replace("Z", "+00:00")).timestamp()
    assert first + 100 <= ready <= first + 180, (reason, first)
    from_file = diagnose("--replay", str(trace), *window, "--format", "json")
    assert json.loads(from_file.stdout)["judged"] == doc["judged"]

    # A minute later: 145 s of data; judged only where the data is, on the same 20 s grid.
    trace, first, last = short_trace(tmp_path, 145)
    url = served(trace)
    result = diagnose("--prometheus", url, "--start", f"{last - 300:.3f}", "--end", f"{last + 2:.3f}",
                      "--format", "json")
    assert result.returncode == 0 and "Warning" not in result.stderr, result.stderr
    doc = json.loads(result.stdout)
    assert doc["judged"]["start"] >= first and doc["judged"]["end"] - doc["judged"]["start"] >= 80, doc["judged"]
    assert (doc["judged"]["end"] - doc["judged"]["start"]) % 20 == 0
