"""Classification: for each window, which bottleneck classes (docs/classes.md) hold, on
which nodes, with what evidence.

The rules live one per class in `rules/`; this module builds each window's context (the
job's baseline, the window's cluster, node and NIC features) and runs the rules in their
order. A window may hold more than one root cause (an input-pipeline stall while a link
flaps), but never a symptom beside its cause: the rules read what ran before them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnoser.analysis.features import Features
from diagnoser.analysis.rules import EXPLAINS, RULES, WAITS_IN
from diagnoser.analysis.rules.base import MIN_PEERS, Baseline, Detection, WindowContext, plain, tcp_share
from diagnoser.model.findings import WindowFinding

BASELINE_QUANTILE = 0.2  # the job's quieter windows: robust to incidents covering most, not all, of the range
MIN_CONFIDENCE, MAX_CONFIDENCE = 0.05, 0.99
MIN_CLEAN = 1  # windows free of every class's signal that make the baseline on their own


def baseline(f: Features, phase: frozenset[float] = frozenset(),
             fabric: tuple[float, float] = (float("nan"), float("nan"))) -> Baseline:
    """The job's own normal: its quieter windows, robust to incidents that cover most but
    not all of the range, and outside its phases (`phase`: the windows of its start-up or
    restart, analysis/phases.py). `fabric`: the other jobs' congestion signal (fabric_level).
    GPU idle is its low quantile; every other figure is its median
    over the windows where GPUs idled least (where the job ran as usual), not its own low
    quantile: a storm's windows hold no idle at line rate (the links are paused), and
    would make the usual line-rate idle look like a rise."""
    g = f.cluster
    idle = g["idle_frac"].dropna()
    # Windows where some class's own physical signal held (a storm, loss, a link down, a
    # throttle) are no part of the normal, where enough others are left to say what it is.
    flagged = pd.Series(g.index.isin(list(phase)), index=g.index)
    for record in RULES.values():
        if record.signature is not None and len(f.node):
            flagged |= record.signature(f.node).reindex(g.index, fill_value=False).astype(bool)
    clean = idle[~flagged.reindex(idle.index, fill_value=False)]
    if len(clean) >= MIN_CLEAN:
        idle = clean
    usual = g.loc[idle.index[idle <= np.quantile(idle, BASELINE_QUANTILE)]] if len(idle) >= 2 else None

    def q(col: str) -> float:
        values = g[col].dropna()
        if usual is not None and usual[col].notna().any():
            return float(usual[col].median())
        return float(np.quantile(values, BASELINE_QUANTILE)) if len(values) else float("nan")

    idle_base = float(np.quantile(idle, BASELINE_QUANTILE)) if len(idle) else float("nan")
    return Baseline(idle_base, q("idle_saturated_frac"), q("idle_quiet_frac"), q("ecn_per_gb"),
                    q("retrans_ratio"), q("other_util_median"), q("xmit_wait_per_gb"), tcp_byte_share(f.node),
                    q("loss_per_gb"), _top(g["util_median"]), *fabric)


# The fabric's usual congestion signal: the quieter quarter of the nodes that carry training
# traffic outside the job (a node moving a tenth of the median node's bytes carries none).
FABRIC_QUANTILE = 0.25
CARRIES_TRAFFIC = 0.1


def fabric_level(whole: Features, job_nodes: list[str]) -> tuple[float, float]:
    """(ECN marks, credit-wait ticks) per GB moved over the whole range on the other jobs'
    nodes that carry traffic, at their quieter quarter; NaN with fewer than MIN_PEERS such
    nodes. Where one job's traffic congests the uplinks for its whole life, its own windows
    all look alike and its baseline is the congestion; the rest of the fabric is not."""
    node = whole.node
    if not len(node) or "marks" not in node:
        return float("nan"), float("nan")
    others = node[~node.index.get_level_values("instance").isin(job_nodes)]
    gb = others["bytes_moved"] / 1e9
    per = pd.DataFrame({"gb": gb, "marks": others["marks"], "wait": others["xmit_wait_per_gb"] * gb})
    per = per.groupby(level="instance").sum(min_count=1)
    per = per[per["gb"] > CARRIES_TRAFFIC * per["gb"].median()]
    if len(per) < MIN_PEERS:
        return float("nan"), float("nan")

    def level(col: str) -> float:
        rate = (per[col] / per["gb"]).dropna()
        return float(np.quantile(rate, FABRIC_QUANTILE)) if len(rate) >= MIN_PEERS else float("nan")

    return level("marks"), level("wait")


def _top(values: pd.Series) -> float:
    values = values.dropna()
    return float(np.quantile(values, 0.9)) if len(values) else float("nan")


def tcp_byte_share(node: pd.DataFrame) -> float:
    """The median node's share of its bytes sent that TCP carried, over the whole range: a
    property of how the job communicates (NCCL over sockets or over RDMA), not of one window,
    whose stalls would raise the share of the management traffic that goes on through them."""
    if not len(node) or "tcp_sent" not in node or "bytes_sent" not in node:
        return float("nan")
    by_node = node[["tcp_sent", "bytes_sent"]].groupby(level="instance").sum(min_count=1)
    by_node = by_node[(by_node["bytes_sent"] > 0) & by_node["tcp_sent"].notna()]
    if not len(by_node):
        return float("nan")
    return float(tcp_share(by_node["tcp_sent"], by_node["bytes_sent"]).median())


def windows(f: Features, base: Baseline) -> list[WindowContext]:
    """The context of every window that holds node features, with its detections empty."""
    nic = f.nic
    if len(nic):
        # Over the whole range: NICs that ever carried traffic or were ever up (a spare port
        # down all along is not a fault), and the fastest each ever ran (a link that fell).
        seen = nic.groupby(level=["instance", "device"]).agg(bytes=("bytes", "sum"), up=("up", "max"),
                                                              top_speed=("speed", "max"))
        keys = nic.index.droplevel("window")
        used = seen[(seen["bytes"] > 0) | (seen["up"] > 0)].index
        nic = nic.assign(in_use=keys.isin(used), top_speed=seen["top_speed"].reindex(keys).to_numpy())
    # One pass to cut the tables by window (a lookup per window costs more than the rules).
    node_at = _by_window(f.node)
    nic_at = _by_window(nic)
    empty_nic = nic.iloc[0:0].droplevel("window") if len(nic) else nic
    speed_median = f.frame.fabric_speed_median
    gpu = f.frame.gpu
    out = []
    for k, (w, g) in enumerate(f.cluster.iterrows()):
        nw = node_at.get(float(w))
        if nw is None:
            continue
        median = float(speed_median[k]) if speed_median is not None and k < len(speed_median) else float("nan")
        out.append(WindowContext(float(w), g, nw, nic_at.get(float(w), empty_nic), base, median, gpu, f.frame.step,
                                 {}, EXPLAINS, WAITS_IN))
    return out


def _by_window(table: pd.DataFrame) -> dict[float, pd.DataFrame]:
    if not len(table):
        return {}
    return {float(w): part.droplevel("window") for w, part in table.groupby(level="window", sort=False)}


def classify(f: Features, base: Baseline, phase: frozenset[float] = frozenset()) -> list[WindowFinding]:
    """Every class's detections in every window, with their cost; then the markers of
    signals that another class explained (they bridge incidents, see incidents.merge). In
    the windows of a phase (`phase`) only the classes with a physical signal of their own."""
    out: list[WindowFinding] = []
    suppressed: list[WindowFinding] = []
    for ctx in windows(f, base):
        found: list[WindowFinding] = []
        for name, record in RULES.items():
            if record.needs_gpu and not ctx.has_gpu or (ctx.window in phase and record.signature is None):
                continue
            detection = record.check(ctx)
            if detection is None:
                continue
            if detection.suppressed_by is not None:
                suppressed.append(WindowFinding(ctx.window, name, [], [], 0.0, 0.0,
                                                {"suppressed_by": detection.suppressed_by}))
                continue
            ctx.found[name] = detection
            found.append(_finding(ctx, name, detection))
        out.extend(found)
    return out + suppressed


def _finding(ctx: WindowContext, name: str, d: Detection) -> WindowFinding:
    """The window's finding and its cost: GPU idle above the job's baseline; for a condition
    that lasts the whole range (no baseline below it), at least the idle spent in the state
    it makes GPUs wait in."""
    g = ctx.cluster
    cost = max(ctx.excess, 0.0) * float(g["gpu_time"]) if ctx.has_gpu else float("nan")
    record_state = RULES[name].waits_in
    states = d.waits_in or ((record_state,) if record_state is not None else ())
    if ctx.has_gpu and states:
        cost = max(cost, sum(float(np.nan_to_num(g[f"idle_{s}_frac"])) for s in states) * float(g["gpu_time"]))
    confidence = float(np.clip(d.confidence, MIN_CONFIDENCE, MAX_CONFIDENCE))
    effect = d.effect if d.effect is not None else dict.fromkeys(d.nodes, 1.0)
    return WindowFinding(ctx.window, name, list(d.nodes), list(d.devices), confidence, cost,
                         {k: plain(v) for k, v in d.evidence.items()}, dict(effect))
