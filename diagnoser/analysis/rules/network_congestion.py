"""network_congestion: the fabric marks and pauses (RoCE) or withholds credits (InfiniBand)
while throughput stays below line rate."""

from __future__ import annotations

import numpy as np

from diagnoser.analysis.rules import counts
from diagnoser.analysis.rules.base import BottleneckClass, Detection, WindowContext

# ECN-marked packets per GB moved. 250 marks/GB is ~0.1% of 4 KB packets; a healthy DCQCN
# fabric marks ~0.001-0.01%, a congested one percents.
ECN_PER_GB = 250.0
ECN_RISE = 20.0  # or twenty times the job's own baseline
# Received pauses per second per fabric NIC, over the job, with pauses received on at least
# half the nodes: lossless back-pressure spread through the fabric, not one port. Per NIC:
# the switch pauses each ingress port on its own, so the bar means the same on nodes with
# one rail or eight. A healthy DCQCN fabric stays far below (ECN brakes the senders before
# the queues reach Xoff); congestion pauses each port tens to thousands of times a second.
PAUSE_RX_PER_NIC = 5.0
# InfiniBand: ticks waited for credit per GB moved, against the job's own baseline (the
# tick's length is the HCA's, so there is no absolute scale). A healthy fabric's ports wait
# well under 1% of their busy time, in each burst's incast; congestion that takes a third of
# the line rate makes them wait tens of percent of it, and per byte moved more still: ten
# times the baseline on the median node (so on at least half the nodes) is no burst's jitter.
XMIT_WAIT_RISE = 10.0
# Congestion slows transfers below line rate, or pauses them: the GPUs' extra idle is spent
# with the network active or paused. Where most of it is spent at line rate (the links'
# bandwidth) or with the wire quiet (the host: a checkpoint, the data loader), marks that a
# busy fabric always makes did not cause it, however many there are.
OTHER_STATES_SHARE = 0.5
# A job congested all its life (an all-to-all over oversubscribed uplinks, from its first
# step to its last) has the congestion for its baseline: no window rises above it. Against
# the rest of the fabric it shows (Baseline.fabric_*: the other jobs' nodes): marks or credit
# wait per GB ten times theirs, the marks passing the count test against their rate, with
# a fifth of GPU time idle while its links move below line rate or stand paused. Twice the
# bar of network_bandwidth's idle at line rate: with no baseline of its own, the wait must
# stand clear of the exposed all-reduce a healthy job always has (up to a tenth of its time,
# also below line rate between bursts), whose background marks a busy DCQCN fabric can
# raise to the absolute bar where the rest of the fabric (a job inside one leaf) has none.
FABRIC_RISE = 10.0
CONGESTED_IDLE = 0.20


def congested_all_along(w: WindowContext) -> bool:
    g, base = w.cluster, w.baseline
    waiting = float(np.nan_to_num(g["idle_active_frac"] + g["idle_paused_frac"]))
    if not (w.has_gpu and waiting >= CONGESTED_IDLE and waiting >= (1 - OTHER_STATES_SHARE) * g["idle_frac"]):
        return False
    fabric_ecn, fabric_wait = base.fabric_ecn_per_gb, base.fabric_xmit_wait_per_gb
    marks, moved = float(g.get("marks", np.nan)), float(g.get("gb_moved", np.nan))
    ecn = bool(np.isfinite(fabric_ecn) and g["ecn_per_gb"] >= max(ECN_PER_GB, FABRIC_RISE * fabric_ecn)
               and counts.job_excess(marks, moved, fabric_ecn, FABRIC_RISE)[2])
    wait = bool(np.isfinite(fabric_wait) and fabric_wait > 0 and g["xmit_wait_per_gb"] >= FABRIC_RISE * fabric_wait)
    return ecn or wait


