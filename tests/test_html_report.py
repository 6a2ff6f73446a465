"""diagnose --html: a self-contained page whose charts really render (headless Chromium)."""

import html
import json
import math
import re
import shutil
import subprocess

import pytest
from test_diagnoser import REPO, diagnose

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_html_report_is_self_contained_with_the_charts(tmp_path):
    page = tmp_path / "report.html"
    result = diagnose("--replay", str(REPO / "replay_data" / "two_incidents.om.gz"), "--html", str(page))
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert 'id="gpu-time"' in text and 'class="layer-paused"' in text and 'class="finding"' in text
    assert 'id="culprit-1"' in text and 'id="culprit-2"' in text  # pfc_storm and gpu_throttle vs peers
    assert "node-002:9845" in text and "node-005:9845" in text
    assert not re.search(r'(src|href)="https?://', text) and "<script" not in text  # nothing to fetch
    # The verdict first, naming the worst finding; then the findings, each with its culprits'
    # chart; then where GPU time went; the whole text report last.
    assert text.index('id="verdict"') < text.index('id="finding-1"') < text.index('id="culprit-1"') \
        < text.index('id="finding-2"') < text.index('id="gpu-time"') < text.index('id="report"')
    assert 'class="verdict-findings"' in text and "2 findings; the worst:" in text
    # Readable axes: dates with the times, the timezone, no raw exponents; evidence in one unit style.
    assert re.search(r">01-01 00:\d\d</text>", text) and "(times in UTC)</text>" in text
    assert not re.search(r">[0-9.]+e[+-]\d+<", text)
    assert "confirm: <code>" in text and re.search(r"GPU idle: \d+\.\d%", text)


def test_html_report_says_inconclusive_first(tmp_path):
    page = tmp_path / "short.html"
    result = diagnose("--replay", str(REPO / "replay_data" / "pfc_storm.om.gz"), "--since", "5m", "--html", str(page))
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert 'class="verdict-inconclusive"' in text and "whole window" in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_charts_render_in_a_browser(tmp_path):
    matplotlib_image = pytest.importorskip("matplotlib.image")
    page, shot = tmp_path / "report.html", tmp_path / "shot.png"
    assert diagnose("--replay", str(REPO / "replay_data" / "two_incidents.om.gz"), "--html",
                    str(page)).returncode == 0
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1000,2600",
                    page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists(), "chromium took no screenshot"
    pixels = matplotlib_image.imread(str(shot))[..., :3]
    # The charts are drawn: many colours, the culprit lines (#e45756, under the first finding)
    # and the stacked GPU-time chart's busy blue (#4c78a8) all appear.
    top = pixels[:, 50:850].reshape(-1, 3)
    colours = {tuple((c * 255).round().astype(int)) for c in top[::7]}
    assert len(colours) > 20, "the page looks blank"
    near = lambda rgb: (abs(top * 255 - rgb).sum(axis=1) < 40).mean()  # noqa: E731
    assert near((0x4C, 0x78, 0xA8)) > 0.02 and near((0xE4, 0x57, 0x56)) > 0.002


# --- what the page says it diagnosed, and each finding's job --------------------------------

def _visible(page: str) -> str:
    """The page as a reader sees it without opening anything: the collapsed text report
    left out."""
    return re.sub(r"<details>.*?</details>", "", page, flags=re.S)


