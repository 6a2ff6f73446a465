"""Event counts judged as counts (diagnoser/analysis/rules/counts.py): the Poisson tail
against scipy.stats' own, the correction for the nodes tried, the background of the typical
nodes, and the effect-size floor."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import poisson

from diagnoser.analysis.rules import counts


@pytest.mark.parametrize(("count", "expected"), [(1, 0.5), (3, 0.3), (10, 4.0), (120, 100.0), (7, 0.01)])
def test_the_tail_is_poissons_at_whole_counts(count, expected):
    got = counts.poisson_tail(np.array([count], dtype=float), np.array([expected]))[0]
    assert got == pytest.approx(poisson.sf(count - 1, expected), rel=1e-9)


def test_no_events_are_never_news_and_a_fractional_count_lies_between_its_neighbours():
    assert counts.poisson_tail(np.array([0.0]), np.array([3.0]))[0] == 1.0
    low, mid, high = counts.poisson_tail(np.array([2.0, 2.5, 3.0]), np.array([1.0] * 3))
    assert high < mid < low


def nodes(n: int) -> list[str]:
    return [f"gpu-{k:03d}:9400" for k in range(n)]


def test_an_unlucky_node_among_many_is_not_named_but_a_loud_one_is():
    """At a background of 2 events per window, 11 events on one node has p ~ 1e-5 alone: named
    among 8 nodes, not among 1,000 (where one such node turns up by chance in 1 window of 100)."""
    for size, named in ((8, True), (1000, False)):
        names = nodes(size)
        count = pd.Series(2.0, index=names)
        count[names[3]] = 11.0
        table = counts.against_background(count, pd.Series(1.0, index=names), ratio=3.0)
        assert bool(table.at[names[3], "holds"]) is named, size
        # The typical nodes: every other one (all at or below the median rate).
        alone = poisson.sf(10, (2.0 * (size - 1) + counts.PSEUDO_COUNT) / (size - 1))
        assert table.at[names[3], "p_value"] == pytest.approx(min(1.0, alone * size), rel=0.05)


def test_significance_without_the_effect_floor_is_no_culprit():
    """1,300 ECN marks where 1,000 are expected is significant (p ~ 1e-19) and a node's own
    background: the floor (a physical ratio) says no."""
    names = nodes(8)
    count = pd.Series(1000.0, index=names)
    count[names[0]] = 1300.0
    table = counts.against_background(count, pd.Series(1.0, index=names), ratio=10.0)
    assert table.at[names[0], "p_value"] < 1e-10
    assert not table["holds"].any()


def test_faulty_nodes_do_not_raise_the_bar_for_each_other():
    names = nodes(8)
    count = pd.Series(1.0, index=names)
    count[names[1]] = count[names[2]] = 500.0
    table = counts.against_background(count, pd.Series(1.0, index=names), ratio=10.0)
    assert list(table.index[table["holds"]]) == [names[1], names[2]]


def test_exposure_sets_what_is_expected():
    """A node that moved ten times the bytes meets ten times the loss on the same fabric."""
    names = nodes(8)
    exposure = pd.Series(1.0, index=names)
    exposure[names[5]] = 10.0
    count = pd.Series(10.0, index=names)
    count[names[5]] = 100.0
    table = counts.against_background(count, exposure, ratio=3.0)
    assert not table["holds"].any()
    # Every node at the same rate: all are typical, 170 events (and half a one) over 17 units.
    assert table.at[names[5], "ratio"] == pytest.approx(100.0 / (10 * 170.5 / 17), rel=1e-9)


def test_a_node_without_peers_holds_on_the_physical_bar_alone_and_unknowns_are_left_out():
    alone = counts.against_background(pd.Series({"a": 30.0}), pd.Series({"a": 20.0}), ratio=10.0, at_least=20.0)
    assert bool(alone.at["a", "holds"]) and np.isnan(alone.at["a", "expected"])
    unknown = counts.against_background(pd.Series({"a": np.nan, "b": 5.0}), pd.Series({"a": 1.0, "b": 0.0}), 10.0)
    assert not unknown["holds"].any()


def test_the_job_against_its_own_usual_rate():
    expected, p, holds = counts.job_excess(50.0, 10.0, 0.2, ratio=10.0)
    assert expected == pytest.approx(2.0 + counts.PSEUDO_COUNT)
    assert p == pytest.approx(poisson.sf(49, 2.5), rel=1e-9) and holds
    assert not counts.job_excess(20.0, 10.0, 0.2, ratio=10.0)[2]  # significant, but 8x
    assert not counts.job_excess(float("nan"), 10.0, 0.2, ratio=10.0)[2]
