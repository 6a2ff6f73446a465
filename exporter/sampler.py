"""The sampler owns time: it runs collectors on a fast and a slow tick, off the event loop.

Fast tick (default 0.2 s): what the fast-tick correlation needs: wire bytes and pause
frames, then the counters derived from them (link_load.py: saturated seconds, the node's
network_state), then GPU activity, whose idle time is split by that state. Of what the fast
collectors read, only the series that correlation needs are kept up at every fast tick
(bytes, the saturated and state seconds, GPU up, busy and idle seconds; link_load and the
GPU collector keep them as sums, made into samples when a scrape asks); the rest
(per-priority pause frames, GPU utilization, clock, throttled seconds) once a slow
interval, at the first fast tick that interval, and served in between from that refresh.
Slow tick (default 1 s): NIC discovery (published as "inventory") and everything else.

Scraped at a steady rhythm (exporter/scrape_clock.py), the slow collectors read, and the
fast tick refreshes, only at the ticks before each scrape is due rather than once every slow
interval: a scrape still gets what was read within a slow interval (and a scrape's jitter)
before it, never waits for it, and at a 15 s scrape the node is read a fifteenth as often.
Discovery runs at every slow tick: the fast ticks depend on it.

Which collectors run, and at which tick, comes from exporter/collector_registry.py, where
each collector module registered itself. Discovery and link_load are the sampler's own
steps, not registered collectors: every collector depends on the inventory, and
link_load derives from the wire collector's samples rather than reading a source.

Each kind of tick runs on a worker thread of its own (an exporter/bounded.py lane) that
wakes on its own schedule, with no hand-off per tick. Every read of the host is bounded in
time: each collector (and discovery) runs under a time limit a watchdog thread checks, so a
source that blocks (a sysfs read stuck in a driver) costs its own collector's series and
`up`, for as long as it hangs, and nothing else: the tick starts again on a fresh worker and
goes on with the other collectors. Ticks of one kind never overlap: a tick that overruns
delays the next, which is counted (gpunet_exporter_ticks_late_total) rather than piled up.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple

import exporter.collectors  # noqa: F401  (importing the package registers every collector)
from exporter.bounded import BoundedCalls, Hung, Lane, Watchdog
from exporter.collector_registry import CollectorSetup, Registration, default_names, registered
from exporter.counters import MonotonicCounters
from exporter.inventory import InventoryOptions, Nic, discover
from exporter.link_load import LinkLoad
from exporter.readers.gpus import GpuSource
from exporter.refresh import DEFAULT_INTERVAL, Refreshed
from exporter.registry import Registry
from exporter.root import Root, SourceError
from exporter.samples import Collector, Sample, TickContext
from exporter.scrape_clock import ScrapeClock, should_read
from exporter.workload_options import WorkloadOptions

log = logging.getLogger("gpunet.exporter")

MAX_LOGGED_PROBLEMS = 1000
LINK_LOAD = "link_load"  # the collector label of what link_load.py derives
INVENTORY = "inventory"  # the collector label of discovery


class Collected(NamedTuple):
    """A collector's run, as the sampler publishes it."""

    samples: list[Sample]
    duration: float  # seconds, the collect alone
    errors: list[SourceError]
    refreshed: list[Sample] | None  # its `refreshed_series` where this tick refreshed them; None: the last stand
    live: Callable[[], list[Sample]] | None  # its `live_samples`; None where it has none or the run was lost


