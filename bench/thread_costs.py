#!/usr/bin/env python3
"""Where a running gpunet-exporter spends its CPU: per thread, and per part of a scrape's render.

    python bench/thread_costs.py [--seconds 60] [--scrape-interval 1] [--no-gpus] [--root DIR]
                                 [--gpunet-args ARGS] [--floor-seconds 20]

Runs gpunet-exporter as `gpunet-exporter` runs (over a fresh bench/make_fixture.py node with
8 ports and 8 GPUs by default), each of its threads named for the kernel after its role,
scrapes it every --scrape-interval seconds on a fixed grid with the headers Prometheus 3
sends (0: never), and reports over --seconds after a warm-up:

1. per thread: CPU (% of one core, from /proc/PID/task/TID/schedstat, kernel time included)
   and context switches a second: the fast lane, the slow lane, the watchdog and the event
   loop (which serves the scrapes);
2. per part of the render and per thread that rendered: calls, and CPU per call
   (time.thread_time around each, inside the exporter): gathering the families (`families`),
   formatting them (`format`), gzip, and the whole `render` with its cache;
3. the floor: what a bare Python thread that does nothing but wake every fast interval
   (the exporter's, 0.2 s unless --gpunet-args sets --fast-interval) costs on this machine,
   measured after the exporter stopped (--floor-seconds; 0 skips). On a VM a wake is not
   free: it is the part of the fast lane's cost that any sampler at that rate pays,
   whatever it reads.

The figures are those of a process on a shared machine: a part that runs just after a
thread woke up costs more than the same part run again at once (bench/profile_sampler.py
times both). Compare variants of the code in alternating runs of the same length.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))


# --- inside the exporter (--child) ---------------------------------------------------------
def child(out: str, exporter_args: list[str]) -> None:
    """Run the exporter in this process, its threads named and its render's parts timed; the
    times are written to `out` as JSON when it exits (SIGTERM included)."""
    import ctypes
    import gzip
    import runpy
    from collections import defaultdict

    sys.path.insert(0, str(REPO))
    from exporter import exposition, registry

    libc = ctypes.CDLL(None)
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named_bootstrap(self: threading.Thread) -> None:
        libc.prctl(15, self.name[-15:].encode(), 0, 0, 0)  # PR_SET_NAME: what /proc/.../comm shows
        bootstrap(self)

    threading.Thread._bootstrap_inner = named_bootstrap  # type: ignore[attr-defined]
    spent: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])

    def timed(part: str, fn):
        def wrapper(*args, **kwargs):
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                entry = spent[(threading.current_thread().name, part)]
                entry[0] += 1
                entry[1] += time.thread_time() - started
        return wrapper

    registry.Registry.render = timed("render", registry.Registry.render)
    registry.Registry.families = timed("families", registry.Registry.families)
    exposition.Renderer.render = timed("format", exposition.Renderer.render)
    registry.gzip = type("TimedGzip", (), {"compress": staticmethod(timed("gzip", gzip.compress))})

    def dump() -> None:
        with open(out, "w") as f:
            json.dump([[thread, part, n, seconds] for (thread, part), (n, seconds) in spent.items()], f)

    atexit.register(dump)
    sys.argv = ["gpunet-exporter", *exporter_args]
    runpy.run_module("exporter", run_name="__main__", alter_sys=True)


# --- the benchmark -----------------------------------------------------------------------------
def per_thread(pid: int) -> dict[str, tuple[str, int, int]]:
    """tid -> (name, on-CPU ns, context switches)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns, _, switches = f.read().split()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        out[tid] = (name + (" (event loop)" if tid == str(pid) else ""), int(ns), int(switches))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2:])
        return 0
    import exporter_vs_node_exporter as bench
    import make_fixture

    from exporter.settings import build_parser

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--seconds", type=float, default=60.0, help="measured window (default 60)")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds of scrapes before it (default 8)")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes; 0: none (default 1)")
    p.add_argument("--root", help="fixture root (default: a fresh bench/make_fixture.py node)")
    p.add_argument("--no-gpus", action="store_true", help="the generated fixture without nvml.json")
    p.add_argument("--gpunet-args", default="", metavar="ARGS", help="extra arguments for gpunet-exporter")
    p.add_argument("--floor-seconds", type=float, default=20.0,
                   help="seconds of a bare thread waking every 0.2 s, for the floor (0 skips; default 20)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="gpunet-threads-") as tmp:
        work = Path(tmp)
        root = Path(args.root) if args.root else work / "node"
        if not args.root:
            root.mkdir()
            make_fixture.generate(root, 8, 32, gpus=not args.no_gpus)
        port, timings = bench.free_port(), work / "timings.json"
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(timings), "--root", str(root),
                                 "--listen", f"127.0.0.1:{port}", *shlex.split(args.gpunet_args)],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(work / "exporter.log", "w"))
        try:
            bench.wait_ready(proc, port, bench.PROMETHEUS_ACCEPT)
            scraper = bench.Scraper(port, bench.PROMETHEUS_ACCEPT)
            start = time.monotonic()
            measured_from = start + args.warmup
            before: dict[str, tuple[str, int, int]] | None = None
            k = 0
            while True:
                now = time.monotonic()
                if before is None and now >= measured_from:
                    before, window_start = per_thread(proc.pid), now
                if now >= measured_from + args.seconds:
                    break
                if args.scrape_interval > 0:
                    scraper.get()
                    k += 1
                    next_at = start + k * args.scrape_interval
                else:
                    next_at = measured_from if before is None else measured_from + args.seconds
                time.sleep(max(0.0, next_at - time.monotonic()))
            after, wall = per_thread(proc.pid), time.monotonic() - window_start
        finally:
            bench.stop(proc)
        assert before is not None
        scrapes = f"scraped every {args.scrape_interval:g} s" if args.scrape_interval > 0 else "not scraped"
        print(f"gpunet-exporter over {root} ({'given' if args.root else 'make_fixture.py, 8 ports'}"
              f"{', no GPUs' if args.no_gpus and not args.root else ''}), {scrapes}, {wall:.0f} s:")
        print(f"\n{'thread':34s} {'CPU, % of a core':>17s} {'switches/s':>11s}")
        total_ns = total_switches = 0
        gone = ("", 0, 0)  # a thread started within the window
        for tid, (name, ns, switches) in sorted(after.items(), key=lambda kv: before.get(kv[0], gone)[1] - kv[1][1]):
            d_ns, d_sw = ns - before.get(tid, gone)[1], switches - before.get(tid, gone)[2]
            total_ns, total_switches = total_ns + d_ns, total_switches + d_sw
            print(f"{name:34s} {100 * d_ns / 1e9 / wall:17.3f} {d_sw / wall:11.1f}")
        print(f"{'all threads':34s} {100 * total_ns / 1e9 / wall:17.3f} {total_switches / wall:11.1f}")
        if timings.exists():
            rows = json.loads(timings.read_text())
            print(f"\n{'render, by part and thread (whole run)':40s} {'calls':>6s} {'CPU ms a call':>14s}")
            for thread, part, n, seconds in sorted(rows, key=lambda r: (r[0], r[1])):
                print(f"{thread + ': ' + part:40s} {n:6d} {1e3 * seconds / max(n, 1):14.3f}")
    if args.floor_seconds > 0:
        given = build_parser().parse_known_args(shlex.split(args.gpunet_args))[0]
        interval = given.fast_interval
        ns = bench.wake_floor(interval, args.floor_seconds)
        print(f"\nthe floor: a bare Python thread waking every {interval:g} s, nothing else: "
              f"{100 * ns / 1e9 / args.floor_seconds:.3f}% of a core, "
              f"{ns / 1e3 / (args.floor_seconds / interval):.0f} us of CPU a wake")
    return 0


if __name__ == "__main__":
    atexit.register(sys.stdout.flush)
    sys.exit(main())
