"""network_congestion: the fabric marks and pauses while throughput stays below line rate."""

from __future__ import annotations

import numpy as np

from diagnoser.analysis.rules.base import BottleneckClass, Detection, WindowContext

# ECN-marked packets per GB moved. 250 marks/GB is ~0.1% of 4 KB packets; a healthy DCQCN
# fabric marks ~0.001-0.01%, a congested one percents.
ECN_PER_GB = 250.0
ECN_RISE = 20.0  # or twenty times the job's own baseline
# Received pauses per second per node, on at least half the nodes: lossless back-pressure
# spread through the fabric, not one port.
PAUSE_RX_PER_NODE = 10.0


def check(w: WindowContext) -> Detection | None:
    if "pfc_storm" in w.found:  # the storm's victims receive pauses: they are its symptom
        return None
    g, base, n = w.cluster, w.baseline, max(len(w.node), 1)
    ecn_hot = bool((g["ecn_per_gb"] >= ECN_PER_GB) or (
        np.isfinite(base.ecn_per_gb) and base.ecn_per_gb > 0 and g["ecn_per_gb"] >= ECN_RISE * base.ecn_per_gb))
    pauses_hot = g["pfc_rx_rate"] / n >= PAUSE_RX_PER_NODE and g["pfc_rx_nodes"] >= len(w.node) / 2
    if not (ecn_hot or pauses_hot) or not w.impact:
        return None
    return Detection([], [], 0.6 + 0.3 * ecn_hot, {
        "ecn_marks_per_gb": g["ecn_per_gb"], "pauses_received_per_s": g["pfc_rx_rate"],
        "link_utilisation": g["util_median"], "gpu_idle_active_or_paused": g["idle_active_frac"] + g["idle_paused_frac"],
        "gpu_idle": g["idle_frac"]})


RULE = BottleneckClass(
    name="network_congestion",
    title="Fabric congestion",
    # ECN marks where the fabric marks; without ECN, the pauses the congested switches send.
    confirm=('sum by (instance) (rate(gpunet_nic_ecn_marked_packets_total{instance=~"$NODES"}[5m]))\n'
             'or sum by (instance) (rate(gpunet_nic_pfc_pause_frames_total{direction="receive", instance=~"$NODES"}[5m]))'),
    remediation=(
        "The fabric marks and pauses but does not fill the links: congestion in the switches. Check that ECN "
        "(DCQCN) is enabled end to end on the RoCE priority with sane marking thresholds, that PFC is on that "
        "priority only, the oversubscription and ECMP hashing of the uplinks (elephant flows on one path), and "
        "other jobs sharing the spine."),
    check=check,
    localised=False,
    after=("pfc_storm",),
)
