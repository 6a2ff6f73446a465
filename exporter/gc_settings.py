"""Python's cyclic garbage collector, set for a process whose garbage is freed as it goes.

Every tick makes hundreds of samples and drops those of the tick before; reference
counting frees them at once, and the steady state makes no reference cycles. CPython's
collector still collects its youngest generation whenever tracked objects allocated exceed
those freed by 700, which the transient samples of one tick do: over the bench node
(8 ports, 8 GPUs), a young collection every second and a full one, through all 43,000
objects of the process, every 100 s: 0.5 ms of CPU a second, about 5% of the exporter's,
for no garbage (docs/architecture.md, "Memory and start-up").

So the youngest generation waits for YOUNG_THRESHOLD net allocations, which a tick's peak
does not reach and cyclic garbage (an exception's traceback, kept by a bug) still does, a
megabyte at most; and what exists once the exporter is set up (modules, code, the
collectors and their caches) is frozen out of the collections (`gc.freeze`), which then
look only at what came after.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 5000


def set_thresholds() -> None:
    """The youngest generation collected after YOUNG_THRESHOLD net allocations; the older ones as before."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def freeze_what_is_set_up() -> None:
    """Once the exporter is set up: what is garbage of the start goes, the rest is left out of every collection."""
    gc.collect()
    gc.freeze()
