"""Fast tick: GPU activity, and GPU idle time split by what the network did meanwhile.

Each tick, for every GPU: busy += utilization x tick, idle{network_state} += the rest,
throttled{reason} += tick while a throttle reason is active. The network_state is the
node's, for the same tick (link_load.py), so a 15 s scrape still tells idle-while-paused
from idle-while-quiet. Each NVML call runs under a time limit (exporter/bounded.py): a GPU
that hangs or is lost costs only its own series.

Every fast tick reads and integrates every GPU and makes no sample: up, busy and idle
seconds are made from its sums when a scrape asks (`live_samples`), as of the latest tick (a
GPU lost shows at once, with its series gone); utilization, SM clock and throttled seconds
are made at the fast tick that refreshes everything once a slow interval
(exporter/sampler.py).
"""

from __future__ import annotations

import threading

from exporter.bounded import BoundedCalls, Hung
from exporter.collector_registry import register
from exporter.readers.gpus import GpuSource
from exporter.readers.nvml import GpuActivity, GpuLost
from exporter.root import SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import (
    GPU_BUSY_SECONDS,
    GPU_IDLE_SECONDS,
    GPU_SM_CLOCK,
    GPU_THROTTLED_SECONDS,
    GPU_UP,
    GPU_UTILIZATION,
    NETWORK_STATES,
    THROTTLE_REASONS,
)

GAP_TICKS = 10  # a gap longer than this many ticks (GPU hung, then back) is not integrated


class GpuActivityCollector:
    name = "gpu"
    # Its counters are sums of positive tick lengths that it keeps itself (never reset while
    # the exporter runs): the sampler need not make them monotonic.
    monotonic = True
    refreshed_series = frozenset({GPU_UTILIZATION.name, GPU_SM_CLOCK.name, GPU_THROTTLED_SECONDS.name})

    def __init__(self, source: GpuSource, fast_interval: float = 0.2):
        self.source = source
        self.fast_interval = fast_interval
        self.calls = BoundedCalls("gpunet-nvml-fast")
        self._last: dict[str, float] = {}  # gpu -> time of its last integrated reading
        self.busy: dict[str, float] = {}
        self.idle: dict[tuple[str, str], float] = {}
        self.throttled: dict[tuple[str, str], float] = {}
        self._idle_keys: dict[str, list[tuple[str, str]]] = {}  # made once per GPU, not per tick
        self._throttled_keys: dict[str, list[tuple[str, str]]] = {}
        self._up: list[tuple[str, bool]] = []  # (gpu, answered) at the latest tick, in order
        # Held while a tick adds up and while a scrape reads the sums: a scrape sees a whole tick.
        self._lock = threading.Lock()

    def close(self) -> None:
        self.calls.close()

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        self.source.ensure_open()
        identities = self.source.identities
        # The SM clock is exported only at the refresh: asking NVML for it on the ticks in
        # between would be a call per GPU per tick that no series shows.
        activity, sm_clock = self.source.backend.activity, ctx.refresh_all
        results = self.calls.run({g.index: (lambda i=g.index: activity(i, sm_clock)) for g in identities},
                                 timeout=max(0.5 * self.fast_interval, 0.05))
        samples: list[Sample] = []
        up = []
        with self._lock:
            for ident in identities:
                gpu = str(ident.index)
                result = results.get(ident.index)
                if not isinstance(result, GpuActivity):
                    errors.append(as_source_error(result, ident.index))
                    self._last.pop(gpu, None)  # the time it was away is not known: not integrated
                    up.append((gpu, False))
                    continue
                self._integrate(gpu, result, ctx)
                up.append((gpu, True))
                if ctx.refresh_all:
                    labels = (gpu,)
                    samples.append(Sample(GPU_UTILIZATION, labels, result.utilization))
                    if result.sm_clock_hz is not None:
                        samples.append(Sample(GPU_SM_CLOCK, labels, result.sm_clock_hz))
                    for key in self._throttled_keys[gpu]:
                        samples.append(Sample(GPU_THROTTLED_SECONDS, key, self.throttled[key]))
            self._up = up
        return samples

    def live_samples(self) -> list[Sample]:
        """up of every GPU, and busy and idle seconds of those that answered, as of the latest tick."""
        with self._lock:
            samples = []
            for gpu, answered in self._up:
                labels = (gpu,)
                if not answered:
                    samples.append(Sample(GPU_UP, labels, 0.0))
                    continue
                samples.append(Sample(GPU_UP, labels, 1.0))
                samples.append(Sample(GPU_BUSY_SECONDS, labels, self.busy[gpu]))
                for key in self._idle_keys[gpu]:  # (gpu, state): the series' labels and the dict's key
                    samples.append(Sample(GPU_IDLE_SECONDS, key, self.idle[key]))
            return samples

    def _integrate(self, gpu: str, reading: GpuActivity, ctx: TickContext) -> None:
        if gpu not in self.busy:
            self.busy[gpu] = 0.0
            self._idle_keys[gpu] = [(gpu, s) for s in NETWORK_STATES]
            self._throttled_keys[gpu] = [(gpu, r) for r in THROTTLE_REASONS]
            for key in self._idle_keys[gpu]:
                self.idle[key] = 0.0
            for key in self._throttled_keys[gpu]:
                self.throttled[key] = 0.0
        last = self._last.get(gpu)
        self._last[gpu] = ctx.now
        if last is None:
            return
        dt = ctx.now - last
        if dt <= 0 or dt > GAP_TICKS * self.fast_interval:
            return
        busy = reading.utilization * dt
        self.busy[gpu] += busy
        self.idle[(gpu, ctx.network_state)] += dt - busy
        for reason in reading.reasons:
            if (gpu, reason) in self.throttled:
                self.throttled[(gpu, reason)] += dt


def as_source_error(result: object, index: int) -> SourceError:
    if isinstance(result, SourceError):
        return result
    if isinstance(result, Hung):
        return SourceError(f"NVML gpu {index}", f"call hung: {result}")
    if isinstance(result, GpuLost):
        return result
    return SourceError(f"NVML gpu {index}", repr(result))


register("gpu", "fast", lambda setup: GpuActivityCollector(setup.gpus, setup.fast_interval),
         needs_gpu=True, help="GPU utilization and SM clock; busy, idle (by network_state) and throttled seconds")
