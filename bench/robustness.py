"""Robustness of the diagnoser: accuracy on the same labelled traces under perturbations.

    python bench/robustness.py                       # fresh evaluation suite (seed 2000), + cleanroom's full set
    python bench/robustness.py replay_data --offsets 1
    python bench/robustness.py DIR --perturbation none jitter resets -v

Every trace of each labelled set (default: a fresh evaluation suite made as
bench/accuracy.py makes it, `python -m gpunet.simulate.suite --evaluation DIR --seed SEED`,
and, where bench/cleanroom.py exists, its full set, `python bench/cleanroom.py DIR --set
full`) is perturbed by bench/perturb.py (`--list` there says what each perturbation does;
`none` is the trace as it is) into a temporary folder, then scored exactly as
bench/accuracy.py scores it (its `score_trace`: diagnoser.evaluate.sweep over shifted
windows of 15 min, 30 min, 1 h and 3 h, Score). The seed makes both the suite and the
perturbations' draws. Prints, per set, one row per perturbation (incidents, detected, false
findings, recall, precision, culprits named exactly, healthy windows with a finding, seconds
spent perturbing and diagnosing), then the same per class; -v lists the misses and false
findings of each perturbation. Traces run in parallel (--jobs, default 2) with results
gathered in a fixed order, so the output does not depend on the number of workers (its
seconds aside).
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, fields
from pathlib import Path
from types import ModuleType

from diagnoser.evaluate import Score

HERE = Path(__file__).resolve().parent
NONE = "none"


def sibling(name: str) -> ModuleType:
    """bench/NAME.py as a module (bench/ is no package): imported once, under a name of its own."""
    key = f"_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


score_trace = sibling("accuracy").score_trace
_perturb = sibling("perturb")
PERTURBATIONS: dict[str, str] = {NONE: "the trace as it is", **_perturb.PERTURBATIONS}


@dataclass
class Task:
    set_name: str
    perturbation: str
    trace: Path
    number: int  # unique among the tasks: the temporary folder of its perturbed trace
    offsets: int
    seed: int
    workdir: Path


@dataclass
class Result:
    task: Task
    score: Score
    windows: int
    seconds: float
    error: str | None = None


def run_task(task: Task) -> Result:
    """Perturb one trace, score it, remove the perturbed copy."""
    started = time.perf_counter()
    score = Score()
    folder = task.workdir / f"{task.number:05d}"
    try:
        trace = task.trace
        if task.perturbation != NONE:
            folder.mkdir(parents=True)
            trace = folder / task.trace.name
            _perturb.perturb(task.trace, trace, task.perturbation, task.seed)
        windows = score_trace(trace, score, task.offsets)
        return Result(task, score, windows, time.perf_counter() - started)
    except Exception as e:  # noqa: BLE001 - a crash under perturbation is a result to report
        where = traceback.extract_tb(e.__traceback__)[-1]
        return Result(task, Score(), 0, time.perf_counter() - started,
                      f"{type(e).__name__}: {e} ({Path(where.filename).name}:{where.lineno})")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def merge(into: Score, part: Score) -> None:
    """Add one Score's counts and lists to another."""
    for f in fields(Score):
        mine, theirs = getattr(into, f.name), getattr(part, f.name)
        if isinstance(mine, dict):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        elif isinstance(mine, list):
            mine.extend(theirs)
        else:
            setattr(into, f.name, mine + theirs)


def table(scores: dict[str, Score], seconds: dict[str, float]) -> str:
    head = (f"{'perturbation':15} {'incidents':>9} {'detected':>9} {'false':>6} {'recall':>7} {'precision':>9} "
            f"{'culprits exact':>14} {'healthy w/ finding':>18} {'seconds':>8}")
    rows = [head, "-" * len(head)]
    for name, s in scores.items():
        rows.append(f"{name:15} {sum(s.incidents.values()):9} {sum(s.detected.values()):9} {sum(s.false.values()):6} "
                    f"{s.recall:7.3f} {s.precision:9.3f} {f'{s.exact}/{s.named}':>14} "
                    f"{f'{s.healthy_with_findings}/{s.healthy_windows}':>18} {seconds[name]:8.0f}")
    return "\n".join(rows)


