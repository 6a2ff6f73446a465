"""Replay traces (docs/trace-format.md): OpenMetrics text with a timestamp on every sample.

    # TYPE gpunet_nic_transmit_bytes counter
    # HELP gpunet_nic_transmit_bytes Bytes sent on the wire, RDMA included.
    gpunet_nic_transmit_bytes_total{device="ib0",instance="node-001:9845",job="gpunet"} 1.5e+12 1767225600.000
    ...
    # EOF

Each family is written once, its series one after the other, each series' samples in
increasing time: the form `promtool tsdb create-blocks-from openmetrics` loads. A path
ending in .gz is gzip-compressed (in a background thread, so that compressing overlaps
formatting). The simulator and `gpunet-trace export` write through this module; the
diagnoser has its own fast reader.

Fast path for writers with many samples per scrape: format each scrape's timestamp once
(`timestamp_suffixes`) and the values once (`format_ints`, `format_fixed`), then hand the
strings to `TraceWriter.series_formatted`.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import queue
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpunet.contract import BY_NAME, unit_of


@contextmanager
def open_trace(path: str | Path) -> Iterator[io.BufferedIOBase]:
    """A trace's bytes, decompressed where it is gzip (told by its first bytes, not its
    name). Opened once and read front to back: a pipe (`<(cat x.om.gz)`) reads as a file."""
    with open(path, "rb") as raw:
        yield gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == b"\x1f\x8b" else raw


def unwritable(path: str | Path) -> str | None:
    """Why no file can be written at `path` (None: it can), told before the work that
    makes it: a folder, a folder that does not exist, one not writable, a read-only file."""
    target = Path(path).absolute()
    if str(path).endswith("/") or target.is_dir():
        return "a folder: give a file name in it"
    if target.exists():
        return None if os.access(target, os.W_OK) else "not writable"
    folder = target.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        return f"no writable folder {folder}"
    return None


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label(str(v))}"' for k, v in sorted(labels.items())) + "}"


def format_value(value: float) -> str:
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def family_of(sample_name: str, type_: str) -> str:
    return sample_name.removesuffix("_total") if type_ == "counter" else sample_name


def timestamp_suffixes(timestamps: Sequence[float]) -> list[str]:
    """' <timestamp>\\n' for each timestamp: the tail of every sample line of one scrape."""
    return [f" {t:.3f}\n" for t in timestamps]


def format_ints(values: Sequence[float]) -> list[str]:
    """Integer-valued samples (counters of bytes, packets, events; integral gauges)."""
    return list(map(str, (int(round(v)) for v in values)))


def format_fixed(values: Sequence[float], decimals: int) -> list[str]:
    """Samples with a fixed number of decimals (seconds to the millisecond, ratios)."""
    return list(map(f"%.{decimals}f".__mod__, values))


class _GzipSink:
    """Compresses in a worker thread (zlib releases the GIL), writing a gzip stream with no
    file name and mtime 0, so the same trace always makes the same bytes."""

    def __init__(self, raw, level: int):
        self._raw = raw
        self._z = zlib.compressobj(level, zlib.DEFLATED, 31)
        self._q: queue.Queue = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="trace-gzip", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            data = self._q.get()
            if data is None:
                break
            if self._error is None:
                try:
                    self._raw.write(self._z.compress(data))
                except BaseException as e:  # noqa: BLE001 - re-raised in the writer's thread
                    self._error = e

    def write(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._q.put(data)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._raw.write(self._z.flush())


class TraceWriter:
    """Writes a trace family by family. Usage:

        with TraceWriter("x.om.gz") as w:
            w.family("gpunet_nic_up", "gauge")
            w.series("gpunet_nic_up", {"instance": "n1:9845", "job": "gpunet", "device": "ib0"}, ts, values)
    """

    BUFFER = 1 << 20  # characters gathered before encoding and handing to the sink

    def __init__(self, path: str | Path, compresslevel: int = 6):
        self.path = Path(path)
        self._raw = open(self.path, "wb")
        self._sink = _GzipSink(self._raw, compresslevel) if self.path.suffix == ".gz" else self._raw
        self._buf: list[str] = []
        self._buffered = 0
        self._closed = False
        self._families: set[str] = set()
        self._current: tuple[str, str] | None = None  # (family, type)
        self.samples = 0

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write(self, text: str) -> None:
        self._buf.append(text)
        self._buffered += len(text)
        if self._buffered >= self.BUFFER:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            self._sink.write("".join(self._buf).encode("utf-8"))
            self._buf.clear()
            self._buffered = 0

    def family(self, sample_name: str, type_: str | None = None, help_: str | None = None) -> None:
        """Start the family that `sample_name` belongs to; type and help default to the contract's."""
        spec = BY_NAME.get(sample_name)
        type_ = type_ or (spec.type if spec else "gauge")
        help_ = help_ if help_ is not None else (spec.help if spec else "")
        family = family_of(sample_name, type_)
        if family in self._families:
            raise ValueError(f"family {family} written twice: a trace keeps each family contiguous")
        self._families.add(family)
        self._current = (family, type_)
        self._write(f"# TYPE {family} {type_}\n")
        if unit := unit_of(family):
            self._write(f"# UNIT {family} {unit}\n")
        if help_:
            self._write(f"# HELP {family} {help_}\n")

    def _check(self, sample_name: str) -> None:
        if self._current is None or family_of(sample_name, self._current[1]) != self._current[0]:
            raise ValueError(f"{sample_name}: call family() first")

    def series(self, sample_name: str, labels: dict[str, str], timestamps: Sequence[float],
               values: Sequence[float]) -> None:
        """One series' samples; None (or NaN) values are absent samples and are skipped."""
        self._check(sample_name)
        prefix = sample_name + format_labels(labels) + " "
        lines = [f"{prefix}{format_value(v)} {t:.3f}\n" for t, v in zip(timestamps, values)
                 if v is not None and v == v]
        self._write("".join(lines))
        self.samples += len(lines)

    def series_formatted(self, sample_name: str, labels: dict[str, str], values: Sequence[str],
                         suffixes: Sequence[str]) -> None:
        """Fast path: values already formatted, `suffixes` from timestamp_suffixes()."""
        self._check(sample_name)
        prefix = sample_name + format_labels(labels) + " "
        self._write("".join([prefix + v + s for v, s in zip(values, suffixes)]))
        self.samples += len(values)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._write("# EOF\n")
        self._flush()
        if self._sink is not self._raw:
            self._sink.close()
        self._raw.close()


