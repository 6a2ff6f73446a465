"""gpunet-trace: move incidents between Prometheus and trace files.

    gpunet-trace export --prometheus URL --since 30m [--match SELECTOR] OUT.om.gz
    gpunet-trace load TRACE [--data DIR] [--serve [--listen 127.0.0.1:9090]]

export writes the raw samples a server holds for the gpunet series (range-vector
queries: the samples as scraped, not resampled), a family at a time, split by time so no
single query is large; its progress is one line rewritten in place on a terminal, and
elsewhere (a log, a pipe) a line every PROGRESS_EVERY_S seconds at most, then the summary.
load backfills a trace into a Prometheus data folder with
`promtool tsdb create-blocks-from openmetrics` and can serve it for investigation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from gpunet.contract import BY_NAME
from gpunet.promapi import (
    PromError,
    PrometheusClient,
    PromLimitError,
    add_connection_arguments,
    client_from_arguments,
    where_data_is,
)
from gpunet.trace import TraceWriter, open_trace, unwritable
from gpunet.window import ArgumentParser, resolve, rfc3339, window_problem
from gpunet.words import printable

CHUNK_SECONDS = 3600.0  # one range query covers at most this much time
MIN_CHUNK_SECONDS = 60.0  # ... and a query refused over a limit is halved down to this
# Off a terminal, a progress line at most this often: a long export shows it is alive, a
# short one prints only its summary.
PROGRESS_EVERY_S = 30.0


class Progress:
    """An export's progress on `stream`: on a terminal one line rewritten in place (families
    done, the share, the family just written); elsewhere a line at most every `every`
    seconds. `done()` clears the terminal's line before the summary is printed."""

    def __init__(self, stream: TextIO, every: float = PROGRESS_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.stream, self.every, self.clock = stream, every, clock
        self.tty = stream.isatty()
        self.last = clock()
        self.shown = False

    def __call__(self, done: int, total: int, name: str, series: int) -> None:
        share = f"{100 * done / max(total, 1):.0f}%"
        line = f"exported {done}/{total} families ({share}), last {printable(name)}: {series} series"
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self.shown = True
        elif self.clock() - self.last >= self.every:
            self.stream.write(line + "\n")
            self.stream.flush()
            self.last = self.clock()

    def done(self) -> None:
        if self.tty and self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def _inner(selector: str) -> tuple[str | None, str]:
    """'name{a="b"}' -> ('name', 'a="b"'); '{a="b"}' -> (None, 'a="b"')."""
    selector = selector.strip()
    name, brace, rest = selector.partition("{")
    return (name.strip() or None), rest.rstrip().removesuffix("}") if brace else ""


def _type_of(name: str, metadata: dict[str, list[dict]]) -> str:
    if name in BY_NAME:
        return BY_NAME[name].type
    for key in (name, name.removesuffix("_total")):
        if metadata.get(key):
            t = metadata[key][0].get("type", "gauge")
            return t if t in ("counter", "gauge") else "gauge"
    return "counter" if name.endswith("_total") else "gauge"


async def _samples(client: PrometheusClient, selector: str, start: float, end: float, first: bool) -> list[dict]:
    """The raw samples of `selector` in (start, end], as a range vector returns them (the
    first chunk reaches back a millisecond, so that a sample exactly at the export's start
    is kept). A query refused over a limit (the server's, or the size of an answer) is
    halved in time and run again, down to MIN_CHUNK_SECONDS."""
    try:
        answer = await client.query(f"{selector}[{round((end - start) * 1000) + first}ms]", end)
        return answer.get("result", [])
    except PromLimitError:
        if end - start <= MIN_CHUNK_SECONDS:
            raise
        middle = round((start + end) / 2, 3)
        before, after = await asyncio.gather(_samples(client, selector, start, middle, first),
                                             _samples(client, selector, middle, end, False))
        return before + after


async def export(client: PrometheusClient, out: Path, start: float, end: float, match: str | None,
                 progress: Callable[[int, int, str, int], None] | None = None) -> int:
    """Write the gpunet series the server holds in [start, end] (narrowed by `match`) into
    `out`, a family at a time; `progress(families done, families, family, its series)`
    after each. Returns the samples written."""
    selected_name, matchers = _inner(match) if match else (None, "")
    selector = "{" + ",".join(m for m in ('__name__=~"gpunet_.*"', matchers) if m) + "}"
    names = [selected_name] if selected_name else sorted(await client.label_values("__name__", [selector], start, end))
    if not names:
        raise PromError(f"{client.url}: no gpunet series between {rfc3339(start)} and {rfc3339(end)}; "
                        f"{await where_data_is(client, time.time())}")
    metadata = await client.metadata()
    chunks = []
    t = start
    while t < end:
        chunks.append((t, min(t + CHUNK_SECONDS, end)))
        t += CHUNK_SECONDS
    with TraceWriter(out) as writer:
        for i, name in enumerate(names):
            inner = ",".join(m for m in (f'__name__="{name}"', matchers) if m)
            results = await asyncio.gather(*(_samples(client, "{" + inner + "}", cs, ce, k == 0)
                                             for k, (cs, ce) in enumerate(chunks)))
            series: dict[tuple, tuple[dict, list, list]] = {}
            for result in results:
                for item in result:
                    labels = {k: v for k, v in item["metric"].items() if k != "__name__"}
                    entry = series.setdefault(tuple(sorted(labels.items())), (labels, [], []))
                    for ts, value in item.get("values", []):
                        if entry[1] and ts <= entry[1][-1]:
                            continue  # chunk boundaries: each sample once
                        entry[1].append(ts)
                        entry[2].append(float(value))
            if progress:
                progress(i + 1, len(names), name, len(series))
            if not series:
                continue
            writer.family(name, _type_of(name, metadata))
            for key in sorted(series):
                labels, ts, vs = series[key]
                writer.series(name, labels, ts, vs)
        return writer.samples


def copy_plain(trace: Path, plain: Path) -> tuple[float, float, int]:
    """Write the trace uncompressed (promtool reads no gzip) and, in the same pass, find its
    (first, last, samples) timestamps; a malformed line is refused with its number."""
    lo, hi, n = float("inf"), float("-inf"), 0
    with open_trace(trace) as src, open(plain, "wb") as dst:  # gzip or not by its first bytes; a pipe too
        for lineno, line in enumerate(src, 1):
            dst.write(line)
            if line.startswith(b"#") or not line.strip():
                continue
            try:
                t = float(line.rsplit(b" ", 2)[-1])
            except (ValueError, IndexError):
                text = line.decode("utf-8", "replace").strip()[:80]
                raise ValueError(f"{trace}:{lineno}: sample without a timestamp: {text!r}") from None
            n += 1
            if t < lo:
                lo = t
            if t > hi:
                hi = t
    return lo, hi, n


def load(trace: Path, data: Path) -> tuple[float, float, int]:
    """Backfill a trace into a Prometheus data folder; returns its time range and sample count."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("promtool not found: install Debian's 'prometheus' package")
    data.mkdir(parents=True, exist_ok=True)
    plain = data / trace.name.removesuffix(".gz")
    try:
        first, last, samples = copy_plain(trace, plain)
        result = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(plain), str(data)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"promtool could not load {trace}: {result.stderr.strip() or result.stdout.strip()}")
    finally:
        plain.unlink(missing_ok=True)
    return first, last, samples


def prometheus_command(data: Path, listen: str) -> list[str]:
    config = data / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "15s"}, "scrape_configs": []}))
    # Backfilled traces are old: without a long retention, Prometheus deletes them at start.
    return ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}", f"--web.listen-address={listen}",
            "--storage.tsdb.retention.time=100y", "--query.lookback-delta=5m"]


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="gpunet-trace", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write what a Prometheus server holds into a trace file")
    e.add_argument("out", help="trace file to write (.om or .om.gz)")
    e.add_argument("--prometheus", default=os.environ.get("GPUNET_PROMETHEUS_URL"),
                   help="Prometheus API base URL (default $GPUNET_PROMETHEUS_URL)")
    e.add_argument("--since", help="window length ending at --end or now, e.g. 30m")
    e.add_argument("--start", help="window start, RFC 3339 or Unix seconds")
    e.add_argument("--end", help="window end, RFC 3339 or Unix seconds (default now)")
    e.add_argument("--match", help='series selector to narrow the export, e.g. \'{job="gpunet"}\'')
    add_connection_arguments(e)
    lo = sub.add_parser("load", help="backfill a trace into a Prometheus data folder")
    lo.add_argument("trace")
    lo.add_argument("--data", help="data folder (default: TRACE name + .tsdb in the current folder)")
    lo.add_argument("--serve", action="store_true", help="then run Prometheus on it until interrupted")
    lo.add_argument("--listen", default="127.0.0.1:9090", help="address for --serve (default 127.0.0.1:9090)")
    return p


def usage_problem(args: argparse.Namespace) -> str | None:
    """A flag that cannot work, found before any work (exit 2)."""
    if args.command == "load":
        _, colon, port = args.listen.rpartition(":")
        if not (colon and port.isdigit() and 1 <= int(port) <= 65535):
            return f"--listen {args.listen}: expected [HOST]:PORT with a port 1-65535"
        return None
    if not args.prometheus:
        return "give --prometheus URL (or set GPUNET_PROMETHEUS_URL)"
    if problem := window_problem(args.since, args.start, args.end, server=True):
        return problem
    if problem := unwritable(args.out):
        return f"{args.out}: {problem}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if problem := usage_problem(args):
        print(f"gpunet-trace: {printable(problem)}", file=sys.stderr)
        return 2
    try:
        if args.command == "export":
            start, end = resolve(args.since, args.start, args.end)

            progress = Progress(sys.stderr)

            async def run() -> int:
                async with client_from_arguments(args.prometheus, args) as client:
                    return await export(client, Path(args.out), start, end, args.match, progress)

            try:
                samples = asyncio.run(run())
            finally:
                progress.done()
            print(f"wrote {samples} samples from {rfc3339(start)} to {rfc3339(end)} into {args.out}", file=sys.stderr)
            return 0
        trace = Path(args.trace)
        name = trace.name.removesuffix(".gz").removesuffix(".om")
        data = Path(args.data) if args.data else Path(f"{name}.tsdb")
        first, last, samples = load(trace, data)
        print(f"loaded {samples} samples ({rfc3339(first)} .. {rfc3339(last)}) into {data}", file=sys.stderr)
        if args.serve:
            print(f"serving on http://{args.listen}; then: diagnose --prometheus http://{args.listen} "
                  f"--start {first:.0f} --end {last:.0f}", file=sys.stderr)
            os.execvp("prometheus", prometheus_command(data, args.listen))
        return 0
    except (EOFError, zlib.error) as e:  # a gzip cut short, or corrupt
        print(f"gpunet-trace: {printable(getattr(args, 'trace', ''))}: {printable(str(e))}", file=sys.stderr)
        return 1
    except (PromError, ValueError, RuntimeError, OSError) as e:
        # A server's error text (or promtool's) is printed escaped: its ESC must not drive the terminal.
        print(f"gpunet-trace: {printable(str(e))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