def by_class(scores: dict[str, Score]) -> str:
    """Per class and perturbation: detected/incidents, and false findings after a '+'."""
    classes = sorted({c for s in scores.values() for c in (*s.incidents, *s.false)})
    width = max(9, *(len(n) for n in scores))
    rows = [f"{'class':20} " + " ".join(f"{n:>{width}}" for n in scores)]
    for c in classes:
        cells = [f"{s.detected.get(c, 0)}/{s.incidents.get(c, 0)} +{s.false.get(c, 0)}" for s in scores.values()]
        rows.append(f"{c:20} " + " ".join(f"{x:>{width}}" for x in cells))
    return "\n".join(rows)


def default_sets(tmp: Path, seed: int) -> list[tuple[str, Path]]:
    """The evaluation suite of `seed`, made as bench/accuracy.py makes it, and cleanroom's full set."""
    suite = tmp / "suite"
    print(f"generating the evaluation suite, seed {seed} ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "gpunet.simulate.suite", "--evaluation", str(suite), "--seed", str(seed)],
                   check=True, stdout=subprocess.DEVNULL)
    sets = [(f"evaluation suite (seed {seed})", suite)]
    cleanroom = HERE / "cleanroom.py"
    if cleanroom.exists():
        print("generating cleanroom's full set ...", file=sys.stderr)
        out = tmp / "cleanroom"
        done = subprocess.run([sys.executable, str(cleanroom), str(out), "--set", "full"], stdout=subprocess.DEVNULL)
        if done.returncode == 0:
            sets.append(("cleanroom (full)", out))
        else:
            print(f"warning: bench/cleanroom.py exited {done.returncode}: its set left out", file=sys.stderr)
    return sets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", help="folders of labelled traces (default: a fresh evaluation suite and "
                   "cleanroom's full set)")
    p.add_argument("--perturbation", nargs="+", choices=list(PERTURBATIONS), metavar="NAME",
                   help=f"perturbations to run (default: all of them): {', '.join(PERTURBATIONS)}")
    p.add_argument("--offsets", type=int, default=2, help="windows per length (default 2)")
    p.add_argument("--seed", type=int, default=2000, help="the suite's seed and the perturbations' (default 2000)")
    p.add_argument("--jobs", "-j", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    p.add_argument("-v", "--verbose", action="store_true", help="list misses and false findings")
    args = p.parse_args(argv)
    names = list(dict.fromkeys(args.perturbation or PERTURBATIONS))
    started = time.perf_counter()
    # Workers are forked before anything reads a trace (the readers run threads).
    pool = multiprocessing.get_context("fork").Pool(args.jobs) if args.jobs > 1 else None
    try:
        with tempfile.TemporaryDirectory(prefix="robustness-") as tmp_name:
            tmp = Path(tmp_name)
            sets = [(str(d), Path(d)) for d in args.dirs] or default_sets(tmp, args.seed)
            tasks: list[Task] = []
            for set_name, folder in sets:
                traces = sorted(folder.rglob("*.om.gz"))
                for name in names:
                    for trace in traces:
                        tasks.append(Task(set_name, name, trace, len(tasks), args.offsets, args.seed, tmp / "work"))
            print(f"{len(tasks)} runs ({len(names)} perturbations x traces), {args.jobs} worker(s) ...",
                  file=sys.stderr)
            results = list(pool.imap(run_task, tasks, chunksize=1) if pool else map(run_task, tasks))
    finally:
        if pool:
            pool.close()
            pool.join()
    elapsed = time.perf_counter() - started
    for set_name, _ in sets:
        scores = {name: Score() for name in names}
        seconds = dict.fromkeys(names, 0.0)
        traces: set[Path] = set()
        windows = 0
        errors = []
        for r in results:
            if r.task.set_name != set_name:
                continue
            merge(scores[r.task.perturbation], r.score)
            seconds[r.task.perturbation] += r.seconds
            traces.add(r.task.trace)
            windows += r.windows
            if r.error:
                errors.append(f"{r.task.perturbation} {r.task.trace.name}: {r.error}")
        print(f"\n{set_name}: {len(traces)} traces x {len(names)} perturbations, {windows} windows "
              f"({args.offsets} per length of 15m, 30m, 1h, 3h); seed {args.seed}")
        print(table(scores, seconds))
        print("\nper class: detected/incidents +false findings")
        print(by_class(scores))
        for line in errors:
            print("ERROR", line)
        if args.verbose:
            for name, s in scores.items():
                for line in s.misses:
                    print(f"MISS  [{name}] {line}")
                for line in s.false_findings:
                    print(f"FALSE [{name}] {line}")
    print(f"\n{len(results)} runs in {elapsed:.0f} s ({args.jobs} worker(s); 'seconds' above: per perturbation, "
          "perturbing and diagnosing, summed over traces)")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
