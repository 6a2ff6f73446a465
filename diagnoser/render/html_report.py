"""`diagnose --html FILE`: one self-contained page (inline SVG, no script, no network): the
source, window and nodes in its title and header, the verdict, the jobs where there are
several, then each finding (its job, what, where, since when, the evidence, what to do, the
query and link that confirm it) with its culprits drawn against their peers in the signal
that named them; then where the cluster's GPU time went, window by window, each finding
shaded and the idle no finding covers said in words; the capacity advice, the notes; last,
the whole text report. Times are UTC, with the date; axes carry their units and round ticks."""

from __future__ import annotations

import html
import math

import numpy as np

from diagnoser.model.report import FINDINGS, HEALTHY, CulpritChart, Finding, GpuTimeChart, Report
from diagnoser.render.document import plural, safe
from diagnoser.render.text import evidence_lines, impact, jobs_table, render_text, span_words, window_words
from gpunet.window import rfc3339

WIDTH, HEIGHT, PAD = 900, 260, 50
COLORS = {"busy": "#4c78a8", "quiet": "#9ecae9", "active": "#72b7b2", "saturated": "#f58518", "paused": "#e45756"}
LINE_COLORS = ("#888", "#e45756", "#f58518", "#b279a2")  # the peers' median, then the culprits
# Time between ticks, by the span shown: round seconds, minutes (1, 2, 5, 10, 15, 30) and
# hours (1, 2, 3, 6, 12), then days; at most TIME_TICKS ticks.
TIME_STEPS = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
TIME_TICKS = 7
VALUE_TICKS = 5  # at most this many steps of 1, 2, 2.5 or 5 times a power of ten up the value axis
# The GPU-time chart's words for idle no finding covers: GPU idle this far above its usual
# level (the median window's) is a dip the caption names.
DIP = 0.10
STATE_WORDS = {"quiet": "with the network quiet", "active": "while the links moved data below line rate",
               "saturated": "while the links ran at line rate", "paused": "while the links stood paused"}


def _escape(text: str) -> str:
    """What the data names, as the page shows it: control characters escaped (as in the text
    report: a label value's ESC is no byte of the page), then HTML's own."""
    return html.escape(safe(text))


def _x(t: float, t0: float, t1: float) -> float:
    return PAD + (WIDTH - 2 * PAD) * (t - t0) / max(t1 - t0, 1e-9)


def _shade(spans: list[tuple[float, float, str]], t0: float, t1: float) -> str:
    out = []
    for start, end, name in spans:
        x0, x1 = _x(max(start, t0), t0, t1), _x(min(end, t1), t0, t1)
        out.append(f'<rect class="finding" x="{x0:.1f}" y="{PAD / 2:.1f}" width="{max(x1 - x0, 1):.1f}" '
                   f'height="{HEIGHT - PAD:.1f}" fill="#000" fill-opacity="0.08"><title>{_escape(name)}'
                   f'</title></rect>')
    return "".join(out)


def time_ticks(t0: float, t1: float) -> tuple[list[float], float]:
    """Ticks on round times of day (UTC) inside [t0, t1], and their step: the smallest of
    TIME_STEPS that gives at most TIME_TICKS of them."""
    span = max(t1 - t0, 1.0)
    step = next((float(s) for s in TIME_STEPS if span / s <= TIME_TICKS), 86400.0 * math.ceil(span / 86400 / TIME_TICKS))
    first = math.ceil(t0 / step - 1e-9) * step
    return [float(t) for t in np.arange(first, t1 + 1e-6, step)], step


def _time_label(t: float, step: float, first: bool) -> str:
    """'00:15', with the date ('01-01 00:15') on the first tick and at midnight, since a
    window can span it; seconds where the ticks are closer than a minute."""
    stamp = rfc3339(t)
    clock = stamp[11:19] if step < 60 else stamp[11:16]
    return f"{stamp[5:10]} {clock}" if first or stamp[11:19] == "00:00:00" else clock


def value_ticks(top: float) -> list[float]:
    """Round ticks from 0 to at least `top`: steps of 1, 2, 2.5 or 5 times a power of ten
    (0.96 -> 0, 0.2, ..., 1.0; 24010 -> 0, 5k, ..., 25k), at most VALUE_TICKS steps."""
    top = top if np.isfinite(top) and top > 0 else 1.0
    raw = top / VALUE_TICKS
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    return [round(k * step, 12) for k in range(math.ceil(top / step - 1e-9) + 1)]


