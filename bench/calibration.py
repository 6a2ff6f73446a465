"""Does a finding's confidence mean what it says? The reliability of the calibrated
confidence, source by source, on data never used to fit it: the project's simulator
(held-out seeds), the clean-room generator (bench/cleanroom.py, a held-out seed), the
clean-room set perturbed (bench/perturb.py's `all`), and the committed traces.

    python bench/calibration.py                       # seeds 9000 and 9001, clean-room 9000
    python bench/calibration.py --seeds 3000 --cleanroom-seed 3000 --plot docs/img/reliability.svg

Each trace is diagnosed over shifted windows (as bench/accuracy.py does); each finding is
right when it matches a labelled incident (class, time, culprits). Prints, per source, how
many findings were reported, how many were right, the share right among those reported at
confidence 0.9 or more (target: at least 0.9) and the expected calibration error (ECE: the
bins' gaps weighed by their counts; target below 0.05); then, over all sources, per
confidence bin, the count, the mean confidence and the share right. The fit itself:
python -m diagnoser.calibrate (tuning seeds only).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from diagnoser.analysis.calibration import calibrated
from diagnoser.calibrate import outcomes, suite

BINS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0001)
HERE = Path(__file__).resolve().parent
REPLAY = HERE.parent / "replay_data"


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
    ax.set_title(f"Reliability on held-out data, all sources (ECE {ece:.3f})", fontsize=10)
    ax.legend(loc="lower right", fontsize=8, markerscale=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)


def _perturbed(folder: Path, out: Path, seed: int) -> Path:
    """Every trace of `folder` under bench/perturb.py's `all`, into `out`."""
    from robustness import sibling  # bench/ is on the path of a bench script

    module = sibling("perturb")
    out.mkdir(parents=True, exist_ok=True)
    for trace in sorted(folder.glob("*.om.gz")):
        module.perturb(trace, out / trace.name, "all", seed)
    return out


def summary(results: list[tuple[str, float, bool]]) -> tuple[np.ndarray, np.ndarray, str]:
    confidence = np.array([calibrated(score) for _, score, _ in results])
    right = np.array([r for _, _, r in results], dtype=float)
    if not len(results):
        return confidence, right, "no findings"
    high = confidence >= 0.9
    share = f"{right[high].mean():.3f} of {int(high.sum())}" if high.any() else "none"
    return confidence, right, (f"{len(results)} findings, {int(right.sum())} right; at confidence >= 0.9: {share} "
                               f"right; ECE {reliability(confidence, right)[1]:.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[9000, 9001], help="the simulator's held-out seeds")
    p.add_argument("--cleanroom-seed", type=int, default=9000, help="the clean-room set's held-out seed")
    p.add_argument("--offsets", type=int, default=4, help="windows per length (default 4)")
    p.add_argument("--no-replay", action="store_true", help="leave out the committed traces")
    p.add_argument("--plot", type=Path, help="write the reliability plot (SVG or PNG) here")
    args = p.parse_args()
    sources: dict[str, list[tuple[str, float, bool]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            print(f"simulator seed {seed}: generating and diagnosing ...", file=sys.stderr)
            sources.setdefault(f"simulator (seeds {', '.join(map(str, args.seeds))})", []).extend(
                outcomes(suite(seed, Path(tmp) / f"sim-{seed}"), args.offsets))
        clean = Path(tmp) / "cleanroom"
        print(f"clean-room seed {args.cleanroom_seed}: generating and diagnosing ...", file=sys.stderr)
        subprocess.run([sys.executable, str(HERE / "cleanroom.py"), str(clean), "--set", "full", "--seed",
                        str(args.cleanroom_seed)], check=True, stdout=subprocess.DEVNULL)
        sources[f"clean-room (seed {args.cleanroom_seed})"] = outcomes(clean, args.offsets)
        sources["clean-room perturbed (all)"] = outcomes(_perturbed(clean, Path(tmp) / "perturbed",
                                                                    args.cleanroom_seed), args.offsets)
    if not args.no_replay:
        sources["replay_data/"] = outcomes(REPLAY, args.offsets)
    for name, results in sources.items():
        print(f"{name:34} {summary(results)[2]}")
    everything = [r for results in sources.values() for r in results]
    confidence, right, line = summary(everything)
    rows, ece = reliability(confidence, right)
    print(f"all sources: {line}")
    print(f"{'confidence':>12} {'findings':>9} {'mean conf':>10} {'right':>7}")
    for low, high, n, conf, acc in rows:
        print(f"{low:5.2f}-{high:4.2f}  {n:9} {conf:10.3f} {acc:7.3f}")
    by_class: dict[str, list[float]] = {}
    for cls, _, r in everything:
        by_class.setdefault(cls, []).append(float(r))
    print("per class (findings, right): " + ", ".join(f"{c} {len(v)}/{int(sum(v))}" for c, v in sorted(by_class.items())))
    if args.plot:
        plot(rows, ece, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
