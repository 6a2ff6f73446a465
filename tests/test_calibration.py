"""Confidence that means what it says: the committed calibration is a proper one (fitted on
tuning seeds only, monotone, bounded), and the fit recovers a known reliability.

The held-out check (reliability table, expected calibration error) is bench/calibration.py:
it needs simulated suites too large for the test suite's time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diagnoser.analysis.calibration import PARAMETERS, calibrated
from diagnoser.calibrate import CEILING, FLOOR, fit

HELD_OUT_FROM = 2000  # seeds from here on measure; bench/accuracy.py and bench/calibration.py use them


def test_the_committed_calibration_was_fitted_on_tuning_seeds_and_is_monotone():
    doc = json.loads(PARAMETERS.read_text())
    assert doc["fitted_on"]["seeds"] and all(s < HELD_OUT_FROM for s in doc["fitted_on"]["seeds"])
    scores, confidence = np.array(doc["score"]), np.array(doc["confidence"])
    assert len(scores) >= 2 and np.all(np.diff(scores) > 0)
    assert np.all(np.diff(confidence) >= 0) and confidence.min() >= FLOOR and confidence.max() <= CEILING
    assert doc["findings"] >= 200, "too few findings to say how often a score is right"
    # Looked up, never extrapolated past the fitted range.
    assert calibrated(-1.0) == confidence[0] and calibrated(2.0) == confidence[-1]


def test_the_fit_recovers_a_known_reliability():
    """Findings whose chance of being right is known (a score s is right with probability
    0.3 + 0.6 s): the fitted confidence follows that curve."""
    rng = np.random.default_rng(11)
    scores = rng.uniform(0.0, 1.0, 20000)
    right = rng.uniform(size=scores.size) < 0.3 + 0.6 * scores
    doc = fit([("x", float(s), bool(r)) for s, r in zip(scores, right)])
    table = np.array(doc["score"]), np.array(doc["confidence"])
    for s in (0.2, 0.5, 0.8):
        assert float(np.interp(s, *table)) == pytest.approx(0.3 + 0.6 * s, abs=0.05)
    assert doc["findings"] == 20000 and doc["right"] == int(right.sum())
