"""Counters that never go backwards, whatever the hardware does.

Every counter (docs/metrics.md) starts at the system's own value, then advances by the
system's deltas. A decrease in the source is either a wrap of a narrow hardware counter
(it passed its top and restarted at zero) or a reset (driver reload, NIC re-added); in
both cases the exported counter goes on growing.
"""

from __future__ import annotations

from exporter.samples import Sample

# Series not read for this many ticks are forgotten, bounding memory as NICs come and go.
FORGET_AFTER_TICKS = 3000
INF = float("inf")


class MonotonicCounters:
    def __init__(self) -> None:
        # (name, labels) -> [last raw value, exported value, tick last seen]
        self._state: dict[tuple[str, tuple[str, ...]], list] = {}
        self._tick = 0

    def __len__(self) -> int:
        return len(self._state)

    def apply(self, samples: list[Sample]) -> list[Sample]:
        self._tick += 1
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
            for key in [k for k, e in state.items() if tick - e[2] > FORGET_AFTER_TICKS]:
                del state[key]
        return out