def readable(value: float) -> str:
    """24000 -> '24k', 0.0035 -> '0.0035', 2.5e9 -> '2.5G': an axis figure people read."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _axes(t0: float, t1: float, label: str, ticks: list[tuple[float, str]]) -> str:
    """The frame, round time ticks below, `ticks` (a share of the height, its label) on the
    left with faint lines across."""
    y0, y1 = HEIGHT - PAD / 2, PAD / 2
    times, step = time_ticks(t0, t1)
    out = [f'<line x1="{PAD}" y1="{y0}" x2="{WIDTH - PAD}" y2="{y0}" stroke="#333"/>',
           f'<line x1="{PAD}" y1="{y0}" x2="{PAD}" y2="{y1}" stroke="#333"/>',
           f'<text x="{PAD}" y="{y1 - 6:.1f}" font-size="11">{_escape(label)} (times in UTC)</text>']
    for k, t in enumerate(times):
        x = _x(t, t0, t1)
        out.append(f'<line class="tick" x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 4}" stroke="#333"/>'
                   f'<text class="time-tick" x="{x:.1f}" y="{y0 + 14:.1f}" font-size="10" text-anchor="middle">'
                   f'{_time_label(t, step, k == 0)}</text>')
    for share, text in ticks:
        y = y0 - (y0 - y1) * share
        if share > 0:
            out.append(f'<line x1="{PAD}" y1="{y:.1f}" x2="{WIDTH - PAD}" y2="{y:.1f}" stroke="#ddd" '
                       f'stroke-width="0.5"/>')
        out.append(f'<text class="value-tick" x="{PAD - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
                   f'{_escape(text)}</text>')
    return "".join(out)


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
    spans = [(f.start, f.end, f.cls + (f" ({f.job})" if f.job else "")) for f in findings]
    shares = [(v, f"{100 * v:.0f}%") for v in value_ticks(1.0)]
    return (f'<svg id="gpu-time" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT + 18}">'
            f'{"".join(paths)}{_shade(spans, t0, t1)}'
            f'{_axes(t0, t1, "Where GPU time went (share of GPU time)", shares)}{legend}</svg>')


def idle_dips(chart: GpuTimeChart, findings: list[Finding]) -> tuple[float, list[tuple[float, float, float, str]]]:
    """The usual GPU idle (the median window's), and each run of windows where idle rose DIP
    or more above it with no finding over it: (start, end, its highest idle, the network
    state most of that idle was spent in)."""
    times = np.asarray(chart.times, dtype=float)
    if not len(times) or "busy" not in chart.layers:
        return float("nan"), []
    idle = 1 - np.asarray(chart.layers["busy"], dtype=float)
    usual = float(np.nanmedian(idle)) if np.isfinite(idle).any() else float("nan")
    if not np.isfinite(usual):
        return usual, []
    step = float(np.median(np.diff(times))) if len(times) > 1 else chart.end - chart.start
    covered = np.zeros(len(times), dtype=bool)
    for f in findings:
        covered |= (times + step / 2 > f.start) & (times - step / 2 < f.end)
    high = (np.nan_to_num(idle) >= usual + DIP) & ~covered
    dips: list[tuple[float, float, float, str]] = []
    k = 0
    while k < len(times):
        if not high[k]:
            k += 1
            continue
        end = k
        while end + 1 < len(times) and high[end + 1]:
            end += 1
        worst = k + int(np.nanargmax(idle[k:end + 1]))
        states = {s: float(np.nan_to_num(chart.layers[s][worst])) for s in STATE_WORDS if s in chart.layers}
        state = max(states, key=lambda s: states[s]) if states else ""
        dips.append((float(times[k] - step / 2), float(times[end] + step / 2), float(idle[worst]), state))
        k = end + 1
    return usual, dips


def gpu_time_caption(report: Report) -> str:
    """What the chart shows, and in words the idle no finding covers: where it was, how high,
    in which network state, and why it is not a finding (no rule found a cause there). The
    analysis's own notes (left-out checkpoints, a job's start) are listed below the chart."""
    chart = report.gpu_time_chart
    assert chart is not None
    e = _escape
    parts = ["Shaded: the span of each finding. Above the busy share, the idle share in each state of its "
             "node's network (the exporter's network_state)."]
    usual, dips = idle_dips(chart, report.findings)
    if dips:
        where = "; ".join(f"{rfc3339(a)[11:16]} .. {rfc3339(b)[11:16]} (up to {100 * peak:.0f}%"
                          f"{', most of it ' + STATE_WORDS[state] if state else ''})" for a, b, peak, state in dips)
        parts.append(f"Outside every finding, GPU idle rose well above its usual {100 * usual:.0f}% "
                     f"{'once' if len(dips) == 1 else plural(len(dips), 'time')}: {where}. No rule found a "
                     "bottleneck there, so no finding: brief stalls, and those a normal part of training explains, "
                     "are left out" + (" (the notes below name what the analysis recognised)" if report.all_notes()
                                       else "") + ".")
        if report.verdict == HEALTHY:
            parts.append("The verdict is healthy all the same: no such stretch was both long and unexplained "
                         "(docs/diagnose.md, \"Verdict and exit status\").")
    return f'<p id="gpu-time-caption" class="caption">{e(" ".join(parts))}</p>'


def culprit_svg(chart: CulpritChart, cls: str) -> str:
    """The culprit nodes' signal against the median of their peers."""
    t0, t1 = chart.start, chart.end
    lines = [(name, np.asarray(values, dtype=float), color)
             for (name, values), color in zip(chart.lines.items(), LINE_COLORS)]
    highest = float(np.nanmax([np.nanmax(v) for _, v, _ in lines if np.isfinite(v).any()] + [0.0]))
    ticks = value_ticks(highest)
    top = ticks[-1]
    mids = np.asarray(chart.times, dtype=float)

    def y_of(v: float) -> float:
        return HEIGHT - PAD / 2 - (HEIGHT - PAD) * (v / top)

    svg = []
    for i, (name, values, color) in enumerate(lines):
        points = " ".join(f"{_x(t, t0, t1):.1f},{y_of(v):.1f}" for t, v in zip(mids, values) if np.isfinite(v))
        svg.append(f'<polyline class="series" points="{points}" fill="none" stroke="{color}" stroke-width="2">'
                   f'<title>{_escape(name)}</title></polyline>')
        svg.append(f'<text x="{PAD + 220 * i}" y="{HEIGHT + 11}" font-size="11" fill="{color}">'
                   f'{_escape(name)}</text>')
    shade = _shade([(chart.shade[0], chart.shade[1], cls)], t0, t1)
    return (f'<svg id="culprit-{chart.finding}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{HEIGHT + 18}">{shade}{"".join(svg)}'
            f'{_axes(t0, t1, chart.title, [(v / top, readable(v)) for v in ticks])}</svg>')


