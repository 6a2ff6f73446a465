"""Which contract series feed which column of the frame, and how: written once, read by the
trace reader (diagnoser/model/frame.py's FrameBuilder) and by the PromQL the Prometheus
source sends (diagnoser/sources/prometheus.py).

A counter becomes its increase within each window (resets and gaps handled), a gauge its
mean or its minimum. Series split by a label (`network_state`, `direction`) fill one
column per label value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpunet import contract as c

INCREASE, MEAN, MIN = "increase", "mean", "min"


@dataclass(frozen=True)
class Column:
    metric: str  # the contract's sample name
    table: str  # "nic": per NIC port, summed per node over fabric NICs; "node": per node; "gpu": per GPU, summed per node
    column: str  # the frame column, or its prefix where `split_by` is set
    how: str = INCREASE
    split_by: str | None = None  # a label whose value completes the column name
    # label value -> column suffix (default: the value itself); values not listed are ignored
    split_values: dict[str, str] = field(default_factory=dict)
    default_split: str | None = None  # the label value taken where the label is missing

    def name_for(self, labels: dict[str, str]) -> str | None:
        """The column a series with these labels feeds; None where it feeds none."""
        if self.split_by is None:
            return self.column
        value = labels.get(self.split_by, self.default_split or "")
        suffix = self.split_values.get(value)
        return None if suffix is None else self.column + suffix


_STATES = {s: s for s in c.NETWORK_STATES}

COLUMNS = (
    # per NIC port
    Column(c.NIC_TRANSMIT_BYTES.name, "nic", "tx_bytes"),
    Column(c.NIC_RECEIVE_BYTES.name, "nic", "rx_bytes"),
    Column(c.NIC_ECN_MARKED.name, "nic", "ecn"),
    Column(c.NIC_CNP_SENT.name, "nic", "cnp_sent"),
    Column(c.NIC_CNP_RECEIVED.name, "nic", "cnp_received"),
    Column(c.NIC_RDMA_LOSS_EVENTS.name, "nic", "rdma_loss"),
    Column(c.NIC_RECEIVE_DISCARDS.name, "nic", "discards"),
    Column(c.NIC_RECEIVE_ERRORS.name, "nic", "rx_errors"),
    Column(c.NIC_CARRIER_CHANGES.name, "nic", "carrier_changes"),
    Column(c.NIC_SATURATED_SECONDS.name, "nic", "saturated"),
    Column(c.NIC_TRANSMIT_WAIT.name, "nic", "xmit_wait"),  # InfiniBand's congestion signal, in the HCA's ticks
    Column(c.NIC_PFC_PAUSE_FRAMES.name, "nic", "pfc_", split_by="direction",
           split_values={"transmit": "tx", "receive": "rx"}, default_split="receive"),
    Column(c.NIC_LINK_SPEED.name, "nic", "speed", MEAN),
    Column(c.NIC_UP.name, "nic", "up", MIN),
    # per node
    Column(c.TCP_RETRANSMITTED.name, "node", "tcp_retrans"),
    Column(c.TCP_SENT.name, "node", "tcp_sent"),
    Column(c.NODE_NETWORK_BURSTS.name, "node", "bursts"),
    Column(c.NODE_NETWORK_STATE_SECONDS.name, "node", "state_", split_by="network_state", split_values=_STATES,
           default_split="quiet"),
    # per GPU
    Column(c.GPU_BUSY_SECONDS.name, "gpu", "busy"),
    Column(c.GPU_IDLE_SECONDS.name, "gpu", "idle_", split_by="network_state", split_values=_STATES,
           default_split="quiet"),
)
BY_METRIC = {col.metric: col for col in COLUMNS}
NIC_INCREASES = tuple(col for col in COLUMNS if col.table == "nic" and col.how == INCREASE)
NODE_INCREASES = tuple(col for col in COLUMNS if col.table == "node")

NODE_COLUMNS = (
    "gpus", "busy", "idle_paused", "idle_saturated", "idle_active", "idle_quiet", "throttled", "sm_clock",
    "tx_bytes", "rx_bytes", "capacity", "saturated", "pfc_tx", "pfc_rx", "xmit_wait", "ecn", "cnp_sent", "cnp_received",
    "rdma_loss", "discards", "rx_errors", "tcp_retrans", "tcp_sent", "carrier_changes", "nics_down",
    "state_paused", "state_saturated", "state_active", "state_quiet",
    "other_bytes", "other_capacity",  # NICs outside the training fabric (management, storage)
    "fabric_nics",
    "bursts",  # quiet -> busy transitions of the fabric at the exporter's fast tick
)
GPU_COLUMNS = ("busy", "idle", "throttled", "sm_clock")
NIC_COLUMNS = ("fabric", "speed", "up", "tx_bytes", "rx_bytes", "saturated", "pfc_tx", "pfc_rx", "xmit_wait", "ecn",
               "cnp_sent", "cnp_received", "rdma_loss", "discards", "rx_errors", "carrier_changes")
# The NIC columns summed per node over its fabric NICs.
NIC_SUMMED = ("tx_bytes", "rx_bytes", "saturated", "pfc_tx", "pfc_rx", "xmit_wait", "ecn", "cnp_sent", "cnp_received",
              "rdma_loss", "discards", "rx_errors", "carrier_changes")
WORKLOAD_COLUMNS = ("instance", "gpu", "workload", "source", "namespace", "window")

# NCCL's inspector plugin, where its dump is scraped too (diagnoser/analysis/nccl.py): per
# rank bus bandwidth.
NCCL_BUS_BANDWIDTH = "nccl_bus_bandwidth_gbs"
NCCL_COLUMNS = ("host", "rank", "comm", "collective", "size", "busbw", "time")

# Read beside COLUMNS, each with a rule of its own in the frame builder: a GPU's throttled
# time is its busiest reason's, SM clocks are averaged per node, info series carry labels.
OTHER_METRICS = frozenset({c.GPU_THROTTLED_SECONDS.name, c.GPU_SM_CLOCK.name, c.NIC_INFO.name, c.NIC_FABRIC.name,
                           c.GPU_INFO.name, c.GPU_WORKLOAD_INFO.name, NCCL_BUS_BANDWIDTH})
RUNTIME_METRICS = frozenset(BY_METRIC) | OTHER_METRICS


def nccl_key(labels: dict[str, str]) -> tuple[str, str, str, str, str]:
    """(host, rank, communicator, collective, message size) of an NCCL inspector series: the
    host that ran the rank (its own label; else the scraped instance's host)."""
    host = labels.get("hostname") or labels.get("instance", "").rsplit(":", 1)[0]
    return (host, labels.get("rank", ""), labels.get("comm_id", ""), labels.get("collective", ""),
            labels.get("message_size", ""))


def counter_increase(t: np.ndarray, v: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Increase of a counter within each window [edges[i], edges[i+1]).

    A decrease is a reset (the exporter restarted, a driver reloaded): the counter grew by
    its new value since. Each delta lands in the window of its later sample.
    """
    return binned(*counter_deltas(t, v), edges)


def counter_deltas(t: np.ndarray, v: np.ndarray, glitches: list[float] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(time of each later sample, the counter's growth since the sample before), resets,
    NaN/Inf and bad samples (`isolated_glitches`, whose times go to `glitches`) handled (see
    counter_increase)."""
    # A NaN/Inf sample carries no information, but the counter kept counting through it:
    # drop the sample, so that the growth across it lands on the next finite one (zeroing
    # the deltas on either side would lose two scrape intervals' growth).
    ok = np.isfinite(v)
    if not ok.all():
        t, v = t[ok], v[ok]
    if len(t) < 2:
        return t[:0], v[:0]
    delta = np.diff(v)
    reset = delta < 0
    if reset.any():  # a decrease: a reset, or a bad sample (which always makes one)
        glitch = isolated_glitches(v)
        if glitch.any():
            if glitches is not None:
                glitches.extend(t[glitch].tolist())
            t, v = t[~glitch], v[~glitch]
            delta = np.diff(v)
            reset = delta < 0
        delta[reset] = v[1:][reset]
    return t[1:], delta


def isolated_glitches(v: np.ndarray) -> np.ndarray:
    """Samples of a counter that lie outside the range of their two neighbours while the
    neighbours themselves are in order: a counter only grows, so one such sample is a bad
    reading (a corrupted or half-written value), not growth. Taken as it is, a sample far
    above would count as a burst and then a reset counting the whole counter again (a PFC
    storm of millions of pauses a second from one bad sample); one below, as a reset counting
    the whole counter. A real reset restarts near zero, below the sample before it, so the
    sample after it is too: it is no glitch. (A counter reset and grown past its old value
    within one scrape would lose that old value: only small counters can, by little.)"""
    glitch = np.zeros(len(v), dtype=bool)
    if len(v) >= 3:
        before, here, after = v[:-2], v[1:-1], v[2:]
        glitch[1:-1] = (after >= before) & ((here > after) | (here < before))
    return glitch


def binned(t: np.ndarray, amounts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The sum of `amounts` within each window [edges[i], edges[i+1])."""
    n = len(edges) - 1
    idx = np.searchsorted(edges, t, side="right") - 1
    ok = (idx >= 0) & (idx < n)
    return np.bincount(idx[ok], weights=amounts[ok], minlength=n)  # weights: float64, n long (idx < n)


def gauge_stats(t: np.ndarray, v: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, min) of a gauge within each window; NaN where the window holds no sample."""
    n = len(edges) - 1
    idx = np.searchsorted(edges, t, side="right") - 1
    ok = (idx >= 0) & (idx < n) & np.isfinite(v)
    sums = np.bincount(idx[ok], weights=v[ok], minlength=n)
    counts = np.bincount(idx[ok], minlength=n)
    mins = np.full(n, np.inf)
    np.minimum.at(mins, idx[ok], v[ok])
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return mean, np.where(counts > 0, mins, np.nan)


def reduce(column: Column, t: np.ndarray, v: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The column's value in each window, by its rule."""
    if column.how == INCREASE:
        return counter_increase(t, v, edges)
    mean, low = gauge_stats(t, v, edges)
    return mean if column.how == MEAN else low
