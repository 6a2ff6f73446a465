"""Read a replay trace (docs/trace-format.md) fast, streaming, family by family.

The prometheus_client parser costs tens of microseconds a sample; this reader leans on
the trace's shape instead: a series' samples are contiguous, so a block of sample lines
is cut into runs of one series by the lines' byte layout (numpy), its numbers parsed by
pandas' C parser, and a series' labels parsed once. Families the diagnoser does not use
are skipped whole. A block that is not clean goes line by line, which repairs and warns.
"""

from __future__ import annotations

import csv
import gzip
import io
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from queue import Full, Queue
from typing import TypeVar

import numpy as np
import pandas as pd

from diagnoser.model.frame import WANTED, Frame, FrameBuilder, choose_step, data_window
from diagnoser.model.netconfig import SPARSE
from diagnoser.sources.exposition import parse_series
from gpunet import contract as c
from gpunet.trace import format_labels, open_trace
from gpunet.window import LAST_SECOND

BLOCK = 1 << 22  # bytes read at a time
_T = TypeVar("_T")
# No gpunet value reaches this: a byte counter of a 1.6 Tb/s port takes 300 years to get
# there. Larger samples are garbage (1e308), dropped with a warning rather than believed.
IMPOSSIBLE = 1e21
NON_NEGATIVE = frozenset({c.NIC_LINK_SPEED.name, c.NIC_UP.name, c.GPU_SM_CLOCK.name})  # gauges that cannot be < 0
MAX_LINE = 1 << 20  # a "line" longer than this is not a sample: refuse it rather than buffer it


class TraceError(Exception):
    """A trace that cannot be read; str() says where (file and line) and what."""


@dataclass
class RawSeries:
    name: str
    labels: dict[str, str]
    timestamps: np.ndarray  # seconds
    values: np.ndarray
    line: int = 0  # where its first sample is


MAX_WARNINGS = 5  # of one kind; the rest are counted in one closing line
MAX_NAMED = 3  # series outside the contract named in the warning that counts them
MAX_INSTANCES = 10_000  # nodes in one trace
MAX_PER_INSTANCE = 256  # NICs, and GPUs, of one node


class _Warnings:
    """Bounded warnings: a hostile trace can hold millions of damaged series."""

    def __init__(self, path: Path, warn: Callable[[str], None]):
        self.path, self.warn = path, warn
        self.counts: dict[str, int] = {}

    def __call__(self, kind: str, message: str) -> None:
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if n <= MAX_WARNINGS:
            self.warn(message)

    def close(self) -> None:
        for kind, n in self.counts.items():
            if n > MAX_WARNINGS:
                self.warn(f"{self.path}: {n - MAX_WARNINGS} more series with {kind} (warned for the first "
                          f"{MAX_WARNINGS})")


def read_trace(path: str | Path, wanted: Callable[[str], bool] | None = None,
               warn: Callable[[str], None] | None = None,
               sparse: Callable[[str], bool] | None = None) -> Iterator[RawSeries]:
    """Yield the series of the wanted sample names. Raises TraceError on what cannot be
    read at all (a line too long, a broken compressed stream); damage to single lines and
    series is repaired with a warning naming file, line and series, never fatal: a sample
    line of the wrong shape (no timestamp) or a value that is no number (the sample
    dropped), malformed labels (the series skipped), duplicate or out-of-order samples,
    NaN/Inf values or timestamps, negative counters, samples outside their family's block,
    a last line cut short. Series outside the gpunet contract are skipped and counted.

    `sparse` families (constant configuration gauges, sampled at every scrape) keep only the
    samples where a series' value changes, and its last one."""
    reader = _TraceReader(Path(path), wanted or (lambda name: True), warn or (lambda message: None),
                          sparse or (lambda name: False))
    yield from reader.series()


@dataclass
class _Parsed:
    """Samples parsed in bulk; `clean`: none that _flush would drop or reorder."""
    values: np.ndarray
    stamps: np.ndarray
    clean: bool


@dataclass
class _Lines:
    """Samples read line by line, as text, from line `line` on."""
    values: list[bytes]
    stamps: list[bytes]
    line: int


