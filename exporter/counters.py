"""Counters that never go backwards, whatever the hardware does.

Every counter (docs/metrics.md) starts at the system's own value, then advances by the
system's deltas. A decrease in the source is either a wrap of a narrow hardware counter
(it passed its top and restarted at zero) or a reset (driver reload, NIC re-added); in
both cases the exported counter goes on growing.

A collector returns the same series in the same order tick after tick, and almost every
counter only ever rises. So each tick first asks, in C (map, comparisons of lists), whether
the series are those of the last tick and every counter rose or stood still since: then the
samples go out as they came (those of counters that once wrapped or reset with what they
carry over added), with no Python work for the others. Only a tick where that is not so (a
NIC came or went, a counter wrapped, reset or read -1, NaN or infinity) goes through the
series one by one.

What a link carries is checked before (LinkBound, used by the collectors that read it): a
reading that rises past what the link could have carried is not taken at all.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from itertools import repeat
from operator import itemgetter, le

from exporter.root import SourceError
from exporter.samples import SERIES, VALUE, KnownSeries, Sample

# Series not read for this many ticks (calls of `apply`: a slow collector's reads, a fast
# collector's refreshes) are forgotten, bounding memory as NICs come and go.
FORGET_AFTER_TICKS = 3000
INF = float("inf")
NAN = float("nan")


def _no_counters(samples: list[Sample]) -> tuple[()]:
    return ()


class _Layout:
    """The series of the last tick, each counter among them with what it exports above its
    raw value (what it carried over a wrap or a reset; almost always nothing)."""

    __slots__ = ("series", "counters", "raw", "keys", "carried")

    def __init__(self, series: list, counters: Callable[[list[Sample]], object], raw: list[float], keys: list,
                 carried: list[tuple[int, int, float]]):
        self.series = series  # [(metric, labels)] of every sample, in order
        self.counters = counters  # picks the counter samples out of a tick's samples
        self.raw = raw  # their values at the last tick
        self.keys = keys  # their keys in MonotonicCounters._state
        self.carried = carried  # [(place in the samples, in `keys`, exported - raw)] where not 0


class MonotonicCounters:
    def __init__(self) -> None:
        # (name, labels) -> [last raw value, exported value, tick last seen]
        self._state: dict[tuple[str, tuple[str, ...]], list] = {}
        self._tick = 0
        self._layout: _Layout | None = None
        # The list the last tick was given and what it gave back: a collector served from its
        # last read (exporter/refresh.py) hands the same list again, which needs no look.
        self._last_in: list[Sample] | None = None
        self._last_out: list[Sample] = []

    def __len__(self) -> int:
        return len(self._state)

    def apply(self, samples: list[Sample]) -> list[Sample]:
        out = self._apply_tick(samples)
        self._last_in, self._last_out = samples, out
        return out

    def _apply_tick(self, samples: list[Sample]) -> list[Sample]:
        self._tick += 1
        layout = self._layout
        if layout is not None:
            if samples is self._last_in:  # the very list of the last tick: the same values, the same answer
                self._now_and_then(layout)
                return self._last_out
            series = list(map(SERIES, samples))
            if series == layout.series:
                raw = list(map(VALUE, layout.counters(samples)))
                # Every counter rose or stood still (NaN compares false; -1 is below any reading
                # kept), and none is infinite: each exports its raw value and what it carries, as before.
                if all(map(le, layout.raw, raw)) and INF not in raw:
                    layout.raw = raw
                    self._now_and_then(layout)
                    out = KnownSeries(samples, layout.series)
                    for place, _, carried in layout.carried:
                        s = samples[place]
                        out[place] = s._replace(value=s.value + carried)
                    return out
            self._settle(layout, self._tick - 1)
            self._layout = None
        out = self._apply(samples)
        self._layout = layout = self._learn(samples, out)
        return out if layout is None else KnownSeries(out, layout.series)

    def _apply(self, samples: list[Sample]) -> list[Sample]:
        tick = self._tick
        state = self._state
        out: list[Sample] = []
        append = out.append  # hundreds of samples a tick: every lookup saved counts
        for s in samples:
            metric, labels, raw, wrap = s
            if metric.type != "counter":
                append(s)
                continue
            key = (metric.name, labels)
            entry = state.get(key)
            if not 0 <= raw < INF:  # a driver's -1 or NaN is no reading: the last value stands
                if entry is not None:
                    entry[2] = tick
                    append(s._replace(value=entry[1]))
                continue
            if entry is None:
                state[key] = [raw, raw, tick]
                append(s)
                continue
            last_raw, exported, _ = entry
            if raw >= last_raw:
                exported += raw - last_raw
            elif wrap and wrap / 2 <= last_raw < wrap and raw < wrap / 2:
                exported += raw + wrap - last_raw  # passed the top of a narrow counter
            else:
                exported += raw  # reset (a value past the width cannot have wrapped): restarted from zero
            entry[0] = raw
            entry[1] = exported
            entry[2] = tick
            # Most counters never wrapped nor reset: their sample goes out as it came.
            append(s if exported == raw else s._replace(value=exported))
        if tick % 100 == 0:
            self._forget()
        return out

    def _learn(self, samples: list[Sample], out: list[Sample]) -> _Layout | None:
        """The layout of this tick, where the next may take the short way: every sample went
        out (none was a counter's first reading of -1 or NaN), each series once."""
        if len(out) != len(samples):
            return None
        positions = [i for i, s in enumerate(samples) if s[0].type == "counter"]
        counters: Callable[[list[Sample]], object]
        if not positions:
            counters = _no_counters
        elif len(positions) == 1:
            only = positions[0]
            counters = itemgetter(slice(only, only + 1))
        else:
            counters = itemgetter(*positions)
        picked = counters(samples)
        raw = list(map(VALUE, picked))
        if not (all(map(le, repeat(0.0), raw)) and INF not in raw):  # -1, NaN, inf: no reading to go on from
            return None
        keys = [(s[0].name, s[1]) for s in picked]
        if len(set(keys)) != len(keys):  # a series twice in one tick (a collector's bug): the long way
            return None
        carried = [(place, k, out[place].value - samples[place].value) for k, place in enumerate(positions)
                   if out[place] is not samples[place]]
        return _Layout(list(map(SERIES, samples)), counters, raw, keys, carried)

    def _now_and_then(self, layout: _Layout) -> None:
        """On the short way, every 100 ticks: what it kept written back, then the forgetting."""
        if self._tick % 100 == 0:
            self._settle(layout, self._tick)
            self._forget()

    def _settle(self, layout: _Layout | None, tick: int) -> None:
        """Write what the short way kept (the last raw values, and so what was exported, at
        `tick`) back into the state of each series, before the long way or the forgetting
        reads it."""
        if layout is None:
            return
        state = self._state
        for key, raw in zip(layout.keys, layout.raw):
            entry = state[key]
            entry[0] = entry[1] = raw
            entry[2] = tick
        for _, k, carried in layout.carried:
            state[layout.keys[k]][1] += carried

    def _forget(self) -> None:
        tick, state = self._tick, self._state
        for key in [k for k, e in state.items() if tick - e[2] > FORGET_AFTER_TICKS]:
            del state[key]



# --- readings a link could not have carried ---------------------------------------------------
# A counter of what crosses a link rises at most as fast as the link carries. A reading past
# that (a driver's garbage, a fixture file that holds 1e25 for a tick) is no reading: adopted,
# the exported counter would stay that high for good, as the next true reading is lower, a
# reset to MonotonicCounters, which then counts on from there.
COUNTER_TOP = 2.0**64  # no counter of the kernel or a NIC holds more
MARGIN = 2.0  # a reading may rise by twice what the link carries at its speed ...
SLACK_SECONDS = 2.0  # ... in the time since the reading before, and this: drivers refresh their counters once a second or so
MIN_FRAME_BYTES = 64  # no Ethernet frame is shorter: packets and frames rise by at most the bytes' bound / 64
UNKNOWN_SPEED = 1e12  # bytes/s taken for a link without a speed (a veth, a link that is down): 8 Tb/s


class LinkBound:
    """Readings of a link's counters checked against what the link could have carried since
    the last reading taken: one that could not be true is not taken, the last reading taken
    stands in for it (so the counter stands still), and the next one that could be true goes
    on from there, without a jump. One error (file and value) is reported while readings are
    refused, the same at each, so that it is logged once.

    A reading below the last is taken: a reset or a wrap, which MonotonicCounters tells
    apart. The time a rise is measured over starts where the last reading taken was first
    read: a counter that stood still (a link at rest, a driver's stale copy) may rise by what
    the link carried in all that time."""

    def __init__(self) -> None:
        # key -> [the last reading taken (None before any), when it was first read, the error while refused]
        self._last: dict[tuple[str, str], list] = {}

    def check(self, key: tuple[str, str], value: float, now: float, speed: float | None,
              where: Callable[[], str], errors: list, unit_bytes: int = 1) -> float:
        """`value` where it could be true, else the last reading taken (NaN before any). `key`:
        (device, counter); `speed`: the link's, bytes/s (None: unknown, UNKNOWN_SPEED);
        `unit_bytes`: the fewest bytes one count stands for (1 for bytes, MIN_FRAME_BYTES for
        packets and frames); `now`: monotonic seconds; `where`: gives the counter's file, for the
        error."""
        if not 0 <= value < INF:  # -1, NaN, inf: no reading, which MonotonicCounters already skips
            return value
        last = self._last.get(key)
        if last is None:
            last = self._last[key] = [None, now, None]
        taken, since, refused = last
        if taken is not None and value == taken:
            last[2] = None
            return value
        if taken is None or value < taken:
            ceiling = COUNTER_TOP
        else:
            ceiling = taken + (speed or UNKNOWN_SPEED) / unit_bytes * MARGIN * (now - since + SLACK_SECONDS)
        if value <= ceiling and value < COUNTER_TOP:
            last[0], last[1], last[2] = value, now, None
            return value
        if refused is None:
            if value >= COUNTER_TOP:
                why = "more than any 64-bit counter holds"
            else:
                why = f"more than the link could carry since the last reading ({taken:.6g}, {now - since:.3g} s before)"
            refused = last[2] = SourceError(where(), f"read {value:.6g}, {why}: not counted")
        errors.append(refused)
        return NAN if taken is None else taken

    def forget_except(self, devices: Collection[str]) -> None:
        """Let go of the readings of devices not in `devices` (NICs that left)."""
        for key in [key for key in self._last if key[0] not in devices]:
            del self._last[key]
