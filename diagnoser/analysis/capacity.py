"""Capacity advice: how much network per node would bring the GPU idle that waits on the
links under 5%, and which step of the upgrade path (or how many rails) gets there.

Everything comes from what the exporter measured at its fast tick and the scrape kept:
  - the share of time the node's fabric ran at line rate (network_state=saturated),
  - the GPU idle spent in those ticks (gpunet_gpu_idle_seconds_total{network_state="saturated"}),
  - the communication bursts (gpunet_node_network_bursts_total) and the bytes sent, whence
    the traffic of one all-reduce and how often it comes.
The model (see needed_speed) is the plain one: an all-reduce at line rate takes time in
inverse proportion to the link speed, and the part of it that compute did not hide is what
GPUs wait for; how much of a shorter transfer compute would hide is bounded both ways, so
the need is given as a range. Given a model size, the ring all-reduce arithmetic is shown beside it.

This is the one place that sizes the links: a network_bandwidth finding carries what its
window measured and points here (its evidence `link_sizing: "capacity"`), so that a report
gives one sizing. A sizing of the finding's worst window beside one of the whole window
gave two answers to one question (138 Gb/s -> 200G there, 85 Gb/s -> 100G here, on a job
network-bound for half the window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diagnoser.analysis.features import Features
from diagnoser.model.report import Finding, rounded

UPGRADE_PATH_GBPS = (25, 100, 200, 400, 800)  # per NIC (port), the Ethernet/InfiniBand generations
TARGET_NETWORK_IDLE = 0.05  # GPU idle spent waiting on saturated links that is worth having
# Below this much GPU idle in saturated ticks the links are not what the job waits for:
# nothing to size (the formula would only echo noise).
MIN_SATURATED_IDLE = 0.005


@dataclass(frozen=True)
class ModelSize:
    """What the user tells about the model, for the all-reduce arithmetic."""
    parameters: float  # e.g. 10e9
    bytes_per_parameter: float = 2.0  # FP16/BF16 gradients


def needed_speed(speed: float, saturated: float, idle_saturated: float,
                 target: float = TARGET_NETWORK_IDLE) -> tuple[float, float]:
    """The link speed at which GPU idle spent waiting on saturated links falls to `target`,
    as (at least, enough): two bounds, because how much of a shorter transfer compute
    would hide is not measured.

    Per unit of time the links run at line rate for `saturated` (s), and `idle_saturated`
    (E) of it is not hidden behind compute; s - E overlaps it. At speed B' the transfer
    takes s x B/B'. The part compute hides can only shrink with the transfer (it cannot
    hide more than there is to hide, nor more than it hides now), so:
      - at least: the hidden part stays as it is now:  s x B/B' - (s - E) <= target
                  B' >= B x s / (s - E + target)
      - enough:   the hidden share stays as it is now: E x B/B' <= target
                  B' >= B x E / target
    NaNs when the inputs do not allow an answer."""
    nan = (float("nan"), float("nan"))
    if not (np.isfinite(speed) and np.isfinite(saturated) and np.isfinite(idle_saturated)
            and saturated > 0 and speed > 0):
        return nan
    # GPU idle in saturated ticks cannot exceed the saturated time itself (per GPU-second):
    # where noise says it does, nothing overlapped.
    idle_saturated = min(max(idle_saturated, 0.0), saturated)
    if idle_saturated <= target:
        return speed, speed
    return speed * saturated / (saturated - idle_saturated + target), speed * idle_saturated / target


def upgrade_step(needed_gbps: float, current_gbps: float) -> str:
    """The first step of the upgrade path at or above the need, or more rails beyond it."""
    if needed_gbps <= current_gbps * 1.0001:
        return f"none: {current_gbps:.0f}G per NIC suffices"
    step = next((s for s in UPGRADE_PATH_GBPS if s >= needed_gbps), None)
    if step is not None:
        return f"{step}G per NIC"
    return f"more rails: {math.ceil(needed_gbps / UPGRADE_PATH_GBPS[-1])} x {UPGRADE_PATH_GBPS[-1]}G per NIC's share"


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB"


def advise(features: Features, model: ModelSize | None = None, other_causes: Sequence[Finding] = ()) -> dict | None:
    """The capacity section of the report, or None where the source has no GPU time or no
    fabric speed (nothing to size). The windows of `other_causes` (findings that explain the
    idle otherwise: a throttled or slow node, a storm, an input stall) are left out: faster
    links would not give that idle back."""
    frame = features.frame
    explained = _explained(frame.node.index.get_level_values("window").to_numpy(), other_causes)
    n = frame.node[~explained]
    node_gpu_time = features.node["gpu_time"][~explained]
    gpu_time = float(node_gpu_time.sum(min_count=1))
    speed = float(np.nanmedian(frame.fabric_speed_median)) if frame.fabric_speed_median is not None and \
        np.isfinite(frame.fabric_speed_median).any() else float("nan")
    if not (np.isfinite(gpu_time) and gpu_time > 0 and np.isfinite(speed) and speed > 0):
        return None
    per_node = n.groupby(level="instance")
    nodes = len(per_node)
    gpus = int(np.nansum(per_node["gpus"].max()))
    nics_per_node = float(np.nanmedian(per_node["fabric_nics"].max())) if n["fabric_nics"].notna().any() else 1.0
    gpus_per_node = gpus / nodes if nodes else float("nan")
    idle_saturated = float(np.nansum(n["idle_saturated"])) / gpu_time
    noise = _noise(n["idle_saturated"], node_gpu_time)  # NaN with fewer than 2 windows
    idle_paused = float(np.nansum(n["idle_paused"])) / gpu_time
    # Time the node's fabric ran at line rate (any NIC, either direction), per node-second
    # observed: the exporter's own network_state, not a sum over NICs and directions.
    state_time = n[[f"state_{s}" for s in ("paused", "saturated", "active", "quiet")]].sum(axis=1, min_count=1)
    observed = float(np.nansum(state_time))
    saturated = float(np.nansum(n["state_saturated"])) / observed if observed > 0 else float("nan")
    gbps = speed * 8 / 1e9
    out: dict = {"nic_speed_gbps": round(gbps, 1), "fabric_nics_per_node": round(nics_per_node, 2),
                 "gpus": gpus, "gpus_per_node": round(gpus_per_node, 2),
                 "gpu_idle_saturated_fraction": round(idle_saturated, 4),
                 "gpu_idle_saturated_noise": rounded(noise, 4),
                 "windows_left_out": int(len(np.unique(frame.node.index.get_level_values("window")[explained]))),
                 "gpu_idle_paused_fraction": round(idle_paused, 4),
                 "saturated_time_fraction": round(saturated, 4) if np.isfinite(saturated) else None,
                 "target_network_idle": TARGET_NETWORK_IDLE}
    arithmetic = [f"GPU idle while the links ran at line rate: {100 * idle_saturated:.1f}% "
                  f"(+/- {100 * noise:.1f}% window to window) of GPU time "
                  f"(target under {100 * TARGET_NETWORK_IDLE:.0f}%); links at line rate "
                  + (f"{100 * saturated:.1f}% of the time" if np.isfinite(saturated) else "for an unknown share "
                     "of the time (no network_state series)")]

    # Bursts: the traffic of one communication phase and how often it comes.
    bursts = float(np.nansum(n["bursts"])) if n["bursts"].notna().any() else float("nan")
    tx = float(np.nansum(n["tx_bytes"]))
    if np.isfinite(bursts) and bursts > 0 and observed > 0:
        per_second = bursts / observed  # per node
        bytes_per_burst_node = tx / bursts
        bytes_per_burst_nic = bytes_per_burst_node / max(nics_per_node, 1.0)
        transfer = bytes_per_burst_nic / speed
        out.update(bursts_per_second=round(per_second, 3), bytes_per_burst_per_node=round(bytes_per_burst_node),
                   bytes_per_burst_per_nic=round(bytes_per_burst_nic), seconds_per_burst_at_line_rate=round(transfer, 3))
        arithmetic.append(f"each node sends {_gb(bytes_per_burst_node)} per communication burst "
                          f"({_gb(bytes_per_burst_nic)} per NIC), {per_second:.2f} bursts/s (one every "
                          f"{1 / per_second:.2f} s); at {gbps:.0f} Gb/s a NIC needs {transfer:.3f} s per burst")

    if model is not None and gpus > 1 and nodes == 1:
        out["model"] = {"parameters": model.parameters, "bytes_per_parameter": model.bytes_per_parameter,
                        "gradient_bytes": model.parameters * model.bytes_per_parameter,
                        "allreduce_bytes_per_node": 0, "allreduce_seconds_at_line_rate": 0.0}
        arithmetic.append("model: one node, so the all-reduce stays inside it (NVLink/PCIe): nothing crosses "
                          "the fabric NICs")
    elif model is not None and gpus > 1:
        gradient = model.parameters * model.bytes_per_parameter
        per_gpu = 2 * (gpus - 1) / gpus * gradient
        per_nic = per_gpu / max(nics_per_node, 1.0)
        out["model"] = {"parameters": model.parameters, "bytes_per_parameter": model.bytes_per_parameter,
                        "gradient_bytes": gradient, "allreduce_bytes_per_node": round(per_gpu),
                        "allreduce_seconds_at_line_rate": round(per_nic / speed, 3)}
        arithmetic.append(
            f"model: {model.parameters / 1e9:.3g}B parameters x {model.bytes_per_parameter:g} B = {_gb(gradient)} of "
            f"gradients; a ring all-reduce over {gpus} GPUs moves 2(N-1)/N = {2 * (gpus - 1) / gpus:.3f} x that = "
            f"{_gb(per_gpu)} per GPU, and (one ring crossing each node per channel) as much per node, split "
            f"over its fabric NICs ({nics_per_node:.0f} a node): {_gb(per_nic)} per NIC, {per_nic / speed:.3f} s at "
            f"{gbps:.0f} Gb/s")
        if "bytes_per_burst_per_node" in out:
            arithmetic.append(f"measured {_gb(out['bytes_per_burst_per_node'])} per burst per node vs "
                              f"{_gb(per_gpu)} expected per all-reduce: "
                              f"{out['bytes_per_burst_per_node'] / per_gpu:.2f} all-reduces per burst")

    if out["windows_left_out"]:
        arithmetic.append(f"left out: the windows of findings with another cause ({out['windows_left_out']} x "
                          f"{frame.step:.0f} s): faster links would not give that idle back")
    if idle_saturated < MIN_SATURATED_IDLE or not np.isfinite(saturated) or saturated <= 0:
        out["verdict"] = (f"the links are not what GPUs wait for: {100 * idle_saturated:.1f}% GPU idle at line "
                          f"rate; no upgrade needed for this job")
        out["upgrade_to"] = None
    else:
        low, high = needed_speed(speed, saturated, idle_saturated)
        low_gbps, high_gbps = low * 8 / 1e9, high * 8 / 1e9
        overlap = saturated - min(idle_saturated, saturated)
        arithmetic.append(
            f"{100 * overlap:.1f}% of the {100 * saturated:.1f}% at line rate overlaps compute; at B' the transfer "
            f"takes {100 * saturated:.1f}% x {gbps:.0f}/B'. If compute keeps hiding {100 * overlap:.1f}%: "
            f"B' >= {gbps:.0f} x {saturated:.3f} / ({saturated:.3f} - {idle_saturated:.3f} + "
            f"{TARGET_NETWORK_IDLE}) = {low_gbps:.0f} Gb/s; if it hides only the same share: "
            f"B' >= {gbps:.0f} x {idle_saturated:.3f} / {TARGET_NETWORK_IDLE} = {high_gbps:.0f} Gb/s per NIC")
        out["needed_gbps_per_nic"] = round(high_gbps, 1)
        out["needed_gbps_per_nic_at_least"] = round(low_gbps, 1)
        out["upgrade_to"] = upgrade_step(high_gbps, gbps)
        out["may_suffice"] = upgrade_step(low_gbps, gbps)
        if high_gbps > gbps and idle_saturated - np.nan_to_num(noise) <= TARGET_NETWORK_IDLE:
            out["upgrade_to"] = out["may_suffice"] = None
            out["verdict"] = (f"{100 * idle_saturated:.1f}% +/- {100 * noise:.1f}% GPU idle at line rate: within "
                              f"the noise of the {100 * TARGET_NETWORK_IDLE:.0f}% target; no upgrade follows from "
                              f"this window")
        elif high_gbps > gbps:
            rails = math.ceil(nics_per_node * high_gbps / gbps - 1e-9)
            if np.isfinite(gpus_per_node) and rails <= max(gpus_per_node, nics_per_node):
                out["or_rails_per_node"] = rails
                arithmetic.append(f"or keep {gbps:.0f}G and give each node {rails} rails instead of "
                                  f"{nics_per_node:.0f} (one NIC per GPU at most, each on its GPU's NUMA node)")
            maybe = f" ({out['may_suffice']} may do)" if out["may_suffice"] != out["upgrade_to"] else ""
            bound = "network-bound" if idle_saturated >= 2 * TARGET_NETWORK_IDLE else "slightly network-bound"
            out["verdict"] = (f"{bound} over the window: {100 * idle_saturated:.1f}% +/- {100 * noise:.1f}% GPU "
                              f"idle at line rate; "
                              f"{low_gbps:.0f} to {high_gbps:.0f} Gb/s per NIC would bring it under "
                              f"{100 * TARGET_NETWORK_IDLE:.0f}%: {out['upgrade_to']}{maybe}")
        else:
            out["upgrade_to"] = out["may_suffice"] = None
            out["verdict"] = (f"{100 * idle_saturated:.1f}% GPU idle at line rate is within the "
                              f"{100 * TARGET_NETWORK_IDLE:.0f}% target")
    if idle_paused >= TARGET_NETWORK_IDLE:
        arithmetic.append(f"besides, {100 * idle_paused:.1f}% of GPU time idles while PFC pauses the links: "
                          f"that is congestion or a storm, which faster links do not cure")
    out["arithmetic"] = arithmetic
    return out


def _explained(windows: np.ndarray, findings: Sequence[Finding]) -> np.ndarray:
    """Rows (by their window) inside one of the findings."""
    mask = np.zeros(len(windows), dtype=bool)
    for f in findings:
        mask |= (windows >= f.start - 1e-6) & (windows < f.end - 1e-6)
    return mask


def _noise(idle_saturated: pd.Series, gpu_time: pd.Series) -> float:
    """Two standard errors of the window-to-window GPU idle at line rate: how far the
    figure could move with the window asked for."""
    by = idle_saturated.groupby(level="window").sum(min_count=1) / gpu_time.groupby(level="window").sum(min_count=1)
    by = by.dropna()
    if len(by) < 2:
        return float("nan")
    return float(2 * by.std(ddof=1) / math.sqrt(len(by)))