class _TraceReader:
    """One pass over a trace. Decompression runs on a thread of its own (zlib lets go of
    the GIL), the parsing here. A block of sample lines of one family, each `series value
    timestamp` with no space inside the series (all a well-formed trace holds), is parsed
    at once: its numbers by pandas' C parser, its series boundaries from the lines' key
    lengths and a byte count (_regular_block). Anything else (comments, blank lines, a
    label value with a space, a value that is no number...) goes line by line through
    `_line`, which repairs and warns."""

    def __init__(self, path: Path, wanted: Callable[[str], bool], warn: Callable[[str], None],
                 sparse: Callable[[str], bool]):
        self.path, self.wanted, self.sparse = path, wanted, sparse
        self.notes = _Warnings(path, warn)
        self.lineno = 0
        self.key: bytes | None = None
        self.key_line = 0  # line of the current series' first sample
        self.parts: list[_Parsed | _Lines] = []  # the current series' samples, in order
        self.values: list[bytes] = []  # the line-by-line part being filled
        self.stamps: list[bytes] = []
        self.values_line = 0
        self.skip_family = False
        self.sparse_family = False
        self.repeat = b""  # a sparse series' key and its last kept value: a line starting so repeats it
        self.pending: bytes | None = None  # the latest repeated line (kept as the series' last sample)
        self.pending_line = 0
        self.family_b = b""
        self.seen_eof = False
        self.unknown = 0
        self.unknown_first = 0
        self.unknown_named: list[str] = []
        self.stamps_seen: dict[bytes, np.ndarray] = {}

    # --- the pass -----------------------------------------------------------------------------
    def series(self) -> Iterator[RawSeries]:
        try:
            for body in _bodies(self.path, self._reads):
                if isinstance(body, _Body):
                    yield from self._body(body)
                    continue
                tail = body
                if len(tail) > MAX_LINE:
                    raise TraceError(f"{self.path}:{self.lineno + 1}: a line of over {MAX_LINE} bytes")
                if tail.strip() == b"# EOF":
                    self.seen_eof = True  # the last line without its newline
                elif tail.strip():
                    self.notes("cut lines", f"{self.path}:{self.lineno + 1}: the file ends in the middle of a line "
                               "(truncated?): that line skipped")
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise TraceError(f"{self.path}:{self.lineno + 1}: compressed stream broken after line {self.lineno} "
                             f"({e}): truncated or corrupt file") from None
        except OSError as e:
            raise TraceError(f"{self.path}: {e.strerror or e}") from None
        self._settle()
        series = self._flush()
        if series is not None:
            yield series
        if self.unknown:
            more = ", ..." if self.unknown > len(self.unknown_named) else ""
            self.notes("series outside the contract", f"{self.path}:{self.unknown_first}: {self.unknown} series or "
                       f"families outside the gpunet contract skipped: {', '.join(self.unknown_named)}{more}")
        if not self.seen_eof:
            self.notes("no EOF", f"{self.path}: no '# EOF' line: the trace may be truncated after line {self.lineno}")
        self.notes.close()

    def _reads(self, family: bytes) -> bool:
        """Whether samples after `# TYPE family` are read (as _line decides)."""
        name = family.decode("utf-8", "replace")
        return self.wanted(name) or self.wanted(name + "_total")

    def _body(self, body: _Body) -> Iterator[RawSeries]:
        """Whole lines: runs of sample lines in bulk, comments and blank lines one by one."""
        data, starts, ends = body.data, body.starts, body.ends
        if len(data) > MAX_LINE and int((ends - starts).max()) > MAX_LINE:
            long = int(np.argmax(ends - starts > MAX_LINE))
            raise TraceError(f"{self.path}:{self.lineno + long + 1}: a line of over {MAX_LINE} bytes")
        at = 0
        for k in [*body.special, len(ends)]:
            if k > at:
                yield from self._samples(body, at, k)
            if k < len(ends):
                yield from self._line(data[starts[k]:ends[k]])
            at = k + 1

    def _samples(self, body: _Body, a: int, b: int) -> Iterator[RawSeries]:
        """Lines a..b-1 of the body, all sample lines (no comment, no blank line)."""
        if not self.skip_family:
            prepared = body.prepared[a] if a in body.prepared else _prepare(body, a, b)
            if prepared is not None:
                block = prepared.block
                yield from self._runs(block, _runs_of(block, prepared), prepared.values, prepared.stamps)
                return
        data, lo, hi = body.data, int(body.starts[a]), int(body.ends[b - 1]) + 1
        if self.skip_family and data.startswith(self.family_b, lo, hi) and \
                data.count(b"\n" + self.family_b, lo, hi - 1) == b - a - 1:
            self.lineno += b - a  # a family the diagnoser does not read, whole: counted, not copied
            return
        for line in data[lo:hi - 1].split(b"\n"):
            yield from self._line(line)

    def _runs(self, block: bytes, runs: list[tuple[int, int, int, int, bool]], values: np.ndarray,
              stamps: np.ndarray) -> Iterator[RawSeries]:
        """Append each series' run of samples (parsed in bulk) to its series."""
        self._settle()
        first_line = self.lineno + 1
        for a, b, key_start, key_end, clean in runs:
            key = block[key_start:key_end]
            if key != self.key:
                series = self._flush()
                if series is not None:
                    yield series
                self.key, self.key_line = key, first_line + a
            v, t = values[a:b].copy(), stamps[a:b]  # a copy: a view would keep the whole block alive
            if self.sparse_family and len(v) > 2:  # value changes only, and the last sample
                keep = np.concatenate(([True], v[1:] != v[:-1]))
                keep[-1] = True
                v, t = v[keep], t[keep]
            self.parts.append(_Parsed(v, t, clean))
        self.lineno += len(values)

    # --- line by line ----------------------------------------------------------------------------
    def _line(self, line: bytes) -> Iterator[RawSeries]:
        self.lineno += 1
        lineno = self.lineno
        if not line:
            return
        if line[0] == 35:  # '#'
            if line.startswith(b"# TYPE "):
                self.family_b = _family_of(line)
                family = self.family_b.decode("utf-8", "replace")
                self.skip_family = not self._reads(self.family_b)
                self.sparse_family = not self.skip_family and self.sparse(family)
                if self.skip_family and not family.startswith("gpunet_"):
                    self._outside_contract(lineno, family)
            elif line.startswith(b"# EOF"):
                self.seen_eof = True
            return
        if self.skip_family:
            if line.startswith(self.family_b):
                return
            # A sample outside its family's block (no TYPE line of its own).
            self.family_b = line.split(b"{", 1)[0].split(b" ", 1)[0]
            family = self.family_b.decode("utf-8", "replace")
            self.skip_family = not self.wanted(family)
            self.sparse_family = not self.skip_family and self.sparse(family)
            if self.skip_family:
                if not family.startswith("gpunet_"):
                    self._outside_contract(lineno, family)
                return
            self.notes("samples outside their family's block", f"{self.path}:{lineno}: samples of {family[:80]} "
                       f"outside their family's '# TYPE' block: read")
        if self.sparse_family and self.repeat and line.startswith(self.repeat):
            self.pending, self.pending_line = line, lineno
            return
        if self.pending is not None:
            self._keep_pending()
        parts = line.rsplit(b" ", 2)
        if len(parts) != 3:
            self._malformed_line(lineno, line)
            return
        if parts[0] != self.key:
            series = self._flush()
            if series is not None:
                yield series
            self.key, self.key_line = parts[0], lineno
        self._append(parts[1], parts[2], lineno)
        self.repeat = parts[0] + b" " + parts[1] + b" " if self.sparse_family else b""

    def _append(self, value: bytes, stamp: bytes, lineno: int) -> None:
        if not self.values:
            self.values_line = lineno
        self.values.append(value)
        self.stamps.append(stamp)

    def _settle(self) -> None:
        """Close the line-by-line part of the current series (before samples parsed in bulk)."""
        if self.pending is not None:
            self._keep_pending()
        self.repeat = b""
        if self.values:
            self.parts.append(_Lines(self.values, self.stamps, self.values_line))
            self.values, self.stamps = [], []

    def _keep_pending(self) -> None:
        pending, self.pending = self.pending, None
        assert pending is not None
        parts = pending.rsplit(b" ", 2)
        if len(parts) == 3 and parts[0] == self.key:
            self._append(parts[1], parts[2], self.pending_line)
        else:
            self._malformed_line(self.pending_line, pending)

    def _malformed_line(self, line: int, text: bytes) -> None:
        self.notes("malformed sample lines", f"{self.path}:{line}: expected 'series value timestamp' (every sample "
                   f"of a trace has a timestamp): {_text(text, 120)!r}: line skipped")

    def _outside_contract(self, line: int, name: str) -> None:
        self.unknown += 1
        self.unknown_first = self.unknown_first or line
        if len(self.unknown_named) < MAX_NAMED:
            self.unknown_named.append(f"{name[:80] or 'a sample without a metric name'} (line {line})")

    # --- a series, whole ---------------------------------------------------------------------------
    def _flush(self) -> RawSeries | None:
        key = self.key
        if self.values:
            self.parts.append(_Lines(self.values, self.stamps, self.values_line))
        parts, self.parts, self.values, self.stamps = self.parts, [], [], []
        if key is None or not parts:
            return None
        name = key.partition(b"{")[0].decode("utf-8", "replace")
        if not self.wanted(name):
            if not name.startswith("gpunet_"):
                self._outside_contract(self.key_line, name)
            return None
        where = f"{self.path}:{self.key_line}"
        try:
            name, labels = parse_series(key.decode("utf-8", "replace"))
        except ValueError as e:
            count = sum(len(p.values) for p in parts)
            self.notes("malformed series", f"{where}: {e}: {_text(key, 120)!r}: its {count} samples skipped")
            return None
        if len(parts) == 1 and isinstance(parts[0], _Parsed) and parts[0].clean:  # nothing to repair
            return RawSeries(name, labels, self._shared(parts[0].stamps), parts[0].values, self.key_line)
        arrays = [(p.values, p.stamps, None) if isinstance(p, _Parsed) else self._numbers(p) for p in parts]
        v = np.concatenate([p[0] for p in arrays]) if len(arrays) > 1 else arrays[0][0]
        t = np.concatenate([p[1] for p in arrays]) if len(arrays) > 1 else arrays[0][1]
        series = key[:100].decode("utf-8", "replace")
        bad = ~(np.isfinite(t) & np.isfinite(v))
        if name.endswith("_total") or name in NON_NEGATIVE:
            bad |= v < 0  # a counter never goes negative (a reset goes to zero); nor does a speed or a state
        bad |= np.abs(v) > IMPOSSIBLE  # 1e308 is no reading of any counter or gauge
        if bad.any():
            # Samples that were no numbers at all are NaN here, in their places, and were named already.
            odd = bad & ~np.concatenate([np.zeros(len(p[0]), bool) if p[2] is None else p[2] for p in arrays])
            if odd.any():
                self.notes("NaN/Inf/negative samples", f"{where}: {series}: {int(odd.sum())} samples with a NaN, "
                           f"infinite, negative or impossible (over 1e21) value or timestamp dropped (the first at "
                           f"line {self.key_line + int(np.argmax(odd))})")
            t, v = t[~bad], v[~bad]
        if len(t) > 1:
            step = np.diff(t)
            if not np.all(step > 0):
                what = []
                if np.any(step < 0):
                    order = np.argsort(t, kind="stable")
                    t, v = t[order], v[order]
                    step = np.diff(t)
                    what.append("samples out of order (sorted)")
                keep = np.concatenate(([True], step > 0))
                if not keep.all():
                    what.append(f"{len(keep) - int(keep.sum())} duplicate timestamps dropped (the first kept)")
                    t, v = t[keep], v[keep]
                self.notes("duplicate or out-of-order samples", f"{where}: {series}: {', '.join(what)}")
        return RawSeries(name, labels, self._shared(t), v, self.key_line)

    def _shared(self, stamps: np.ndarray) -> np.ndarray:
        """One array for equal timestamps: every series of a node is scraped at the same times,
        so this halves what a trace holds in memory."""
        key = stamps.tobytes()
        shared = self.stamps_seen.get(key)
        if shared is None:
            shared = self.stamps_seen[key] = stamps.copy()  # not a view that keeps its whole block alive
        return shared

    def _numbers(self, part: _Lines) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(values, timestamps, which were no numbers: None where all were); those that were
        not are NaN, to be dropped with the rest, and said here, once."""
        values, stamps, line = part.values, part.stamps, part.line
        try:
            return np.array(values).astype(np.float64), np.array(stamps).astype(np.float64), None
        except ValueError:
            numbers = np.array([_is_number(a) and _is_number(b) for a, b in zip(values, stamps)])
            bad = int(np.argmin(numbers))
            more = len(numbers) - int(numbers.sum()) - 1
            self.notes("samples that are no numbers", f"{self.path}:{line + bad}: not a number: value "
                       f"{_text(values[bad])!r}, timestamp {_text(stamps[bad])!r}: dropped"
                       + (f", with {more} more of the series' samples near it" if more else ""))
            return (np.array([float(a) if ok else np.nan for a, ok in zip(values, numbers)]),
                    np.array([float(b) if ok else np.nan for b, ok in zip(stamps, numbers)]), ~numbers)


@dataclass
class _Body:
    """Whole lines of the trace, with where its lines and fields are (found on the reading
    thread): `breaks`, offsets of bytes <= 32; `special`, comment and blank lines; and the
    blocks of sample lines already prepared, by their first line."""
    data: bytes
    starts: np.ndarray
    ends: np.ndarray
    breaks: np.ndarray
    special: list[int]
    prepared: dict[int, _Prepared | None]


@dataclass
class _Prepared:
    """A block of sample lines whose every line is `key value timestamp`, with exactly two
    spaces, and both numbers parse."""
    block: bytes  # the lines themselves
    values: np.ndarray
    stamps: np.ndarray
    starts: np.ndarray  # per line, offsets in the block
    first: np.ndarray  # the space after the key
    ends: np.ndarray
    changed: np.ndarray  # lines where a new series may start
    odd: np.ndarray  # cumulative count of samples _flush would drop (no number, negative, impossible)
    unordered: np.ndarray  # cumulative count of timestamps not after the line before


def _prepare(body: _Body, a: int, b: int) -> _Prepared | None:
    """Lines a..b-1 of the body parsed at once; None where any line is not a plain sample
    line (the reader then goes line by line and says what is wrong)."""
    lo, hi = int(body.starts[a]), int(body.ends[b - 1]) + 1
    text = np.frombuffer(body.data, np.uint8, hi - lo, lo)
    breaks = body.breaks[np.searchsorted(body.breaks, lo):np.searchsorted(body.breaks, hi)] - lo
    n = b - a
    if len(breaks) != 3 * n or not np.array_equal(text[breaks].reshape(n, 3), np.broadcast_to(_LINE_SHAPE, (n, 3))):
        return None
    first, second, ends = breaks[0::3], breaks[1::3], breaks[2::3]
    starts = np.concatenate(([0], ends[:-1] + 1))
    length = first - starts
    if length.min() < 1 or (second - first).min() < 2 or (ends - second).min() < 2:
        return None  # an empty field
    block = body.data[lo:hi]
    try:
        numbers = pd.read_csv(io.BytesIO(block), sep=" ", header=None, usecols=[1, 2], dtype=np.float64,
                              engine="c", quoting=csv.QUOTE_NONE, keep_default_na=False, na_values=["NaN"],
                              skip_blank_lines=False, encoding_errors="replace").to_numpy()
    except (ValueError, pd.errors.ParserError):
        return None
    if numbers.shape != (n, 2):
        return None
    values, stamps = numbers[:, 0], numbers[:, 1]
    odd = np.cumsum(~(np.isfinite(values) & np.isfinite(stamps)) | (values < 0) | (np.abs(values) > IMPOSSIBLE))
    unordered = np.concatenate(([0, 0], np.cumsum(stamps[1:] <= stamps[:-1])))
    # A line whose key differs in length, or in one of a few bytes where label values
    # differ (the last label's value, the middle), from the line before.
    changed = np.flatnonzero((length[1:] != length[:-1]) | (text[first[1:] - 2] != text[first[:-1] - 2])
                             | (text[first[1:] - 3] != text[first[:-1] - 3])
                             | (text[starts[1:] + length[1:] // 2] != text[starts[:-1] + length[:-1] // 2])) + 1
    return _Prepared(block, values, stamps, starts, first, ends, changed, np.concatenate(([0], odd)), unordered)


def _runs_of(block: bytes, p: _Prepared) -> list[tuple[int, int, int, int, bool]]:
    """[(first line, end line, key start, key end, clean)] per run of one series; a clean
    run holds no sample _flush would drop or reorder."""
    starts, first, ends, odd, unordered = p.starts, p.first, p.ends, p.odd, p.unordered
    bounds = [0, *p.changed.tolist(), len(starts)]
    runs: list[tuple[int, int, int, int, bool]] = []
    typical = 1  # samples in the last series: most series of a trace have as many
    for a, b in zip(bounds[:-1], bounds[1:]):
        at = a
        while at < b:
            # Exact: every line of [at, end) starts with at's key and a space (the keys of a
            # candidate run are all as long), counted at once over the guessed run's bytes.
            key = block[starts[at]:first[at] + 1]
            guess = min(at + typical, b)
            end = at + 1
            if guess > end and block.count(b"\n" + key, int(ends[at]), int(first[guess - 1]) + 1) == guess - at - 1:
                end = guess
            while end < b and block.startswith(key, int(starts[end])):  # a series longer or shorter than guessed
                end += 1
            clean = odd[end] == odd[at] and unordered[end] == unordered[at + 1]
            runs.append((at, end, int(starts[at]), int(first[at]), bool(clean)))
            typical, at = end - at, end
    return runs


_LINE_SHAPE = np.array([32, 32, 10], np.uint8)  # a sample line's separators: space, space, newline


def _lay_out(data: bytes, reads: Callable[[bytes], bool], family: bytes | None) -> tuple[_Body, bytes | None]:
    """Where the lines of `data` (whole lines) are, and its sample blocks prepared where
    the family they follow is read; returns the family the data ends in."""
    text = np.frombuffer(data, np.uint8)
    breaks = np.flatnonzero(text <= 32)  # spaces, newlines and other control bytes: one pass
    ends = breaks[text[breaks] == 10]
    starts = np.concatenate(([0], ends[:-1] + 1))
    special = np.flatnonzero((text[starts] == 35) | (ends == starts)).tolist()  # '#' or a blank line
    body = _Body(data, starts, ends, breaks, special, {})
    at = 0
    for k in [*special, len(ends)]:
        if k > at and (family is None or reads(family)):
            body.prepared[at] = _prepare(body, at, k)
        if k < len(ends) and data.startswith(b"# TYPE ", int(starts[k])):
            family = _family_of(data[starts[k]:ends[k]])
        at = k + 1
    return body, family


def _family_of(type_line: bytes) -> bytes:
    """The family a `# TYPE family type` line declares."""
    fields = type_line.split(b" ", 3)
    return fields[2] if len(fields) > 2 else b""


def _bodies(path: Path, reads: Callable[[bytes], bool]) -> Iterator[_Body | bytes]:
    """The file's whole lines, laid out (_lay_out), then the bytes after its last newline.
    Decompressing and laying out each run on a thread of its own (zlib, numpy and pandas'
    parser let go of the GIL), ahead of the reader."""
    return _ahead(lambda: _laid_out(_ahead(lambda: _decompressed(path)), reads))


def _decompressed(path: Path) -> Iterator[bytes]:
    with open_trace(path) as f:  # gzip or not by its first bytes; a pipe (`--replay <(cat x.om.gz)`) too
        while block := f.read(BLOCK):
            yield block


def _laid_out(blocks: Iterator[bytes], reads: Callable[[bytes], bool]) -> Iterator[_Body | bytes]:
    family: bytes | None = None  # before any `# TYPE` line: read
    tail = b""
    for block in blocks:
        chunk = tail + block
        cut = chunk.rfind(b"\n") + 1
        tail = chunk[cut:]
        if cut:
            body, family = _lay_out(chunk[:cut], reads, family)
            yield body
        if len(tail) > MAX_LINE:  # no newline in sight: the reader refuses the line
            break
    yield tail


def _ahead(produce: Callable[[], Iterator[_T]], depth: int = 4) -> Iterator[_T]:
    """The items of `produce()`, made on a thread of its own up to `depth` ahead; its
    errors are raised here, where the consumer would have met them."""
    done = object()
    queue: Queue = Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> None:
        while not stop.is_set():
            try:
                queue.put(item, timeout=0.1)
                return
            except Full:
                continue

    def run() -> None:
        items = produce()
        try:
            for item in items:
                put(item)
                if stop.is_set():
                    break
            put(done)
        except BaseException as e:  # handed to the consumer, which raises it
            put(e)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # an upstream stage stops too

    thread = threading.Thread(target=run, name="trace-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = queue.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _text(field: bytes, limit: int = 40) -> str:
    """A field (or a line) of a damaged trace, as a warning shows it."""
    return field[:limit].decode("utf-8", "replace")


def _is_number(text: bytes) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _merge_repeated(stream: Iterator[RawSeries], notes: _Warnings) -> list[RawSeries]:
    """The series, each once: a series whose samples come in several blocks (a trace
    concatenated, a family out of place) is merged, not counted twice."""
    first: dict[tuple, RawSeries] = {}
    out = []
    parts: dict[tuple[str, str], set[str]] = {}  # (instance, "device" or "gpu") -> names seen
    instances: set[str] = set()
    for s in stream:
        if not len(s.timestamps):  # every sample of it dropped (and said so): nothing to keep or merge
            continue
        k = (s.name, tuple(sorted(s.labels.items())))
        prev = first.get(k)
        if prev is None:
            # Bounded memory: the frame holds a row per node, NIC and GPU, whatever a
            # series' length; millions of one-sample series must not become millions of rows.
            instance = s.labels.get("instance", "")
            if instance not in instances:
                if len(instances) >= MAX_INSTANCES:
                    notes("an instance over the limit", f"{notes.path}:{s.line}: {s.name}: instance {instance[:80]!r} "
                          f"dropped: the trace has over {MAX_INSTANCES} instances")
                    continue
                instances.add(instance)
            over = False
            for label in ("device", "gpu"):
                if label in s.labels:
                    seen = parts.setdefault((instance, label), set())
                    if s.labels[label] not in seen:
                        if len(seen) >= MAX_PER_INSTANCE:
                            over = True
                            notes(f"a {label} over the limit", f"{notes.path}:{s.line}: {s.name}: {label} "
                                  f"{s.labels[label][:80]!r} of {instance[:80]} dropped: over {MAX_PER_INSTANCE} "
                                  f"{label}s on one instance")
                        else:
                            seen.add(s.labels[label])
            if over:
                continue
            first[k] = s
            out.append(s)
            continue
        series = (s.name + "{" + ",".join(f'{a}="{b}"' for a, b in k[1]) + "}")[:200]
        notes("samples in several blocks", f"{notes.path}:{s.line}: {series}: the series appears again, apart "
              f"from its first block at line {prev.line}: merged")
        t = np.concatenate((prev.timestamps, s.timestamps))
        v = np.concatenate((prev.values, s.values))
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        keep = np.concatenate(([True], np.diff(t) > 0))
        prev.timestamps, prev.values = t[keep], v[keep]
    notes.close()
    return out


def _where(path: str | Path, s: RawSeries) -> str:
    """A series as a warning names it: the file, the line of its first sample, the series
    (cut short: a label value may be any length)."""
    return f"{path}:{s.line}: {s.name}{format_labels(s.labels)}"[:300]


def _seconds_from_milliseconds(path: str | Path, series: list[RawSeries],
                               note: Callable[[str], None]) -> list[RawSeries]:
    """Series whose times are all past any Unix second, in a trace with series wholly in
    seconds (one node's recorder wrote milliseconds, as Prometheus' text format does): where
    their times divided by 1000 fall in the span of the series in seconds, they are read as
    milliseconds, and said so; the rest are left out, and said so. A trace with no series
    wholly in seconds is left as it is (read() names the problem), and so is a series that
    mixes both (_time_range leaves its stray samples out)."""
    late = [s for s in series if s.timestamps[0] >= LAST_SECOND]
    on_time = [s for s in series if s.timestamps[-1] < LAST_SECOND]
    if not late or not on_time:
        return series
    lo = min(float(s.timestamps[0]) for s in on_time) - 86400.0
    hi = max(float(s.timestamps[-1]) for s in on_time) + 86400.0
    converted, dropped = [], []
    in_seconds: dict[int, np.ndarray] = {}  # a node's series share their times: converted once
    for s in late:
        t = in_seconds.get(id(s.timestamps))
        if t is None:
            t = in_seconds[id(s.timestamps)] = s.timestamps / 1000.0
        if lo <= t[0] and t[-1] <= hi:
            s.timestamps = t
            converted.append(s)
        else:
            dropped.append(s)
    for group, what in ((converted, "are in milliseconds where the trace format has seconds: read as "
                                    "milliseconds"),
                        (dropped, "are not Unix seconds, nor milliseconds in the trace's span: left out")):
        if group:
            s = group[0]
            instances = sorted({x.labels.get("instance", "")[:80] for x in group})
            note(_where(path, s) + f": sample times like {s.timestamps[0]:.0f} {what}"
                 + (f", and in {len(group) - 1} more series" if len(group) > 1 else "")
                 + f" (instance {', '.join(instances[:5])}{', ...' if len(instances) > 5 else ''})")
    left_out = {id(s) for s in dropped}
    return [s for s in series if id(s) not in left_out] if left_out else series


def _time_range(path: str | Path, series: list[RawSeries], note: Callable[[str], None]) -> tuple[float, float]:
    """The trace's first and last sample time, ignoring stray samples far outside the time
    its series cover (a timestamp off by days would stretch the windows over nothing)."""
    firsts = np.array([s.timestamps[0] for s in series])
    lasts = np.array([s.timestamps[-1] for s in series])
    lo, hi = np.percentile(firsts, 1), np.percentile(lasts, 99)
    margin = max(hi - lo, 3600.0)
    first = float(firsts[firsts >= lo - margin].min())
    last = float(lasts[lasts <= hi + margin].max())
    strays = [s for s in series if s.timestamps[0] < first or s.timestamps[-1] > last]
    if strays:
        note(_where(path, strays[0]) + f": samples far outside the trace's time range "
             f"({first:.0f}..{last:.0f}) ignored" + (f", and in {len(strays) - 1} more series" if len(strays) > 1 else ""))
    return first, last


@dataclass
class Trace:
    """A trace read once: its series and where its samples lie in time. Frames of any window
    of it are cut from this (`frame_of`), without reading the file again."""
    path: Path
    series: list[RawSeries]
    first: float
    last: float
    scrape_interval: float
    warnings: list[str]


def read(path: str | Path, warn: Callable[[str], None] | None = None,
         wanted: set[str] | frozenset[str] | None = None) -> Trace:
    """Parse a trace. `wanted`: read only these families (the audit needs only
    diagnoser.model.netconfig.METRICS)."""
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if warn:
            warn(message)

    series = _merge_repeated(read_trace(path, (wanted or WANTED).__contains__, note, SPARSE.__contains__),
                             _Warnings(Path(path), note))
    series = [s for s in series if len(s.timestamps)]
    if not series:
        raise TraceError(f"{path}: no gpunet series in the trace")
    series = _seconds_from_milliseconds(path, series, note)
    first, last = _time_range(path, series, note)
    if last >= LAST_SECOND or first < 0:
        raise TraceError(f"{path}: sample times like {last:.0f} are not Unix seconds (milliseconds? the trace "
                         "format's timestamps are seconds)")
    gaps = [np.median(np.diff(s.timestamps)) for s in series[:2000] if len(s.timestamps) > 2 and s.name not in SPARSE]
    scrape = float(np.median(gaps)) if gaps else 15.0
    return Trace(Path(path), series, first, last, scrape, warnings)


def frame_of(trace: Trace, since: float | None = None, start: float | None = None,
             end: float | None = None) -> Frame:
    """The tidy frame of a window of the trace; it ends at the trace's last sample unless given.
    The window is cut to the span the trace covers: what lies outside it holds no data to judge
    (a window wholly outside it is an error that names the span)."""
    end_t = end if end is not None else trace.last
    start_t = start if start is not None else (end_t - since if since is not None else trace.first)
    asked = (start_t, end_t)
    try:
        start_t, end_t, notes = data_window(start_t, end_t, trace.first, trace.last, trace.scrape_interval,
                                            "the trace")
    except ValueError as e:
        raise TraceError(f"{trace.path}: {e}") from None
    scrape = trace.scrape_interval
    builder = FrameBuilder(f"replay:{trace.path.name}", start_t, end_t, choose_step(start_t, end_t, scrape), scrape)
    # One scrape before the range (and its first whole window), so that the first increase is whole.
    since_t = min(start_t, builder.edges[0]) - 1.5 * scrape
    for s in trace.series:
        if s.name in SPARSE:  # value changes only: the value in force at the window start comes before it
            builder.add(s.name, s.labels, s.timestamps, s.values)
            continue
        lo = np.searchsorted(s.timestamps, since_t, side="left")
        hi = np.searchsorted(s.timestamps, end_t, side="right")
        builder.add(s.name, s.labels, s.timestamps[lo:hi], s.values[lo:hi])
    builder.warnings.extend(trace.warnings + notes)
    frame = builder.build()
    frame.asked = asked if asked != (start_t, end_t) else None
    return frame


def frame_from_trace(path: str | Path, since: float | None = None, start: float | None = None,
                     end: float | None = None, warn: Callable[[str], None] | None = None,
                     wanted: set[str] | frozenset[str] | None = None) -> Frame:
    """The tidy frame of a trace's window, read from its file."""
    return frame_of(read(path, warn, wanted), since, start, end)
