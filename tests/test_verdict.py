"""No verdict without the data for it (docs/diagnose.md): each way a window can lack what
a verdict needs gives `inconclusive` with a reason that says what is missing and what was
seen, findings and `inconclusive` never appear together, the exit status follows the
verdict, and every document matches the committed JSON Schema.

The traces are committed ones with parts taken away (as a scrape that lost them would), so
what the full trace holds is known from its labels."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
from test_diagnoser import REPO, SCHEMA, diagnose
from test_diagnoser_prometheus import window

STORM = REPO / "replay_data" / "pfc_storm.om.gz"
HEALTHY = REPO / "replay_data" / "healthy_basic.om.gz"


def document(*args: str, expect: int = 0) -> dict:
    result = diagnose(*args, "--format", "json")
    assert result.returncode == expect, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    return doc


def keep_families(src: Path, dst: Path, keep) -> Path:
    """A copy of a trace with only the metric families `keep(name)` accepts."""
    kept = True
    with gzip.open(src, "rt") as f, gzip.open(dst, "wt") as out:
        for line in f:
            if line.startswith(("# TYPE ", "# HELP ", "# UNIT ")):
                kept = keep(line.split()[2])
            if line.startswith("# EOF") or kept:
                out.write(line)
    return dst


def strip_instance(src: Path, dst: Path, only: str | None = None) -> Path:
    """A copy of a trace whose series lose their instance label (all, or those of one node)."""
    pattern = re.compile(r'instance="' + (re.escape(only) if only else r'[^"]*') + r'",?')
    with gzip.open(src, "rt") as f, gzip.open(dst, "wt") as out:
        for line in f:
            out.write(pattern.sub("", line).replace(",}", "}").replace("{}", ""))
    return dst


def test_gpu_series_without_nic_series_say_what_the_gpus_saw(tmp_path):
    """A PFC storm with only the GPU series left: not host_bound, not healthy; the GPUs'
    own network_state says they idled while their links were paused."""
    trace = keep_families(STORM, tmp_path / "gpu-only.om.gz", lambda name: name.startswith("gpunet_gpu_"))
    doc = document("--replay", str(trace))
    assert doc["verdict"] == "inconclusive" and doc["findings"] == []
    reasons = " ".join(doc["inconclusive_reasons"])
    assert "no fabric NIC series" in reasons and "paused" in reasons, reasons
    document("--replay", str(trace), "--fail-on-findings", expect=4)


def test_nic_series_without_gpu_series_find_the_storm_and_say_the_impact_is_unknown(tmp_path):
    trace = keep_families(STORM, tmp_path / "nic-only.om.gz", lambda name: not name.startswith("gpunet_gpu_"))
    doc = document("--replay", str(trace))
    assert doc["verdict"] == "findings" and "inconclusive_reasons" not in doc
    (storm,) = doc["findings"]
    assert storm["class"] == "pfc_storm" and storm["nodes"] == ["node-011:9845"]
    assert storm["gpu_idle_seconds"] is None
    assert any("no GPU series" in note for note in doc["notes"]), doc["notes"]
    document("--replay", str(trace), "--fail-on-findings", expect=3)


@pytest.mark.parametrize("since", ["10s", "2m", "5m"])
def test_a_window_too_short_to_compare_is_inconclusive_at_any_length_below_the_need(since):
    doc = document("--replay", str(STORM), "--since", since)
    assert doc["verdict"] == "inconclusive" and doc["findings"] == []
    (reason,) = doc["inconclusive_reasons"]
    assert "whole window" in reason and "needs at least" in reason, reason
    document("--replay", str(STORM), "--since", since, "--fail-on-findings", expect=4)


def test_series_without_instance_are_named_not_read_as_a_healthy_cluster(tmp_path):
    trace = strip_instance(HEALTHY, tmp_path / "no-instance.om.gz")
    doc = document("--replay", str(trace))
    assert doc["verdict"] == "inconclusive" and doc["nodes"] == 0
    assert any("no `instance` label" in r for r in doc["inconclusive_reasons"]), doc["inconclusive_reasons"]


def test_one_node_without_instance_makes_a_healthy_window_inconclusive(tmp_path):
    trace = strip_instance(HEALTHY, tmp_path / "one-lost.om.gz", only="node-003:9845")
    doc = document("--replay", str(trace))
    assert doc["verdict"] == "inconclusive", doc
    assert any("no `instance` label" in r for r in doc["inconclusive_reasons"])


def test_healthy_and_findings_set_the_exit_status():
    assert document("--replay", str(HEALTHY), "--fail-on-findings")["verdict"] == "healthy"
    doc = document("--replay", str(STORM), "--fail-on-findings", expect=3)
    assert doc["verdict"] == "findings"


def test_the_text_report_says_the_verdict_first(tmp_path):
    trace = keep_families(STORM, tmp_path / "gpu-only.om.gz", lambda name: name.startswith("gpunet_gpu_"))
    lines = diagnose("--replay", str(trace)).stdout.splitlines()
    assert lines[2].startswith("Verdict: inconclusive"), lines[:4]
    assert "looks healthy" not in "\n".join(lines)
    lines = diagnose("--replay", str(HEALTHY)).stdout.splitlines()
    assert lines[2].startswith("Verdict: healthy"), lines[:4]


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_series_without_instance_are_named_from_prometheus_too(tmp_path, served):
    trace = strip_instance(HEALTHY, tmp_path / "one-lost-served.om.gz", only="node-003:9845")
    url = served(trace)
    first, last = window(trace)
    doc = document("--prometheus", url, "--start", first, "--end", last)
    assert doc["verdict"] == "inconclusive", doc
    assert any("no `instance` label" in r for r in doc["inconclusive_reasons"])
