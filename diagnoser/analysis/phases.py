"""A job's phases: the minutes after it starts, and after its set of nodes changes.

A job that starts inside the range spends minutes loading data, compiling and warming up
with its GPUs mostly idle and its network quiet; an elastic job that loses a node stops,
restarts and goes on with a replacement. Neither is the job's steady state, and neither is
an incident: judged against the steady state, they would read as an input stall
(host_bound) or a network the job does not use. A phase runs from the change until the
job's GPU idle is back within a finding's margin of its steady level (the job's low
quantile of idle outside every phase), at most PHASE_LONGEST. Inside a phase only the
classes with a physical signal of their own are judged (a storm's pauses, loss events, a
link down, a throttle: `signature` in their records), and the phase's windows are no part
of the job's baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diagnoser.analysis.features import Features
from diagnoser.analysis.rules.base import EXCESS_IDLE
from gpunet.window import rfc3339

# A start-up or restart still far from the job's steady state after this long is no phase:
# a data set that takes half an hour to load is what host_bound reports.
PHASE_LONGEST = 20 * 60.0
# A job's end: the last checkpoint and the processes exiting take a few minutes; a job that
# stalled for longer before it ended (or was killed) stalled, and that is judged.
ENDING_LONGEST = 5 * 60.0
STEADY_QUANTILE = 0.2  # as the job's baseline (classify.BASELINE_QUANTILE)


@dataclass(frozen=True)
class Change:
    """When a job's life changed inside the range: it started or ended, or a node joined or
    left."""
    at: float
    what: str  # for people: "the job started", "gpu-07:9400 joined", "gpu-03:9400 left"
    # The phase comes before the change (a job winding down to its end: a last checkpoint,
    # the processes exiting), not after it.
    before: bool = False


@dataclass(frozen=True)
class Phase:
    start: float  # the window holding the change
    end: float  # the end of the last window before the job settled
    change: Change


def phases_of(features: Features, changes: list[Change]) -> list[Phase]:
    """The job's phases in the features' windows: for each change, from the window that
    holds it until the first later window where the job is settled (for an end, back to the
    last settled window before it). Settled: GPU idle, and GPU idle with the network quiet,
    both within EXCESS_IDLE of the job's steady level (a start-up loads and compiles with
    the network quiet, whatever the job's usual idle). Without GPU series there is nothing
    to tell a phase by: none."""
    g = features.cluster
    if not changes or not features.frame.has_gpus or not len(g):
        return []
    step = features.frame.step
    starts = g.index.to_numpy(dtype=float)
    idle = g["idle_frac"].to_numpy(dtype=float)
    quiet = g["idle_quiet_frac"].to_numpy(dtype=float)
    near = np.zeros(len(starts), dtype=bool)
    for c in changes:
        near |= (starts + step > c.at - (ENDING_LONGEST if c.before else 0.0)) & \
            (starts < c.at + (0.0 if c.before else PHASE_LONGEST))
    out = []
    for c in sorted(changes, key=lambda c: c.at):
        held = int(np.searchsorted(starts + step, c.at, side="right"))  # the window holding the change
        if c.before:
            order = range(min(held, len(starts) - 1), -1, -1)
            beyond = starts + step <= c.at - ENDING_LONGEST
        else:
            order = range(held, len(starts))
            beyond = starts >= c.at + PHASE_LONGEST
        # Without steady windows beside the phase (a job that started a few minutes before
        # the range's end), its best window so far is the level it is heading for.
        pool = ~near if (~near & np.isfinite(idle)).any() else np.isin(np.arange(len(starts)), list(order))
        if not (pool & np.isfinite(idle)).any():
            continue
        steady_idle = float(np.nanquantile(idle[pool], STEADY_QUANTILE))
        steady_quiet = float(np.nanquantile(quiet[pool], STEADY_QUANTILE)) if np.isfinite(quiet[pool]).any() else 0.0
        inside: list[int] = []
        for k in order:
            settled = np.isfinite(idle[k]) and idle[k] <= steady_idle + EXCESS_IDLE and \
                np.nan_to_num(quiet[k]) <= steady_quiet + EXCESS_IDLE
            if settled and (starts[k] >= c.at if not c.before else starts[k] + step <= c.at):
                break
            if beyond[k]:
                inside = []  # never settled within `longest`: no phase, what is slow is judged as usual
                break
            inside.append(k)
        if inside:
            out.append(Phase(float(starts[min(inside)]), float(starts[max(inside)] + step), c))
    return out


def phase_windows(phases: list[Phase], features: Features) -> set[float]:
    starts = features.cluster.index.to_numpy(dtype=float)
    return {float(w) for w in starts for p in phases if p.start <= w < p.end}


def phase_notes(phases: list[Phase]) -> list[str]:
    """One line per phase (changes at the same time, a node leaving and its replacement
    joining, share one), for the job's notes."""
    spans: dict[tuple[float, float, bool], list[str]] = {}
    for p in phases:
        spans.setdefault((p.start, p.end, p.change.before), []).append(f"{p.change.what} at {rfc3339(p.change.at)}")
    return [f"{'; '.join(what)}: the {(end - start) / 60:.0f} min "
            + ("before, from when its GPUs left their steady level," if before else
               "until its GPUs were back at their steady level")
            + " are judged only for faults with a signal of their own (storm, loss, link, throttle)"
            for (start, end, before), what in spans.items()]
