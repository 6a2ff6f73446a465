"""The verdict (docs/diagnose.md): findings, healthy, or inconclusive, and why.

"Healthy" is a claim: that the window held what the rules need and none of them held. When
the data cannot carry that claim, the diagnosis says what was missing or contradictory
instead of printing "looks healthy" over a gap. Each reason says what is missing and what
was seen, so that on-call knows whether to fix the scrape or look elsewhere.
"""

from __future__ import annotations

import numpy as np

from diagnoser.analysis.features import STATES, Features, sub_window_share
from diagnoser.analysis.rules.base import EXCESS_IDLE, MIN_PEERS
from diagnoser.model.frame import FINE, Frame, choose_step
from diagnoser.model.report import FINDINGS, HEALTHY, INCONCLUSIVE, Finding
from gpunet.window import rfc3339
from gpunet.words import plural

# Whole windows a verdict needs: the job's baseline is its quieter windows (a quantile), and
# an incident must be told from the windows around it. Fewer, and there is nothing to compare.
MIN_WINDOWS = 4
# GPU idle this far above the job's baseline, in this many consecutive windows, is too much to call
# healthy when no rule explains it (several times what a finding needs: not noise); in
# exactly that many, only where it was high for longer than one window in all (see below).
UNEXPLAINED_IDLE = 3 * EXCESS_IDLE
UNEXPLAINED_WINDOWS = 2
# Idle in one network state, as a share of GPU time, worth naming when the NIC series are absent.
STATE_WORTH_NAMING = 0.05
STATE_WORDS = {"paused": "while their node's links were paused by PFC",
               "saturated": "while their node's links ran at line rate",
               "active": "while their node's links moved traffic below line rate",
               "quiet": "while their node's links were quiet"}


def enough_windows(frame: Frame) -> bool:
    return not frame.partial and len(frame.windows) >= MIN_WINDOWS


def missing_data(frame: Frame, features: Features) -> list[str]:
    """What the window lacks for a verdict; empty where it holds what the rules need."""
    reasons = unplaced_series(frame)
    if not frame.instances:
        return reasons + ["no series of any node in the window"]
    if not enough_windows(frame):
        reasons.append(_too_short(frame))
    node = features.node
    has_nics = bool(node["bytes_rate"].notna().any()) if len(node) else False
    if not frame.has_gpus:
        reasons.append("no GPU series: whether GPUs waited on the network cannot be judged")
    if not has_nics:
        seen = ""
        if frame.has_gpus:
            idle = _idle_by_state(features)
            named = [f"{share:.0%} of their time {STATE_WORDS[s]}" for s, share in idle.items()
                     if share >= STATE_WORTH_NAMING and s in STATE_WORDS and s != "quiet"]
            if named:
                seen = "; GPUs idled " + " and ".join(named) + " (their own network_state), but the NIC series " \
                       "that would name the source are absent"
        reasons.append("no fabric NIC series: network causes (PFC storms, loss, congestion, slow links) cannot be "
                       "judged" + seen)
    return reasons


def _too_short(frame: Frame) -> str:
    """Why a window this short gets no verdict, and advice that can be followed: a longer
    window where the source holds more, else when a live source will have enough."""
    whole = 0 if frame.partial else len(frame.windows)
    step = frame.step if not frame.partial else choose_step(frame.start, frame.end, frame.scrape_interval)
    needed = (MIN_WINDOWS + 1) * step  # MIN_WINDOWS whole windows fit in any range one step longer
    minutes = f"{np.ceil(needed / 60):.0f} minutes"
    said = (f"the window holds {plural(whole, 'whole window')} of the diagnoser's {step:.0f} s grid "
            f"(scrapes every {frame.scrape_interval:.0f} s); comparing windows with the job's normal needs at "
            f"least {MIN_WINDOWS}")
    asked_start, asked_end = frame.asked or (frame.start, frame.end)
    if asked_end - asked_start >= needed:  # the source holds less than was asked for
        said += (f", and the data covers only {frame.end - frame.start:.0f} s of the {asked_end - asked_start:.0f} s "
                 f"asked ({rfc3339(frame.start)} .. {rfc3339(frame.end)})")
        if frame.source.startswith("replay:"):
            return said + f": the trace holds no more; {minutes} of data are needed"
        ready = frame.start + np.ceil(needed / 60) * 60
        return said + f": diagnose again once {minutes} of data exist, after {rfc3339(ready)}"
    return said + f": ask for {minutes} or more"


