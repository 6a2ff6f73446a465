"""How fast `diagnose --replay` reads a big trace, against a bare gzip line loop.

    python bench/diagnose_speed.py                # generates 256 nodes x 8 GPUs x 8 NICs, 1 h at 15 s
    python bench/diagnose_speed.py TRACE.om.gz    # any trace

Prints, in one run: the bare `for line in gzip.open(...)` loop, then the `diagnose` command
itself on the same file (a child process running every stage, report rendering included),
the ratio to the loop and the command's peak RSS; then, in-process, where the time goes
(reading the trace into the frame, and the analysis that follows).
"""

from __future__ import annotations

import argparse
import gzip
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python bench/diagnose_speed.py", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", nargs="?", type=Path,
                   help="a trace (.om or .om.gz) to read; default: generate 256 nodes x 8 GPUs x 8 NICs, 1 h at 15 s")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.trace is not None and not args.trace.is_file():
        print(f"diagnose_speed: {args.trace}: no such file", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        if args.trace is not None:
            trace = args.trace
        else:
            trace = Path(tmp) / "big.om.gz"
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "gpunet.simulate.cli", "--nodes", "256", "--gpus", "8", "--nics",
                            "8", "--nic-speed", "400G", "--duration", "1h", "--scrape", "15s", "--seed", "5",
                            "--fault", "pfc_storm:start=20m,dur=10m,nodes=1", str(trace)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(f"generated {trace.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        lines = sum(1 for _ in gzip.open(trace, "rb"))
        loop = time.perf_counter() - started
        print(f"bare gzip line loop: {lines:,} lines in {loop:.1f} s")

        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "diagnoser.cli", "--replay", str(trace), "--format", "json"],
                                capture_output=True, text=True)
        total = time.perf_counter() - started
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        if result.returncode != 0:
            print(result.stderr, file=sys.stderr)
            return 1
        print(f"diagnose --replay (the command, all stages): {total:.1f} s = {total / loop:.2f}x the gzip loop; "
              f"peak RSS {rss:.0f} MB")

        from diagnoser.pipeline import diagnose_frame
        from diagnoser.sources import Source, read_frame

        t0 = time.perf_counter()
        frame = read_frame(Source(replay=str(trace)))
        t1 = time.perf_counter()
        report = diagnose_frame(frame)
        t2 = time.perf_counter()
        print(f"in-process: read+frame {t1 - t0:.1f} s, analysis and report {t2 - t1:.2f} s")
        print(f"findings: {[(f.cls, f.nodes[:3]) for f in report.findings]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
