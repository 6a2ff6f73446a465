"""Fast tick: GPU activity, and GPU idle time split by what the network did meanwhile.

For every GPU: busy += utilization x time, idle{network_state} += the rest, and
throttled{reason} += the time since the last read while a throttle reason is active. The
network_state is the node's at the same time (link_load.py), so a 15 s scrape still tells
idle-while-paused from idle-while-quiet. Each NVML call runs under a time limit
(exporter/bounded.py): a GPU that hangs or is lost costs only its own series.

How often a GPU is read depends on what it keeps:
- A GPU with a utilization sample buffer (nvmlDeviceGetSamples: every data-centre GPU since
  Kepler) is read once a second, or at the fast tick that refreshes everything, whichever
  comes first. The driver samples utilization every 1/6 to 1 s and stamps each sample, so
  one read a second gets every sample there is, and each sample's idle time is split by the
  network states of the fast ticks it spans (the ticks' states are kept: `ctx.network_ticks`).
  Polling such a GPU five times a second would read the same samples again, for five times
  the NVML calls; NVML offers the buffer for this ("higher frequency data at lower polling
  cost").
- A GPU without one (its utilization is only the rate over the last sample period) is read
  at every fast tick, its utilization over the tick split by that tick's state.

The reads make no sample: up, busy and idle seconds are made from the sums when a scrape
asks (`live_samples`), as of the latest read (a GPU lost shows at its next read, within a
second, with its series gone); utilization, SM clock and throttled seconds are made at the
fast tick that refreshes everything once a slow interval (exporter/sampler.py).
"""

from __future__ import annotations

import threading

from exporter.bounded import BoundedCalls, Hung
from exporter.collector_registry import register
from exporter.link_load import time_in_states
from exporter.readers.gpus import GpuSource
from exporter.readers.nvml import GpuActivity, GpuLost
from exporter.root import SourceError
from exporter.samples import NetworkTick, Sample, TickContext
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
# A GPU with a sample buffer is read at least this often (seconds). Drivers keep many
# seconds of samples; a read a second keeps well inside that, and bounds how late a scrape
# sees the sums and a lost GPU.
READ_BUFFERED_EVERY = 1.0


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
        # A gap longer than this between two readings (GPU hung, then back; samples lost) is not integrated.
        self.gap = max(GAP_TICKS * fast_interval, 2 * READ_BUFFERED_EVERY)
        self._last: dict[str, float] = {}  # gpu -> the time up to which it was integrated
        self._read_at: dict[str, float] = {}  # gpu -> the tick (ctx.now) of its last read
        self._buffered: set[int] = set()  # GPUs (indexes) whose last read gave the driver's samples
        self._buffers_read_at: float | None = None  # the tick at which the buffered GPUs were last read
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
        last = self._buffers_read_at
        due = ctx.refresh_all or last is None or not 0 <= ctx.now - last < READ_BUFFERED_EVERY - self.fast_interval / 2
        reading = identities if due else [g for g in identities if g.index not in self._buffered]
        if not reading:
            return []
        if due:
            self._buffers_read_at = ctx.now
        # The SM clock is exported only at the refresh: asking NVML for it on the ticks in
        # between would be a call per GPU per tick that no series shows.
        activity, sm_clock = self.source.backend.activity, ctx.refresh_all
        results = self.calls.run({g.index: (lambda i=g.index: activity(i, sm_clock)) for g in reading},
                                 timeout=max(0.5 * self.fast_interval, 0.05))
        samples: list[Sample] = []
        up = []
        answered_before = dict(self._up)
        # The network's last ticks and their ends, taken once a read for the GPUs with samples.
        ticks: tuple[list[NetworkTick], list[float]] | None = None
        with self._lock:
            for ident in identities:
                gpu = str(ident.index)
                if ident.index not in results:  # buffered, read at the next due tick
                    up.append((gpu, answered_before.get(gpu, False)))
                    continue
                result = results[ident.index]
                if not isinstance(result, GpuActivity):
                    errors.append(as_source_error(result, ident.index))
                    self._last.pop(gpu, None)  # the time it was away is not known: not integrated
                    self._read_at.pop(gpu, None)
                    self._buffered.discard(ident.index)
                    up.append((gpu, False))
                    continue
                if result.history is None:
                    self._buffered.discard(ident.index)
                    self._integrate(gpu, result, ctx)
                else:
                    self._buffered.add(ident.index)
                    if ticks is None:
                        kept = list(ctx.network_ticks)
                        ticks = (kept, [tick.end for tick in kept])
                    self._integrate_samples(gpu, result, ctx, *ticks)
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

    def _start(self, gpu: str) -> None:
        """The GPU's sums, at zero, at its first answer."""
        self.busy[gpu] = 0.0
        self._idle_keys[gpu] = [(gpu, s) for s in NETWORK_STATES]
        self._throttled_keys[gpu] = [(gpu, r) for r in THROTTLE_REASONS]
        for key in self._idle_keys[gpu]:
            self.idle[key] = 0.0
        for key in self._throttled_keys[gpu]:
            self.throttled[key] = 0.0

    def _integrate(self, gpu: str, reading: GpuActivity, ctx: TickContext) -> None:
        """A GPU read at every tick: its utilization over the time since it was last
        integrated, the idle part in this tick's network state."""
        if gpu not in self.busy:
            self._start(gpu)
        last = self._last.get(gpu)
        self._last[gpu] = ctx.now
        self._throttle(gpu, reading, ctx.now)
        if last is None:
            return
        dt = ctx.now - last
        if dt <= 0 or dt > self.gap:
            return
        busy = reading.utilization * dt
        self.busy[gpu] += busy
        self.idle[(gpu, ctx.network_state)] += dt - busy

    def _integrate_samples(self, gpu: str, reading: GpuActivity, ctx: TickContext,
                           ticks: list[NetworkTick], ends: list[float]) -> None:
        """A GPU read from its sample buffer: each sample's utilization over its own period
        (since the sample before), the idle part split by the network states of the ticks
        that period spans. At its first read, only where it stands is taken: the samples
        from before the exporter watched are not its to count."""
        if gpu not in self.busy:
            self._start(gpu)
        self._throttle(gpu, reading, ctx.now)
        history = reading.history
        last = self._last.get(gpu)
        if last is None:  # from the newest sample on, or from now where the buffer is still empty
            self._last[gpu] = history[-1][0] if history else ctx.now
            return
        busy = 0.0
        for at, utilization in history:
            dt = at - last
            if dt <= 0:  # not after what was integrated (a clock step back): skipped
                continue
            if dt <= self.gap:
                busy += utilization * dt
                for state, seconds in time_in_states(ticks, ends, last, at).items():
                    self.idle[(gpu, state)] += (1.0 - utilization) * seconds
            last = at
        self.busy[gpu] += busy
        self._last[gpu] = last

    def _throttle(self, gpu: str, reading: GpuActivity, now: float) -> None:
        """Throttle reasons are a state at the read: each active one counts the time since
        the last read."""
        last = self._read_at.get(gpu)
        self._read_at[gpu] = now
        if last is None or not 0 < now - last <= self.gap:
            return
        for reason in reading.reasons:
            if (gpu, reason) in self.throttled:
                self.throttled[(gpu, reason)] += now - last


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
