"""Soak: 50 concurrent scrapers for 60 s against the exporter on a fixture node with 8 NICs
and 8 GPUs (loopback only), alone, beside a hostile mix, or beside a flood.

    python bench/soak.py [--scrapers 50] [--seconds 60]
    python bench/soak.py --hostile      # the same, beside the hostile mix below
    python bench/soak.py --flood [--fresh-connections]   # one scraper beside the flood below

--hostile serves with basic auth (bcrypt cost 10; the honest scrapers have the password)
and adds, each looping for the whole run: clients that send a request and never read
(--slow-readers 40), connections that never send (--idle 40), requests whose header never
ends (--half-sent 40), password guessers (--guessers 20) and senders of malformed requests
(--malformed 10).

--flood is the attack of issue 40: 300 connections that never send, against the default cap
of 256 connections, and 100 password guessers, each reconnecting or guessing again as soon
as it is answered, beside one honest scraper (--scrapers 1, every 0.1 s) with the password.
The honest scraper connects from 127.0.0.2, the hostile clients from 127.0.0.1: a scraper
and its attackers are different hosts. --fresh-connections: each honest scrape on a new
connection (as after a reload, or a scraper without keep-alive), which must win a place at
the cap.

Prints the honest scrapes' count, errors and latency percentiles, what the hostile clients
got, RSS every 10 s (it must stay flat after warm-up and under the systemd unit's
MemoryMax=128M), the sampler's late ticks (none: scrapes never hold up ticks), and the
exporter's own count of what it turned away.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.1"
HONEST_ADDRESS = "127.0.0.2"  # the honest scrapers' own address; the hostile clients use 127.0.0.1
FLOOD = {"idle": 300, "guessers": 100}  # --flood: silent connections past the default cap, guessers


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User and system CPU the process has used (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def self_metrics(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url) as resp:
        text = await resp.text()
    return {(s.name, s.labels.get("tick", "")): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith("gpunet_exporter_ticks")}


PASSWORD = "right-horse"


async def hostile(port: int, kind: str, stop: float, outcomes: dict[str, int]) -> None:
    """One hostile client, looping until `stop`: whenever the server closes on it, again."""
    host = "127.0.0.1"
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    payload = {"slow": request + b"\r\n", "idle": b"", "half": request,
               "malformed": b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"}[kind]
    loop = asyncio.get_running_loop()
    while time.monotonic() < stop:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes almost nothing
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host, port))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(payload)
        except OSError:
            outcomes[f"{kind} refused"] = outcomes.get(f"{kind} refused", 0) + 1
            sock.close()
            await asyncio.sleep(0.05)
            continue
        try:
            if kind == "malformed":
                await reader.read(1024)
                outcomes["malformed answered"] = outcomes.get("malformed answered", 0) + 1
            elif kind == "slow":  # never reads: waits until the server cuts it
                while time.monotonic() < stop and not writer.transport.is_closing():
                    await asyncio.sleep(0.5)
            else:  # reads nothing but the server's close
                await asyncio.wait_for(reader.read(1), timeout=max(stop - time.monotonic(), 0.01))
            if time.monotonic() < stop and kind != "malformed":
                outcomes[f"{kind} cut"] = outcomes.get(f"{kind} cut", 0) + 1
        except (TimeoutError, OSError):
            pass  # the run ended, or the server reset it
        writer.close()


async def guesser(session: aiohttp.ClientSession, url: str, stop: float, outcomes: dict[str, int], n: int) -> None:
    i = 0
    while time.monotonic() < stop:
        i += 1
        try:
            guess = {"Authorization": aiohttp.encode_basic_auth("prometheus", f"guess-{n}-{i}")}
            async with session.get(url, headers=guess) as resp:
                await resp.read()
                outcomes[f"guess HTTP {resp.status}"] = outcomes.get(f"guess HTTP {resp.status}", 0) + 1
        except aiohttp.ClientError:
            outcomes["guess refused"] = outcomes.get("guess refused", 0) + 1


def run_hostiles(url: str, mix: dict[str, int], seconds: float) -> dict[str, int]:
    async def all_of_them() -> dict[str, int]:
        outcomes: dict[str, int] = {}
        stop = time.monotonic() + seconds
        port = int(url.split(":")[2].split("/")[0])
        async with aiohttp.ClientSession() as guessing:
            await asyncio.gather(*(hostile(port, kind, stop, outcomes) for kind in ("slow", "idle", "half", "malformed")
                                   for _ in range(mix.get(kind, 0))),
                                 *(guesser(guessing, url, stop, outcomes, n) for n in range(mix.get("guessers", 0))))
        return outcomes

    return asyncio.run(all_of_them())


async def soak(url: str, pid: int, scrapers: int, seconds: float, interval: float = 0.0,
               mix: dict[str, int] | None = None, fresh_connections: bool = False) -> None:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    rss: list[tuple[float, float]] = []
    stop = time.monotonic() + seconds
    headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip"}
    if mix:
        headers["Authorization"] = aiohttp.encode_basic_auth("prometheus", PASSWORD)
    connector = aiohttp.TCPConnector(local_addr=(HONEST_ADDRESS, 0), force_close=fresh_connections,
                                     limit=max(scrapers, 100))
    async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
        before = await self_metrics(session, url)
        cpu_before = cpu_seconds(pid)
        # The hostile clients run in a process of their own, so that their work does not
        # delay the honest scrapers' own event loop (and read as server latency).
        pool = ProcessPoolExecutor(1)
        hostiles = [asyncio.get_running_loop().run_in_executor(pool, run_hostiles, url, mix, seconds)] if mix else []

        async def scraper() -> None:
            # Back to back (interval 0), or once per interval from a random phase, as Prometheus
            # spreads its targets.
            next_at = time.monotonic() + random.uniform(0, interval)
            while next_at < stop:
                await asyncio.sleep(max(next_at - time.monotonic(), 0))
                next_at = max(next_at + interval, time.monotonic()) if interval else time.monotonic()
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

        results = await asyncio.gather(watch(), *(scraper() for _ in range(scrapers)), *hostiles)
        outcomes = results[-1] if mix else {}
        cpu = cpu_seconds(pid) - cpu_before
        pool.shutdown()
        after = await self_metrics(session, url)
        async with session.get(url) as resp:
            text = await resp.text()
        refused = {s.labels["reason"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "gpunet_exporter_http_refused_total" and s.value}
        bad = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name == "gpunet_exporter_http_bad_requests_total")
    latencies.sort()
    q = lambda p: 1000 * latencies[min(int(p * len(latencies)), len(latencies) - 1)]  # noqa: E731
    pace = f"each every {interval:g} s" if interval else "back to back"
    connections = "a new connection each" if fresh_connections else "kept alive"
    print(f"{scrapers} scrapers ({pace}, {connections}) x {seconds:.0f} s: {len(latencies)} of "
          f"{len(latencies) + sum(errors.values())} scrapes answered 200 ({len(latencies) / seconds:.0f}/s), "
          f"errors {errors or 0}")
    print(f"latency ms: p50 {q(0.5):.2f}  p90 {q(0.9):.2f}  p99 {q(0.99):.2f}  max {1000 * latencies[-1]:.2f}")
    print("RSS MB over time: " + ", ".join(f"{t:.0f}s {m:.1f}" for t, m in rss) +
          f"; max {max(m for _, m in rss):.1f} (the unit's MemoryMax: 128)")
    print(f"exporter CPU: {100 * cpu / seconds:.0f}% of a core (of {os.cpu_count()} here, "
          f"load average {os.getloadavg()[0]:.1f} at the end)")
    if mix:
        print("hostile mix: " + ", ".join(f"{k} {v}" for k, v in mix.items()))
        print("hostile clients got: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        print("the exporter turned away: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(refused.items())) +
              f", bad requests {bad:.0f}")
    for tick in ("fast", "slow"):
        ran = after.get(("gpunet_exporter_ticks_total", tick), 0) - before.get(("gpunet_exporter_ticks_total", tick), 0)
        late = after.get(("gpunet_exporter_ticks_late_total", tick), 0) - \
            before.get(("gpunet_exporter_ticks_late_total", tick), 0)
        print(f"{tick} ticks during the soak: {ran:.0f} ran, {late:.0f} late")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scrapers", type=int, default=None, help="concurrent honest scrapers (default 50; 1 with --flood)")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=None,
                   help="seconds between one scraper's scrapes (default: back to back; 1 with --hostile)")
    p.add_argument("--hostile", action="store_true", help="add the hostile mix, with basic auth on")
    p.add_argument("--flood", action="store_true",
                   help="300 silent connections and 100 guessers beside one scraper, with basic auth on")
    p.add_argument("--fresh-connections", action="store_true", help="each honest scrape on a new connection")
    p.add_argument("--slow-readers", type=int, default=40)
    p.add_argument("--idle", type=int, default=40)
    p.add_argument("--half-sent", type=int, default=40)
    p.add_argument("--guessers", type=int, default=20)
    p.add_argument("--malformed", type=int, default=10)
    args = p.parse_args()
    mix = {"slow": args.slow_readers, "idle": args.idle, "half": args.half_sent, "guessers": args.guessers,
           "malformed": args.malformed} if args.hostile else None
    scrapers, interval = args.scrapers or (1 if args.flood else 50), args.interval
    if args.flood:
        mix = dict(FLOOD)
        interval = 0.1 if interval is None else interval
    with tempfile.TemporaryDirectory() as tmp:
        node = Path(tmp) / "node"
        subprocess.run([sys.executable, str(REPO / "bench" / "make_fixture.py"), str(node)], check=True,
                       stdout=subprocess.DEVNULL)
        port = 19000 + os.getpid() % 1000
        flags = []
        if mix:
            import bcrypt

            web = Path(tmp) / "web.yml"
            hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
            web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
            flags = [f"--web.config.file={web}"]
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "--root", str(node), "--listen",
                                 f"127.0.0.1:{port}", *flags], cwd=REPO, stderr=subprocess.DEVNULL)
        try:
            time.sleep(3)  # start and warm up
            interval = interval if interval is not None else 1.0 if mix else 0.0
            asyncio.run(soak(f"http://127.0.0.1:{port}/metrics", proc.pid, scrapers, args.seconds, interval, mix,
                             args.fresh_connections))
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