def write_series(path: str | Path, series: Iterable[tuple[str, dict[str, str], Sequence[float], Sequence[float]]],
                 types: dict[str, str] | None = None) -> int:
    """Write (sample_name, labels, timestamps, values) tuples, grouping them by family."""
    by_name: dict[str, list] = {}
    for name, labels, ts, vs in series:
        by_name.setdefault(name, []).append((labels, ts, vs))
    with TraceWriter(path) as w:
        for name in sorted(by_name):
            w.family(name, (types or {}).get(name))
            for labels, ts, vs in sorted(by_name[name], key=lambda item: sorted(item[0].items())):
                w.series(name, labels, ts, vs)
        return w.samples


def shift_trace(source: str | Path, dest: str | Path, last: float) -> float:
    """Rewrite the trace `source` into `dest` with every sample moved by the same whole number
    of seconds, so that its newest sample lies within the second before `last`; returns
    the shift in seconds. A trace recorded long ago then reads as "the last 30 minutes" to a
    server or service that judges a window ending now. `dest` is gzip when it ends in .gz.
    Labels beside the trace (NAME.labels.json) move with `shift_labels`."""
    newest = float("-inf")
    with open_trace(source) as src:  # first pass: the newest sample
        for lineno, line in enumerate(src, 1):
            if not line.startswith(b"#") and line.strip():
                newest = max(newest, _timestamp(line, source, lineno))
    if newest == float("-inf"):
        raise ValueError(f"{source}: no samples to shift")
    offset = float(math.floor(last - newest))  # whole seconds: the newest lands in (last - 1, last]
    dest = Path(dest)
    with open_trace(source) as src, open(dest, "wb") as raw:
        sink = _GzipSink(raw, 6) if dest.suffix == ".gz" else raw
        for lineno, line in enumerate(src, 1):
            if not line.startswith(b"#") and line.strip():
                head = line.rstrip(b"\r\n").rsplit(b" ", 1)[0]
                line = b"%s %.3f\n" % (head, _timestamp(line, source, lineno) + offset)
            sink.write(line)
        if sink is not raw:
            sink.close()
    return offset


def _timestamp(line: bytes, source: str | Path, lineno: int) -> float:
    try:
        return float(line.rsplit(b" ", 2)[-1])
    except (ValueError, IndexError):
        text = line.decode("utf-8", "replace").strip()[:80]
        raise ValueError(f"{source}:{lineno}: sample without a timestamp: {text!r}") from None


def shift_labels(labels: dict, offset: float) -> dict:
    """A trace's labels (NAME.labels.json) with every incident's and waited-on span moved by
    `offset` seconds, as `shift_trace` moved the trace."""
    moved = dict(labels)
    for key in ("incidents", "waited_on"):
        if key in labels:
            moved[key] = [{**item, **{edge: item[edge] + offset for edge in ("start", "end") if edge in item}}
                          for item in labels[key]]
    return moved
