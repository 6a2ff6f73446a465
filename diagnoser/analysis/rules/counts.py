"""Event counters judged as counts: is one node's count of events (loss events, TCP
retransmits, pauses sent, receive errors) more than its peers' rate can explain?

A rate of rare events is noisy: 3 retransmits where 1 was expected is a ratio of 3 and means
nothing, 3,000 where 1,000 were expected means a lot. So a node is tested on its count, not
its rate: its peers' rate (events per unit of exposure: bytes moved, segments sent, seconds)
predicts how many it should have counted over its own exposure, and a one-sided Poisson test
says how likely its count, or more, would be by chance. The test is corrected for the number
of nodes tried (Bonferroni): among 1,000 healthy nodes one will always look unlucky.

Significance alone is not enough where counts are large (ECN marks, pauses): nodes differ
in their backgrounds (their traffic mix, their position in the fabric) by far more than
Poisson noise, and 1,300 against 1,000 expected is "significant" and harmless. Each rule
therefore also sets an effect-size floor with a physical reason (its `ratio`). A node stands
out only where both hold.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import gammainc

# Chance of naming a healthy node in one window, over all the nodes tried: one in a thousand.
ALPHA = 1e-3
# Half an event added to the peers' count: where no peer counted any, their rate is not
# zero but "less than one in their exposure", and a node with one event is no outlier.
PSEUDO_COUNT = 0.5
# The peers' background is pooled over the typical half of the nodes (those at or below the
# median rate): two or three faulty nodes among eight must not raise the bar for each other.
TYPICAL_SHARE = 0.5


def poisson_tail(count: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """P(X >= count) for X ~ Poisson(expected), for counts that may be fractional (counter
    increases interpolated at a window's edges): the regularised lower incomplete gamma
    function, which is that tail at whole counts and continuous between them."""
    count = np.asarray(count, dtype=float)
    expected = np.asarray(expected, dtype=float)
    out = np.ones_like(count)
    test = (count > 0) & np.isfinite(count) & np.isfinite(expected)
    with np.errstate(all="ignore"):
        out[test] = np.where(expected[test] > 0, gammainc(count[test], np.maximum(expected[test], 1e-300)), 0.0)
    return out


def against_background(counts: pd.Series, exposure: pd.Series, ratio: float,
                       at_least: float = 0.0) -> pd.DataFrame:
    """For each node (the index): its `count`, the count its peers' rate predicts over its
    own exposure (`expected`), their `ratio`, the one-sided Poisson p-value corrected for
    the nodes tried (`p_value`), and whether it stands out (`holds`): p_value <= ALPHA,
    ratio >= `ratio`, and count >= `at_least`.

    A node without peers (the only one with a known count) has no expected count; it holds
    on `at_least` alone, which must then carry the physical bar on its own."""
    k = counts.astype(float)
    e = exposure.astype(float).reindex(k.index)
    known = k.notna() & e.notna() & (e > 0)
    out = pd.DataFrame({"count": k, "expected": np.nan, "ratio": np.nan, "p_value": np.nan, "holds": False},
                       index=k.index)
    if not known.any():
        return out
    kk, ee = k[known], e[known]
    rate = kk / ee
    if len(kk) >= 2:
        typical = rate <= rate.quantile(TYPICAL_SHARE)
        background = (kk[typical].sum() + PSEUDO_COUNT) / ee[typical].sum()
        expected = background * ee
        with np.errstate(all="ignore"):
            p = np.minimum(1.0, poisson_tail(kk.to_numpy(), expected.to_numpy()) * len(kk))
        out.loc[known, "expected"] = expected
        out.loc[known, "ratio"] = kk / expected
        out.loc[known, "p_value"] = p
        out.loc[known, "holds"] = (p <= ALPHA) & (kk / expected >= ratio) & (kk >= at_least)
    else:
        out.loc[known, "holds"] = kk >= max(at_least, PSEUDO_COUNT)
    out["holds"] = out["holds"].astype(bool)
    return out


def job_excess(count: float, exposure: float, background_rate: float, ratio: float) -> tuple[float, float, bool]:
    """The whole job's count against its own usual rate (its quieter windows) over the
    window's exposure: (expected, p-value, holds), holds where the count is both significant
    (one test: no correction) and `ratio` times what the usual rate predicts."""
    if not (np.isfinite(count) and np.isfinite(exposure) and exposure > 0):
        return float("nan"), float("nan"), False
    rate = background_rate if np.isfinite(background_rate) and background_rate > 0 else 0.0
    expected = rate * exposure + PSEUDO_COUNT
    p = float(poisson_tail(np.array([count]), np.array([expected]))[0])
    return expected, p, bool(p <= ALPHA and count >= ratio * expected)


def evidence(table: pd.DataFrame, nodes: list[str]) -> dict[str, dict[str, float | None]]:
    """The named nodes' counts as a report shows them: count, expected from the peers' rate,
    ratio and p-value."""
    out: dict[str, dict[str, float | None]] = {}
    for node in nodes:
        if node not in table.index:
            continue
        row = table.loc[node]
        out[node] = {key: (float(row[key]) if np.isfinite(row[key]) else None)
                     for key in ("count", "expected", "ratio", "p_value")}
    return out
