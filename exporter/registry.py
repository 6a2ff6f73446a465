"""The latest samples of every collector, the self-metrics, and their exposition.

Collectors publish from the sampler's threads; scrapes read. A scrape never triggers a
read of the machine: it renders what was published, and the rendered body is reused
until something new is published.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from exporter.exposition import Family, Renderer
from exporter.process import ProcessMetrics
from exporter.samples import SERIES, KnownSeries, Sample
from gpunet import __version__
from gpunet.contract import (
    COLLECTOR_DURATION,
    COLLECTOR_ERRORS,
    COLLECTOR_LAST_SUCCESS,
    COLLECTOR_UP,
    EXPORTER_BUILD_INFO,
    HTTP_BAD_REQUESTS,
    HTTP_OPEN_CONNECTIONS,
    HTTP_REFUSED,
    HTTP_REFUSED_REASONS,
    TICK_INTERVAL,
    TICKS,
    TICKS_LATE,
    MetricSpec,
)

log = logging.getLogger("gpunet.exporter")
LABELS = itemgetter(1)  # a Sample's labels
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass
class CollectorStatus:
    up: bool = False
    duration: float = 0.0
    errors_total: int = 0
    last_run: float = 0.0


class Registry:
    def __init__(self, root_label: str = "/"):
        self._lock = threading.Lock()
        self._samples: dict[str, list[Sample]] = {}
        # A fast collector's `refreshed_series` (exporter/samples.py), as of its last refresh.
        self._refreshed: dict[str, list[Sample]] = {}
        # A fast collector's `live_samples` (exporter/samples.py): made when a scrape asks.
        self._live: dict[str, Callable[[], list[Sample]]] = {}
        self._status: dict[str, CollectorStatus] = {}
        self._ticks: dict[str, list[float]] = {}  # tick -> [interval, count, late]
        self._generation = 0
        self._cache: dict[tuple[str, bool], tuple[int, bytes]] = {}
        self._render_lock = threading.Lock()
        self._root_label = root_label
        self._renderer = Renderer()
        self._process = ProcessMetrics()  # process_cpu_seconds_total, RSS, fds
        self._bad_requests = 0
        self._refused = dict.fromkeys(HTTP_REFUSED_REASONS, 0)
        self._open_connections = 0
        self._failing_makers: set[str] = set()  # collectors whose live samples raised at the last scrape
        self._groupings: dict[tuple[str, str], _Grouping] = {}  # (part, collector) -> its last: see _grouping

    # --- written by the sampler ---------------------------------------------------------
    def publish(self, collector: str, samples: list[Sample], duration: float, errors: int,
                refreshed: list[Sample] | None = None, live: Callable[[], list[Sample]] | None = None) -> None:
        """Store a collector's run: its samples replace the previous ones, so the series of
        a source that failed are gone from the next scrape rather than frozen. `refreshed`,
        where not None, replaces the series it refreshes only once a slow interval; None
        keeps those of its last refresh. `live`, where not None, makes the rest of its
        series when a scrape asks (thread-safe); None: it has none (a failed run)."""
        with self._lock:
            if refreshed is not None:
                self._refreshed[collector] = refreshed
            if live is not None:
                self._live[collector] = live
            else:
                self._live.pop(collector, None)
            status = self._status.setdefault(collector, CollectorStatus())
            status.up = errors == 0
            status.duration = duration
            status.errors_total += errors
            status.last_run = time.time()
            self._samples[collector] = samples
            self._generation += 1

    def add_tick(self, tick: str, interval: float, late: bool) -> None:
        with self._lock:
            entry = self._ticks.setdefault(tick, [interval, 0, 0])
            entry[1] += 1
            entry[2] += int(late)

    def count_bad_request(self) -> None:
        """A request the server refused as malformed HTTP (exporter/server.py). The cached body
        is not invalidated for it (a flood must not make every scrape render anew): the count
        goes out with the next tick's body."""
        with self._lock:
            self._bad_requests += 1

    def count_refused(self, reason: str) -> None:
        """A connection or request the server turned away (exporter/connections.py, server.py);
        like bad requests, it goes out with the next tick's body."""
        with self._lock:
            self._refused[reason] += 1

    def set_open_connections(self, count: int) -> None:
        self._open_connections = count

    def collector_status(self) -> dict[str, CollectorStatus]:
        with self._lock:
            return {k: CollectorStatus(**vars(v)) for k, v in self._status.items()}

    def published(self) -> dict[str, list[Sample]]:
        """The latest samples of each collector (inventory and link_load included), by its name."""
        with self._lock:
            published = {k: [*v, *self._refreshed.get(k, ())] for k, v in self._samples.items()}
            live = dict(self._live)
        for k, make in live.items():  # outside the registry's lock: they take their collector's
            published[k] = [*published.get(k, ()), *self._made(k, make)]
        return published

    # --- read by the server -------------------------------------------------------------
    def render(self, openmetrics: bool, gzipped: bool = False) -> bytes:
        key = ("om" if openmetrics else "text", gzipped)
        with self._render_lock:
            generation = self._generation
            cached = self._cache.get(key)
            if cached is not None and cached[0] == generation:
                return cached[1]
            body = self._renderer.render(self.families(), openmetrics)
            if gzipped:
                body = gzip.compress(body, compresslevel=1)
            self._cache[key] = (generation, body)
            return body

    def families(self) -> list[Family]:
        with self._lock:
            published = [*(("samples", k, v) for k, v in self._samples.items()),
                         *(("refreshed", k, v) for k, v in self._refreshed.items())]
            live = list(self._live.items())
            status = [(k, v.up, v.duration, v.errors_total, v.last_run) for k, v in self._status.items()]
            ticks = {k: list(v) for k, v in self._ticks.items()}
            bad_requests = self._bad_requests
            refused = dict(self._refused)
        self_samples = [Sample(EXPORTER_BUILD_INFO, (__version__, self._root_label), 1.0),
                        Sample(HTTP_BAD_REQUESTS, (), bad_requests),
                        Sample(HTTP_OPEN_CONNECTIONS, (), self._open_connections)]
        self_samples += [Sample(HTTP_REFUSED, (reason,), count) for reason, count in refused.items()]
        for name, up, duration, errors_total, last_run in status:
            self_samples += [Sample(COLLECTOR_UP, (name,), 1.0 if up else 0.0),
                             Sample(COLLECTOR_DURATION, (name,), duration),
                             Sample(COLLECTOR_ERRORS, (name,), errors_total),
                             Sample(COLLECTOR_LAST_SUCCESS, (name,), last_run)]
        for tick, (interval, count, late) in ticks.items():
            self_samples += [Sample(TICK_INTERVAL, (tick,), interval), Sample(TICKS, (tick,), count),
                             Sample(TICKS_LATE, (tick,), late)]
        sources = [*published, *(("live", k, self._made(k, make)) for k, make in live), ("self", "", self_samples)]
        # A thousand samples a scrape, grouped by family. Each source (a collector's list)
        # has the series it had at the last scrape, almost always: its grouping is then reused.
        by_metric: dict[str, tuple[MetricSpec, list[Sample]]] = {}
        for part, name, samples in sources:
            for metric, group in self._grouping((part, name), samples):
                known = by_metric.get(metric.name)
                if known is None:
                    by_metric[metric.name] = (metric, group)
                else:  # a family two sources make: in label order, as one
                    merged = [*known[1], *group]
                    merged.sort(key=LABELS)
                    by_metric[metric.name] = (known[0], merged)
        out = []
        for name in sorted(by_metric):
            metric, group_samples = by_metric[name]
            out.append(Family(metric.name, metric.type, metric.help, metric.labels, group_samples))
        out += self._process.families()
        return out

    def _grouping(self, source: tuple[str, str], samples: list[Sample]) -> list[tuple[MetricSpec, list[Sample]]]:
        """The samples of one source by family, each family's in label order, as the
        renderer reads them. Where the source has the same series, in the same order, as at
        the last scrape (told by exporter/counters.py: KnownSeries; else checked in C, a map
        and a comparison of lists), the positions found then pick them out again; else they
        are found anew (a sample at a time)."""
        last = self._groupings.get(source)
        if last is not None and last.samples is samples:  # the very list (a collector served from its last read)
            return last.grouped
        # The series told by the counters (the very list of the last scrape where they are the
        # same: `is` answers before any comparison), else read off the samples.
        series = samples.series if isinstance(samples, KnownSeries) else list(map(SERIES, samples))
        if last is not None and (last.series is series or last.series == series):
            picks = last.picks
        else:
            picks = grouping_plan(samples)
        grouped = [(metric, pick(samples)) for metric, pick in picks]
        self._groupings[source] = _Grouping(series, picks, samples, grouped)
        return grouped

    def _made(self, collector: str, make: Callable[[], list[Sample]]) -> list[Sample]:
        """A collector's live samples; a bug in making them costs its own series, not the
        scrape, and is logged once until they are made again (not at every scrape)."""
        try:
            samples = make()
        except Exception:  # noqa: BLE001
            if collector not in self._failing_makers:
                self._failing_makers.add(collector)
                log.exception("collector %s: making its samples for the scrape failed (logged once until "
                              "it works again)", collector)
            return []
        if collector in self._failing_makers:
            self._failing_makers.discard(collector)
            log.info("collector %s: its samples are made again", collector)
        return samples


