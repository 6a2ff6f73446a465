"""Accuracy of the diagnoser on traces it was not tuned on, over shifted windows: the
project's own simulator and the clean-room generator, side by side.

    python bench/accuracy.py                 # the held-out sets (seed 2000), a column each
    python bench/accuracy.py --seed 3000     # other sets
    python bench/accuracy.py DIR [DIR ...]   # traces with .labels.json in each DIR (replay_data/, ...)
    python bench/accuracy.py --offsets 30    # 30 windows per length (default 8)

The generated sets: the simulator's evaluation suite (`python -m gpunet.simulate.suite
--evaluation DIR --seed SEED`), bench/cleanroom.py's full set (`python bench/cleanroom.py
DIR --set full --seed SEED`), a generator written from the public docs alone, with its own
step, traffic and noise models, and the same generator's multi-job set (`--set multijob`:
several jobs on spine-leaf and rail fabrics, faults that cross jobs, jobs starting, ending
and replacing nodes, one cluster of 512 nodes). Thresholds were tuned on replay_data/ and
the sets of seed 1000; seed 2000 and later are the measurement.

Each trace is read once and diagnosed over windows of 15 min, 30 min, 1 h and 3 h whose
start (or, beyond the trace's length, whose end) moves by 29 s at a time: every window
goes through exactly what `diagnose` runs on it (diagnoser.pipeline), jobs and all. A
labelled incident wholly inside a window must be found in it; a finding must match a
labelled incident (one the window cuts may be found or not); a healthy trace must have no
finding in any window. "Inside" means inside the whole windows of the diagnoser's grid that
the diagnosis judged (its `judged` span): up to one step at either end is not judged.

Prints one table with a column per set (recall, precision, culprits named exactly, healthy
windows with a finding), then each set's classes: labelled incidents (counted once per
window that holds them), detected, false findings; -v lists the misses and false findings.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diagnoser.evaluate import Score, sweep

HERE = Path(__file__).resolve().parent


def score_trace(trace: Path, score: Score, offsets: int) -> int:
    """Score every shifted window of one trace; returns how many were diagnosed."""
    windows = 0
    for w in sweep(trace, offsets):
        where = f"{trace.name} +{w.start - w.first:.0f}..+{w.end - w.first:.0f}s"
        score.add(where, w.whole, w.report.to_dict()["findings"], w.cut)
        windows += 1
    return windows


def own_suite(folder: Path, seed: int) -> None:
    subprocess.run([sys.executable, "-m", "gpunet.simulate.suite", "--evaluation", str(folder), "--seed", str(seed)],
                   check=True, stdout=subprocess.DEVNULL)


def cleanroom_set(folder: Path, seed: int) -> None:
    subprocess.run([sys.executable, str(HERE / "cleanroom.py"), str(folder), "--set", "full", "--seed", str(seed)],
                   check=True, stdout=subprocess.DEVNULL)


def multijob_set(folder: Path, seed: int) -> None:
    subprocess.run([sys.executable, str(HERE / "cleanroom.py"), str(folder), "--set", "multijob", "--seed", str(seed)],
                   check=True, stdout=subprocess.DEVNULL)


def score_folder(folder: Path, offsets: int) -> tuple[Score, int, int, float]:
    """(score, traces, windows, seconds) of every labelled trace under `folder`."""
    score, started, traces, windows = Score(), time.perf_counter(), 0, 0
    for trace in sorted(folder.rglob("*.om.gz")):
        windows += score_trace(trace, score, offsets)
        traces += 1
    return score, traces, windows, time.perf_counter() - started


def side_by_side(results: dict[str, tuple[Score, int, int, float]]) -> str:
    """One column per set: the figures the targets are stated in."""
    def row(label: str, cell) -> str:
        return f"{label:34}" + "".join(f"{cell(*r):>26}" for r in results.values())

    def exact(s: Score, *_) -> str:
        return f"{s.exact}/{s.named}" if s.named else "-"

    lines = [f"{'':34}" + "".join(f"{name:>26}" for name in results),
             row("traces, windows", lambda s, t, w, sec: f"{t}, {w}"),
             row("labelled incidents", lambda s, *_: str(sum(s.incidents.values()))),
             row("detected", lambda s, *_: str(sum(s.detected.values()))),
             row("false findings", lambda s, *_: str(sum(s.false.values()))),
             row("recall", lambda s, *_: f"{s.recall:.3f}"),
             row("precision", lambda s, *_: f"{s.precision:.3f}"),
             row("culprits exact", exact),
             row("healthy windows with a finding", lambda s, *_: f"{s.healthy_with_findings}/{s.healthy_windows}"),
             row("seconds", lambda s, t, w, sec: f"{sec:.0f}")]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", help="folders of labelled traces (default: both generators' held-out sets)")
    p.add_argument("--seed", type=int, default=2000, help="the generated sets' seed (default 2000, held out)")
    p.add_argument("--offsets", type=int, default=8, help="windows per length (default 8)")
    p.add_argument("-v", "--verbose", action="store_true", help="list misses and false findings")
    args = p.parse_args()
    results: dict[str, tuple[Score, int, int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sets = {str(d): Path(d) for d in args.dirs}
        if not sets:
            for name, make in (("own simulator", own_suite), ("clean-room", cleanroom_set),
                               ("multi-job", multijob_set)):
                folder = Path(tmp) / name.replace(" ", "-")
                print(f"generating the {name} set, seed {args.seed} ...", file=sys.stderr)
                make(folder, args.seed)
                sets[f"{name} ({args.seed})"] = folder
        for name, folder in sets.items():
            results[name] = score_folder(folder, args.offsets)
    print(f"{args.offsets} windows per length of 15m, 30m, 1h, 3h, shifted by 29 s")
    print(side_by_side(results))
    for name, (score, *_rest) in results.items():
        print(f"\n{name}\n{score.table()}")
        if args.verbose:
            for line in score.misses:
                print("MISS ", line)
            for line in score.false_findings:
                print("FALSE", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
