"""host_bound: GPUs idle while the network is quiet and no node stands out (input pipeline,
CPU, storage, checkpointing)."""

from __future__ import annotations

import numpy as np

from diagnoser.analysis.rules.base import BottleneckClass, Detection, WindowContext
from diagnoser.model.findings import Incident
from gpunet.words import plural

# The extra idle comes with a quiet network. At a 0.2 s tick much of an input stall still
# lands in ticks that saw the tail of an all-reduce ("active"), so the quiet share need only
# be a good part of the rise, not most of it.
QUIET_RISE = 0.015
QUIET_SHARE = 0.3
# Storage/management NICs far busier than usual while GPUs idle quiet: a checkpoint being
# written, part of normal training, where it is over within a few minutes; storage too slow
# for the data loader holds for longer, and is this class's fault. (The median node: a
# backup on a few nodes moves no median, a checkpoint does.)
CHECKPOINT_OTHER_UTIL = 0.02
CHECKPOINT_RISE = 3.0
CHECKPOINT_LONGEST = 300.0  # seconds (or two windows, where a window is longer)
# A node standing out (slower, or throttled) is the cause the job waits for.
NODE_STANDS_OUT = ("straggler", "gpu_throttle")
# Brief stalls (at most this many windows) recurring at a regular period (spread of the gaps
# at most this share of their mean) are scheduled pauses: checkpoints.
STALL_WINDOWS = 2
BRIEF_STALL = 150.0  # seconds: a quiet stall this short is a checkpoint or a hiccup, whatever its period
STALL_MIN_COUNT = 3
STALL_REGULARITY = 0.35


def check(w: WindowContext) -> Detection | None:
    g, base = w.cluster, w.baseline
    # Sustained through the window (the median of its sub-windows): a checkpoint's 20 s stall
    # fills one sub-window of a 2-minute window; a data loader that cannot keep up fills all.
    quiet_rise = min(g["idle_quiet_frac"], g["idle_quiet_sustained"]) - base.idle_quiet_frac
    if not (w.impact and quiet_rise >= QUIET_RISE and quiet_rise >= QUIET_SHARE * w.excess) \
            or w.found.keys() & set(NODE_STANDS_OUT):
        return None
    # A stalled fabric also leaves GPUs idle with nothing on the wire: that is the cause's
    # symptom, kept as a marker so that an input-pipeline incident around it is not cut in two.
    cause = w.cause_found("host_bound")
    if cause is not None:
        return Detection([], [], 0.0, {}, suppressed_by=cause)
    evidence = {"gpu_idle_quiet": g["idle_quiet_frac"], "baseline_gpu_idle_quiet": base.idle_quiet_frac,
                "gpu_idle": g["idle_frac"]}
    other = np.nan_to_num(g["other_util_median"])
    if other >= CHECKPOINT_OTHER_UTIL and other >= CHECKPOINT_RISE * np.nan_to_num(base.other_util):
        # Storage busy: a checkpoint or slow storage; the stall's length tells (brief_stalls).
        evidence |= {"storage_nic_utilisation": other, "baseline_storage_nic_utilisation": base.other_util}
    return Detection([], [], 0.5 + min(quiet_rise / 0.2, 0.45), evidence)


def _writes_a_checkpoint(incident: Incident, step: float) -> bool:
    """A stall with the storage NICs busy, over within a few minutes."""
    return "storage_nic_utilisation" in incident.evidence and \
        incident.end - incident.start <= max(CHECKPOINT_LONGEST, 2 * step) + 1e-6


def brief_stalls(incidents: list[Incident], step: float) -> tuple[list[Incident], str | None]:
    """Quiet stalls of a couple of minutes at most, and short ones that recur at a regular
    period (checkpoints, or another scheduled pause), are a normal part of training: left
    out, with a note. An input pipeline that cannot keep up holds for longer. The brief ones
    count toward the period: a checkpoint that straddles a window edge once makes a longer
    incident than its siblings, and is one of them all the same."""
    checkpoints = [i for i in incidents if i.cls == "host_bound" and _writes_a_checkpoint(i, step)]
    notes = []
    if checkpoints:
        incidents = [i for i in incidents if i not in checkpoints]
        notes.append(f"{plural(len(checkpoints), 'GPU stall')} of a few minutes with the storage NICs busy (checkpoints) "
                     "left out")
    brief = [i for i in incidents if i.cls == "host_bound" and i.end - i.start <= BRIEF_STALL + 1e-6]
    kept, periodic = _periodic(incidents, step)
    if periodic is not None:
        return kept, "; ".join([*notes, periodic])
    if brief:
        kept = [i for i in incidents if i not in brief]
        notes.append(f"{plural(len(brief), 'GPU stall')} of at most {BRIEF_STALL / 60:.1f} min with a quiet network "
                     "(a checkpoint?) left out")
    return kept, "; ".join(notes) or None


def _periodic(incidents: list[Incident], step: float) -> tuple[list[Incident], str | None]:
    longest = max(STALL_WINDOWS * step, BRIEF_STALL)
    short = [i for i in incidents if i.cls == "host_bound" and i.end - i.start <= longest + 1e-6]
    if len(short) < STALL_MIN_COUNT:
        return incidents, None
    starts = sorted(i.start for i in short)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    mean = sum(gaps) / len(gaps)
    spread = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    if mean <= 0 or spread > STALL_REGULARITY * mean:
        return incidents, None
    return ([i for i in incidents if i not in short],
            f"{len(short)} brief, periodic GPU stalls with a quiet network (checkpoints?) were left out")


RULE = BottleneckClass(
    name="host_bound",
    title="Host-bound (input/CPU/storage)",
    confirm='avg by (instance) (rate(gpunet_gpu_idle_seconds_total{network_state="quiet", instance=~"$NODES"}[5m]))',
    remediation=(
        "GPUs idle while the network is quiet and no node stands out: the input pipeline, CPU or storage "
        "(or synchronous checkpointing) cannot keep up. More data-loader workers, prefetching and pinned "
        "memory, faster or cached storage, asynchronous checkpoints."),
    check=check,
    localised=False,
    waits_in="quiet",
    needs_gpu=True,
    after=("pfc_storm", "link_degraded", "packet_loss", "gpu_throttle", "straggler"),
    incident_filter=brief_stalls,
)
