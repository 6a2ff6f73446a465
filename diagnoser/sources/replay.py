"""Read a replay trace (docs/trace-format.md) fast, streaming, family by family.

The prometheus_client parser costs tens of microseconds a sample; this reader leans on
the trace's shape instead: a series' samples are contiguous, so a line is split once
from the right (series, value, timestamp) and its labels are parsed only when the
series changes. Numbers are converted in bulk by numpy. Families the diagnoser does not
use are skipped without splitting their lines.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from diagnoser.model.frame import WANTED, Frame, FrameBuilder, choose_step
from diagnoser.model.netconfig import SPARSE
from diagnoser.sources.exposition import parse_series
from gpunet import contract as c
from gpunet.window import LAST_SECOND, rfc3339

BLOCK = 1 << 22  # bytes read at a time
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


def _open(path: Path):
    with open(path, "rb") as probe:
        magic = probe.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


MAX_WARNINGS = 5  # of one kind; the rest are counted in one closing line
MAX_NAMED = 3  # series outside the contract named in the warning that counts them
MAX_INSTANCES = 10_000  # nodes in one trace
MAX_PER_INSTANCE = 256  # NICs, and GPUs, of one node


class _Warnings:
    """Bounded warnings: a hostile trace can hold millions of damaged series."""

    def __init__(self, path: Path, warn: Callable[[str], None]):
        self.path, self.warn, self.counts = path, warn, {}

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
    samples where a series' value changes, and its last one: a line repeating the previous
    value is recognised by its prefix, without being split."""
    path = Path(path)
    notes = _Warnings(path, warn or (lambda message: None))
    wanted = wanted or (lambda name: True)
    lineno = 0
    key: bytes | None = None
    key_line = 0  # line of the current series' first sample
    skip_family = False
    sparse_family = False
    sparse = sparse or (lambda name: False)
    repeat = b""  # a sparse series' key and its last kept value: a line starting so repeats it
    pending: bytes | None = None  # the latest repeated line (kept as the series' last sample)
    pending_line = 0
    family_b = b""
    values: list[bytes] = []
    stamps: list[bytes] = []
    seen_eof = False
    unknown = 0
    unknown_first = 0
    unknown_named: list[str] = []

    def outside_contract(line: int, name: str) -> None:
        nonlocal unknown, unknown_first
        unknown += 1
        unknown_first = unknown_first or line
        if len(unknown_named) < MAX_NAMED:
            unknown_named.append(f"{name[:80]} (line {line})")

    def keep_pending() -> None:
        nonlocal pending
        parts = pending.rsplit(b" ", 2)
        if len(parts) == 3 and parts[0] == key:
            values.append(parts[1])
            stamps.append(parts[2])
        else:
            malformed_line(pending_line, pending)
        pending = None

    def malformed_line(line: int, text: bytes) -> None:
        notes("malformed sample lines", f"{path}:{line}: expected 'series value timestamp' (every sample of a trace "
              f"has a timestamp): {text[:120]!r}: line skipped")

    def flush() -> RawSeries | None:
        if key is None or not values:
            return None
        name = key.partition(b"{")[0].decode("utf-8", "replace")
        if not wanted(name):
            if not name.startswith("gpunet_"):
                outside_contract(key_line, name)
            return None
        where = f"{path}:{key_line}"
        try:
            name, labels = parse_series(key.decode("utf-8", "replace"))
        except ValueError as e:
            notes("malformed series", f"{where}: {e}: {key[:120]!r}: its {len(values)} samples skipped")
            return None
        try:
            v = np.array(values).astype(np.float64)
            t = np.array(stamps).astype(np.float64)
        except ValueError:  # some are no numbers: those become NaN, dropped below with the rest
            bad = next(i for i, (a, b) in enumerate(zip(values, stamps)) if not _is_number(a) or not _is_number(b))
            notes("samples that are no numbers", f"{path}:{key_line + bad}: not a number: "
                  f"{values[bad][:40]!r} {stamps[bad][:40]!r}: dropped")
            v = np.array([float(a) if _is_number(a) else np.nan for a in values])
            t = np.array([float(b) if _is_number(b) else np.nan for b in stamps])
        series = key[:100].decode("utf-8", "replace")
        bad = ~(np.isfinite(t) & np.isfinite(v))
        if name.endswith("_total") or name in NON_NEGATIVE:
            bad |= v < 0  # a counter never goes negative (a reset goes to zero); nor does a speed or a state
        bad |= np.abs(v) > IMPOSSIBLE  # 1e308 is no reading of any counter or gauge
        if bad.any():
            first = int(np.argmax(bad))
            notes("NaN/Inf/negative samples", f"{where}: {series}: {int(bad.sum())} samples with a NaN, infinite, "
                  f"negative or impossible (over 1e21) value or timestamp dropped (the first at line {key_line + first})")
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
                notes("duplicate or out-of-order samples", f"{where}: {series}: {', '.join(what)}")
        return RawSeries(name, labels, t, v, key_line)

    try:
        with _open(path) as f:
            tail = b""
            while True:
                block = f.read(BLOCK)
                if not block:
                    break
                chunk = tail + block
                lines = chunk.split(b"\n")
                tail = lines.pop()
                if len(chunk) > MAX_LINE and max(map(len, lines), default=0) > MAX_LINE:
                    long = next(i for i, line in enumerate(lines) if len(line) > MAX_LINE)
                    raise TraceError(f"{path}:{lineno + long + 1}: a line of over {MAX_LINE} bytes")
                if len(tail) > MAX_LINE:
                    raise TraceError(f"{path}:{lineno + len(lines) + 1}: a line of over {MAX_LINE} bytes")
                del chunk
                for line in lines:
                    lineno += 1
                    if not line:
                        continue
                    if line[0] == 35:  # '#'
                        if line.startswith(b"# TYPE "):
                            fields = line.split(b" ", 3)
                            family_b = fields[2] if len(fields) > 2 else b""
                            family = family_b.decode("utf-8", "replace")
                            skip_family = not (wanted(family) or wanted(family + "_total"))
                            sparse_family = not skip_family and sparse(family)
                            if skip_family and not family.startswith("gpunet_"):
                                outside_contract(lineno, family)
                        elif line.startswith(b"# EOF"):
                            seen_eof = True
                        continue
                    if skip_family:
                        if line.startswith(family_b):
                            continue
                        # A sample outside its family's block (no TYPE line of its own).
                        family_b = line.split(b"{", 1)[0].split(b" ", 1)[0]
                        family = family_b.decode("utf-8", "replace")
                        skip_family = not wanted(family)
                        sparse_family = not skip_family and sparse(family)
                        if skip_family:
                            if not family.startswith("gpunet_"):
                                outside_contract(lineno, family)
                            continue
                        notes("samples outside their family's block", f"{path}:{lineno}: samples of {family[:80]} "
                              f"outside their family's '# TYPE' block: read")
                    if sparse_family and repeat and line.startswith(repeat):
                        pending, pending_line = line, lineno
                        continue
                    if pending is not None:
                        keep_pending()
                    parts = line.rsplit(b" ", 2)
                    if len(parts) != 3:
                        malformed_line(lineno, line)
                        continue
                    if parts[0] != key:
                        series = flush()
                        if series is not None:
                            yield series
                        key, key_line, values, stamps = parts[0], lineno, [], []
                    values.append(parts[1])
                    stamps.append(parts[2])
                    repeat = parts[0] + b" " + parts[1] + b" " if sparse_family else b""
            if tail.strip() == b"# EOF":
                seen_eof = True  # the last line without its newline
            elif tail.strip():
                notes("cut lines", f"{path}:{lineno + 1}: the file ends in the middle of a line (truncated?): "
                      f"that line skipped")
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise TraceError(f"{path}:{lineno + 1}: compressed stream broken after line {lineno} ({e}): truncated "
                         f"or corrupt file") from None
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror or e}") from None
    if pending is not None:
        keep_pending()
    series = flush()
    if series is not None:
        yield series
    if unknown:
        notes("series outside the contract", f"{path}:{unknown_first}: {unknown} series or families outside the gpunet "
              f"contract skipped: {', '.join(unknown_named)}{', ...' if unknown > len(unknown_named) else ''}")
    if not seen_eof:
        notes("no EOF", f"{path}: no '# EOF' line: the trace may be truncated after line {lineno}")
    notes.close()


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


