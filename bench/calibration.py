"""Does a finding's confidence mean what it says? The reliability of the calibrated
confidence on held-out simulator seeds (never used to fit it) and on the committed traces.

    python bench/calibration.py                       # held-out seeds 9000 and 9001
    python bench/calibration.py --seeds 3000 --plot docs/reliability.svg

Each trace is diagnosed over shifted windows (as bench/accuracy.py does); each finding is
right when it matches a labelled incident (class, time, culprits). Prints, per confidence
bin, how many findings were reported, their mean confidence and the share that were right,
and the expected calibration error (ECE: the bins' gaps weighed by their counts; target
below 0.05). The fit itself: python -m diagnoser.calibrate (tuning seeds only).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from diagnoser.analysis.calibration import calibrated
from diagnoser.calibrate import outcomes, suite

BINS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0001)
REPLAY = Path(__file__).resolve().parents[1] / "replay_data"


def reliability(confidence: np.ndarray, right: np.ndarray) -> tuple[list[tuple], float]:
    """Rows (low, high, count, mean confidence, share right) and the ECE."""
    rows, ece = [], 0.0
    for low, high in zip(BINS, BINS[1:]):
        inside = (confidence >= low) & (confidence < high)
        if inside.any():
            conf, acc = float(confidence[inside].mean()), float(right[inside].mean())
            rows.append((low, min(high, 1.0), int(inside.sum()), conf, acc))
            ece += inside.sum() / len(confidence) * abs(acc - conf)
    return rows, float(ece)


def plot(rows: list[tuple], ece: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect calibration")
    conf = [r[3] for r in rows]
    acc = [r[4] for r in rows]
    ax.scatter(conf, acc, s=[20 + 16 * r[2] ** 0.5 for r in rows], color="#1f77b4", zorder=3, clip_on=False,
               label="findings per bin (area: count)")
    for r in rows:
        ax.annotate(str(r[2]), (r[3], r[4]), textcoords="offset points", xytext=(6, -10), fontsize=8)
    ax.set_xlim(0.4, 1.02)
    ax.set_ylim(0.4, 1.02)
    ax.set_xlabel("confidence reported")
    ax.set_ylabel("share of findings that were right")
    ax.set_title(f"Reliability on held-out seeds (ECE {ece:.3f})", fontsize=10)
    ax.legend(loc="lower right", fontsize=8, markerscale=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[9000, 9001])
    p.add_argument("--offsets", type=int, default=4, help="windows per length (default 4)")
    p.add_argument("--no-replay", action="store_true", help="leave out the committed traces")
    p.add_argument("--plot", type=Path, help="write the reliability plot (SVG or PNG) here")
    args = p.parse_args()
    results = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"seed {seed}: generating and diagnosing ...", file=sys.stderr)
            results += outcomes(suite(seed, Path(tmp)), args.offsets)
    if not args.no_replay:
        results += outcomes(REPLAY, args.offsets)
    confidence = np.array([calibrated(score) for _, score, _ in results])
    right = np.array([r for _, _, r in results], dtype=float)
    rows, ece = reliability(confidence, right)
    where = f"seeds {', '.join(map(str, args.seeds))}" + ("" if args.no_replay else " and replay_data/")
    print(f"{len(results)} findings over shifted windows ({where}), {int(right.sum())} right")
    print(f"{'confidence':>12} {'findings':>9} {'mean conf':>10} {'right':>7}")
    for low, high, n, conf, acc in rows:
        print(f"{low:5.2f}-{high:4.2f}  {n:9} {conf:10.3f} {acc:7.3f}")
    print(f"expected calibration error: {ece:.3f} (target below 0.05)")
    by_class: dict[str, list[float]] = {}
    for cls, _, r in results:
        by_class.setdefault(cls, []).append(float(r))
    print("per class (findings, right): " + ", ".join(f"{c} {len(v)}/{int(sum(v))}" for c, v in sorted(by_class.items())))
    if args.plot:
        plot(rows, ece, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
