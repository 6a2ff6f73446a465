"""`diagnose --html FILE`: one self-contained page (inline SVG, no script, no network): the
verdict, then each finding (what, where, since when, the evidence, what to do, the query
and link that confirm it) with its culprits drawn against their peers in the signal that
named them; then where the cluster's GPU time went, window by window, each finding shaded;
last, the whole text report. Times are UTC, with the date; axes carry their units."""

from __future__ import annotations

import html

import numpy as np

from diagnoser.model.report import FINDINGS, HEALTHY, CulpritChart, Finding, GpuTimeChart, Report
from diagnoser.render.text import figure, is_share, render_text
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


def _time_label(t: float, t0: float, t1: float) -> str:
    """'01-01 00:12': the date too, since a window can span midnight; seconds where it is short."""
    stamp = rfc3339(t)
    return stamp[5:10] + " " + (stamp[11:19] if t1 - t0 < 600 else stamp[11:16])


def readable(value: float) -> str:
    """24010 -> '24k', 0.0035 -> '0.0035', 2.4e9 -> '2.4G': an axis figure people read."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _axes(t0: float, t1: float, label: str, top: str, middle: str = "") -> str:
    y0, y1 = HEIGHT - PAD / 2, PAD / 2
    ticks = "".join(f'<text x="{_x(t, t0, t1):.1f}" y="{y0 + 14:.1f}" font-size="10" text-anchor="middle">'
                    f'{_time_label(t, t0, t1)}</text>' for t in np.linspace(t0, t1, 6))
    mid = (f'<text x="{PAD - 4}" y="{(y0 + y1) / 2 + 4:.1f}" font-size="10" text-anchor="end">{html.escape(middle)}'
           f'</text>' if middle else "")
    return (f'<line x1="{PAD}" y1="{y0}" x2="{WIDTH - PAD}" y2="{y0}" stroke="#333"/>'
            f'<line x1="{PAD}" y1="{y0}" x2="{PAD}" y2="{y1}" stroke="#333"/>{ticks}'
            f'<text x="{PAD}" y="{y1 - 6:.1f}" font-size="11">{html.escape(label)} (times in UTC)</text>'
            f'<text x="{PAD - 4}" y="{y1 + 4:.1f}" font-size="10" text-anchor="end">{html.escape(top)}</text>{mid}'
            f'<text x="{PAD - 4}" y="{y0:.1f}" font-size="10" text-anchor="end">0</text>')


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
            f'{"".join(paths)}{_shade(spans, t0, t1)}'
            f'{_axes(t0, t1, "Where GPU time went (share of GPU time)", "100%", "50%")}{legend}</svg>')


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
            f'height="{HEIGHT + 18}">{shade}{"".join(svg)}'
            f'{_axes(t0, t1, chart.title, readable(top), readable(top / 2))}</svg>')


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


def _finding(n: int, f: Finding, chart: CulpritChart | None) -> str:
    """One finding as on-call reads it, its culprit chart below it."""
    e = html.escape
    minutes = (f.end - f.start) / 60
    impact = f"{f.gpu_idle_seconds / 3600:.1f} GPU-hours idle" if f.gpu_idle_seconds is not None else \
        "GPU impact unknown"
    where = f"<li>culprits: {e(', '.join(f.nodes))}{' (' + e(', '.join(f.devices)) + ')' if f.devices else ''}</li>" \
        if f.nodes else ""
    evidence = "".join(f"<li>{e(k.replace('_', ' '))}: {e(figure(v, is_share(k)))}</li>" for k, v in f.evidence.items())
    confirm = f"<li>confirm: <code>{e(' '.join(f.promql.split()))}</code></li>" if f.promql else ""
    link = f'<li>see: <a href="{e(f.grafana_url)}">the dashboard for this finding</a></li>' if f.grafana_url else ""
    return (f'<section class="finding" id="finding-{n}"><h2>{n}. {e(f.title)} <small>({e(f.cls)}, confidence '
            f'{f.confidence:.2f})</small></h2>'
            f'<p>{e(rfc3339(f.start))} .. {e(rfc3339(f.end))} ({minutes:.0f} min{", still going on" if f.ongoing else ""})'
            f', {e(impact)}</p><ul>{where}{evidence}{confirm}{link}</ul>'
            f'<p class="remediation"><b>What to do:</b> {e(f.remediation)}</p>'
            f'{culprit_svg(chart, f.cls) if chart is not None else ""}</section>')


def render_html(report: Report) -> str:
    """The page: the verdict, the findings with their culprit charts, where GPU time went,
    then the whole text report."""
    charts = {c.finding: c for c in report.culprit_charts}
    findings = "".join(_finding(n, f, charts.get(n)) for n, f in enumerate(report.findings, 1))
    if report.gpu_time_chart is not None:
        gpu_time = gpu_time_svg(report.gpu_time_chart, report.findings)
    else:
        gpu_time = '<p id="gpu-time-missing">No GPU series in this window: GPU time cannot be shown.</p>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpunet diagnosis</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:960px}} pre{{white-space:pre-wrap;background:#f6f6f6;
padding:12px}} svg{{display:block;margin:12px 0}} code{{background:#f6f6f6;word-break:break-all}}
section.finding{{border-top:1px solid #ddd;margin-top:16px}}</style></head>
<body><h1>gpunet diagnosis</h1>
{_verdict(report)}
{findings}
<h2>Where the GPU time went</h2>
{gpu_time}
<details><summary>The whole report (as <code>diagnose</code> prints it)</summary>
<pre id="report">{html.escape(render_text(report))}</pre></details>
</body></html>
"""
