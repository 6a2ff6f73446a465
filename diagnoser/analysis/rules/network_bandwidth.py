"""network_bandwidth: GPUs wait while the links run at line rate, and nothing else explains
it: the job needs more bandwidth per node than the fabric gives."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnoser.analysis.rules.base import BottleneckClass, Detection, WindowContext

SATURATED_IDLE = 0.10  # GPU idle in saturated ticks, of GPU time, absolute: a network-bound job
SATURATED_IDLE_RISE = 0.04  # or this much above the job's baseline
# ... and most of the (extra) idle is in saturated ticks: the links are the wait. Waiting
# for a straggler also exposes the all-reduce, so the saturated share must be the larger part.
SATURATED_SHARE = 0.5
# Without GPU series: the median node's fabric at line rate half the window.
SATURATED_TIME_NO_GPU = 0.5


# The finding carries what its window measured; how fast the links should be is sized once
# per report (or per job), in the capacity section (diagnoser/analysis/capacity.py): the
# evidence `link_sizing: "capacity"` points there, so that one report never gives two sizings.
def check(w: WindowContext) -> Detection | None:
    if w.found:  # any other finding in the window explains the wait better
        return None
    g, base = w.cluster, w.baseline
    if not w.has_gpu:
        if g["sat_frac_median"] >= SATURATED_TIME_NO_GPU:
            return Detection([], [], 0.5, {"saturated_time": g["sat_frac_median"],
                                           "link_utilisation": g["util_median"],
                                           "gpu_idle": "unknown (no GPU series)"})
        return None
    sat_idle = g["idle_saturated_frac"]
    rise = sat_idle - base.idle_saturated_frac
    persistent = sat_idle >= SATURATED_IDLE and sat_idle >= SATURATED_SHARE * g["idle_frac"]
    rising = w.impact and rise >= SATURATED_IDLE_RISE and rise >= SATURATED_SHARE * w.excess
    if not (persistent or rising):
        return None
    speed = w.fabric_speed_median * 8 / 1e9
    return Detection([], [], 0.5 + min(sat_idle / 0.3, 0.45), {
        "gpu_idle_saturated": sat_idle, "link_utilisation": g["util_median"],
        "saturated_time": line_rate_time(g), "gpu_idle": g["idle_frac"],
        **({"nic_speed_gbps": round(float(speed), 1), "link_sizing": "capacity"} if np.isfinite(speed) else {})})


def line_rate_time(g: pd.Series) -> float:
    """Share of the window the fabric ran at line rate: the nodes' network_state where the
    source has it, else the NICs' saturated seconds (summed over both directions, so at most
    twice the truth: halved)."""
    value = g.get("state_sat_frac_median", np.nan)
    return float(value) if np.isfinite(value) else float(g["sat_frac_median"]) / 2


RULE = BottleneckClass(
    name="network_bandwidth",
    title="Network bandwidth too low for the job",
    confirm='max by (instance) (rate(gpunet_nic_saturated_seconds_total{instance=~"$NODES"}[5m]))',
    remediation=(
        "The links run at line rate while GPUs wait: the job needs more bandwidth per node than the fabric "
        "gives. Compare the links' measured load with the upgrade path 25G -> 100G -> 200G/400G per NIC, or add "
        "rails (one NIC per GPU, each on the GPU's NUMA node and PCIe switch). Meanwhile: larger gradient "
        "buckets and more compute/communication overlap, gradient compression, or fewer nodes per job."),
    check=check,
    localised=False,
    waits_in="saturated",
    after=("pfc_storm", "link_degraded", "packet_loss", "network_congestion", "gpu_throttle", "straggler",
           "host_bound"),
)