def _json(trace: str) -> dict:
    result = diagnose("--replay", str(REPO / "replay_data" / f"{trace}.om.gz"), "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("trace", ["jobs3", "jobs2_shared_storm", "two_incidents"])
def test_title_and_header_name_source_window_and_nodes_and_each_finding_its_job(tmp_path, trace):
    page = tmp_path / f"{trace}.html"
    assert diagnose("--replay", str(REPO / "replay_data" / f"{trace}.om.gz"), "--html", str(page)).returncode == 0
    text = page.read_text()
    doc = _json(trace)
    nodes = f"{doc['nodes']} nodes"
    start, end = doc["start_rfc3339"], doc["end_rfc3339"]
    title = re.search(r"<title>(.*?)</title>", text).group(1)
    assert f"{trace}.om.gz" in title and nodes in title, title
    assert start[:10] in title and start[11:16] in title and end[11:16] in title, title
    header = re.search(r"<header>(.*?)</header>", text, re.S).group(1)
    assert f"{trace}.om.gz" in header and nodes in header and start in header and end in header, header
    sections = re.findall(r'<section class="finding" id="finding-(\d+)">(.*?)</section>', _visible(text), re.S)
    assert len(sections) == len(doc["findings"]) > 0
    for (n, body), finding in zip(sections, doc["findings"]):
        if "job" in finding:  # a report of several jobs: the job shows, outside any collapsed part
            assert f"job <b>{html.escape(finding['job'])}</b>" in body, (n, finding["job"])
        assert html.escape(finding["class"]) in body


# --- round ticks ----------------------------------------------------------------------------

def test_time_ticks_fall_on_round_times_of_day():
    from diagnoser.render.html_report import TIME_TICKS, time_ticks

    start = 1767225600.0 + 2  # 2026-01-01T00:00:02Z, as the traces start
    for span, allowed in ((180, {30}), (26 * 60, {300}), (30 * 60, {300}), (50 * 60, {600}), (3 * 3600, {1800}),
                          (26 * 3600, {14400, 21600}), (9 * 86400, {2 * 86400})):
        ticks, step = time_ticks(start, start + span)
        assert step in allowed, (span, step)
        assert 2 <= len(ticks) <= TIME_TICKS, (span, ticks)
        assert all(t % step == 0 and start <= t <= start + span for t in ticks), (span, ticks)


def test_value_ticks_are_one_two_five_steps_from_zero():
    from diagnoser.render.html_report import value_ticks

    for top in (0.96, 0.48, 0.0035, 1.0, 7.3, 24010.0, 2.4e9, 0.0):
        ticks = value_ticks(top)
        step = ticks[1]
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5)), (top, ticks)
        shown = top if top > 0 else 1.0  # nothing to show: a 0 to 1 axis
        assert ticks[0] == 0 and ticks[-1] >= shown > ticks[-2] and len(ticks) <= 6, (top, ticks)
        assert all(math.isclose(t, k * step, abs_tol=1e-12) for k, t in enumerate(ticks)), (top, ticks)
    assert value_ticks(0.96) in ([0, 0.2, 0.4, 0.6, 0.8, 1.0], [0, 0.25, 0.5, 0.75, 1.0])


def test_the_page_draws_round_ticks(tmp_path):
    page = tmp_path / "report.html"
    assert diagnose("--replay", str(REPO / "replay_data" / "two_incidents.om.gz"), "--html", str(page)).returncode == 0
    text = page.read_text()
    times = re.findall(r'class="time-tick"[^>]*>(?:\d\d-\d\d )?(\d\d):(\d\d)</text>', text)
    assert times and all(int(m) % 5 == 0 for _, m in times), times
    values = re.findall(r'class="value-tick"[^>]*>([^<]+)</text>', text)
    assert values
    for v in values:
        number = float(v.rstrip("%kMGT")) if v.rstrip("%kMGT") else 0.0
        assert number == 0 or any(math.isclose(number / 10 ** math.floor(math.log10(number)), m)
                                  for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 7.5, 8)), values  # multiples of a 1-2-5 step


# --- a healthy page says what its idle dips are ---------------------------------------------

