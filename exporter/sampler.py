"""The sampler owns time: it runs collectors on a fast and a slow tick, off the event loop.

Fast tick (default 0.2 s): what the fast-tick correlation needs: wire bytes and pause
frames, then the counters derived from them (link_load.py: saturated seconds, the node's
network_state), then GPU activity, whose idle time is split by that state.
Slow tick (default 1 s): NIC discovery (published as "inventory") and everything else.

Which collectors run, and at which tick, comes from exporter/collector_registry.py, where
each collector module registered itself. Discovery and link_load are the sampler's own
steps, not registered collectors: every collector depends on the inventory, and
link_load derives from the wire collector's samples rather than reading a source.

Each tick has its own thread, so a slow source (a hung sysfs read) delays only its own
tick, and ticks of one kind never overlap: a tick that overruns delays the next, which is
counted (gpunet_exporter_ticks_late_total) rather than piled up.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

import exporter.collectors  # noqa: F401  (importing the package registers every collector)
from exporter.bounded import BoundedCalls
from exporter.collector_registry import CollectorSetup, Registration, default_names, registered
from exporter.counters import MonotonicCounters
from exporter.inventory import InventoryOptions, Nic, discover
from exporter.link_load import LinkLoad
from exporter.readers.gpus import GpuSource
from exporter.refresh import DEFAULT_INTERVAL, Refreshed
from exporter.registry import Registry
from exporter.root import Root, SourceError
from exporter.samples import Collector, Sample, TickContext
from exporter.workload_options import WorkloadOptions

log = logging.getLogger("gpunet.exporter")

MAX_LOGGED_PROBLEMS = 1000


class Sampler:
    def __init__(self, root: Root, registry: Registry, inventory: InventoryOptions,
                 fast_interval: float = 0.2, slow_interval: float = 1.0,
                 gpus: GpuSource | None = None, workload: WorkloadOptions | None = None,
                 config_interval: float = DEFAULT_INTERVAL, collectors: Iterable[str] | None = None):
        """`collectors` names the registered collectors to run (exporter/collector_registry.py);
        None: those enabled by default. Collectors that need a GPU run only with `gpus`."""
        self.root = root
        self.registry = registry
        self.inventory_options = inventory
        self.fast_interval = fast_interval
        self.slow_interval = slow_interval
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
        self._counters: dict[str, MonotonicCounters] = {}
        self._logged: dict[str, str] = {}  # problem -> collector that first met it
        self._failing: set[str] = set()
        self._slow_calls = BoundedCalls("gpunet-slow-collectors")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.last_fast_tick = time.monotonic()

    def collector(self, name: str) -> Collector | None:
        """The running collector of that name (as run: wrapped when it refreshes), None when off."""
        return next((c for c in [*self.link_load_inputs, *self.fast, *self.slow] if c.name == name), None)

    # --- one tick ---------------------------------------------------------------------
    def slow_tick(self, now: float | None = None) -> None:
        started = time.perf_counter()
        errors: list[SourceError] = []
        try:
            self.nics = discover(self.root, self.inventory_options, errors, self._static)
        except Exception as e:  # noqa: BLE001 - keep the last inventory, say why
            errors.append(e if isinstance(e, SourceError) else SourceError("inventory", repr(e)))
        self._report("inventory", [], time.perf_counter() - started, errors)
        ctx = TickContext(time.monotonic() if now is None else now, self.nics)
        # A source that blocks (a sysfs read stuck in a driver) costs its own collector only:
        # the calls are time-bounded and a hung collector is set aside until it returns.
        results = self._slow_calls.run({c.name: (lambda c=c: self._collect(c, ctx)) for c in self.slow},
                                       timeout=max(2 * self.slow_interval, 1.0))
        for collector in self.slow:
            result = results.get(collector.name)
            if isinstance(result, tuple):
                self._publish(collector, *result)
            else:
                self._publish(collector, [], [SourceError(collector.name, f"collector hung: {result}")], 0.0)

    def fast_tick(self, now: float | None = None) -> None:
        """One fast tick; `now` (monotonic seconds) lets tests run ticks on a clock of their own."""
        ctx = TickContext(time.monotonic() if now is None else now, self.nics)
        self.last_fast_tick = time.monotonic()
        if self.link_load_inputs:
            wire = [s for collector in self.link_load_inputs for s in self._run(collector, ctx)]
            started = time.perf_counter()
            derived = self.link_load.update(ctx.now, ctx.nics, wire)
            self.registry.publish("link_load", derived, time.perf_counter() - started, 0)
            ctx = replace(ctx, network_state=self.link_load.network_state)
        for collector in self.fast:
            self._run(collector, ctx)

    def _run(self, collector: Collector, ctx: TickContext) -> list[Sample]:
        return self._publish(collector, *self._collect(collector, ctx))

    def _collect(self, collector: Collector, ctx: TickContext) -> tuple[list[Sample], list[SourceError], float]:
        started = time.perf_counter()
        errors: list[SourceError] = []
        try:
            samples = collector.collect(ctx, errors)
        except SourceError as e:
            errors.append(e)
            samples = []
        except Exception as e:  # noqa: BLE001 - a bug in one collector must not stop the others
            log.exception("collector %s failed", collector.name)
            errors.append(SourceError(collector.name, repr(e)))
            samples = []
        return samples, errors, time.perf_counter() - started

    def _publish(self, collector: Collector, samples: list[Sample], errors: list[SourceError],
                 duration: float) -> list[Sample]:
        counters = self._counters.setdefault(collector.name, MonotonicCounters())
        samples = counters.apply(samples)
        self._report(collector.name, samples, duration, errors)
        return samples

    def _report(self, name: str, samples: list[Sample], duration: float, errors: list[SourceError]) -> None:
        self.registry.publish(name, samples, duration, len(errors))
        # Log each distinct problem once (a malformed file would otherwise log every tick,
        # and two collectors reading one broken source would log it twice).
        for e in errors:
            problem = str(e)
            if problem not in self._logged and len(self._logged) < MAX_LOGGED_PROBLEMS:
                self._logged[problem] = name
                log.warning("collector %s: %s", name, e)
        if errors:
            self._failing.add(name)
        elif name in self._failing:
            self._failing.discard(name)
            self._logged = {k: v for k, v in self._logged.items() if v != name}
            log.info("collector %s: recovered", name)

    # --- the loops --------------------------------------------------------------------
    # Plain threads with their own clock: a tick costs no event-loop round trip, and the
    # HTTP server's loop never waits on a tick.
    async def start(self) -> None:
        await asyncio.to_thread(self.slow_tick)  # the first inventory, before any scrape
        await asyncio.to_thread(self.fast_tick)
        self._stop.clear()
        self._threads = [threading.Thread(target=self._loop, args=("slow", self.slow_interval, self.slow_tick),
                                          name="gpunet-slow", daemon=True),
                         threading.Thread(target=self._loop, args=("fast", self.fast_interval, self.fast_tick),
                                          name="gpunet-fast", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _loop(self, tick: str, interval: float, fn) -> None:
        deadline = time.monotonic()
        while True:
            deadline += interval
            delay = deadline - time.monotonic()
            late = delay < -interval
            if late:
                deadline = time.monotonic()  # skip the missed ticks instead of bursting
            if self._stop.wait(max(delay, 0.0)):
                return
            try:
                fn()
            except Exception:  # noqa: BLE001 - collectors are guarded; this is a bug elsewhere
                log.exception("%s tick failed", tick)
            self.registry.add_tick(tick, interval, late)

    async def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            await asyncio.to_thread(thread.join, 5.0)
        self._slow_calls.close()
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
