"""Fit the confidence calibration (diagnoser/analysis/calibration.py) and write its table.

    python -m diagnoser.calibrate                        # tuning seeds 1000 and 1001, clean-room 1000
    python -m diagnoser.calibrate --seeds 1000 1001 1002 --offsets 4

Generates the simulator's evaluation suite for each seed and, from a clone of the
repository, the clean-room generator's full set (bench/cleanroom.py: data from a generator
written apart from the diagnoser, so that the fit is not one simulator's), diagnoses every
trace over shifted windows (diagnoser.evaluate.windows_of), marks each finding right (it
matches a labelled incident) or wrong, and fits an isotonic regression of right on the
rules' score over all of them. Seeds 2000 and later are held out for bench/calibration.py
and bench/accuracy.py; never fit on them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn.isotonic import IsotonicRegression

from diagnoser.analysis.calibration import PARAMETERS
from diagnoser.evaluate import matches, of_cut, sweep

CLEANROOM = Path(__file__).resolve().parent.parent / "bench" / "cleanroom.py"
# The fitted confidence stays within these: no finding is certain, none worthless enough to print.
FLOOR, CEILING = 0.05, 0.99


def outcomes(folder: Path, offsets: int) -> list[tuple[str, float, bool]]:
    """(class, rule score, right) of every finding over shifted windows of every trace in
    `folder`; findings of an incident the window cuts are left out (neither right nor wrong)."""
    out = []
    for trace in sorted(folder.rglob("*.om.gz")):
        for w in sweep(trace, offsets):
            for f in w.report.findings:
                doc = f.to_dict()
                if not of_cut(doc, w.cut):
                    out.append((f.cls, f.score, any(matches(t, doc) for t in w.whole)))
    return out


def suite(seed: int, folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "gpunet.simulate.suite", "--evaluation", str(folder), "--seed", str(seed)],
                   check=True, stdout=subprocess.DEVNULL)
    return folder


def fit(results: list[tuple[str, float, bool]]) -> dict:
    scores = np.array([s for _, s, _ in results])
    right = np.array([r for _, _, r in results], dtype=float)
    model = IsotonicRegression(y_min=FLOOR, y_max=CEILING, out_of_bounds="clip").fit(scores, right)
    return {"score": [round(float(x), 4) for x in model.X_thresholds_],
            "confidence": [round(float(y), 4) for y in model.y_thresholds_],
            "findings": len(results), "right": int(right.sum())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1000, 1001])
    p.add_argument("--cleanroom-seeds", type=int, nargs="*", default=[1000],
                   help="seeds of bench/cleanroom.py's full set to fit on too (none: the simulator alone)")
    p.add_argument("--offsets", type=int, default=4, help="windows per length (default 4)")
    p.add_argument("--out", type=Path, default=PARAMETERS)
    args = p.parse_args()
    results: list[tuple[str, float, bool]] = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"seed {seed}: generating and diagnosing ...", file=sys.stderr)
            results += outcomes(suite(seed, Path(tmp)), args.offsets)
    for seed in args.cleanroom_seeds:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"clean-room seed {seed}: generating and diagnosing ...", file=sys.stderr)
            subprocess.run([sys.executable, str(CLEANROOM), tmp, "--set", "full", "--seed", str(seed)], check=True,
                           stdout=subprocess.DEVNULL)
            results += outcomes(Path(tmp), args.offsets)
    doc = {"fitted_on": {"seeds": args.seeds, "cleanroom_seeds": args.cleanroom_seeds,
                         "offsets_per_length": args.offsets,
                         "command": " ".join(["python -m diagnoser.calibrate", *sys.argv[1:]])}, **fit(results)}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{doc['findings']} findings, {doc['right']} right; {len(doc['score'])} steps -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