def check(w: WindowContext) -> Detection | None:
    if "pfc_storm" in w.found:  # the storm's victims receive pauses: they are its symptom
        return None
    g, base = w.cluster, w.baseline
    if not w.impact and congested_all_along(w):
        return Detection([], [], 0.9, {
            "ecn_marks_per_gb": g["ecn_per_gb"], "fabric_ecn_marks_per_gb": base.fabric_ecn_per_gb,
            "credit_wait_per_gb_times_fabric": g["xmit_wait_per_gb"] / base.fabric_xmit_wait_per_gb
            if base.fabric_xmit_wait_per_gb > 0 else None,
            "link_utilisation": g["util_median"],
            "gpu_idle_active_or_paused": g["idle_active_frac"] + g["idle_paused_frac"], "gpu_idle": g["idle_frac"]},
            waits_in=("active", "paused"))
    ecn_hot = bool((g["ecn_per_gb"] >= ECN_PER_GB) or (
        np.isfinite(base.ecn_per_gb) and base.ecn_per_gb > 0 and g["ecn_per_gb"] >= ECN_RISE * base.ecn_per_gb))
    # ... and as a count: a handful of marks over the few megabytes of a stalled window is a
    # high rate per GB and no news against the job's usual marks (rules/counts.py).
    marks, moved = float(g.get("marks", np.nan)), float(g.get("gb_moved", np.nan))
    if ecn_hot and np.isfinite(marks) and np.isfinite(moved):
        ecn_hot = counts.job_excess(marks, moved, base.ecn_per_gb, 1.0)[2]
    pauses_hot = bool(g["pfc_rx_per_nic"] >= PAUSE_RX_PER_NIC) and g["pfc_rx_nodes"] >= len(w.node) / 2
    wait_hot = bool(np.isfinite(base.xmit_wait_per_gb) and base.xmit_wait_per_gb > 0
                    and g["xmit_wait_per_gb"] >= XMIT_WAIT_RISE * base.xmit_wait_per_gb)
    if not (ecn_hot or pauses_hot or wait_hot) or not w.impact:
        return None
    if w.has_gpu:
        elsewhere = max(g["idle_quiet_frac"] - base.idle_quiet_frac, 0.0) + \
            max(g["idle_saturated_frac"] - base.idle_saturated_frac, 0.0)
        if elsewhere > OTHER_STATES_SHARE * w.excess:
            return None
    figures = {"ecn_marks_per_gb": g["ecn_per_gb"], "pauses_received_per_s": g["pfc_rx_rate"],
               "pauses_received_per_s_per_nic": g["pfc_rx_per_nic"]}
    if wait_hot:
        figures = {"credit_wait_per_gb_times_baseline": g["xmit_wait_per_gb"] / base.xmit_wait_per_gb}
    return Detection([], [], 0.6 + 0.3 * (ecn_hot or wait_hot), {
        **figures,
        "link_utilisation": g["util_median"], "gpu_idle_active_or_paused": g["idle_active_frac"] + g["idle_paused_frac"],
        "gpu_idle": g["idle_frac"]})


RULE = BottleneckClass(
    name="network_congestion",
    title="Fabric congestion",
    # ECN marks where the fabric marks; without ECN, the pauses the congested switches send; on
    # InfiniBand, the ticks ports waited for credit.
    confirm=('sum by (instance) (rate(gpunet_nic_ecn_marked_packets_total{instance=~"$NODES"}[5m]))\n'
             'or sum by (instance) (rate(gpunet_nic_pfc_pause_frames_total{direction="receive", instance=~"$NODES"}[5m]))\n'
             'or sum by (instance) (rate(gpunet_nic_transmit_wait_ticks_total{instance=~"$NODES"}[5m]))'),
    remediation=(
        "The fabric marks and pauses (or, on InfiniBand, holds back credits) but does not fill the links: "
        "congestion in the switches. On RoCE, check that ECN (DCQCN) is enabled end to end on the RoCE priority "
        "with sane marking thresholds, and that PFC is on that priority only. On InfiniBand, check the subnet "
        "manager's routing (adaptive routing, fat-tree balance) and its congestion control settings. Either way: "
        "the oversubscription and hashing of the uplinks (elephant flows on one path), and other jobs sharing "
        "the spine."),
    check=check,
    localised=False,
    after=("pfc_storm",),
    # Buffers that overflow where the fabric is congested lose packets: the loss events that
    # follow the marks and pauses are congestion's symptom, not a cause beside it (a link that
    # corrupts frames is the exception, and packet_loss keeps it).
    explains=frozenset({"packet_loss"}),
    # One job's traffic filling the shared uplinks slows every job whose flows cross them.
    reaches_other_jobs=True,
)