def _time_range(path, series: list[RawSeries], note: Callable[[str], None]) -> tuple[float, float]:
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
        s = strays[0]
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        note(f"{path}:{s.line}: {s.name}{{{labels}}}"[:300] + f": samples far outside the trace's time range "
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
    first, last = _time_range(path, series, note)
    if last >= LAST_SECOND or first < 0:
        raise TraceError(f"{path}: sample times like {last:.0f} are not Unix seconds (milliseconds? the trace "
                         "format's timestamps are seconds)")
    gaps = [np.median(np.diff(s.timestamps)) for s in series[:2000] if len(s.timestamps) > 2 and s.name not in SPARSE]
    scrape = float(np.median(gaps)) if gaps else 15.0
    return Trace(Path(path), series, first, last, scrape, warnings)


def frame_of(trace: Trace, since: float | None = None, start: float | None = None,
             end: float | None = None) -> Frame:
    """The tidy frame of a window of the trace; it ends at the trace's last sample unless given."""
    end_t = end if end is not None else trace.last
    start_t = start if start is not None else (end_t - since if since is not None else trace.first)
    start_t = max(start_t, trace.first)
    if end_t <= start_t:
        raise TraceError(f"{trace.path}: the window holds no samples: the trace covers {rfc3339(trace.first)} .. "
                         f"{rfc3339(trace.last)}")
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
    builder.warnings.extend(trace.warnings)
    return builder.build()


def frame_from_trace(path: str | Path, since: float | None = None, start: float | None = None,
                     end: float | None = None, warn: Callable[[str], None] | None = None,
                     wanted: set[str] | frozenset[str] | None = None) -> Frame:
    """The tidy frame of a trace's window, read from its file."""
    return frame_of(read(path, warn, wanted), since, start, end)