def test_healthy_page_says_what_the_gpu_idle_dips_are(tmp_path):
    """healthy_confounders: checkpoints stall every GPU for 2 minutes every 15 (the
    simulator's own command, in the labels). The chart shows the stalls; the page says
    where they are, that no rule found a bottleneck there, and shows the notes."""
    trace = REPO / "replay_data" / "healthy_confounders.om.gz"
    labels = json.loads(trace.with_name("healthy_confounders.labels.json").read_text())
    every = int(re.search(r"checkpoint:every=(\d+)m", labels["notes"]).group(1))
    page = tmp_path / "healthy.html"
    assert diagnose("--replay", str(trace), "--html", str(page)).returncode == 0
    visible = _visible(page.read_text())
    assert 'class="verdict-healthy"' in visible
    caption = html.unescape(re.search(r'<p id="gpu-time-caption"[^>]*>(.*?)</p>', visible, re.S).group(1))
    assert "No rule found a bottleneck there" in caption and "verdict is healthy" in caption
    starts = [int(h) * 60 + int(m) for h, m in re.findall(r"(\d\d):(\d\d) \.\. \d\d:\d\d \(up to", caption)]
    assert len(starts) >= 2, caption
    assert all(abs((b - a) - every) <= 4 for a, b in zip(starts, starts[1:])), (starts, every)
    notes = re.search(r'<section id="notes">(.*?)</section>', visible, re.S)
    assert notes and "checkpoint" in notes.group(1)


def test_a_page_without_dips_says_nothing_of_them(tmp_path):
    page = tmp_path / "basic.html"
    assert diagnose("--replay", str(REPO / "replay_data" / "healthy_basic.om.gz"), "--html", str(page)).returncode == 0
    caption = re.search(r'<p id="gpu-time-caption"[^>]*>(.*?)</p>', page.read_text(), re.S).group(1)
    assert "rose well above" not in caption


# --- evidence in words, with units ----------------------------------------------------------

RULE_FILES = [p for p in (REPO / "diagnoser" / "analysis" / "rules").glob("*.py")
              if p.name not in ("__init__.py", "__main__.py", "base.py", "counts.py")]


def test_every_evidence_key_the_rules_write_has_a_label():
    """Every key a rule file writes into its evidence (its dict literals and evidence[...]),
    NCCL's and the configuration cross-reference's, has a label of its own."""
    from diagnoser.render.evidence import LABELS

    written = set()
    for path in RULE_FILES:
        source = path.read_text()
        written |= set(re.findall(r'"([a-z][a-z0-9_]*)":', source)) | set(re.findall(r'evidence\["([a-z_]+)"\]', source))
    nccl = (REPO / "diagnoser" / "analysis" / "nccl.py").read_text()
    written |= set(re.findall(r'setdefault\("([a-z_]+)"', nccl)) | set(re.findall(r'\{"([a-z_]+)": \{node', nccl))
    written |= set(re.findall(r'\.evidence\["([a-z_]+)"\]', (REPO / "diagnoser" / "analysis" / "audit.py").read_text()))
    assert {"nccl_bus_bandwidth", "configuration", "gpu_idle"} <= written  # the scan sees what it should
    assert written - set(LABELS) == set()


TRACES = sorted((REPO / "replay_data").glob("*.om.gz"))


def test_evidence_reads_as_words_with_units():
    """Over the committed traces: no evidence line is a key turned into words, and the
    figures carry their units."""
    from diagnoser.pipeline import diagnose as diagnosis
    from diagnoser.render.evidence import LABELS
    from diagnoser.render.text import render_text
    from diagnoser.sources import Source

    seen = set()
    for trace in TRACES:
        report = diagnosis(Source(replay=str(trace)))
        text = render_text(report)
        for f in report.findings:
            for key in f.evidence:
                seen.add(key)
                assert key in LABELS, (trace.name, key)
                assert f"- {key.replace('_', ' ')}:" not in text or LABELS[key].words == key.replace("_", " ")
        assert " gbps" not in text and "per gb " not in text and "times baseline" not in text, trace.name
    assert len(seen) > 25
    ib = diagnose("--replay", str(REPO / "replay_data" / "network_congestion_ib.om.gz")).stdout
    assert re.search(r"- credit wait per GB: \d+(\.\d+)?x the job's baseline\n", ib), ib
    storm = diagnose("--replay", str(REPO / "replay_data" / "pfc_storm.om.gz")).stdout
    assert re.search(r"- PFC pauses sent: \S+ [\d,.]+/s \(peers' median [\d.,]+/s", storm), storm
    assert re.search(r"- GPU idle while the links stood paused: \d+\.\d%", storm)
