"""Classification: for each window, which bottleneck classes (contract section 4) hold, on
which nodes, with what evidence.

Rules, each with a physical reason, read the features; every threshold is named here
with why it is where it is. A window may hold more than one root cause (an input-pipeline
stall while a link flaps), but never a symptom beside its cause: the nodes that receive
a storm's pauses are victims of the pfc_storm, not a congestion finding of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagnoser.capacity import bandwidth_evidence
from diagnoser.features import Features

# --- thresholds, and why ------------------------------------------------------------------
# GPU idle above the job's own baseline (its quieter windows) that is worth a finding:
# the subtle faults on-call must catch add 5 to 8 points of idle.
EXCESS_IDLE = 0.03
# A PFC storm: a NIC stuck in XOFF refreshes pauses every few hundred microseconds, i.e.
# thousands of frames a second; healthy DCQCN fabrics send a handful per second at most.
STORM_TX_RATE = 500.0  # pause frames per second sent by one node
STORM_Z = 6.0  # ... and far above its peers
# Congestion: ECN-marked packets per GB moved. 250 marks/GB is ~0.1% of 4 KB packets;
# a healthy DCQCN fabric marks ~0.001-0.01%, a congested one percents.
ECN_PER_GB = 250.0
ECN_RISE = 20.0  # or twenty times the job's own baseline
PAUSE_RX_PER_NODE = 10.0  # received pauses per second per node, widespread: lossless back-pressure
# Loss: go-back-N events per second per node; a clean fabric has none for hours.
LOSS_RATE = 1.0
RETRANS_RATIO = 0.005  # TCP retransmitted / sent segments; datacentre TCP sits below 0.1%
# ... or ten times the job's own background: in a collective every lost tail segment can
# cost a retransmission timeout (200 ms minimum on Linux), so even rare loss stalls it.
RETRANS_RISE = 10.0
RETRANS_FLOOR = 1e-5
LOCAL_Z = 5.0  # a node this far above its peers' median holds the problem
# Bandwidth: GPUs idle while the fabric ran at line rate.
SATURATED_IDLE = 0.10  # of GPU time, absolute: a network-bound job
SATURATED_IDLE_RISE = 0.04  # or this much above the job's baseline
SATURATED_SHARE = 0.5  # ... and most of the (extra) idle is in saturated ticks: the links are the wait
# A link below its peers' speed (a 200G NIC trained at 100G, or 4x lanes at 2x).
SLOW_LINK = 0.75
THROTTLE = 0.25  # fraction of a node's GPU time under a throttle reason
STRAGGLER_Z = -4.0  # a node idles far less than its peers: the others wait for it
STRAGGLER_GAP = 0.03  # ... by at least this much idle fraction
# Host-bound: the extra idle comes with a quiet network. At a 0.2 s tick much of an input
# stall still lands in ticks that saw the tail of an all-reduce ("active"), so the quiet
# share need only be a good part of the rise, not most of it.
QUIET_RISE = 0.015
QUIET_SHARE = 0.3
# Storage/management NICs far busier than usual while GPUs idle quiet: a checkpoint
# being written, part of normal training, not a host-bound fault.
CHECKPOINT_OTHER_UTIL = 0.02
CHECKPOINT_RISE = 3.0


# The network_state in which each class makes GPUs wait.
STATE_OF = {"network_bandwidth": "saturated", "pfc_storm": "paused", "host_bound": "quiet"}


@dataclass
class WindowFinding:
    window: float
    cls: str
    nodes: list[str]
    devices: list[str]
    confidence: float
    idle_seconds: float  # extra GPU idle in the window, over the baseline
    evidence: dict = field(default_factory=dict)


@dataclass
class Baseline:
    idle_frac: float
    idle_saturated_frac: float
    idle_quiet_frac: float
    ecn_per_gb: float
    retrans_ratio: float
    other_util: float


def baseline(f: Features) -> Baseline:
    """The job's own normal: its quieter windows (20th percentile), robust to incidents
    that cover most but not all of the window."""
    g = f.cluster

    def q(col: str) -> float:
        values = g[col].dropna()
        return float(np.quantile(values, 0.2)) if len(values) else float("nan")

    return Baseline(q("idle_frac"), q("idle_saturated_frac"), q("idle_quiet_frac"), q("ecn_per_gb"),
                    q("retrans_ratio"), q("other_util_median"))


def _top(series: pd.Series, mask: pd.Series) -> list[str]:
    picked = series[mask].sort_values(ascending=False)
    return list(picked.index.get_level_values("instance"))


def classify(f: Features) -> list[WindowFinding]:
    base = baseline(f)
    out: list[WindowFinding] = []
    suppressed: list[WindowFinding] = []
    node = f.node
    nic = f.nic
    # NICs that ever carried traffic or were ever up: a spare port down all along is not a fault.
    if len(nic):
        used = nic.groupby(level=["instance", "device"]).agg(bytes=("bytes", "sum"), up=("up", "max"))
        used = used[(used["bytes"] > 0) | (used["up"] > 0)].index
    speed_median = pd.Series(f.frame.fabric_speed_median if f.frame.fabric_speed_median is not None
                             else np.nan, index=f.frame.windows)
    for w, g in f.cluster.iterrows():
        try:
            nw = node.xs(w, level="window")
        except KeyError:
            continue
        has_gpu = bool(g["gpu_time"] > 0) if np.isfinite(g["gpu_time"]) else False
        excess = float(g["idle_frac"] - base.idle_frac) if has_gpu else float("nan")
        idle_cost = max(excess, 0.0) * float(g["gpu_time"]) if has_gpu else float("nan")
        impact = (not has_gpu) or excess >= EXCESS_IDLE
        found: dict[str, WindowFinding] = {}

        def add(cls: str, nodes: list[str], devices: list[str], confidence: float, **evidence) -> None:
            # The cost: GPU idle above the job's own baseline; for a condition that lasts the
            # whole window (no baseline below it), the idle spent in the state it causes.
            cost = idle_cost
            state = STATE_OF.get(cls)
            if has_gpu and state is not None:
                cost = max(cost, float(np.nan_to_num(g[f"idle_{state}_frac"])) * float(g["gpu_time"]))
            found[cls] = WindowFinding(w, cls, nodes, devices, float(np.clip(confidence, 0.05, 0.99)),
                                       cost, {k: _plain(v) for k, v in evidence.items()})

        # 1. PFC storm: a node sends pauses without end; everyone behind it freezes.
        storm = nw[(nw["pfc_tx_rate"] >= STORM_TX_RATE) & (nw["pfc_tx_rate_z"] >= STORM_Z)]
        if len(storm):
            culprits = list(storm["pfc_tx_rate"].sort_values(ascending=False).index)
            devices = _devices(nic, w, culprits, "pfc_tx_rate")
            victims = int(((nw["pfc_rx_rate"] > 1.0) & ~nw.index.isin(culprits)).sum())
            add("pfc_storm", culprits, devices, 0.6 + 0.4 * min(g["idle_paused_frac"] / 0.2, 1.0) if has_gpu else 0.7,
                pause_tx_per_s={n: nw.at[n, "pfc_tx_rate"] for n in culprits}, nodes_receiving_pauses=victims,
                gpu_idle_paused=g["idle_paused_frac"], gpu_idle=g["idle_frac"])

        # 2. Link degraded: slower than its peers, down after being up, or flapping.
        if len(nic):
            try:
                nicw = nic.xs(w, level="window")
            except KeyError:
                nicw = nic.iloc[0:0]
            nicw = nicw[nicw.index.isin(used)]
            median_speed = speed_median.get(w, np.nan)
            if not np.isfinite(median_speed):
                median_speed = nicw["speed"].median()
            slow = nicw["speed"] < SLOW_LINK * median_speed
            down = nicw["up"] == 0
            flaps = nicw["carrier_changes"] > 0
            bad = nicw[slow | down | flaps]
            if len(bad):
                culprits = sorted(set(bad.index.get_level_values("instance")))
                why = {f"{i} {d}": ("down" if nicw.at[(i, d), "up"] == 0 else
                                   f"{nicw.at[(i, d), 'speed'] * 8 / 1e9:.0f} Gb/s vs peers "
                                   f"{median_speed * 8 / 1e9:.0f} Gb/s" if slow.at[(i, d)] else
                                   f"{nicw.at[(i, d), 'carrier_changes']:.0f} carrier changes")
                       for i, d in bad.index}
                add("link_degraded", culprits, sorted({d for _, d in bad.index}), 0.9, links=why,
                    gpu_idle=g["idle_frac"])

        # 3. Packet loss: go-back-N or TCP retransmission, throughput falls.
        loss_nodes = nw["loss_rate"].fillna(0)
        retrans = nw["retrans_ratio"]
        rdma_loss = float(loss_nodes.sum()) / max(len(nw), 1) >= LOSS_RATE
        ratio = float(np.nan_to_num(g["retrans_ratio"]))
        tcp_loss = ratio >= RETRANS_RATIO or (
            np.isfinite(base.retrans_ratio) and ratio >= max(RETRANS_RISE * base.retrans_ratio, RETRANS_FLOOR))
        if (rdma_loss or tcp_loss) and (impact or not has_gpu):
            # Localised when the loss concentrates: a few nodes far above their peers, or
            # (in a job too small for peer statistics) one node holding most of it.
            values, z = (loss_nodes, nw["loss_rate_z"]) if rdma_loss else (retrans.fillna(0), nw["retrans_ratio_z"])
            total = float(values.sum())
            share = values / total if total > 0 else values * 0
            local = values[((z >= LOCAL_Z) | (share >= 0.7)) & (values >= 0.5 * values.max())]
            culprits = list(local.sort_values(ascending=False).index) if 0 < len(local) <= max(1, len(nw) // 4) \
                else []
            add("packet_loss", culprits, _devices(nic, w, culprits, "loss_rate") if rdma_loss else [],
                0.6 + 0.3 * (excess >= 2 * EXCESS_IDLE if has_gpu else 0),
                loss_events_per_s=float(loss_nodes.sum()), tcp_retransmit_ratio=g["retrans_ratio"],
                gpu_idle=g["idle_frac"])

        # 4. Congestion: the fabric marks and pauses, throughput stays below line rate.
        ecn_hot = (g["ecn_per_gb"] >= ECN_PER_GB) or (
            np.isfinite(base.ecn_per_gb) and base.ecn_per_gb > 0 and g["ecn_per_gb"] >= ECN_RISE * base.ecn_per_gb)
        pauses_hot = g["pfc_rx_rate"] / max(len(nw), 1) >= PAUSE_RX_PER_NODE and g["pfc_rx_nodes"] >= len(nw) / 2
        if (ecn_hot or pauses_hot) and impact and "pfc_storm" not in found:
            add("network_congestion", [], [], 0.6 + 0.3 * ecn_hot, ecn_marks_per_gb=g["ecn_per_gb"],
                pauses_received_per_s=g["pfc_rx_rate"], link_utilisation=g["util_median"],
                gpu_idle_active_or_paused=g["idle_active_frac"] + g["idle_paused_frac"], gpu_idle=g["idle_frac"])

        if has_gpu:
            # 6. Throttled GPUs: the others wait for them.
            throttled = nw[nw["throttle_frac"] >= THROTTLE]
            if len(throttled) and (impact or (throttled["idle_frac_z"] <= -2).any()):
                culprits = list(throttled["throttle_frac"].sort_values(ascending=False).index)
                add("gpu_throttle", culprits, [], 0.7 + 0.25 * min(throttled["throttle_frac"].max(), 1.0),
                    throttled_fraction={n: nw.at[n, "throttle_frac"] for n in culprits},
                    throttled_gpus=_throttled_gpus(f.frame, w, culprits),
                    sm_clock_mhz={n: nw.at[n, "sm_clock"] / 1e6 for n in culprits}, gpu_idle=g["idle_frac"])

            # 7. Stragglers: a node idles far less than its peers, and no cause shows on it.
            median_idle = nw["idle_frac"].median()
            slow_nodes = nw[(nw["idle_frac_z"] <= STRAGGLER_Z) & (nw["idle_frac"] <= median_idle - STRAGGLER_GAP)]
            explained = set()
            for cls in ("gpu_throttle", "link_degraded", "packet_loss", "pfc_storm"):
                if cls in found:
                    explained |= set(found[cls].nodes)
            slow_nodes = slow_nodes[~slow_nodes.index.isin(list(explained))]
            if len(slow_nodes) and impact and len(slow_nodes) <= max(1, len(nw) // 4):
                culprits = list(slow_nodes["idle_frac"].sort_values().index)
                add("straggler", culprits, [], 0.6 + 0.3 * min(-slow_nodes["idle_frac_z"].min() / 10, 1.0),
                    node_gpu_idle={n: nw.at[n, "idle_frac"] for n in culprits}, peer_median_gpu_idle=median_idle,
                    gpu_idle=g["idle_frac"])

            # 8. Host-bound: GPUs idle with the network quiet, no node standing out, and
            # sustained through the window: a checkpoint's brief full stop is not a finding.
            quiet_rise = g["idle_quiet_frac"] - base.idle_quiet_frac
            if impact and quiet_rise >= QUIET_RISE and quiet_rise >= QUIET_SHARE * excess \
                    and not found.keys() & {"straggler", "gpu_throttle"}:
                # (the median node: a backup on a few nodes moves no median, a checkpoint does)
                checkpoint = np.nan_to_num(g["other_util_median"]) >= CHECKPOINT_OTHER_UTIL and \
                    np.nan_to_num(g["other_util_median"]) >= CHECKPOINT_RISE * np.nan_to_num(base.other_util)
                cause = next((c for c in ("pfc_storm", "link_degraded", "packet_loss") if c in found), None)
                if cause is not None:
                    # A stalled fabric also leaves GPUs idle with nothing on the wire: that is
                    # the cause's symptom. Kept as a marker so an input-pipeline incident
                    # around it is not cut in two.
                    suppressed.append(WindowFinding(w, "host_bound", [], [], 0.0, 0.0, {"suppressed_by": cause}))
                elif not checkpoint:
                    add("host_bound", [], [], 0.5 + min(quiet_rise / 0.2, 0.45),
                        gpu_idle_quiet=g["idle_quiet_frac"], baseline_gpu_idle_quiet=base.idle_quiet_frac,
                        gpu_idle=g["idle_frac"])
        # 5. Bandwidth: GPUs wait while the links run at line rate, and nothing else explains
        # it. Waiting for a straggler also exposes the all-reduce, so the saturated share of
        # the idle must be the larger part, and no node may stand out.
        sat_idle = g["idle_saturated_frac"]
        rise = sat_idle - base.idle_saturated_frac
        if has_gpu and not found.keys() & {"pfc_storm", "link_degraded", "network_congestion", "packet_loss",
                                           "gpu_throttle", "straggler", "host_bound"}:
            persistent = sat_idle >= SATURATED_IDLE and sat_idle >= SATURATED_SHARE * g["idle_frac"]
            rising = impact and rise >= SATURATED_IDLE_RISE and rise >= SATURATED_SHARE * excess
            if persistent or rising:
                add("network_bandwidth", [], [], 0.5 + min(sat_idle / 0.3, 0.45),
                    gpu_idle_saturated=sat_idle, link_utilisation=g["util_median"],
                    saturated_time=_line_rate_time(g), gpu_idle=g["idle_frac"],
                    **bandwidth_evidence(speed_median.get(w, np.nan), _line_rate_time(g), sat_idle))
        elif not has_gpu and g["sat_frac_median"] >= 0.5 and not found:
            add("network_bandwidth", [], [], 0.5, saturated_time=g["sat_frac_median"],
                link_utilisation=g["util_median"], gpu_idle="unknown (no GPU series)")
        out.extend(found.values())
    return out + suppressed


def _line_rate_time(g: pd.Series) -> float:
    """Share of the window the fabric ran at line rate: the nodes' network_state where the
    source has it, else the NICs' saturated seconds (summed over both directions, so at most
    twice the truth: halved)."""
    value = g.get("state_sat_frac_median", np.nan)
    return float(value) if np.isfinite(value) else float(g["sat_frac_median"]) / 2


def _throttled_gpus(frame, w: float, nodes: list[str]) -> dict[str, str]:
    """Which GPUs of the culprit nodes were throttled in window w, where the source gives GPUs."""
    if not len(frame.gpu):
        return {}
    try:
        gw = frame.gpu.xs(w, level="window")
    except KeyError:
        return {}
    out = {}
    for node in nodes:
        if node in gw.index.get_level_values("instance"):
            rows = gw.xs(node, level="instance")
            gpus = rows.index[(rows["throttled"] / frame.step) >= THROTTLE]
            out[node] = ",".join(sorted(gpus, key=lambda g: (len(g), g))) or "none above the threshold alone"
    return out


def _devices(nic: pd.DataFrame, w: float, nodes: list[str], column: str) -> list[str]:
    """The NICs of `nodes` that carry most of `column` in window w."""
    if not len(nic) or not nodes or column not in nic:
        return []
    try:
        nicw = nic.xs(w, level="window")
    except KeyError:
        return []
    sub = nicw[nicw.index.get_level_values("instance").isin(nodes)][column].fillna(0)
    if not len(sub) or sub.max() <= 0:
        return []
    return sorted({d for (_, d), v in sub.items() if v >= 0.3 * sub.max()})


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (np.floating, float)):
        return None if not np.isfinite(value) else round(float(value), 4)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value
