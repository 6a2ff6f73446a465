"""The sampler owns time: it runs collectors on a fast and a slow tick, off the event loop.

Fast tick (default 0.2 s): what the fast-tick correlation needs (wire bytes, pause frames,
GPU activity), then the derived counters (saturated seconds, network_state).
Slow tick (default 1 s): NIC discovery and everything else.

Each tick has its own thread, so a slow source (a hung sysfs read) delays only its own
tick, and ticks of one kind never overlap: a tick that overruns delays the next, which is
counted (gpunet_exporter_ticks_late_total) rather than piled up.
"""

from __future__ import annotations

import asyncio
import logging
import time
import threading
from dataclasses import replace

from exporter.bounded import BoundedCalls
from exporter.collectors.bond import BondCollector
from exporter.collectors.driver_stats import DriverStatsCollector
from exporter.collectors.gpu import GpuActivityCollector, GpuSource
from exporter.collectors.gpu_details import GpuDetailsCollector
from exporter.collectors.gpu_workload import GpuWorkloadCollector, WorkloadOptions
from exporter.collectors.netdev import NetdevCollector
from exporter.collectors.nic_info import NicInfoCollector
from exporter.collectors.pcie import PcieCollector
from exporter.collectors.qos import QosCollector
from exporter.collectors.rdma import RdmaCollector
from exporter.collectors.tcp import TcpCollector
from exporter.collectors.wire import WireCollector
from exporter.counters import MonotonicCounters
from exporter.inventory import InventoryOptions, Nic, discover
from exporter.link_load import LinkLoad
from exporter.refresh import DEFAULT_INTERVAL, Refreshed
from exporter.registry import Registry
from exporter.root import Root, SourceError
from exporter.samples import Collector, Sample, TickContext

log = logging.getLogger("gpunet.exporter")

MAX_LOGGED_PROBLEMS = 1000


class Sampler:
    def __init__(self, root: Root, registry: Registry, inventory: InventoryOptions,
                 fast_interval: float = 0.2, slow_interval: float = 1.0,
                 gpus: GpuSource | None = None, workload: WorkloadOptions | None = None,
                 config_interval: float = DEFAULT_INTERVAL):
        self.root = root
        self.registry = registry
        self.inventory_options = inventory
        self.fast_interval = fast_interval
        self.slow_interval = slow_interval
        self.wire = WireCollector(root)
        self.fast: list[Collector] = []
        self.slow: list[Collector] = [NicInfoCollector(), NetdevCollector(root), RdmaCollector(root),
                                      DriverStatsCollector(root), TcpCollector(root)]
        self.gpus = gpus
        if gpus is not None:
            self.fast.append(GpuActivityCollector(gpus, fast_interval))
            self.slow.append(GpuDetailsCollector(gpus))
            workload = workload or WorkloadOptions()
            self.slow.append(Refreshed(GpuWorkloadCollector(gpus, root, workload), workload.interval))
        # Configuration facts (issue 8): QoS and PCIe links change rarely, so they are read
        # every config_interval seconds and when the inventory changes, served in between.
        self.slow += [Refreshed(QosCollector(root), config_interval),
                      Refreshed(PcieCollector(root, gpus), config_interval,
                                lambda: tuple(g.pci_address for g in gpus.identities) if gpus else ()),
                      BondCollector(root)]
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
        wire = self._run(self.wire, ctx)
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
        for collector in [self.wire, *self.fast, *self.slow, self.gpus]:
            close = getattr(collector, "close", None)
            if close is not None:
                close()
