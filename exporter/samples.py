"""The boundary between collectors and everything after them."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import NamedTuple, Protocol

from exporter.inventory import Nic
from exporter.root import SourceError
from gpunet.contract import MetricSpec


class Sample(NamedTuple):
    metric: MetricSpec
    labels: tuple[str, ...]  # values, in the order of metric.labels
    value: float
    # For counters read from hardware: the value at which the source wraps to zero
    # (32-bit counters), so a wrap is told from a reset. None: a decrease is a reset.
    wrap: float | None = None


# What a Sample is, picked out in C (map(SERIES, samples) makes no Python call per sample):
# the stages after the collectors compare series and values of whole lists with these.
SERIES = itemgetter(0, 1)  # (metric, labels)
VALUE = itemgetter(2)


class KnownSeries(list[Sample]):
    """Samples whose series are known without a look: `series` is [(metric, labels)] of
    them, in order, the very list that told them at the last tick where they were the same.
    exporter/counters.py, which compares each tick's series with the last tick's, hands its
    answer on this way, so that a scrape (exporter/registry.py) need not compare them again."""

    __slots__ = ("series",)

    def __init__(self, samples: list[Sample], series: list):
        super().__init__(samples)
        self.series = series


class NetworkTick(NamedTuple):
    """One fast tick of the node's network (exporter/link_load.py): the time (start, end] and
    the node's network_state in it."""

    start: float  # monotonic seconds
    end: float
    state: str


class TickContext(NamedTuple):
    """What a collector may know about the tick it runs in. (A tuple: two are made every fast
    tick, and a frozen dataclass costs several times as much to make.)"""

    now: float  # monotonic clock, seconds
    nics: dict[str, Nic]
    network_state: str = "quiet"  # the node's, in this fast tick (set after the wire was read)
    # False on the fast ticks in between those that refresh everything once a slow interval:
    # a fast collector then returns only what the fast-tick correlation needs (its
    # `refreshed_series` left out), and the scrape keeps serving the last refresh of those.
    refresh_all: bool = True
    # The last fast ticks' network states, oldest first, up to this one: for what is read less
    # often than every fast tick but knows when each of its readings was taken (a GPU's
    # sample buffer, collectors/gpu.py). Read on the fast lane only, which writes it.
    network_ticks: Sequence[NetworkTick] = ()


class Collector(Protocol):
    """A collector whose counters are sums it keeps itself, which never go backwards, may say
    so with a class attribute `monotonic = True`: the sampler then does not pass its samples
    through exporter/counters.py.

    A fast collector may name in a class attribute `refreshed_series` (a frozenset of metric
    names) the series it returns only when `ctx.refresh_all`: those the fast-tick correlation
    does not need. The sampler publishes them apart and serves them until the next refresh
    (once a slow interval), so that the ticks in between make, check and publish fewer samples.

    A fast collector that keeps sums may instead make some series only when a scrape asks,
    with a method `live_samples()` (thread-safe, as of its latest tick; its counters
    monotonic): five ticks a second then make no sample for them, a scrape makes them once.
    After a run that raised, they are left out until the next run answers."""

    name: str

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        """Read the source and return samples. Problems that cost only some series are
        appended to ``errors``; a SourceError raised costs the collector's whole run."""
        ...
