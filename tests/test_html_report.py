"""diagnose --html: a self-contained page whose charts really render (headless Chromium)."""

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
    assert 'class="verdict-findings"' in text and "2 finding(s); the worst:" in text
    # Readable axes: dates with the times, the timezone, no raw exponents; evidence in one unit style.
    assert re.search(r">01-01 00:\d\d</text>", text) and "(times in UTC)</text>" in text
    assert not re.search(r">[0-9.]+e[+-]\d+<", text)
    assert "confirm: <code>" in text and re.search(r"gpu idle: \d+\.\d%", text)


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
