#!/usr/bin/env python3
"""CPU of the exporters when scraped as Prometheus usually scrapes: every 15 s.

    python bench/sparse_scrapes.py [--interval 15] [--scrapes 6] [--no-gpus]

Three run at once on this machine, each scraped every --interval seconds (their scrapes
spread over the interval, as Prometheus spreads its targets), and the CPU of each is
measured over the same window:

  gpunet-exporter                         defaults: the slow tick reads before each scrape
  gpunet-exporter --slow-read every-tick  the slow tick reads every slow interval
  node_exporter                           default collectors, on the live machine

gpunet reads the 8-port mlx5 fixture of exporter_vs_node_exporter.py (8 GPUs unless
--no-gpus). The window starts once each has been scraped --rhythm-scrapes times, so that
gpunet knows the rhythm (exporter/scrape_clock.py), and spans --scrapes scrapes.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_fixture  # noqa: E402
from exporter_vs_node_exporter import (  # noqa: E402
    PROMETHEUS_ACCEPT,
    REPO,
    CpuWindow,
    Scraper,
    free_port,
    loadavg,
    log,
    machine,
    node_exporter_binary,
    stop,
    wait_ready,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--interval", type=float, default=15.0, help="seconds between two scrapes of one exporter (default 15)")
    p.add_argument("--scrapes", type=int, default=6, help="scrapes of each in the measured window (default 6)")
    p.add_argument("--rhythm-scrapes", type=int, default=5,
                   help="scrapes of each before the window (default 5: gpunet trusts a rhythm after 4)")
    p.add_argument("--no-gpus", action="store_true", help="the fixture without nvml.json")
    p.add_argument("--node-exporter", help="node_exporter binary (default /usr/bin/prometheus-node-exporter)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ne = node_exporter_binary(args.node_exporter)
    if ne is None:
        print("sparse_scrapes: prometheus-node-exporter not found; apt-get install prometheus-node-exporter",
              file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="gpunet-sparse-"))
    procs: list[subprocess.Popen] = []
    try:
        root = work / "node"
        root.mkdir()
        make_fixture.generate(root, 8, 32, gpus=not args.no_gpus)
        runs = []
        for name, extra in (("gpunet-exporter", []), ("gpunet-exporter --slow-read every-tick",
                                                      ["--slow-read", "every-tick"])):
            port = free_port()
            runs.append((name, [sys.executable, "-m", "exporter", "--root", str(root), "--listen",
                                f"127.0.0.1:{port}", *extra], port))
        port = free_port()
        runs.append(("node_exporter", [ne, f"--web.listen-address=127.0.0.1:{port}"], port))
        for _name, argv_, port in runs:
            with open(work / f"{len(procs)}.log", "wb") as err:
                procs.append(subprocess.Popen(argv_, stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd=REPO,
                                              start_new_session=True))
            wait_ready(procs[-1], port, PROMETHEUS_ACCEPT)
        scrapers = [Scraper(port, PROMETHEUS_ACCEPT) for _, _, port in runs]
        offsets = [args.interval * i / len(runs) for i in range(len(runs))]  # spread, as Prometheus does
        start = time.monotonic() + 1.0
        total = args.rhythm_scrapes + args.scrapes
        log(f"{len(runs)} exporters, each scraped every {args.interval:g} s; {args.rhythm_scrapes} scrapes to "
            f"learn the rhythm, then a window of {args.scrapes} ({args.scrapes * args.interval:g} s)")
        windows: list[CpuWindow] = []
        events = sorted((start + k * args.interval + off, i) for k in range(total + 1) for i, off in enumerate(offsets))
        for at, i in events:
            if not windows and at >= start + args.rhythm_scrapes * args.interval:
                windows = [CpuWindow(proc.pid) for proc in procs]
            if at >= start + total * args.interval:
                break
            time.sleep(max(0.0, at - time.monotonic()))
            scrapers[i].get()
        results = [w.result() for w in windows]
        for s in scrapers:
            s.close()
    finally:
        for proc in procs:
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)

    m = machine()
    print(f"machine: {m['nproc']} CPUs, {m['cpu_model']}, Linux {m['kernel']}, Python {m['python']}")
    print(f"fixture: 8 mlx5 ports, {'no GPUs' if args.no_gpus else '8 GPUs'}; load average at end {loadavg()}")
    print(f"all at once, each scraped every {args.interval:g} s; CPU over the same "
          f"{results[0]['wall_s']:.0f} s window ({args.scrapes} scrapes of each)\n")
    ne_pct = results[-1]["cpu_pct_schedstat"] if "cpu_pct_schedstat" in results[-1] else results[-1]["cpu_pct"]
    for (name, _, _), r in zip(runs, results):
        pct = r.get("cpu_pct_schedstat", r["cpu_pct"])
        ratio = f"{pct / ne_pct:5.2f}x node_exporter" if ne_pct > 0 else ""
        print(f"  {name:42s} {pct:6.3f}% of a core  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
