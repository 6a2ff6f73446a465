"""diagnose over labelled traces: the committed simulated set and the real veth recordings.
Ground truth comes from the simulator's and the recorder's labels, never from the diagnoser."""

import functools
import gzip
import json
import os
import re
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


# --- the report for people: plurals, markdown, one sizing ------------------------------------

@functools.cache
def report_of(name: str):
    from diagnoser.pipeline import diagnose as diagnosis
    from diagnoser.sources import Source

    return diagnosis(Source(replay=str(REPO / "replay_data" / f"{name}.om.gz")))


READ = ["jobs3", "two_incidents", "healthy_confounders", "network_bandwidth_25g", "jobs2_shared_storm", "pfc_storm"]
BAD_PLURAL = re.compile(r"(?<![\d.,])1 (nodes|GPUs|findings|jobs|devices|times|windows)\b|\w\(s\)")


def _without_notes(text: str) -> str:
    """The report less its notes: those are the analysis's sentences, quoted as they are."""
    return re.split(r"^(?:## )?Notes$", text, flags=re.M)[0]


@pytest.mark.parametrize("name", READ)
def test_reports_count_in_words(name):
    from diagnoser.render.html_report import render_html
    from diagnoser.render.text import render_text

    report = report_of(name)
    for text in (render_text(report), render_text(report, markdown=True),
                 re.sub(r'<section id="notes">.*?</section>|<details>.*?</details>', "", render_html(report), flags=re.S)):
        assert not BAD_PLURAL.search(_without_notes(text)), BAD_PLURAL.search(_without_notes(text))


def test_one_of_each_reads_singular():
    from diagnoser.model.report import ConfigFinding, Finding, Report, Summary
    from diagnoser.render.html_report import render_html
    from diagnoser.render.text import render_text

    finding = Finding("straggler", "Straggler node", 0.0, 600.0, ["node-1"], [], 0.9, 3600.0,
                      {"node_gpu_idle": {"node-1": {"value": 0.01, "peers_median": 0.2, "ratio": 0.05}}}, "replace it")
    config = ConfigFinding("mtu", "medium", "MTU differs", ["node-1"], {"node-1": ["eth0"]}, "1500 vs 9000")
    report = Report("replay:x", Summary(0.0, 600.0, 1, 1, 0.2), [finding], configuration=[config],
                    verdict="findings")
    text = render_text(report)
    assert "1 node, 1 GPU," in text and "Verdict: 1 finding\n" in text, text
    assert "Configuration (1 finding)" in text and "1 node, 1 device" in text, text
    assert "1 finding; the worst" in render_html(report) and "1 node<" in render_html(report).replace(
        "1 node,", "1 node<")
    assert not BAD_PLURAL.search(text) and not BAD_PLURAL.search(render_text(report, markdown=True))


@pytest.mark.parametrize("name", ["jobs3", "two_incidents", "healthy_confounders"])
def test_markdown_is_a_document(name):
    """One title; sections as headings with no sentence in them; lists as lists; the jobs as
    a table."""
    from diagnoser.render.text import render_text

    report = report_of(name)
    md = render_text(report, markdown=True)
    lines = md.splitlines()
    headings = [line for line in lines if line.startswith("#")]
    assert len([h for h in headings if h.startswith("# ")]) == 1 and lines[0].startswith("# "), headings
    assert {"## Verdict", "## Configuration"} <= set(headings), headings
    for h in headings:  # a heading names its section; the figures are in the paragraph under it
        assert "GPU-hours" not in h and "% GPU idle" not in h and not re.search(r"^#+ (Verdict|Cost|Network capacity):",
                                                                                  h), h
        following = lines[lines.index(h) + 1]
        assert following == "", (h, following)  # a blank line after each heading: a block of its own
    assert any(line.startswith("- ") for line in lines)
    if report.jobs is not None:
        rows = [line for line in lines if line.startswith("| ")]
        assert rows[1].startswith("| ---") and len(rows) == 2 + len(report.jobs), rows
        assert all(any(h.startswith(f"## job {j.name} (") for h in headings) for j in report.jobs), headings
    markdown_it = pytest.importorskip("markdown_it")
    tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse(md)
    assert [t.tag for t in tokens if t.type == "heading_open"].count("h1") == 1
    assert any(t.type == "bullet_list_open" for t in tokens)
    assert (report.jobs is not None) == any(t.type == "table_open" for t in tokens)


SIZES = re.compile(r"\b(\d+)G per NIC")


@pytest.mark.parametrize("name", ["network_bandwidth_25g", "jobs3", "jobs3_no_workload_info"])
def test_a_report_sizes_the_links_once(name):
    """A network_bandwidth finding and its capacity section name one upgrade: the finding
    carries no sizing of its own, and names the capacity section's."""
    from diagnoser.render.html_report import render_html
    from diagnoser.render.text import render_text

    report = report_of(name)
    bound = [f for f in report.findings if f.cls == "network_bandwidth"]
    assert bound, "the trace lost its network_bandwidth finding: the test means nothing"
    for f in bound:
        assert f.evidence.get("link_sizing") == "capacity"
        assert not {"upgrade_to", "may_suffice", "needed_gbps_per_nic", "needed_gbps_per_nic_at_least"} & set(f.evidence)
    sections = [(report.capacity, render_text(report))] if report.jobs is None else [
        (j.capacity, render_text(report).split(f"\njob {j.name} (", 1)[1].split("\njob ", 1)[0])
        for j in report.jobs if any(f.job == j.name for f in bound)]
    for capacity, text in sections:
        assert capacity and capacity["upgrade_to"], capacity
        named = {f"{s}G per NIC" for line in text.splitlines() if "what to do:" not in line for s in SIZES.findall(line)}
        assert named <= {capacity["upgrade_to"], capacity["may_suffice"]}, (named, capacity["verdict"])
        (sizing,) = [line for line in text.splitlines() if "- link sizing:" in line]
        assert capacity["upgrade_to"] in sizing, sizing
        assert text.count("Gb/s per NIC would bring") == 1
    page = render_html(report)
    for capacity, _ in sections:
        section = re.search(r'<section class="finding" id="finding-\d+">(?:(?!</section>).)*?\(network_bandwidth'
                            r"(?:(?!</section>).)*</section>", page, re.S).group(0)
        assert f"link sizing: {capacity['upgrade_to']}" in section


def test_bench_diagnose_speed_prints_its_usage():
    result = subprocess.run([sys.executable, str(REPO / "bench" / "diagnose_speed.py"), "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("usage:") and "trace" in result.stdout, result.stderr
    result = subprocess.run([sys.executable, str(REPO / "bench" / "diagnose_speed.py"), "no-such.om.gz"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no-such.om.gz" in result.stderr and "Traceback" not in result.stderr
