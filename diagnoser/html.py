"""`diagnose --html FILE`: one self-contained page (inline SVG, no script, no network) with
the text report and the pictures on-call wants: where the cluster's GPU time went, window
by window, with each finding shaded; and for a localised finding, the culprit against its
peers in the signal that named it."""

from __future__ import annotations

import html

import numpy as np

from diagnoser.features import STATES, Features
from diagnoser.report import TITLE, to_text
from gpunet.window import rfc3339

WIDTH, HEIGHT, PAD = 900, 260, 50
COLORS = {"busy": "#4c78a8", "quiet": "#9ecae9", "active": "#72b7b2", "saturated": "#f58518", "paused": "#e45756"}
# The per-node signal that shows each localised class best.
SIGNAL = {"pfc_storm": ("pfc_tx_rate", "PFC pauses sent per second"),
          "packet_loss": ("loss_rate", "RDMA loss events per second"),
          "gpu_throttle": ("throttle_frac", "fraction of GPU time throttled"),
          "straggler": ("idle_frac", "GPU idle fraction"),
          "link_degraded": ("bytes_rate", "bytes per second on the fabric")}


def _x(t: float, t0: float, t1: float) -> float:
    return PAD + (WIDTH - 2 * PAD) * (t - t0) / max(t1 - t0, 1e-9)


def _shade(findings: list[dict], t0: float, t1: float) -> str:
    out = []
    for f in findings:
        x0, x1 = _x(max(f["start"], t0), t0, t1), _x(min(f["end"], t1), t0, t1)
        out.append(f'<rect class="finding" x="{x0:.1f}" y="{PAD / 2:.1f}" width="{max(x1 - x0, 1):.1f}" '
                   f'height="{HEIGHT - PAD:.1f}" fill="#000" fill-opacity="0.08"><title>{html.escape(f["class"])}'
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


def gpu_time_chart(features: Features, findings: list[dict]) -> str:
    """Stacked areas: the share of GPU time busy and idle in each network state."""
    g = features.cluster
    t0, t1 = float(features.frame.start), float(features.frame.end)
    mids = np.asarray(g.index, dtype=float) + features.frame.step / 2
    idle = {s: np.nan_to_num(g[f"idle_{s}_frac"].to_numpy()) for s in STATES}
    layers = [("busy", np.clip(1 - sum(idle.values()), 0, 1))] + [(s, idle[s]) for s in ("quiet", "active",
                                                                                          "saturated", "paused")]
    y_of = lambda v: HEIGHT - PAD / 2 - (HEIGHT - PAD) * v  # noqa: E731 - a scale
    base = np.zeros(len(mids))
    paths = []
    for name, share in layers:
        top = base + share
        upper = " ".join(f"{_x(t, t0, t1):.1f},{y_of(v):.1f}" for t, v in zip(mids, top))
        lower = " ".join(f"{_x(t, t0, t1):.1f},{y_of(v):.1f}" for t, v in zip(mids[::-1], base[::-1]))
        paths.append(f'<polygon class="layer-{name}" points="{upper} {lower}" fill="{COLORS[name]}">'
                     f'<title>{name}</title></polygon>')
        base = top
    legend = "".join(f'<rect x="{PAD + 110 * i}" y="{HEIGHT + 2}" width="10" height="10" fill="{COLORS[n]}"/>'
                     f'<text x="{PAD + 14 + 110 * i}" y="{HEIGHT + 11}" font-size="11">{n if n == "busy" else "idle, " + n}'
                     f'</text>' for i, (n, _) in enumerate(layers))
    return (f'<svg id="gpu-time" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT + 18}">'
            f'{"".join(paths)}{_shade(findings, t0, t1)}{_axes(t0, t1, "Where GPU time went", "100%")}{legend}</svg>')


def culprit_chart(features: Features, finding: dict, index: int) -> str:
    """The culprit nodes' signal against the median of their peers."""
    column, label = SIGNAL[finding["class"]]
    node = features.node
    if column not in node or not finding["nodes"]:
        return ""
    t0, t1 = float(features.frame.start), float(features.frame.end)
    table = node[column].unstack("instance")
    culprits = [n for n in finding["nodes"] if n in table.columns][:3]
    peers = table.drop(columns=culprits).median(axis=1)
    lines = [(f"peer median ({len(table.columns) - len(culprits)} nodes)", peers.to_numpy(), "#888")]
    lines += [(n, table[n].to_numpy(), c) for n, c in zip(culprits, ("#e45756", "#f58518", "#b279a2"))]
    top = float(np.nanmax([np.nanmax(v) for _, v, _ in lines if np.isfinite(v).any()] + [1e-9]))
    mids = np.asarray(table.index, dtype=float) + features.frame.step / 2
    y_of = lambda v: HEIGHT - PAD / 2 - (HEIGHT - PAD) * (v / top)  # noqa: E731 - a scale
    svg = []
    for i, (name, values, color) in enumerate(lines):
        points = " ".join(f"{_x(t, t0, t1):.1f},{y_of(v):.1f}" for t, v in zip(mids, values) if np.isfinite(v))
        svg.append(f'<polyline class="series" points="{points}" fill="none" stroke="{color}" stroke-width="2">'
                   f'<title>{html.escape(name)}</title></polyline>')
        svg.append(f'<text x="{PAD + 220 * i}" y="{HEIGHT + 11}" font-size="11" fill="{color}">'
                   f'{html.escape(name)}</text>')
    title = f"{TITLE[finding['class']]}: {label}"
    return (f'<svg id="culprit-{index}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT + 18}">'
            f'{_shade([finding], t0, t1)}{"".join(svg)}{_axes(t0, t1, title, f"{top:.3g}")}</svg>')


def render(features: Features, doc: dict) -> str:
    charts = [gpu_time_chart(features, doc["findings"])] if features.frame.has_gpus else [
        '<p id="gpu-time-missing">No GPU series in this window: GPU time cannot be shown.</p>']
    charts += [culprit_chart(features, f, i) for i, f in enumerate(doc["findings"], 1) if f["class"] in SIGNAL]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpunet diagnosis</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:960px}} pre{{white-space:pre-wrap;background:#f6f6f6;
padding:12px}} svg{{display:block;margin:12px 0}}</style></head>
<body><h1>gpunet diagnosis</h1>
{''.join(charts)}
<pre id="report">{html.escape(to_text(doc))}</pre>
</body></html>
"""
