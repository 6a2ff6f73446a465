"""Accuracy of the diagnoser on traces it was not tuned on.

    python bench/accuracy.py                 # fresh evaluation suite, seed 2000 (held out)
    python bench/accuracy.py --seed 3000     # another one
    python bench/accuracy.py DIR             # traces with .labels.json in DIR (replay_data/, ...)

Each trace goes through exactly what `diagnose` runs (diagnoser.pipeline), jobs and all.

The thresholds were tuned on replay_data/ and the suite of seed 1000; seed 2000 and later
are the measurement. Prints per class: labelled incidents, detected, false findings.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diagnoser.evaluate import Score, labels_of
from diagnoser.pipeline import diagnose as run_diagnosis
from diagnoser.sources import Source


def diagnose(trace: Path) -> list[dict]:
    """What `diagnose --replay TRACE --format json` finds (the same pipeline, in-process)."""
    return run_diagnosis(Source(replay=str(trace))).to_dict()["findings"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", help="folders of labelled traces (default: a fresh evaluation suite)")
    p.add_argument("--seed", type=int, default=2000)
    p.add_argument("-v", "--verbose", action="store_true", help="list misses and false findings")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(d) for d in args.dirs]
        if not dirs:
            print(f"generating the evaluation suite, seed {args.seed} ...", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "gpunet.simulate.suite", "--evaluation", tmp, "--seed",
                            str(args.seed)], check=True, stdout=subprocess.DEVNULL)
            dirs = [Path(tmp)]
        score, started, traces = Score(), time.perf_counter(), 0
        for d in dirs:
            for trace in sorted(d.rglob("*.om.gz")):
                score.add(trace.name, labels_of(trace)["incidents"], diagnose(trace))
                traces += 1
        print(f"{traces} traces, {time.perf_counter() - started:.1f} s")
        print(score.table())
        if args.verbose:
            for line in score.misses:
                print("MISS ", line)
            for line in score.false_findings:
                print("FALSE", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