class Sampler:
    def __init__(self, root: Root, registry: Registry, inventory: InventoryOptions,
                 fast_interval: float = 0.2, slow_interval: float = 1.0,
                 gpus: GpuSource | None = None, workload: WorkloadOptions | None = None,
                 config_interval: float = DEFAULT_INTERVAL, collectors: Iterable[str] | None = None,
                 follow_scrapes: bool = False):
        """`collectors` names the registered collectors to run (exporter/collector_registry.py);
        None: those enabled by default. Collectors that need a GPU run only with `gpus`.
        `follow_scrapes`: the scheduled ticks read what only a scrape shows just before the
        scrapes told to `scrapes` are due (else, and until their rhythm is known, every time)."""
        self.root = root
        self.registry = registry
        self.inventory_options = inventory
        self.fast_interval = fast_interval
        self.slow_interval = slow_interval
        self.scrapes = ScrapeClock() if follow_scrapes else None  # the server tells it each scrape
        chosen = choose(default_names() if collectors is None else collectors, gpus is not None)
        # Without a collector that asks the GPUs they are not read at all, as on a node without GPUs.
        self.gpus = gpus if any(r.needs_gpu for r in chosen) else None
        setup = CollectorSetup(root, self.gpus, fast_interval, config_interval, workload or WorkloadOptions())
        built = [(r, build(r, setup)) for r in chosen]
        # Fast tick: first the collectors link_load derives the network state from (the wire
        # collector), then the rest, which see that state.
        self.link_load_inputs: list[Collector] = [c for r, c in built if r.feeds_link_load]
        self.fast: list[Collector] = [c for r, c in built if r.tick == "fast" and not r.feeds_link_load]
        self.slow: list[Collector] = [c for r, c in built if r.tick == "slow"]
        self.link_load = LinkLoad()
        self.nics: dict[str, Nic] = {}
        self._static: dict = {}  # what discovery need not read again
        self._counters: dict[tuple[str, bool], MonotonicCounters] = {}  # (collector, its refreshed part)
        self._logged: dict[str, set[str]] = {}  # problem logged -> the collectors that met it at their last run
        self._met: dict[str, set[str]] = {}  # collector -> the logged problems it met at its last run
        self._failing: set[str] = set()
        self._slow_calls = BoundedCalls("gpunet-slow-collectors")
        self._fast_calls = BoundedCalls("gpunet-fast-collectors")
        self._slow_lane = Lane("gpunet-slow")
        self._fast_lane = Lane("gpunet-fast")
        self._watchdog: Watchdog | None = None
        self._first_slow_tick = threading.Event()
        self._fast_waits_until = 0.0  # monotonic: the fast ticks wait this long at most for the first slow tick
        self._report_lock = threading.Lock()  # both lanes report: the log bookkeeping is shared
        self.last_fast_tick = time.monotonic()
        self.first_fast_tick_done = threading.Event()
        self._last_refresh: float | None = None  # the time (ctx.now) of the last fast tick that refreshed all
        self._refreshed_devices: frozenset[str] = frozenset()  # the NICs it saw
        # How long the last slow ticks that read took: a read before a scrape starts that much
        # earlier, so that it is published by the time the scrape comes.
        self._slow_reads_took: deque[float] = deque(maxlen=4)

    def collector(self, name: str) -> Collector | None:
        """The running collector of that name (as run: wrapped when it refreshes), None when off."""
        return next((c for c in [*self.link_load_inputs, *self.fast, *self.slow] if c.name == name), None)

    # --- one tick ---------------------------------------------------------------------
    # How long a tick waits for a collector before setting it aside as hung: a few of its
    # intervals (sysfs and netlink answer in microseconds, NVML in milliseconds).
    @property
    def slow_timeout(self) -> float:
        return max(2 * self.slow_interval, 1.0)

    @property
    def fast_timeout(self) -> float:
        return max(2 * self.fast_interval, 0.2)

    @property
    def watchdog_interval(self) -> float:
        """How often the watchdog looks for a hung call: once a slow interval (at most once a
        second, at least once a fast time limit). Each look wakes a thread, which costs as
        much CPU as a fast tick's reads on a VM; a hang is rare, and costs at most this long
        again (a few late fast ticks, counted) before the tick goes on without it."""
        return max(min(self.slow_interval, 1.0), self.fast_timeout)

    def slow_tick(self, now: float | None = None) -> None:
        """One slow tick, discovery and every slow collector, run on its lane's worker while
        this thread waits (tests, one-off scrapes; the running exporter's lanes tick on their
        own schedule)."""
        self._slow_lane.call(lambda: self._slow_tick(now))

    def fast_tick(self, now: float | None = None) -> None:
        """One fast tick, as `slow_tick`; `now` (monotonic seconds) lets tests run ticks on a
        clock of their own."""
        self._fast_lane.call(lambda: self._fast_tick(now))

    def _slow_tick(self, now: float | None = None, collect: bool = True) -> None:
        """Discovery, then (where `collect`) the slow collectors, which see the NICs it found
        (the last inventory where it failed or hung)."""
        started = time.perf_counter()
        errors: list[SourceError] = []
        run, limit = self._slow_calls.call, self.slow_timeout
        result = run(INVENTORY, limit, discover, self.root, self.inventory_options, errors, self._static)
        took = time.perf_counter() - started
        if isinstance(result, dict):
            self.nics = result
        elif isinstance(result, Hung):  # keep the last inventory, say why (in one wording: logged once)
            errors.append(SourceError(INVENTORY, f"hung: no answer within {limit:g}s; the last "
                                                 "inventory is kept until it answers"))
        else:
            errors.append(result if isinstance(result, SourceError) else SourceError(INVENTORY, repr(result)))
        self._report(INVENTORY, [], took, errors)
        if not collect:
            return
        ctx = TickContext(time.monotonic() if now is None else now, self.nics)
        results = {c.name: run(c.name, limit, self._collect, c, ctx) for c in self.slow}
        self._publish_all(self.slow, results, limit)
        self._slow_reads_took.append(time.perf_counter() - started)

    def _fast_tick(self, now: float | None = None) -> None:
        """The wire collector, link_load derived from its samples, then the other fast
        collectors, which see the network state link_load set."""
        now = time.monotonic() if now is None else now
        # Half a fast interval of slack: a tick woken a little early still refreshes, so the
        # refresh comes every slow interval rather than every slow interval plus a fast one.
        # A NIC come or gone refreshes at once: a gone NIC's series go with it.
        # Scraped at a steady rhythm, it waits for the slow interval before the next scrape.
        nics = self.nics
        due = self._last_refresh is None or now - self._last_refresh >= self.slow_interval - self.fast_interval / 2
        refresh_all = (due and should_read(self.scrapes, now, self.slow_interval)
                       or nics.keys() != self._refreshed_devices)
        ctx = TickContext(now, nics, refresh_all=refresh_all)
        self.last_fast_tick = time.monotonic()
        run, limit = self._fast_calls.call, self.fast_timeout
        wire: dict[str, tuple[list[Sample], dict[str, float]]] = {}  # what the wire gave this tick
        results = {c.name: run(c.name, limit, self._collect_wire, c, ctx, wire) for c in self.link_load_inputs}
        if self.link_load_inputs:
            # Run even when the wire hung: link_load then counts the tick as quiet.
            derived = run(LINK_LOAD, limit, self._derive_link_load, ctx, wire)
            if isinstance(derived, float):
                self.registry.publish(LINK_LOAD, [], derived, 0, live=self.link_load.samples)
                ctx = TickContext(now, nics, self.link_load.network_state, refresh_all, self.link_load.ticks)
            else:  # a bug in link_load, or hung: logged, its series kept from the last tick
                log.error("link_load failed: %r", derived)
                if not isinstance(derived, Hung):  # the ticks before this one still hold (a hung update may be writing them)
                    ctx = TickContext(now, nics, refresh_all=refresh_all, network_ticks=self.link_load.ticks)
        for c in self.fast:
            results[c.name] = run(c.name, limit, self._collect, c, ctx)
        self._publish_all([*self.link_load_inputs, *self.fast], results, limit)
        if refresh_all:  # only now: a tick cut short by a hang refreshes again when run again
            self._last_refresh = now
            self._refreshed_devices = frozenset(nics)
        if not self.first_fast_tick_done.is_set():
            self.first_fast_tick_done.set()

    def _collect_wire(self, collector: Collector, ctx: TickContext,
                      wire: dict[str, tuple[list[Sample], dict[str, float]]]):
        """_collect for a collector link_load derives from: its (monotonic) samples and the
        pause frames it summed per NIC (on most ticks it makes no per-priority samples) are
        kept in `wire` for link_load, after it in the same tick."""
        result = self._collect(collector, ctx)
        wire[collector.name] = (result.samples, getattr(collector, "received_pauses", {}))
        return result

    def _derive_link_load(self, ctx: TickContext, wire: dict[str, tuple[list[Sample], dict[str, float]]]) -> float:
        """Saturated seconds and the node's network state from what the wire gave this tick;
        its duration."""
        started = time.perf_counter()
        samples = [s for got, _ in wire.values() for s in got]
        received = {device: n for _, pauses in wire.values() for device, n in pauses.items()}
        self.link_load.update(ctx.now, ctx.nics, samples, received)
        return time.perf_counter() - started

    def _publish_all(self, collectors: list[Collector], results: dict, timeout: float) -> None:
        for collector in collectors:
            result = results.get(collector.name)
            if isinstance(result, Collected):
                self._report(collector.name, *result)
            else:
                # One wording while it stays hung, so that it is logged once (_report).
                self._report(collector.name, [], 0.0, [SourceError(
                    collector.name, f"hung: no answer within {timeout:g}s; its series are left out until it answers")],
                    [])

    def _collect(self, collector: Collector, ctx: TickContext) -> Collected:
        """The collector's run: its samples made monotonic, and apart its `refreshed_series`
        and `live_samples` (exporter/samples.py)."""
        started = time.perf_counter()
        errors: list[SourceError] = []
        refreshed_series: frozenset[str] = getattr(collector, "refreshed_series", frozenset())
        raised = True
        try:
            samples = collector.collect(ctx, errors)
            raised = False
        except SourceError as e:
            errors.append(e)
            samples = []
        except Exception as e:  # noqa: BLE001 - a bug in one collector must not stop the others
            log.exception("collector %s failed", collector.name)
            errors.append(SourceError(collector.name, repr(e)))
            samples = []
        duration = time.perf_counter() - started
        # A lost run loses its live series (and its refreshed ones, as they would go at a refresh).
        live = None if raised else getattr(collector, "live_samples", None)
        if refreshed_series and ctx.refresh_all and not raised:
            # Made monotonic apart: each part then has the same series at every tick that
            # makes it, which exporter/counters.py goes through the short way.
            every_tick = [s for s in samples if s.metric.name not in refreshed_series]
            refreshed = [s for s in samples if s.metric.name in refreshed_series]
            return Collected(self._monotonic(collector, every_tick), duration, errors,
                             self._monotonic(collector, refreshed, refreshed_part=True), live)
        samples = self._monotonic(collector, samples)
        if not refreshed_series:
            return Collected(samples, duration, errors, None, live)
        if raised:
            return Collected(samples, duration, errors, [], None)
        return Collected(samples, duration, errors, None, live)

    def _monotonic(self, collector: Collector, samples: list[Sample], refreshed_part: bool = False) -> list[Sample]:
        """The samples with their counters made monotonic (exporter/counters.py), unless the
        collector keeps counters that never go back itself (`monotonic`)."""
        if getattr(collector, "monotonic", False):
            return samples
        # A collector runs on one worker at a time (a hung one is skipped until it returns),
        # so its counters are never applied from two threads at once.
        key = (collector.name, refreshed_part)
        counters = self._counters.get(key)
        if counters is None:
            counters = self._counters[key] = MonotonicCounters()
        return counters.apply(samples)

    def _report(self, name: str, samples: list[Sample], duration: float, errors: list[SourceError],
                refreshed: list[Sample] | None = None, live: Callable[[], list[Sample]] | None = None) -> None:
        self.registry.publish(name, samples, duration, len(errors), refreshed, live)
        if not errors and name not in self._failing:
            return  # the common case, without the lock
        # Log each distinct problem once while it persists (a malformed file would otherwise
        # log every tick, and two collectors reading one broken source would log it twice).
        # A problem no collector met at its last run is forgotten, so that it is logged again
        # if it comes back, and the cap is reached only by that many problems at once, not
        # by the churn of one collector that always has some problem (a device come and gone).
        with self._report_lock:
            met = {str(e): e for e in errors}
            for problem in self._met.pop(name, set()) - met.keys():
                collectors = self._logged[problem]
                collectors.discard(name)
                if not collectors:
                    del self._logged[problem]
            for problem, e in met.items():
                if problem in self._logged:
                    self._logged[problem].add(name)
                elif len(self._logged) < MAX_LOGGED_PROBLEMS:
                    self._logged[problem] = {name}
                    log.warning("collector %s: %s", name, e)
            tracked = {problem for problem in met if problem in self._logged}
            if tracked:
                self._met[name] = tracked
            if errors:
                self._failing.add(name)
            elif name in self._failing:
                self._failing.discard(name)
                log.info("collector %s: recovered", name)

    # --- the schedule ----------------------------------------------------------------------
    async def start(self) -> None:
        """Start ticking and return at once: the server listens before the first tick (which
        may wait on a hung source for a time limit). The fast ticks start once the first slow
        tick is done (or two of its time limits passed), so the first already sees the NICs,
        and a scrape after it (/healthz answers 200 from then on) sees every collector."""
        self._watchdog = Watchdog([self._slow_lane, self._fast_lane], every=self.watchdog_interval)
        self._watchdog.start()
        # However long the first slow tick takes (a source hung at start costs its limit),
        # the fast ticks start within two of its time limits.
        self._fast_waits_until = time.monotonic() + 2 * self.slow_timeout
        self._slow_lane.schedule(self.slow_interval, self._scheduled_slow_tick)
        self._fast_lane.schedule(self.fast_interval, self._scheduled_fast_tick)

    def _scheduled_slow_tick(self, late: bool) -> None:
        collect = not self._first_slow_tick.is_set() or should_read(
            self.scrapes, time.monotonic(), self.slow_interval, max(self._slow_reads_took, default=0.0))
        self._run_scheduled("slow", self.slow_interval, lambda: self._slow_tick(collect=collect), late)
        self._first_slow_tick.set()

    def _scheduled_fast_tick(self, late: bool) -> None:
        if not self._first_slow_tick.is_set() and time.monotonic() < self._fast_waits_until:
            return  # not yet: the first fast tick should see the NICs
        self._run_scheduled("fast", self.fast_interval, self._fast_tick, late)

    def _run_scheduled(self, tick: str, interval: float, fn: Callable[[], None], late: bool) -> None:
        # Counted as it starts: a tick abandoned in a hang (exporter/bounded.py) never ends here.
        self.registry.add_tick(tick, interval, late)
        try:
            fn()
        except Exception:  # noqa: BLE001 - collectors are guarded; this is a bug elsewhere
            log.exception("%s tick failed", tick)

    def wait_first_ticks(self, timeout: float) -> bool:
        """For `scrape` and tests: True once the first fast tick (after the first inventory) ran."""
        return self.first_fast_tick_done.wait(timeout)

    async def stop(self, timeout: float = 2.0) -> None:
        """Stop ticking, waiting at most `timeout` in all: a tick stuck past its own limits is
        left to the daemon threads, which do not hold the process."""
        if self._watchdog is not None:
            self._watchdog.stop()
        self._slow_lane.close()
        self._fast_lane.close()
        self._slow_calls.close()
        self._fast_calls.close()
        deadline = time.monotonic() + timeout
        for lane in (self._slow_lane, self._fast_lane):
            await asyncio.to_thread(lane.join, max(deadline - time.monotonic(), 0.0))
        for collector in [*self.link_load_inputs, *self.fast, *self.slow, self.gpus]:
            close = getattr(collector, "close", None)
            if close is not None:
                close()


def choose(names: Iterable[str], with_gpus: bool) -> list[Registration]:
    """The registrations of these names, in registration order; those that need a GPU only
    `with_gpus`. An unknown name is a ValueError."""
    names = set(names)
    known = registered()
    unknown = names - {r.name for r in known}
    if unknown:
        raise ValueError(f"unknown collector(s) {', '.join(sorted(unknown))}; registered: "
                         f"{', '.join(r.name for r in known)}")
    return [r for r in known if r.name in names and (with_gpus or not r.needs_gpu)]


def build(registration: Registration, setup: CollectorSetup) -> Collector:
    """The collector, wrapped to run every so often when it registered a refresh."""
    collector = registration.factory(setup)
    if collector.name != registration.name:
        raise ValueError(f"collector registered as {registration.name!r} publishes as {collector.name!r}")
    refresh = registration.refresh
    if refresh is None:
        return collector
    if refresh == "config":
        interval = setup.config_interval
    elif refresh == "workload":
        interval = setup.workload.interval
    else:
        interval = float(refresh)
    return Refreshed(collector, interval)
