"""Confidence that means what it says: the rules' scores mapped to how often a finding of
that score was right.

Each rule scores its detection from its own signal (how far past its threshold); an
incident's score is the mean over its windows. Those scores rank findings but are not
probabilities. `python -m diagnoser.calibrate` diagnoses simulator suites of tuning seeds
over shifted windows, marks each finding right or wrong against the labels, and fits an
isotonic regression (scikit-learn) of "right" on the score. The fitted step function is
committed beside this module (calibration.json); here it is only looked up, so the
diagnoser trains nothing and needs no scikit-learn at run time.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

PARAMETERS = Path(__file__).with_name("calibration.json")


@lru_cache(maxsize=1)
def _table() -> tuple[np.ndarray, np.ndarray]:
    doc = json.loads(PARAMETERS.read_text())
    return np.asarray(doc["score"], dtype=float), np.asarray(doc["confidence"], dtype=float)


def calibrated(score: float) -> float:
    """The share of findings of this rule score that were right, on the tuning seeds."""
    scores, confidence = _table()
    return float(np.interp(score, scores, confidence))
