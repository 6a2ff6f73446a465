"""Features: per node and window, rates and fractions with a physical meaning, and how
each node stands against its peers in the same window (what is normal depends on the job).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diagnoser.model.frame import FINE, Frame

STATES = ("paused", "saturated", "active", "quiet")
# A node counts as receiving pauses from half a pause frame per second per fabric NIC: a
# healthy DCQCN fabric sends a few a minute at most (ECN brakes the senders long before the
# switch's Xoff threshold), congestion tens to thousands.
PFC_RX_NODE_PER_NIC = 0.5


def idle_over_neighbours(f: pd.DataFrame) -> pd.Series:
    """Per node and window: its idle fraction over the window and the windows either side.
    Each node's counters are sampled at its own scrape times, so a cluster-wide stall that
    starts or ends near a window's edge falls partly in the next window on one node and not
    on another (up to a scrape interval's worth each side). Idle is conserved across the
    edge: what one window lacks, its neighbour holds."""
    idle_seconds = (f["idle_frac"] * f["gpu_time"]).unstack("instance")
    known_time = f["gpu_time"].where(f["idle_frac"].notna()).unstack("instance")
    spans = {"min_periods": 1, "center": True}
    with np.errstate(all="ignore"):
        span = idle_seconds.rolling(3, **spans).sum() / known_time.rolling(3, **spans).sum().replace(0, np.nan)
    return span.where(idle_seconds.notna()).stack(future_stack=True).reorder_levels(f.index.names).reindex(f.index)


def sub_window_share(frame: Frame, windows: int, columns: tuple[str, ...]) -> np.ndarray | None:
    """(windows x FINE): the share of the cluster's GPU time (busy and idle in every state)
    that `columns` hold in each sub-window of each window; None where the frame has no
    sub-windows, or none of the columns."""
    fine = frame.fine
    present = [c for c in columns if c in fine]
    if not present or len(fine) < windows * FINE:
        return None
    total = fine.get("busy", 0) + fine[[f"idle_{s}" for s in STATES if f"idle_{s}" in fine]].sum(axis=1)
    with np.errstate(all="ignore"):
        share = (fine[present].sum(axis=1, min_count=1) / total).to_numpy()
    return share[: windows * FINE].reshape(windows, FINE)


def receiving_pauses(node: pd.DataFrame) -> pd.Series:
    """Per node (and window): whether it receives pauses on its fabric NICs (False where
    unknown)."""
    return node["pfc_rx_per_nic"] > PFC_RX_NODE_PER_NIC


@dataclass
class Features:
    frame: Frame
    node: pd.DataFrame  # (instance, window) -> per-node features
    cluster: pd.DataFrame  # window -> cluster features
    nic: pd.DataFrame  # (instance, device, window) -> per-NIC features (fabric NICs)


def robust_z(values: pd.Series, by: pd.Series) -> pd.Series:
    """(x - peer median) / robust spread, peers = same window."""
    grouped = values.groupby(by)
    median = grouped.transform("median")
    mad = (values - median).abs().groupby(by).transform("median")
    # A floor on the spread: with identical peers (MAD = 0) a tiny difference is not news.
    spread = np.maximum(1.4826 * mad, 0.05 * median.abs() + 1e-9)
    return (values - median) / spread


def compute(frame: Frame) -> Features:
    n = frame.node.copy()
    step = frame.step
    window = n.index.get_level_values("window")
    nic = frame.nic
    fabric = nic[nic["fabric"].astype(bool)] if len(nic) else nic

    gpu_time = n["busy"] + n[[f"idle_{s}" for s in STATES]].sum(axis=1, min_count=1)
    f = pd.DataFrame(index=n.index)
    f["gpus"] = n["gpus"]
    f["gpu_time"] = gpu_time
    with np.errstate(all="ignore"):
        # busy + idle must add up to GPUs x window; where it does not (an exporter restart,
        # missing scrapes) the node's split is incomplete and is not compared with peers.
        coverage = gpu_time / (n["gpus"] * step)
        complete = (coverage > 0.5) & (coverage < 1.5)
        f["coverage"] = coverage
        f["idle_frac"] = (1 - n["busy"] / gpu_time).where(complete | n["gpus"].isna())
        for s in STATES:
            f[f"idle_{s}_frac"] = n[f"idle_{s}"] / gpu_time
        f["util"] = np.maximum(n["tx_bytes"], n["rx_bytes"]) / n["capacity"]
        # Time some fabric NIC ran at line rate, as a fraction of the window (either direction).
        f["sat_frac"] = (n["saturated"] / (step * n["fabric_nics"]).replace(0, np.nan)).clip(upper=1.0)
        f["other_util"] = n["other_bytes"] / n["other_capacity"]
        f["pfc_tx_rate"] = n["pfc_tx"] / step
        f["pfc_rx_rate"] = n["pfc_rx"] / step
        # Pauses received per fabric NIC: a congested switch pauses each of its ingress ports
        # on its own, so the rate per port is what means something; a sum per node would make
        # the same fabric look eight times as congested on nodes with eight rails as on one.
        f["pfc_rx_per_nic"] = f["pfc_rx_rate"] / n["fabric_nics"].where(n["fabric_nics"] > 0)
        f["ecn_rate"] = n["ecn"] / step
        f["cnp_rate"] = (n["cnp_sent"].fillna(0) + n["cnp_received"].fillna(0)) / step
        # Congestion marks per gigabyte moved: a busy healthy fabric marks some packets;
        # congestion marks many more for the same traffic. The CNPs a receiver sends answer
        # the marked packets it got (at most one per flow and interval): the same marks
        # counted again, so the larger of the two, which stands for the marks where a NIC
        # counts only its CNPs.
        gb_moved = (n["tx_bytes"] + n["rx_bytes"]) / 1e9
        f["ecn_per_gb"] = np.fmax(n["ecn"].fillna(0), n["cnp_sent"].fillna(0)) / gb_moved
        # InfiniBand's back-pressure: ticks a port waited for credit, per gigabyte moved. The
        # tick is the HCA's own, so only its rise against the same job's baseline means anything.
        f["xmit_wait_per_gb"] = n["xmit_wait"] / gb_moved
        f["loss_rate"] = n["rdma_loss"] / step
        f["rx_error_rate"] = n["rx_errors"] / step
        f["retrans_ratio"] = n["tcp_retrans"] / n["tcp_sent"].where(n["tcp_sent"] > 0)
        f["throttle_frac"] = n["throttled"] / (n["gpus"] * step).replace(0, np.nan)
        # The events themselves, for the rules that judge them as counts (rules/counts.py),
        # and what they are counted over: bytes moved, segments sent, bytes sent.
        for count in ("rdma_loss", "rx_errors", "tcp_retrans", "tcp_sent", "pfc_tx"):
            f[count] = n[count]
        f["bytes_moved"] = n["tx_bytes"].fillna(0) + n["rx_bytes"].fillna(0)
        f["marks"] = np.fmax(n["ecn"].fillna(0), n["cnp_sent"].fillna(0)).where(n["ecn"].notna() | n["cnp_sent"].notna())
        f["bytes_sent"] = n["tx_bytes"].fillna(0) + n["other_bytes"].fillna(0)
        f["bytes_rate"] = (n["tx_bytes"] + n["rx_bytes"]) / step
        # The node's own word on time at line rate (some fabric NIC, either direction):
        # its network_state seconds, not a sum over NICs and directions.
        states = n[[f"state_{s}" for s in STATES]].sum(axis=1, min_count=1)
        f["state_sat_frac"] = n["state_saturated"] / states.where(states > 0)
    f["idle_frac_span"] = idle_over_neighbours(f)
    f["sm_clock"] = n["sm_clock"]
    f["carrier_changes"] = n["carrier_changes"]
    f["nics_down"] = n["nics_down"]
    for col in ("idle_frac", "pfc_tx_rate", "pfc_rx_rate", "loss_rate", "retrans_ratio", "throttle_frac",
                "sm_clock", "util", "bytes_rate", "ecn_rate"):
        f[f"{col}_z"] = robust_z(f[col], window)

    # Cluster, per window: GPU-time weighted idle and sums.
    g = pd.DataFrame(index=frame.windows)
    by = f.groupby(level="window")
    total_gpu_time = by["gpu_time"].sum(min_count=1)
    g["gpu_time"] = total_gpu_time
    # Idle is weighed over the nodes whose split is known: a node whose busy + idle does not
    # add up (catching up after a scrape gap or an exporter restart) has no idle_frac, and
    # its GPU time in the denominator alone would dilute the others' idle (one node of 4
    # catching up would halve the cluster's).
    known_gpu_time = f["gpu_time"].where(f["idle_frac"].notna()).groupby(level="window").sum(min_count=1)
    with np.errstate(all="ignore"):
        g["idle_frac"] = (f["idle_frac"] * f["gpu_time"]).groupby(level="window").sum(min_count=1) / \
            known_gpu_time.replace(0, np.nan)
        for s in STATES:
            g[f"idle_{s}_frac"] = n[f"idle_{s}"].groupby(level="window").sum(min_count=1) / total_gpu_time
    g["nodes"] = by["gpu_time"].count()
    g["nodes_reporting"] = by["bytes_rate"].count()
    for col in ("pfc_tx_rate", "pfc_rx_rate", "ecn_rate", "cnp_rate", "loss_rate", "bytes_rate"):
        g[col] = by[col].sum(min_count=1)
    g["util_median"] = by["util"].median()
    g["sat_frac_median"] = by["sat_frac"].median()
    g["state_sat_frac_median"] = by["state_sat_frac"].median()
    g["ecn_per_gb"] = by["ecn_per_gb"].median()
    g["xmit_wait_per_gb"] = by["xmit_wait_per_gb"].median()
    g["marks"] = by["marks"].sum(min_count=1)
    g["gb_moved"] = by["bytes_moved"].sum(min_count=1) / 1e9
    with np.errstate(all="ignore"):
        g["loss_per_gb"] = by["rdma_loss"].sum(min_count=1) / g["gb_moved"].replace(0, np.nan)
    g["retrans_ratio"] = n["tcp_retrans"].groupby(level="window").sum(min_count=1) / \
        n["tcp_sent"].groupby(level="window").sum(min_count=1).replace(0, np.nan)
    g["throttle_frac_max"] = by["throttle_frac"].max()
    g["other_util_median"] = by["other_util"].median()
    g["other_rate"] = n["other_bytes"].groupby(level="window").sum(min_count=1) / step
    # The job's pauses per fabric NIC, over the nodes where both are known: a node's pauses
    # without its NICs (or NICs without their pauses) would tilt the figure.
    fabric_nics = n["fabric_nics"].where(f["pfc_rx_per_nic"].notna())
    with np.errstate(all="ignore"):
        g["pfc_rx_per_nic"] = f["pfc_rx_rate"].where(fabric_nics.notna()).groupby(level="window").sum(min_count=1) / \
            fabric_nics.groupby(level="window").sum(min_count=1)
    g["pfc_rx_nodes"] = receiving_pauses(f).groupby(level="window").sum()
    g["tcp_retrans_rate"] = n["tcp_retrans"].groupby(level="window").sum(min_count=1) / step
    # Quiet idle sustained through the window (median of its sub-windows), not one stall.
    quiet = sub_window_share(frame, len(g), ("idle_quiet",))
    if quiet is not None:
        with warnings.catch_warnings():  # a window with no sub-window known stays NaN, silently
            warnings.simplefilter("ignore", RuntimeWarning)
            g["idle_quiet_sustained"] = np.nanmedian(quiet, axis=1)
    else:
        g["idle_quiet_sustained"] = g["idle_quiet_frac"]

    nf = pd.DataFrame(index=fabric.index)
    if len(fabric):
        with np.errstate(all="ignore"):
            nf["speed"] = fabric["speed"]
            nf["up"] = fabric["up"]
            nf["util"] = np.maximum(fabric["tx_bytes"], fabric["rx_bytes"]) / (fabric["speed"] * step)
            nf["pfc_tx_rate"] = fabric["pfc_tx"] / step
            nf["loss_rate"] = fabric["rdma_loss"] / step
            nf["carrier_changes"] = fabric["carrier_changes"]
            nf["bytes"] = fabric["tx_bytes"].fillna(0) + fabric["rx_bytes"].fillna(0)
    return Features(frame, f, g, nf)
