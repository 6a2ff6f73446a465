"""How fast `diagnose --replay` reads a big trace, against a bare gzip line loop.

    python bench/diagnose_speed.py                # generates 256 nodes x 8 GPUs x 8 NICs, 1 h at 15 s
    python bench/diagnose_speed.py TRACE.om.gz    # any trace

Prints, in one run: the bare `for line in gzip.open(...)` loop, then the diagnoser's
stages (parse, frame, features, classification), the ratio to the loop and peak RSS.
Targets (issue 5): under 60 s, under 4 GB, at most 3x the gzip loop.
"""

from __future__ import annotations

import gzip
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        if len(sys.argv) > 1:
            trace = Path(sys.argv[1])
        else:
            trace = Path(tmp) / "big.om.gz"
            started = time.perf_counter()
            subprocess.run(["gpunet-simulate", "--nodes", "256", "--gpus", "8", "--nics", "8", "--nic-speed", "400G",
                            "--duration", "1h", "--scrape", "15s", "--seed", "5", "--fault",
                            "pfc_storm:start=20m,dur=10m,nodes=1", str(trace)], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            print(f"generated {trace.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        lines = sum(1 for _ in gzip.open(trace, "rb"))
        loop = time.perf_counter() - started
        print(f"bare gzip line loop: {lines:,} lines in {loop:.1f} s")

        from diagnoser.classify import classify
        from diagnoser.features import compute
        from diagnoser.incidents import merge
        from diagnoser.sources.replay import frame_from_trace

        t0 = time.perf_counter()
        frame = frame_from_trace(trace)
        t1 = time.perf_counter()
        features = compute(frame)
        t2 = time.perf_counter()
        incidents = merge(classify(features), frame.step)
        t3 = time.perf_counter()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        total = t3 - t0
        print(f"diagnose: read+frame {t1 - t0:.1f} s, features {t2 - t1:.2f} s, classify+incidents {t3 - t2:.2f} s; "
              f"total {total:.1f} s = {total / loop:.2f}x the gzip loop; peak RSS {rss:.0f} MB")
        print(f"findings: {[(i.cls, i.nodes[:3]) for i in incidents]}")
        print(f"targets: total < 60 s {'PASS' if total < 60 else 'FAIL'}, RSS < 4 GB {'PASS' if rss < 4096 else 'FAIL'}, "
              f"<= 3x gzip loop {'PASS' if total <= 3 * loop else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
