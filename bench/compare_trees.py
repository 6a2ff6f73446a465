#!/usr/bin/env python3
"""CPU of two versions of the exporter, run at once over one fixture: is a change cheaper?

    python bench/compare_trees.py BEFORE_DIR AFTER_DIR [--windows 5] [--seconds 30] [--root DIR]

BEFORE_DIR and AFTER_DIR are checkouts of this repository (`git worktree add /tmp/before
HEAD~1`, and this one). Each runs `python -m exporter` from its own tree over the same
fixture (a fresh bench/make_fixture.py node with 8 ports and 8 GPUs unless --root), both
scraped once a second, half a second apart, and their CPU (schedstat) is measured over the
same windows: whatever else the machine does weighs on both alike. Then it runs again with
the two started in the other order, since the one scraped second reads about 2% cheaper
(two runs of the same tree gave 0.977). It prints AFTER/BEFORE per window and the geometric
mean of the two runs' medians, which cancels that.

On this 2-core VM, unpaired runs a minute apart differ by up to 10%; this differs by about
2% between repeats, so it tells changes of 3% and more.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import exporter_vs_node_exporter as bench  # noqa: E402
import make_fixture  # noqa: E402


def one_run(trees: list[Path], root: Path, windows: int, seconds: float) -> list[tuple[float, float]]:
    """[(cpu % of trees[0], of trees[1])] per window, both running at once."""
    procs, ports = [], []
    try:
        for tree in trees:
            port = bench.free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "exporter", "--root", str(root), "--listen", f"127.0.0.1:{port}"],
                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
            bench.wait_ready(procs[-1], port, bench.PROMETHEUS_ACCEPT)
            ports.append(port)
        scrapers = [bench.Scraper(port, bench.PROMETHEUS_ACCEPT) for port in ports]
        t_next = time.monotonic()

        def scrape_until(end: float) -> None:
            nonlocal t_next
            while t_next + 1.0 <= end:
                for i, scraper in enumerate(scrapers):
                    time.sleep(max(0.0, t_next + 0.5 * i - time.monotonic()))
                    scraper.get()
                t_next += 1.0

        scrape_until(t_next + 15.0)  # warm-up: the scrape rhythm learned, caches filled
        out = []
        for _ in range(windows):
            cpu = [bench.CpuWindow(p.pid) for p in procs]
            scrape_until(t_next + seconds)
            a, b = (r.get("cpu_pct_schedstat", r["cpu_pct"]) for r in (w.result() for w in cpu))
            out.append((a, b))
        for scraper in scrapers:
            scraper.close()
        return out
    finally:
        for p in procs:
            bench.stop(p)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--root", help="a fixture node (default: a fresh make_fixture.py node, 8 ports, 8 GPUs)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpunet-compare-") as tmp:
        root = Path(args.root) if args.root else Path(tmp) / "node"
        if not args.root:
            root.mkdir()
            make_fixture.generate(root, 8, 32, gpus=True)
        medians = []
        for order in ([args.before, args.after], [args.after, args.before]):
            rows = one_run(order, root, args.windows, args.seconds)
            ratios = []
            print(f"started first: {order[0]}")
            for first, second in rows:
                before, after = (first, second) if order[0] == args.before else (second, first)
                ratios.append(after / before)
                print(f"  before {before:.3f}%  after {after:.3f}%  after/before {after / before:.3f}")
            medians.append(statistics.median(ratios))
            print(f"  median after/before {medians[-1]:.3f}")
        print(f"after/before, both orders (geometric mean of the medians): {math.sqrt(medians[0] * medians[1]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