def _verdict(report: Report) -> str:
    """The verdict first, in words and colour, before any chart."""
    color = {FINDINGS: "#e45756", HEALTHY: "#54a24b"}.get(report.verdict, "#f58518")
    if report.verdict == FINDINGS:
        worst = report.findings[0]
        culprits = f" on {', '.join(worst.nodes[:3])}" if worst.nodes else ""
        job = f" (job {worst.job})" if worst.job else ""
        text = f"{plural(len(report.findings), 'finding')}; the worst: {worst.title}{culprits}{job}"
    elif report.verdict == HEALTHY:
        text = "healthy: no bottleneck found, and the window held what a verdict needs"
    else:
        text = "inconclusive: " + "; ".join(report.inconclusive_reasons)
    return (f'<p id="verdict" class="verdict-{report.verdict}" style="border-left:6px solid {color};'
            f'padding:8px 12px;font-size:1.15em"><b>Verdict:</b> {_escape(text)}</p>')


def _jobs(report: Report) -> str:
    if not report.jobs:
        return ""
    table = jobs_table(report.jobs)
    e = _escape
    head = "".join(f"<th>{e(h)}</th>" for h in table.header)
    num = ' class="num"'
    rows = "".join("<tr>" + "".join(f"<td{num if k in table.right else ''}>{e(c)}</td>" for k, c in enumerate(row))
                   + "</tr>" for row in table.rows)
    return f'<h2>{e(plural(len(report.jobs), "job"))}</h2><table id="jobs"><tr>{head}</tr>{rows}</table>'


def _capacity_of(report: Report, f: Finding) -> dict | None:
    if report.jobs is None:
        return report.capacity
    return next((j.capacity for j in report.jobs if j.name == f.job), None)