def unplaced_series(frame: Frame) -> list[str]:
    """Series the frame could not put on a node."""
    if not frame.without_instance:
        return []
    return [f"{frame.without_instance} series have no `instance` label and were left out: they cannot be put on a "
            "node (keep the scrape's instance label, or relabel it to the node's name)"]


def unexplained_idle(features: Features, explained: set[float], base: float) -> list[str]:
    """GPU idle far above the job's baseline (`base`, its idle fraction) in windows no rule
    explained (`explained`: the windows where some rule held, as a finding or as a marker of
    a cause or of normal operation)."""
    if not features.frame.has_gpus or not len(features.cluster):
        return []
    g = features.cluster
    step = features.frame.step
    excess = (g["idle_frac"] - base).to_numpy()
    covered = np.isin(g.index.to_numpy(dtype=float), sorted(explained))
    high = (np.nan_to_num(excess) >= UNEXPLAINED_IDLE) & ~covered
    # Sustained: a run of consecutive windows; a run of two only where its quarter windows
    # were high for longer than one window in all (a checkpoint's stall fills one window at
    # most, but may straddle an edge and raise two).
    high_fine = _high_sub_windows(features, base)
    run = fine_in_run = 0
    sustained = False
    for k, h in enumerate(high):
        if not h:
            run = fine_in_run = 0
            continue
        run += 1
        fine_in_run += FINE if high_fine is None else int(high_fine[k])
        sustained |= run > UNEXPLAINED_WINDOWS or (run == UNEXPLAINED_WINDOWS and fine_in_run > FINE)
    if not sustained:
        return []
    worst = int(np.nanargmax(np.where(high, g["idle_frac"].to_numpy(), -np.inf)))
    states = {s: float(np.nan_to_num(g[f"idle_{s}_frac"].iloc[worst])) for s in STATES}
    state = max(states, key=lambda s: states[s])
    return [f"GPU idle reached {g['idle_frac'].iloc[worst]:.0%} (the job's baseline is {base:.0%}) in "
            f"{int(high.sum())} windows of {step:.0f} s that no rule explains; most of it "
            f"{STATE_WORDS.get(state, state)}: a cause outside what these series show"]


def _high_sub_windows(features: Features, base: float) -> np.ndarray | None:
    """Per window, how many of its FINE sub-windows hold GPU idle UNEXPLAINED_IDLE or more
    above the baseline; None where the frame has no sub-windows."""
    idle = sub_window_share(features.frame, len(features.cluster), tuple(f"idle_{s}" for s in STATES))
    if idle is None or "busy" not in features.frame.fine:  # idle of an unknown total: no share
        return None
    return (np.nan_to_num(idle - base) >= UNEXPLAINED_IDLE).sum(axis=1)


def too_few_peers(features: Features) -> list[str]:
    """A note (not a reason): the peer-relative class cannot be judged on a small job."""
    nodes = len(features.frame.instances)
    if 0 < nodes < MIN_PEERS:
        return [f"{plural(nodes, 'node')}: a straggler (a node slower than its peers) needs at least {MIN_PEERS} nodes to "
                "compare; storms, loss, slow links and throttling were judged on their own signatures"]
    return []


def _idle_by_state(features: Features) -> dict[str, float]:
    g = features.cluster
    total = float(g["gpu_time"].sum(min_count=1))
    if not np.isfinite(total) or total <= 0:
        return {}
    return {s: float((g[f"idle_{s}_frac"] * g["gpu_time"]).sum()) / total for s in STATES}


def verdict(findings: list[Finding], reasons: list[str]) -> str:
    if findings:
        return FINDINGS
    return INCONCLUSIVE if reasons else HEALTHY
