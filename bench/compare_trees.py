#!/usr/bin/env python3
"""CPU of two versions of the exporter, run at once over one fixture: is a change cheaper?

    python bench/compare_trees.py BEFORE_DIR AFTER_DIR [--windows 5] [--seconds 30] [--root DIR]
                                  [--python-before PATH] [--python-after PATH]

BEFORE_DIR and AFTER_DIR are checkouts of this repository (`git worktree add /tmp/before
HEAD~1`, and this one); or one checkout twice, with --python-before and --python-after
naming two builds of CPython (each with gpunet's dependencies installed). Each runs
`python -m exporter` from its own tree over the same
fixture (a fresh bench/make_fixture.py node with 8 ports and 8 GPUs unless --root), both
scraped once a second, half a second apart, and their CPU (schedstat) is measured over the
same windows: whatever else the machine does weighs on both alike. Then it runs again with
the two started in the other order, since the one scraped second reads about 2% cheaper
(two runs of the same tree gave 0.977). It prints AFTER/BEFORE per window and the geometric
mean of the two runs' medians, which cancels that.

On this 2-core VM, unpaired runs a minute apart differ by up to 10%. This differed by about
2% between repeats in a quiet hour, by up to 5% in a busy one (the same code in two trees
read 1.010; one change read 1.086, then 0.981 when run again): trust changes of 5% and
more, and run again what reads less.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import exporter_vs_node_exporter as bench  # noqa: E402
import make_fixture  # noqa: E402


def one_run(trees: list[tuple[Path, str]], root: Path, windows: int, seconds: float,
            work: Path) -> list[list[float]]:
    """[[cpu % of trees[0], of trees[1]]] per window, both running at once; each tree is
    (its folder, the Python that runs it)."""
    sides = []
    for n, (tree, python) in enumerate(trees):
        port = bench.free_port()
        # Run from its own tree: `-m` puts the working folder first on the path.
        sides.append(bench.Side(f"tree{n}", [python, "-m", "exporter", "--root", str(root), "--listen",
                                             f"127.0.0.1:{port}"], port, tree, {**os.environ, "PYTHONPATH": str(tree)}))
    # Scraped through the warm-up: the scrape rhythm learned, caches filled before the windows.
    return bench.side_by_side(sides, bench.PROMETHEUS_ACCEPT, 15.0, windows, seconds, work, scrape_warmup=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--root", help="a fixture node (default: a fresh make_fixture.py node, 8 ports, 8 GPUs)")
    p.add_argument("--python-before", default=sys.executable, metavar="PATH",
                   help="the Python that runs BEFORE (default: this one; it needs gpunet's dependencies)")
    p.add_argument("--python-after", default=sys.executable, metavar="PATH",
                   help="the Python that runs AFTER: with the same tree twice, two builds of CPython compared")
    args = p.parse_args(argv)
    # Absolute: each side runs in its own tree's folder.
    before = (args.before, os.path.abspath(args.python_before))
    after = (args.after, os.path.abspath(args.python_after))
    with tempfile.TemporaryDirectory(prefix="gpunet-compare-") as tmp:
        root = Path(args.root) if args.root else Path(tmp) / "node"
        if not args.root:
            root.mkdir()
            make_fixture.generate(root, 8, 32, gpus=True)
        medians = []
        for order in ([before, after], [after, before]):
            rows = one_run(order, root, args.windows, args.seconds, Path(tmp))
            ratios = []
            print(f"started first: {order[0][0]} ({order[0][1]})")
            for first, second in rows:
                cpu_before, cpu_after = (first, second) if order[0] is before else (second, first)
                ratios.append(cpu_after / cpu_before)
                print(f"  before {cpu_before:.3f}%  after {cpu_after:.3f}%  after/before {cpu_after / cpu_before:.3f}")
            medians.append(statistics.median(ratios))
            print(f"  median after/before {medians[-1]:.3f}")
        print(f"after/before, both orders (geometric mean of the medians): {math.sqrt(medians[0] * medians[1]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
