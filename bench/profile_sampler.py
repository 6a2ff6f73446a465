#!/usr/bin/env python3
"""Where gpunet-exporter's sampling time goes: cProfile over the sampler's ticks.

    python bench/profile_sampler.py [--root DIR] [--no-gpus] [--seconds 60] [--top 25] [--render]

Builds the Sampler exactly as `gpunet-exporter` does (exporter.cli.make_sampler) over a
fixture (by default a fresh bench/make_fixture.py node), then runs the ticks of
--seconds of exporter time back to back: one slow tick per --slow-interval and one fast
tick per --fast-interval, without the sleeps. It prints the time per tick and the
functions that take it. With --render it also profiles rendering the scrape body
(OpenMetrics, gzip) once per fast tick, which is what each scrape costs when scrapes are
further apart than the fast tick.

This measures the tick work only: the event loop and the hand-offs to the tick threads
are not in it, and cProfile sees the calling thread only, so the per-GPU NVML worker
threads' own work is missing (time waiting for them shows up as lock 'acquire'). Per-thread
CPU of the running exporter is in /proc/PID/task/TID/schedstat; `py-spy dump --pid PID`
names the threads (bench/README.md).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import make_fixture  # noqa: E402

from exporter.cli import build_parser, make_sampler  # noqa: E402
from exporter.registry import Registry  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="fixture root (default: a generated 8-port mlx5 node)")
    p.add_argument("--seconds", type=float, default=60.0, help="exporter seconds of ticks to run (default 60)")
    p.add_argument("--fast-interval", type=float, default=0.2)
    p.add_argument("--slow-interval", type=float, default=1.0)
    p.add_argument("--top", type=int, default=25, help="functions to list (default 25)")
    p.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"))
    p.add_argument("--no-gpus", action="store_true", help="generate the fixture without nvml.json")
    p.add_argument("--render", action="store_true", help="also render the scrape body after every fast tick")
    args = p.parse_args(argv)

    tmp = None
    root = args.root
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpunet-profile-")
        root = tmp.name
        make_fixture.generate(Path(root), gpus=not args.no_gpus)

    cli_args = build_parser().parse_args(["--root", root, "--fast-interval", str(args.fast_interval),
                                          "--slow-interval", str(args.slow_interval)])
    registry = Registry(root)
    sampler = make_sampler(cli_args, registry)
    sampler.slow_tick()
    sampler.fast_tick()  # first reads and parses, outside the profile
    if args.render:
        registry.render(openmetrics=True, gzipped=True)

    fast_per_slow = max(1, round(args.slow_interval / args.fast_interval))
    n_slow = max(1, round(args.seconds / args.slow_interval))
    timings = {"slow": 0.0, "fast": 0.0, "render": 0.0}
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n_slow):
        t0 = time.perf_counter()
        sampler.slow_tick()
        timings["slow"] += time.perf_counter() - t0
        for _ in range(fast_per_slow):
            t0 = time.perf_counter()
            sampler.fast_tick()
            timings["fast"] += time.perf_counter() - t0
            if args.render:
                t0 = time.perf_counter()
                registry.render(openmetrics=True, gzipped=True)
                timings["render"] += time.perf_counter() - t0
    prof.disable()
    for collector in [*sampler.link_load_inputs, *sampler.fast, *sampler.slow]:
        close = getattr(collector, "close", None)
        if close:
            close()

    n_fast = n_slow * fast_per_slow
    total = timings["slow"] + timings["fast"]
    exporter_seconds = n_slow * args.slow_interval
    print(f"{len(sampler.nics)} NICs; {n_slow} slow ticks, {n_fast} fast ticks = {exporter_seconds:g} s of exporter "
          "time (times below include cProfile's overhead, roughly x1.5-2)")
    print(f"  slow tick: {1e3 * timings['slow'] / n_slow:.2f} ms each")
    print(f"  fast tick: {1e3 * timings['fast'] / n_fast:.2f} ms each")
    print(f"  ticks alone: {100 * total / exporter_seconds:.2f}% of one core")
    if args.render:
        print(f"  render (OpenMetrics+gzip): {1e3 * timings['render'] / n_fast:.2f} ms each")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats(args.sort).print_stats(args.top)
    print(out.getvalue())
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
