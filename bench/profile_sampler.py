#!/usr/bin/env python3
"""Where gpunet-exporter's sampling time goes, on every thread the ticks use.

    python bench/profile_sampler.py [--root DIR] [--no-gpus] [--seconds 60] [--paced-seconds 20]
                                    [--functions] [--top 25]

Builds the Sampler exactly as `gpunet-exporter` does (exporter.cli.make_sampler) over a
fixture (by default a fresh bench/make_fixture.py node), then runs the ticks on a lane's
worker thread, as the running exporter does:

1. plain: --seconds of exporter time of ticks back to back (one slow tick per
   --slow-interval, one fast tick per --fast-interval, without the sleeps): CPU per tick
   (the worker's own clock, kernel time included) and wall time, with warm caches.
2. paced: --paced-seconds of ticks at their own times, sleeping between them as the
   exporter does, each run once more at once: CPU per tick as the exporter pays it (after a
   sleep, in caches gone cold) beside the same work warm.
3. categories: the ticks back to back again, with the functions that read the machine,
   call NVML, make counters monotonic, derive link_load, publish, collect and keep calls
   under their time limits timed (exclusive wall time): the time of a tick per category.
4. with --functions: cProfile of the worker; the top functions by own time.

Then the render of a scrape body (OpenMetrics, gzip) after each second of ticks, split
into gathering the families, formatting (the families whose samples changed) and gzip.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gzip
import io
import pstats
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import make_fixture  # noqa: E402

from exporter import bounded  # noqa: E402
from exporter.cli import make_sampler  # noqa: E402
from exporter.registry import Registry  # noqa: E402
from exporter.settings import build_parser  # noqa: E402

FRAMES = "time limits and the sampler's bookkeeping per call"


# --- exclusive timers per category ---------------------------------------------------------
class Categories:
    """Exclusive wall time per category, per thread: a timed function nested in another
    is taken out of the outer one's time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._local = threading.local()
        self._lock = threading.Lock()

    def wrap(self, category: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            stack = getattr(self._local, "stack", None)
            if stack is None:
                stack = self._local.stack = []
            now = time.perf_counter()
            if stack:
                self._charge(stack[-1][0], now - stack[-1][1])
            stack.append([category, now])
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                cat, since = stack.pop()
                self._charge(cat, end - since, call=True)
                if stack:
                    stack[-1][1] = end
        return timed

    def _charge(self, category: str, seconds: float, call: bool = False) -> None:
        with self._lock:
            self.seconds[category] += seconds
            self.calls[category] += call

    def patch(self, owner, attr: str, category: str) -> None:
        fn = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
        if fn is None:
            return
        if isinstance(fn, staticmethod):
            setattr(owner, attr, staticmethod(self.wrap(category, fn.__func__)))
        else:
            setattr(owner, attr, self.wrap(category, fn))

    def reset(self) -> None:
        with self._lock:
            self.seconds.clear()
            self.calls.clear()


def instrument(cats: Categories, sampler) -> None:
    """Time the functions of each category, on whatever thread they run."""
    from exporter import root as root_mod
    from exporter.counters import MonotonicCounters
    from exporter.link_load import LinkLoad
    from exporter.readers import ethtool, netdev, rdma

    for attr in ("_read", "stat_key", "exists", "listdir"):
        cats.patch(root_mod.Root, attr, "read: sysfs/proc/fixture files")
    cats.patch(ethtool.DriverStatsReader, "_read_ioctl", "read: ioctl/netlink")
    cats.patch(netdev.NetdevReader, "_links_netlink", "read: ioctl/netlink")
    cats.patch(rdma, "read_counters", "read: sysfs/proc/fixture files")  # module function: only its callers see it
    cats.patch(MonotonicCounters, "apply", "counters (monotonic)")
    cats.patch(LinkLoad, "update", "link_load")
    cats.patch(Registry, "publish", "publish")
    cats.patch(bounded.BoundedCalls, "_call_on", FRAMES)
    if sampler.gpus is not None:
        backend = sampler.gpus.backend
        for attr in ("activity", "details", "health", "processes", "mig_uuids", "xid_counts"):
            method = getattr(backend, attr, None)
            if method is not None:
                setattr(backend, attr, cats.wrap("NVML calls (fixture json)", method))
    for collector in [*sampler.link_load_inputs, *sampler.fast, *sampler.slow]:
        inner = getattr(collector, "collector", collector)  # a Refreshed wrapper's own collector
        for obj in {id(collector): collector, id(inner): inner}.values():
            obj.collect = cats.wrap("collect: Python per-sample work", obj.collect)


# --- the passes ----------------------------------------------------------------------------
class Clock:
    """The exporter's time, advanced one fast interval per fast tick: the ticks run back to
    back, but see the times the running exporter's would (what refreshes once a slow
    interval, or every --config-interval, does so as often per tick as there)."""

    def __init__(self, fast_interval: float) -> None:
        self.now = time.monotonic()
        self.fast_interval = fast_interval

    def ticks(self, fast_per_slow: int) -> list[tuple[str, float]]:
        """One slow interval's ticks: the slow one, then the fast ones, with their times."""
        out = [("slow", self.now)]
        for _ in range(fast_per_slow):
            out.append(("fast", self.now))
            self.now += self.fast_interval
        return out


def run_ticks(sampler, clock: Clock, n_slow: int, fast_per_slow: int, cpu: dict | None = None,
              wall: dict | None = None, each=None) -> None:
    """Ticks as the running exporter's lanes run them: on a lane's worker (their bounded calls
    inline, under the time limits), called directly rather than handed over one by one."""
    def ticks() -> None:
        for _ in range(n_slow):
            for tick, now in clock.ticks(fast_per_slow):
                fn = sampler._fast_tick if tick == "fast" else sampler._slow_tick
                if each is not None:
                    each(tick, functools.partial(fn, now))
                    continue
                c0, t0 = time.thread_time_ns(), time.perf_counter()
                fn(now)
                if wall is not None:
                    wall[tick] += time.perf_counter() - t0
                if cpu is not None:
                    cpu[tick] += time.thread_time_ns() - c0

    LANE.call(ticks)


LANE = bounded.Lane("gpunet-profile")


def paced(sampler, clock: Clock, seconds: float, fast_per_slow: int) -> None:
    """The ticks of `clock` (the times the other passes run on, going on from theirs), each
    at its time with sleeps between as in the running exporter, timed on the worker's clock,
    then run once more at once: the first run pays for caches that went cold while the
    thread slept (what the exporter pays), the second is the same work warm (the refresh
    state put back as it was; the repeat sees no time pass, so it adds nothing up)."""
    cold = {"fast": 0, "slow": 0}
    warm = {"fast": 0, "slow": 0}
    count = {"fast": 0, "slow": 0}

    def ticks() -> None:
        wall_start, clock_start = time.monotonic(), clock.now
        for _ in range(max(1, round(seconds / (clock.fast_interval * fast_per_slow)))):
            for tick, now in clock.ticks(fast_per_slow):
                time.sleep(max(0.0, wall_start + (now - clock_start) - time.monotonic()))
                fn = sampler._fast_tick if tick == "fast" else sampler._slow_tick
                last_refresh = sampler._last_refresh
                c0 = time.thread_time_ns()
                fn(now)
                c1 = time.thread_time_ns()
                sampler._last_refresh = last_refresh  # a refresh tick refreshes again
                fn(now)
                cold[tick] += c1 - c0
                warm[tick] += time.thread_time_ns() - c1
                count[tick] += 1

    LANE.call(ticks)
    print(f"\n2. paced: {seconds:g} s of ticks at their own times; CPU per tick, ms, as run (after a sleep) "
          "and run again at once")
    for tick in ("fast", "slow"):
        n = max(count[tick], 1)
        print(f"  {tick} tick: as run {cold[tick] / 1e6 / n:.3f}, again at once {warm[tick] / 1e6 / n:.3f}")
    print(f"  ticks as run: {100 * (cold['fast'] + cold['slow']) / 1e9 / seconds:.2f}% of one core "
          f"(again at once: {100 * (warm['fast'] + warm['slow']) / 1e9 / seconds:.2f}%)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="fixture root (default: a generated 8-port mlx5 node)")
    p.add_argument("--seconds", type=float, default=60.0, help="exporter seconds of ticks per pass (default 60)")
    p.add_argument("--fast-interval", type=float, default=0.2)
    p.add_argument("--slow-interval", type=float, default=1.0)
    p.add_argument("--no-gpus", action="store_true", help="generate the fixture without nvml.json")
    p.add_argument("--functions", action="store_true", help="also cProfile every thread and list the top functions")
    p.add_argument("--paced-seconds", type=float, default=20.0,
                   help="seconds of ticks at their own times, for what sleeping between them costs (0 skips)")
    p.add_argument("--top", type=int, default=25, help="functions to list (default 25)")
    p.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"))
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
    fast_per_slow = max(1, round(args.slow_interval / args.fast_interval))
    clock = Clock(args.fast_interval)
    run_ticks(sampler, clock, 3, fast_per_slow)  # first reads, parses and thread starts, outside every pass
    registry.render(openmetrics=True, gzipped=True)

    n_slow = max(1, round(args.seconds / args.slow_interval))
    n_fast = n_slow * fast_per_slow
    exporter_seconds = n_slow * args.slow_interval
    print(f"{len(sampler.nics)} NICs, {len(sampler.gpus.identities) if sampler.gpus else 0} GPUs; "
          f"{n_slow} slow ticks and {n_fast} fast ticks per pass = {exporter_seconds:g} s of exporter time")

    # 1. plain
    cpu = {"fast": 0, "slow": 0}
    wall = {"fast": 0.0, "slow": 0.0}
    run_ticks(sampler, clock, n_slow, fast_per_slow, cpu, wall)
    print("\n1. plain: CPU per tick on the lane's worker, ms")
    for tick, n in (("fast", n_fast), ("slow", n_slow)):
        print(f"  {tick} tick: CPU {cpu[tick] / 1e6 / n:.3f} ms (wall {1e3 * wall[tick] / n:.3f} ms)")
    ticks_cpu = (cpu["fast"] + cpu["slow"]) / 1e9
    print(f"  ticks alone: {100 * ticks_cpu / exporter_seconds:.2f}% of one core")

    # 2. paced, before any timer is put in: the ticks at their own times, with the sleeps
    if args.paced_seconds > 0:
        paced(sampler, clock, args.paced_seconds, fast_per_slow)

    # 3. categories: the timers are reset before each tick and read after it
    cats = Categories()
    instrument(cats, sampler)
    per_tick: dict[str, dict[str, float]] = {"fast": defaultdict(float), "slow": defaultdict(float)}
    calls: dict[str, dict[str, int]] = {"fast": defaultdict(int), "slow": defaultdict(int)}
    tick_wall = {"fast": 0.0, "slow": 0.0}
    def categorised(tick: str, fn) -> None:
        cats.reset()
        t0 = time.perf_counter()
        fn()
        tick_wall[tick] += time.perf_counter() - t0
        for k, v in cats.seconds.items():
            per_tick[tick][k] += v
        for k, c in cats.calls.items():
            calls[tick][k] += c

    run_ticks(sampler, clock, n_slow, fast_per_slow, each=categorised)
    for tick, n in (("fast", n_fast), ("slow", n_slow)):
        seconds = per_tick[tick]
        seconds["tick, other"] = tick_wall[tick] - sum(seconds.values())
        print(f"\n3. {tick} tick by category: wall ms per tick, exclusive (timers' own overhead included; "
              f"wall {1e3 * tick_wall[tick] / n:.3f} ms)")
        for k, v in sorted(seconds.items(), key=lambda x: -x[1]):
            count = calls[tick].get(k)
            print(f"  {1e3 * v / n:8.3f}  {k}" + (f"  ({count / n:.0f} calls)" if count else ""))

    # 4. functions
    if args.functions:
        prof = cProfile.Profile()

        def profiled(tick: str, fn) -> None:
            prof.enable()
            fn()
            prof.disable()

        run_ticks(sampler, clock, n_slow, fast_per_slow, each=profiled)
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats(args.sort).print_stats(args.top)
        print("\n4. functions (cProfile, with its overhead, timers of pass 3 included):")
        print(out.getvalue())

    # 5. render, once a second of ticks (as scraped at 1 Hz): what changed since is formatted anew
    n_render = 100
    gather = fmt = zipped = 0.0
    for _ in range(n_render):
        run_ticks(sampler, clock, 1, fast_per_slow)
        t0 = time.perf_counter()
        families = registry.families()
        t1 = time.perf_counter()
        body = registry._renderer.render(families, True)
        t2 = time.perf_counter()
        gzip.compress(body, compresslevel=1)
        t3 = time.perf_counter()
        gather, fmt, zipped = gather + t1 - t0, fmt + t2 - t1, zipped + t3 - t2
    print(f"\n5. render of one scrape body ({len(body)} bytes), after a second of ticks: families "
          f"{1e3 * gather / n_render:.3f} ms, "
          f"format {1e3 * fmt / n_render:.3f} ms, gzip {1e3 * zipped / n_render:.3f} ms")

    LANE.close()
    for collector in [*sampler.link_load_inputs, *sampler.fast, *sampler.slow]:
        close = getattr(collector, "close", None)
        if close:
            close()
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
