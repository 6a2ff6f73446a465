"""No verdict without the data for it: a window past the end of a replay trace, and GPU or
NIC series that stop before the window, must not read as a healthy cluster."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import jsonschema
import pytest
from test_diagnoser import REPO, SCHEMA, diagnose

from diagnoser.sources.replay import frame_from_trace

HEALTHY = REPO / "replay_data" / "healthy_basic.om.gz"
START = 1767225600.0  # 2026-01-01T00:00:00Z; healthy_basic covers 00:00:01 .. 00:29:58
LAST = "2026-01-01T00:29:58Z"
SAMPLE = re.compile(r"^(\w+)(\{[^}]*\})? \S+ (\S+)$")


def document(*args: str, expect: int) -> dict:
    result = diagnose(*args, "--format", "json")
    assert result.returncode == expect, result.stderr
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    return doc


def stop_early(dst: Path, prefix: str, after: float) -> Path:
    """A copy of healthy_basic whose samples of the families named `prefix*` stop `after`
    seconds into the trace (the series still appear before then)."""
    dropped = 0
    with gzip.open(HEALTHY, "rt") as f, gzip.open(dst, "wt") as out:
        for line in f:
            m = SAMPLE.match(line.rstrip("\n"))
            if m and m.group(1).startswith(prefix) and float(m.group(3)) > START + after:
                dropped += 1
                continue
            out.write(line)
    assert dropped
    return dst


# --- a window after the trace ---------------------------------------------------------------

@pytest.mark.parametrize("window", [("--since", "1h", "--end", "2026-01-02T00:00:00Z"),
                                    ("--start", "2026-01-01T00:31:00Z", "--end", "2026-01-01T01:00:00Z")],
                         ids=["a-day-later", "just-after"])
def test_a_window_after_the_trace_is_an_error_that_names_its_span(window):
    """As a window before the trace: exit 1, naming the span the trace covers, no verdict."""
    result = diagnose("--replay", str(HEALTHY), *window, "--fail-on-findings")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Verdict" not in result.stdout
    assert "the trace covers 2026-01-01T00:00:01Z .. " + LAST in result.stderr


def test_a_window_partly_after_the_trace_is_judged_only_where_the_trace_has_data():
    """00:20 .. 01:30 of a trace that ends at 00:29:58: judged up to the trace's end (not over
    an hour without data), said in a note, and the same answer as asking up to the trace's end."""
    asked = document("--replay", str(HEALTHY), "--start", "2026-01-01T00:20:00Z", "--end", "2026-01-01T01:30:00Z",
                     expect=0)
    assert asked["end_rfc3339"] == LAST
    assert asked["judged"]["end"] <= asked["end"]
    assert any("after the trace's last sample" in n and LAST in n for n in asked["notes"]), asked["notes"]
    upto = document("--replay", str(HEALTHY), "--start", "2026-01-01T00:20:00Z", expect=0)
    for key in ("verdict", "judged", "findings", "gpu_idle_fraction", "nodes", "gpus", "end"):
        assert asked[key] == upto[key], key


# --- series that stop before the window -----------------------------------------------------

@pytest.mark.parametrize("prefix, reason", [("gpunet_gpu_", "no GPU series"),
                                            ("gpunet_nic_", "no fabric NIC series")], ids=["gpu", "nic"])
def test_series_that_stop_before_the_window_are_absent_from_it(tmp_path, prefix, reason):
    """Every gpunet_gpu_* (or gpunet_nic_*) sample after 00:10 removed; the window from 00:15
    holds none of them: inconclusive (exit 4 with --fail-on-findings), not healthy."""
    trace = stop_early(tmp_path / "stopped.om.gz", prefix, 600)
    window = ("--replay", str(trace), "--start", "2026-01-01T00:15:00Z")
    doc = document(*window, expect=0)
    assert doc["verdict"] == "inconclusive"
    assert any(r.startswith(reason) for r in doc["inconclusive_reasons"]), doc["inconclusive_reasons"]
    result = diagnose(*window, "--fail-on-findings")
    assert result.returncode == 4, (result.stdout, result.stderr)
    # the window that still holds them is judged as before
    assert document("--replay", str(trace), "--end", "2026-01-01T00:10:00Z", expect=0)["verdict"] == "healthy"


def test_a_counter_that_stops_before_the_windows_is_no_row_of_zeros(tmp_path):
    """The frame: GPU counters that stop before the judged windows leave no GPU (has_gpus
    false, no GPUs counted per node), and NIC counters no NIC rows, rather than windows of 0."""
    frame = frame_from_trace(stop_early(tmp_path / "gpu.om.gz", "gpunet_gpu_", 600), start=START + 900)
    assert not frame.has_gpus
    assert (frame.node["gpus"] == 0).all()
    frame = frame_from_trace(stop_early(tmp_path / "nic.om.gz", "gpunet_nic_", 600), start=START + 900)
    assert frame.has_gpus and frame.nic.empty
    assert frame.node["tx_bytes"].isna().all()