Pick = Callable[[list[Sample]], list[Sample]]  # a family's samples out of a source's


class _Grouping(NamedTuple):
    """A source's grouping at the last scrape."""

    series: list  # [(metric, labels)] of its samples, in order
    picks: list[tuple[MetricSpec, Pick]]  # where each family's samples are in them (grouping_plan)
    samples: list[Sample]  # the list itself
    grouped: list[tuple[MetricSpec, list[Sample]]]  # what it gave


def grouping_plan(samples: list[Sample]) -> list[tuple[MetricSpec, Pick]]:
    """For a list of samples, each family with what picks its samples, in label order, out of
    a list with the same series: a slice where they sit together in that order (as most
    collectors make them), else their places."""
    positions: dict[str, tuple[MetricSpec, list[int]]] = {}
    for i, s in enumerate(samples):
        group = positions.get(s.metric.name)
        if group is None:
            group = positions[s.metric.name] = (s.metric, [])
        group[1].append(i)
    plan: list[tuple[MetricSpec, Pick]] = []
    for metric, places in positions.values():
        places.sort(key=lambda i: samples[i].labels)
        first, last = places[0], places[-1]
        together = places == list(range(first, last + 1))
        plan.append((metric, itemgetter(slice(first, last + 1)) if together else _picker(places)))
    return plan


def _picker(places: list[int]) -> Pick:
    pick = itemgetter(*places)

    def picked(samples: list[Sample]) -> list[Sample]:
        return list(pick(samples))
    return picked
