"""The series the HTML report draws, taken from the features: where the cluster's GPU time
went, window by window, and for a localised finding its culprits against their peers in
the signal its class's record names."""

from __future__ import annotations

import numpy as np

from diagnoser.analysis.features import STATES, Features
from diagnoser.analysis.rules import rule
from diagnoser.model.report import CulpritChart, Finding, GpuTimeChart

MAX_CULPRITS = 3  # lines on one chart besides the peers' median
LAYERS = ("quiet", "active", "saturated", "paused")  # stacked above "busy", in this order


def gpu_time(features: Features) -> GpuTimeChart:
    g = features.cluster
    frame = features.frame
    idle = {s: np.nan_to_num(g[f"idle_{s}_frac"].to_numpy()) for s in STATES}
    layers = {"busy": np.clip(1 - sum(idle.values()), 0, 1)} | {s: idle[s] for s in LAYERS}
    times = np.asarray(g.index, dtype=float) + frame.step / 2
    return GpuTimeChart(float(frame.start), float(frame.end), times.tolist(),
                        {name: [float(v) for v in values] for name, values in layers.items()})


def culprits(features: Features, finding: Finding, position: int) -> CulpritChart | None:
    """The culprits' signal against the median of their peers; None where the class draws
    no chart or the features lack its signal."""
    record = rule(finding.cls)
    if record.chart is None or not finding.nodes:
        return None
    column, label = record.chart
    node = features.node
    if column not in node:
        return None
    table = node[column].unstack("instance")
    shown = [n for n in finding.nodes if n in table.columns][:MAX_CULPRITS]
    peers = table.drop(columns=shown).median(axis=1)
    lines = {f"peer median ({len(table.columns) - len(shown)} nodes)": peers.to_numpy()}
    lines |= {n: table[n].to_numpy() for n in shown}
    times = np.asarray(table.index, dtype=float) + features.frame.step / 2
    return CulpritChart(position, f"{record.title}: {label}", float(features.frame.start), float(features.frame.end),
                        times.tolist(), {k: [float(x) for x in v] for k, v in lines.items()},
                        (finding.start, finding.end))
