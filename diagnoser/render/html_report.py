"""`diagnose --html FILE`: one self-contained page (inline SVG, no script, no network) with
the text report and the pictures on-call wants: where the cluster's GPU time went, window
by window, with each finding shaded; and for a localised finding, the culprits against
their peers in the signal that named them. Drawn from the series the report carries."""

from __future__ import annotations

import html

import numpy as np

from diagnoser.model.report import FINDINGS, HEALTHY, CulpritChart, Finding, GpuTimeChart, Report
from diagnoser.render.text import render_text
from gpunet.window import rfc3339

WIDTH, HEIGHT, PAD = 900, 260, 50
COLORS = {"busy": "#4c78a8", "quiet": "#9ecae9", "active": "#72b7b2", "saturated": "#f58518", "paused": "#e45756"}
LINE_COLORS = ("#888", "#e45756", "#f58518", "#b279a2")  # the peers' median, then the culprits


def _x(t: float, t0: float, t1: float) -> float:
    return PAD + (WIDTH - 2 * PAD) * (t - t0) / max(t1 - t0, 1e-9)


def _shade(spans: list[tuple[float, float, str]], t0: float, t1: float) -> str:
    out = []
    for start, end, name in spans:
        x0, x1 = _x(max(start, t0), t0, t1), _x(min(end, t1), t0, t1)
        out.append(f'<rect class="finding" x="{x0:.1f}" y="{PAD / 2:.1f}" width="{max(x1 - x0, 1):.1f}" '
                   f'height="{HEIGHT - PAD:.1f}" fill="#000" fill-opacity="0.08"><title>{html.escape(name)}'
                   f'</title></rect>')
    return "".join(out)


def _axes(t0: float, t1: float, label: str, top: str) -> str:
    y0, y1 = HEIGHT - PAD / 2, PAD / 2
    ticks = "".join(f'<text x="{_x(t, t0, t1):.1f}" y="{y0 + 14:.1f}" font-size="10" text-anchor="middle">'
                    f'{rfc3339(t)[11:16]}</text>' for t in np.linspace(t0, t1, 6))
    return (f'<line x1="{PAD}" y1="{y0}" x2="{WIDTH - PAD}" y2="{y0}" stroke="#333"/>'
            f'<line x1="{PAD}" y1="{y0}" x2="{PAD}" y2="{y1}" stroke="#333"/>{ticks}'
            f'<text x="{PAD}" y="{y1 - 6:.1f}" font-size="11">{html.escape(label)}</text>'
            f'<text x="{PAD - 4}" y="{y1 + 4:.1f}" font-size="10" text-anchor="end">{html.escape(top)}</text>')


def gpu_time_svg(chart: GpuTimeChart, findings: list[Finding]) -> str:
    """Stacked areas: the share of GPU time busy and idle in each network state."""
    t0, t1 = chart.start, chart.end
    mids = np.asarray(chart.times, dtype=float)

    def y_of(v: float) -> float:
        return HEIGHT - PAD / 2 - (HEIGHT - PAD) * v

    base = np.zeros(len(mids))
    paths = []
    for name, share in chart.layers.items():
        top = base + np.asarray(share, dtype=float)
        upper = " ".join(f"{_x(t, t0, t1):.1f},{y_of(v):.1f}" for t, v in zip(mids, top))
        lower = " ".join(f"{_x(t, t0, t1):.1f},{y_of(v):.1f}" for t, v in zip(mids[::-1], base[::-1]))
        paths.append(f'<polygon class="layer-{name}" points="{upper} {lower}" fill="{COLORS[name]}">'
                     f'<title>{name}</title></polygon>')
        base = top
    legend = "".join(f'<rect x="{PAD + 110 * i}" y="{HEIGHT + 2}" width="10" height="10" fill="{COLORS[n]}"/>'
                     f'<text x="{PAD + 14 + 110 * i}" y="{HEIGHT + 11}" font-size="11">{n if n == "busy" else "idle, " + n}'
                     f'</text>' for i, n in enumerate(chart.layers))
    spans = [(f.start, f.end, f.cls) for f in findings]
    return (f'<svg id="gpu-time" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT + 18}">'
            f'{"".join(paths)}{_shade(spans, t0, t1)}{_axes(t0, t1, "Where GPU time went", "100%")}{legend}</svg>')


def culprit_svg(chart: CulpritChart, cls: str) -> str:
    """The culprit nodes' signal against the median of their peers."""
    t0, t1 = chart.start, chart.end
    lines = [(name, np.asarray(values, dtype=float), color)
             for (name, values), color in zip(chart.lines.items(), LINE_COLORS)]
    top = float(np.nanmax([np.nanmax(v) for _, v, _ in lines if np.isfinite(v).any()] + [1e-9]))
    mids = np.asarray(chart.times, dtype=float)

    def y_of(v: float) -> float:
        return HEIGHT - PAD / 2 - (HEIGHT - PAD) * (v / top)

    svg = []
    for i, (name, values, color) in enumerate(lines):
        points = " ".join(f"{_x(t, t0, t1):.1f},{y_of(v):.1f}" for t, v in zip(mids, values) if np.isfinite(v))
        svg.append(f'<polyline class="series" points="{points}" fill="none" stroke="{color}" stroke-width="2">'
                   f'<title>{html.escape(name)}</title></polyline>')
        svg.append(f'<text x="{PAD + 220 * i}" y="{HEIGHT + 11}" font-size="11" fill="{color}">'
                   f'{html.escape(name)}</text>')
    shade = _shade([(chart.shade[0], chart.shade[1], cls)], t0, t1)
    return (f'<svg id="culprit-{chart.finding}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{HEIGHT + 18}">{shade}{"".join(svg)}{_axes(t0, t1, chart.title, f"{top:.3g}")}</svg>')


def _verdict(report: Report) -> str:
    """The verdict first, in words and colour, before any chart."""
    color = {FINDINGS: "#e45756", HEALTHY: "#54a24b"}.get(report.verdict, "#f58518")
    if report.verdict == FINDINGS:
        worst = report.findings[0]
        culprits = f" on {', '.join(worst.nodes[:3])}" if worst.nodes else ""
        text = f"{len(report.findings)} finding(s); the worst: {worst.title}{culprits}"
    elif report.verdict == HEALTHY:
        text = "healthy: no bottleneck found, and the window held what a verdict needs"
    else:
        text = "inconclusive: " + "; ".join(report.inconclusive_reasons)
    return (f'<p id="verdict" class="verdict-{report.verdict}" style="border-left:6px solid {color};'
            f'padding:8px 12px;font-size:1.15em"><b>Verdict:</b> {html.escape(text)}</p>')


def render_html(report: Report) -> str:
    """The page: the verdict, GPU time, the culprit charts, then the text report."""
    if report.gpu_time_chart is not None:
        charts = [gpu_time_svg(report.gpu_time_chart, report.findings)]
    else:
        charts = ['<p id="gpu-time-missing">No GPU series in this window: GPU time cannot be shown.</p>']
    charts += [culprit_svg(c, report.findings[c.finding - 1].cls) for c in report.culprit_charts]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpunet diagnosis</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:960px}} pre{{white-space:pre-wrap;background:#f6f6f6;
padding:12px}} svg{{display:block;margin:12px 0}}</style></head>
<body><h1>gpunet diagnosis</h1>
{_verdict(report)}
{''.join(charts)}
<pre id="report">{html.escape(render_text(report))}</pre>
</body></html>
"""
