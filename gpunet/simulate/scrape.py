"""When Prometheus scraped each node, and what it got back.

Prometheus scrapes each target once per interval at a fixed per-target offset (it spreads
targets over the interval), a few milliseconds late or early (jitter); a scrape can fail
(missing sample for every series of the target); an exporter restart costs a few scrapes and
resets the exporter's derived counters (busy/idle/throttled/saturated/state seconds: they
restart at 0), while counters read from the system (NIC bytes, pauses, TCP) go on from the
system's value, as docs/metrics.md says. A node that joins (or leaves) monitoring has
series that start (or end) mid-trace.

The exporter serves what its last fast tick computed, so a scrape at time t returns the
counters as of tick edge floor(t / tick).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpunet.simulate.params import SimSpec


@dataclass
class NodeScrapes:
    times: np.ndarray  # seconds from trace start of the scrapes that succeeded
    kidx: np.ndarray  # tick edge each returns
    restarts: list[float] = field(default_factory=list)  # times the exporter came back up


def plan_node(spec: SimSpec, rng: np.random.Generator, restarts: list[tuple[float, float]] = (),
              window: tuple[float, float] | None = None) -> NodeScrapes:
    """restarts: (down at, seconds down); window: (join, leave) of monitoring."""
    s = spec.scrape
    offset = rng.uniform(0, s.interval)
    slots = offset + np.arange(int(np.ceil(spec.duration / s.interval)) + 1) * s.interval
    jitter = np.clip(rng.normal(0, s.jitter, len(slots)), -s.interval / 4, s.interval / 4) if s.jitter > 0 else 0
    t = slots + jitter
    keep = (t >= 0) & (t < spec.duration)
    keep &= rng.random(len(t)) >= s.missing
    up_times = []
    for at, down in restarts:
        keep &= ~((t >= at) & (t < at + down))
        up_times.append(at + down)
    if window is not None:
        keep &= (t >= window[0]) & (t < window[1])
    t = np.round(t[keep], 3)  # Prometheus keeps milliseconds
    n_ticks = int(np.ceil(spec.duration / s.tick))
    kidx = np.clip(np.floor(t / s.tick + 1e-9).astype(np.int64), 0, n_ticks)
    return NodeScrapes(t, kidx, sorted(up_times))


def derived_view(cum_at: np.ndarray, restart_at: list[np.ndarray], times: np.ndarray, restarts: list[float],
                 initial: np.ndarray | float) -> np.ndarray:
    """A derived counter as scraped: `initial` + its growth until the first exporter restart,
    then its growth since the latest restart. cum_at: (..., n) cumulative at the scrapes;
    restart_at: the cumulative at each restart time (same leading shape)."""
    out = cum_at + np.asarray(initial)[..., None] if np.ndim(initial) else cum_at + initial
    for r, base in zip(restarts, restart_at):
        after = times >= r
        out = np.where(after, cum_at - base[..., None], out)
    return out
