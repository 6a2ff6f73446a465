"""diagnose over labelled traces: the committed simulated set and the real veth recordings.
Ground truth comes from the simulator's and the recorder's labels, never from the diagnoser."""

import gzip
import json
import os
import subprocess
import sys

import jsonschema
import pytest
from procs import REPO

from diagnoser.evaluate import Score, labels_of

TRACES = sorted((REPO / "replay_data").rglob("*.om.gz"))
SCHEMA = json.loads((REPO / "docs" / "diagnose.schema.json").read_text())


def diagnose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagnoser.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("trace", TRACES, ids=[t.name for t in TRACES])
def test_committed_trace_is_diagnosed_right(trace):
    result = diagnose("--replay", str(trace), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)  # docs/diagnose.schema.json: the document's committed shape
    labels = labels_of(trace)["incidents"]
    assert doc["verdict"] == ("findings" if labels else "healthy"), doc.get("inconclusive_reasons")
    score = Score()
    score.add(trace.name, labels_of(trace)["incidents"], doc["findings"])
    assert not score.misses and not score.false_findings, (score.misses, score.false_findings)


def test_text_report_puts_the_worst_first_with_numbers():
    result = diagnose("--replay", str(REPO / "replay_data" / "two_incidents.om.gz"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    first = next(l for l in lines if l.startswith("1. "))
    assert "pfc_storm" in first or "gpu_throttle" in first
    assert "GPU-hours idle" in result.stdout and "what to do:" in result.stdout


def test_trace_without_gpu_series_reports_impact_unknown():
    result = diagnose("--replay", str(REPO / "replay_data" / "real" / "real-iperf3.om.gz"))
    assert result.returncode == 0, result.stderr
    assert "network_bandwidth" in result.stdout and "GPU impact unknown" in result.stdout


def test_fail_on_findings_exit_status():
    assert diagnose("--replay", str(REPO / "replay_data" / "pfc_storm.om.gz"), "--fail-on-findings").returncode == 3
    assert diagnose("--replay", str(REPO / "replay_data" / "healthy_basic.om.gz"),
                    "--fail-on-findings").returncode == 0


def test_malformed_trace_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.om"
    bad.write_text('# TYPE gpunet_nic_up gauge\ngpunet_nic_up{device="x",instance="n:1"} 1 1767225600\n'
                   'gpunet_nic_up{device="x",instance="n:1"} one 1767225615\n# EOF\n')
    result = diagnose("--replay", str(bad))
    assert result.returncode == 1
    assert f"{bad}:3" in result.stderr and "Traceback" not in result.stderr


def test_truncated_gzip_is_a_clear_error(tmp_path):
    data = (REPO / "replay_data" / "healthy_basic.om.gz").read_bytes()
    cut = tmp_path / "cut.om.gz"
    cut.write_bytes(data[: len(data) // 3])
    result = diagnose("--replay", str(cut))
    assert result.returncode == 1
    assert "truncated or corrupt" in result.stderr and "Traceback" not in result.stderr


def test_no_gpunet_series_is_a_clear_error(tmp_path):
    other = tmp_path / "other.om.gz"
    with gzip.open(other, "wt") as f:
        f.write('# TYPE node_load1 gauge\nnode_load1{instance="n:1"} 1 1767225600\n# EOF\n')
    result = diagnose("--replay", str(other))
    assert result.returncode == 1 and "no gpunet series" in result.stderr
