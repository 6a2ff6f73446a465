"""Read a replay trace (contract section 3) fast, streaming, family by family.

The prometheus_client parser costs tens of microseconds a sample; this reader leans on
the trace's shape instead: a series' samples are contiguous, so a line is split once
from the right (series, value, timestamp) and its labels are parsed only when the
series changes. Numbers are converted in bulk by numpy. Families the diagnoser does not
use are skipped without splitting their lines.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

BLOCK = 1 << 22  # bytes read at a time
MAX_LINE = 1 << 20  # a "line" longer than this is not a sample: refuse it rather than buffer it


class TraceError(Exception):
    """A trace that cannot be read; str() says where (file and line) and what."""


@dataclass
class RawSeries:
    name: str
    labels: dict[str, str]
    timestamps: np.ndarray  # seconds
    values: np.ndarray


_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_series(key: str) -> tuple[str, dict[str, str]]:
    """'name{a="b",c="d"}' -> ('name', {'a': 'b', 'c': 'd'})."""
    name, brace, rest = key.partition("{")
    if not brace:
        return name, {}
    if not rest.endswith("}"):
        raise ValueError("unterminated label set")
    body, labels, pos = rest[:-1], {}, 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if not m or m.end() == pos:
            raise ValueError(f"malformed labels near {body[pos:pos + 30]!r}")
        value = m.group(2)
        if "\\" in value:
            value = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], value)
        labels[m.group(1)] = value
        pos = m.end()
    return name, labels


def _open(path: Path):
    with open(path, "rb") as probe:
        magic = probe.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def read_trace(path: str | Path, wanted: Callable[[str], bool] | None = None,
               warn: Callable[[str], None] | None = None) -> Iterator[RawSeries]:
    """Yield the series of the wanted sample names. Raises TraceError on what cannot be
    read; duplicate or out-of-order samples are dropped with a warning, never fatal."""
    path = Path(path)
    warn = warn or (lambda message: None)
    wanted = wanted or (lambda name: True)
    lineno = 0
    key: bytes | None = None
    skip_family = False
    values: list[bytes] = []
    stamps: list[bytes] = []
    seen_eof = False
    warned_order = 0

    def flush() -> RawSeries | None:
        nonlocal warned_order
        if key is None or not values:
            return None
        try:
            name, labels = parse_series(key.decode("utf-8", "replace"))
        except ValueError as e:
            raise TraceError(f"{path}:{lineno}: {e}: {key[:120]!r}") from None
        try:
            v = np.array(values).astype(np.float64)
            t = np.array(stamps).astype(np.float64)
        except ValueError:
            bad = next(i for i, (a, b) in enumerate(zip(values, stamps)) if not _is_number(a) or not _is_number(b))
            raise TraceError(f"{path}:{lineno - len(values) + bad}: not a number: "
                             f"{values[bad][:40]!r} {stamps[bad][:40]!r}") from None
        if len(t) > 1 and not np.all(np.diff(t) > 0):
            order = np.argsort(t, kind="stable")
            t, v = t[order], v[order]
            keep = np.concatenate(([True], np.diff(t) > 0))
            if warned_order < 5:
                warn(f"{path}: {key[:100].decode(errors='replace')}: {len(keep) - keep.sum()} duplicate or "
                     f"out-of-order samples dropped")
            warned_order += 1
            t, v = t[keep], v[keep]
        return RawSeries(name, labels, t, v)

    try:
        with _open(path) as f:
            tail = b""
            while True:
                block = f.read(BLOCK)
                if not block:
                    break
                lines = (tail + block).split(b"\n")
                tail = lines.pop()
                if len(tail) > MAX_LINE:
                    raise TraceError(f"{path}:{lineno + len(lines) + 1}: a line of over {MAX_LINE} bytes")
                for line in lines:
                    lineno += 1
                    if not line:
                        continue
                    if line[0] == 35:  # '#'
                        if line.startswith(b"# TYPE "):
                            family = line.split(b" ", 3)[2].decode()
                            skip_family = not (wanted(family) or wanted(family + "_total"))
                        elif line.startswith(b"# EOF"):
                            seen_eof = True
                        continue
                    if skip_family:
                        continue
                    parts = line.rsplit(b" ", 2)
                    if len(parts) != 3:
                        raise TraceError(f"{path}:{lineno}: expected 'series value timestamp' "
                                         f"(every sample of a trace has a timestamp): {line[:120]!r}")
                    if parts[0] != key:
                        series = flush()
                        if series is not None and wanted(series.name):
                            yield series
                        key, values, stamps = parts[0], [], []
                    values.append(parts[1])
                    stamps.append(parts[2])
            if tail.strip():
                raise TraceError(f"{path}:{lineno + 1}: the file ends in the middle of a line (truncated?)")
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise TraceError(f"{path}: compressed stream broken after line {lineno} ({e}): truncated or corrupt "
                         f"file") from None
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror or e}") from None
    series = flush()
    if series is not None and wanted(series.name):
        yield series
    if not seen_eof:
        warn(f"{path}: no '# EOF' line: the trace may be truncated after line {lineno}")


def _is_number(text: bytes) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def frame_from_trace(path: str | Path, since: float | None = None, start: float | None = None,
                     end: float | None = None, warn: Callable[[str], None] | None = None):
    """The tidy frame of a trace; the window ends at the trace's last sample unless given."""
    from diagnoser.frame import WANTED, FrameBuilder, choose_step

    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if warn:
            warn(message)

    series = list(read_trace(path, lambda name: name in WANTED, note))
    if not series:
        raise TraceError(f"{path}: no gpunet series in the trace")
    last = max(float(s.timestamps[-1]) for s in series if len(s.timestamps))
    first = min(float(s.timestamps[0]) for s in series if len(s.timestamps))
    end_t = end if end is not None else last
    start_t = start if start is not None else (end_t - since if since is not None else first)
    start_t = max(start_t, first)
    if end_t <= start_t:
        raise TraceError(f"{path}: the window holds no samples (trace covers {first:.0f}..{last:.0f})")
    gaps = [np.median(np.diff(s.timestamps)) for s in series[:2000] if len(s.timestamps) > 2]
    scrape = float(np.median(gaps)) if gaps else 15.0
    builder = FrameBuilder(f"replay:{Path(path).name}", start_t, end_t, choose_step(start_t, end_t, scrape), scrape)
    for s in series:
        # One scrape before the window start, so the first window's increase is whole.
        keep = (s.timestamps >= start_t - 1.5 * scrape) & (s.timestamps <= end_t)
        builder.add(s.name, s.labels, s.timestamps[keep], s.values[keep])
    builder.warnings.extend(warnings)
    return builder.build()
