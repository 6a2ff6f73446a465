"""Soak: 50 concurrent scrapers for 60 s against the exporter on a fixture node with 8 NICs
and 8 GPUs (loopback only).

    python bench/soak.py [--scrapers 50] [--seconds 60]

Prints requests, errors, latency percentiles, RSS every 10 s (it must stay flat after
warm-up) and the sampler's late ticks (they must not grow: scrapes never hold up ticks).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.1"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def self_metrics(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url) as resp:
        text = await resp.text()
    return {(s.name, s.labels.get("tick", "")): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith("gpunet_exporter_ticks")}


async def soak(url: str, pid: int, scrapers: int, seconds: float) -> None:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    rss: list[tuple[float, float]] = []
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"}) as session:
        before = await self_metrics(session, url)

        async def scraper() -> None:
            while time.monotonic() < stop:
                started = time.perf_counter()
                try:
                    async with session.get(url) as resp:
                        await resp.read()
                        if resp.status != 200:
                            errors[f"HTTP {resp.status}"] = errors.get(f"HTTP {resp.status}", 0) + 1
                            continue
                except aiohttp.ClientError as e:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                    continue
                latencies.append(time.perf_counter() - started)

        async def watch() -> None:
            t0 = time.monotonic()
            while time.monotonic() < stop:
                rss.append((time.monotonic() - t0, rss_mb(pid)))
                await asyncio.sleep(10)

        await asyncio.gather(watch(), *(scraper() for _ in range(scrapers)))
        after = await self_metrics(session, url)
    latencies.sort()
    q = lambda p: 1000 * latencies[min(int(p * len(latencies)), len(latencies) - 1)]  # noqa: E731
    print(f"{scrapers} scrapers x {seconds:.0f} s: {len(latencies)} scrapes ({len(latencies) / seconds:.0f}/s), "
          f"errors {errors or 0}")
    print(f"latency ms: p50 {q(0.5):.2f}  p90 {q(0.9):.2f}  p99 {q(0.99):.2f}  max {1000 * latencies[-1]:.2f}")
    print("RSS MB over time: " + ", ".join(f"{t:.0f}s {m:.1f}" for t, m in rss))
    for tick in ("fast", "slow"):
        ran = after.get(("gpunet_exporter_ticks_total", tick), 0) - before.get(("gpunet_exporter_ticks_total", tick), 0)
        late = after.get(("gpunet_exporter_ticks_late_total", tick), 0) - \
            before.get(("gpunet_exporter_ticks_late_total", tick), 0)
        print(f"{tick} ticks during the soak: {ran:.0f} ran, {late:.0f} late")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scrapers", type=int, default=50)
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        node = Path(tmp) / "node"
        subprocess.run([sys.executable, str(REPO / "bench" / "make_fixture.py"), str(node)], check=True,
                       stdout=subprocess.DEVNULL)
        port = 19000 + os.getpid() % 1000
        proc = subprocess.Popen([sys.executable, "-m", "exporter.cli", "--root", str(node), "--listen",
                                 f"127.0.0.1:{port}"], cwd=REPO, stderr=subprocess.DEVNULL)
        try:
            time.sleep(3)  # start and warm up
            asyncio.run(soak(f"http://127.0.0.1:{port}/metrics", proc.pid, args.scrapers, args.seconds))
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