def _finding(n: int, f: Finding, chart: CulpritChart | None, capacity: dict | None, currency: str) -> str:
    """One finding as on-call reads it, its job named, its culprit chart below it."""
    e = _escape
    job = f'<p class="job">job <b>{e(f.job)}</b></p>' if f.job is not None else ""
    where = f"<li>culprits: {e(', '.join(f.nodes))}{' (' + e(', '.join(f.devices)) + ')' if f.devices else ''}</li>" \
        if f.nodes else ""
    evidence = "".join(f"<li>{e(line)}</li>" for line in evidence_lines(f, capacity))
    confirm = f"<li>confirm: <code>{e(' '.join(f.promql.split()))}</code></li>" if f.promql else ""
    link = f'<li>see: <a href="{e(f.grafana_url)}">the dashboard for this finding</a></li>' if f.grafana_url else ""
    return (f'<section class="finding" id="finding-{n}"><h2>{n}. {e(f.title)} <small>({e(f.cls)}, confidence '
            f'{f.confidence:.2f})</small></h2>{job}'
            f'<p>{e(span_words(f))}, {e(impact(f, currency))}</p><ul>{where}{evidence}{confirm}{link}</ul>'
            f'<p class="remediation"><b>What to do:</b> {e(f.remediation)}</p>'
            f'{culprit_svg(chart, f.cls) if chart is not None else ""}</section>')


def _capacity(report: Report) -> str:
    e = _escape
    if report.jobs is None:
        if not report.capacity:
            return ""
        arithmetic = "".join(f"<li>{e(step)}</li>" for step in report.capacity["arithmetic"]) \
            if report.capacity.get("upgrade_to") or "model" in report.capacity else ""
        return (f'<section id="capacity"><h2>Network capacity</h2><p>{e(report.capacity["verdict"])}</p>'
                f'{"<ul>" + arithmetic + "</ul>" if arithmetic else ""}</section>')
    items = "".join(f"<li>job <b>{e(j.name)}</b>: {e(j.capacity['verdict'])}</li>" for j in report.jobs if j.capacity)
    return f'<section id="capacity"><h2>Network capacity</h2><ul>{items}</ul></section>' if items else ""


def _notes(report: Report) -> str:
    notes = report.all_notes()
    if not notes:
        return ""
    return '<section id="notes"><h2>Notes</h2><ul>' + "".join(f"<li>{_escape(n)}</li>" for n in notes) + \
        "</ul></section>"


def render_html(report: Report) -> str:
    """The page: what was diagnosed, the verdict, the jobs, the findings with their culprit
    charts, where GPU time went, capacity, notes, then the whole text report."""
    e = _escape
    s = report.summary
    charts = {c.finding: c for c in report.culprit_charts}
    currency = report.cost.currency if report.cost else ""
    findings = "".join(_finding(n, f, charts.get(n), _capacity_of(report, f), currency)
                       for n, f in enumerate(report.findings, 1))
    if report.gpu_time_chart is not None:
        gpu_time = gpu_time_svg(report.gpu_time_chart, report.findings) + gpu_time_caption(report)
    else:
        gpu_time = '<p id="gpu-time-missing">No GPU series in this window: GPU time cannot be shown.</p>'
    title = (f"gpunet diagnosis: {report.source}, {rfc3339(s.start)[:16].replace('T', ' ')} .. "
             f"{rfc3339(s.end)[11:16]} UTC, {plural(s.nodes, 'node')}")
    jobs = f"; {plural(len(report.jobs), 'job')}" if report.jobs is not None else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:960px}} pre{{white-space:pre-wrap;background:#f6f6f6;
padding:12px}} svg{{display:block;margin:12px 0}} code{{background:#f6f6f6;word-break:break-all}}
section.finding{{border-top:1px solid #ddd;margin-top:16px}} p.job{{margin:0;color:#555}}
table{{border-collapse:collapse}} td,th{{padding:2px 10px;text-align:left}} td.num{{text-align:right}}
p.caption{{color:#444;font-size:.95em}}</style></head>
<body><header><h1>gpunet diagnosis of {e(report.source)}</h1>
<p id="summary">{e(window_words(s))}{e(jobs)}</p></header>
{_verdict(report)}
{_jobs(report)}
{findings}
<h2>Where the GPU time went</h2>
{gpu_time}
{_capacity(report)}
{_notes(report)}
<details><summary>The whole report (as <code>diagnose</code> prints it)</summary>
<pre id="report">{html.escape(render_text(report))}</pre></details>
</body></html>
"""
