"""What the network did in each fast tick: saturated seconds and the node's network_state.

A 15 s scrape averages a 300 ms all-reduce burst at line rate into a modest rate; counting
at the fast tick keeps it (docs/metrics.md). Computed from the wire collector's samples
after they were made monotonic, so a counter reset never reads as a burst.

The fast tick only adds up (`update`); the samples are made when a scrape asks for them
(`samples`), once a scrape rather than five times a second.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import deque

from exporter.inventory import Nic
from exporter.samples import NetworkTick, Sample
from gpunet.contract import (
    ACTIVE_RATIO,
    NETWORK_STATES,
    NIC_RECEIVE_BYTES,
    NIC_SATURATED_SECONDS,
    NIC_TRANSMIT_BYTES,
    NODE_NETWORK_BURSTS,
    NODE_NETWORK_STATE_SECONDS,
    SATURATED_RATIO,
)

# Bounds the sums kept for NICs that left (renamed virtual functions come and go by the
# hundred), as exporter/counters.py bounds its state.
FORGET_LEFT_NICS_AFTER = 600.0  # seconds
_DIRECTION = {NIC_RECEIVE_BYTES.name: "receive", NIC_TRANSMIT_BYTES.name: "transmit"}
# The states of the last ticks are kept for GPUs read once a second from their driver's
# sample buffer (collectors/gpu.py): each sample's idle time goes to the states of the ticks
# it spans. Kept by age, whatever the fast interval: several reads' worth.
HISTORY_SECONDS = 10.0
HISTORY_TICKS = 10_000  # and by count, should the clock stand still


def time_in_states(ticks: list[NetworkTick], ends: list[float], start: float, end: float) -> dict[str, float]:
    """How the time (start, end] divides among network states, by the ticks (in order, `ends`
    their ends) it overlaps. Time before the first tick counts in its state, time after the
    last in the last's: the newest driver sample may end a moment past the latest tick.
    Without ticks (no wire collector), all of it is quiet."""
    if not ticks:
        return {"quiet": end - start}
    out: dict[str, float] = {}
    first, last = ticks[0], ticks[-1]
    if start < first.start:
        out[first.state] = min(first.start, end) - start
    if end > last.end:
        out[last.state] = out.get(last.state, 0.0) + end - max(last.end, start)
    for i in range(bisect_right(ends, start), len(ticks)):
        tick = ticks[i]
        if tick.start >= end:
            break
        overlap = min(tick.end, end) - max(tick.start, start)
        if overlap > 0:
            out[tick.state] = out.get(tick.state, 0.0) + overlap
    return out


class LinkLoad:
    def __init__(self) -> None:
        self._last: dict[tuple[str, str], float] = {}  # (device, direction) -> bytes at last tick
        self._last_pauses: dict[str, float] = {}  # device -> received pause frames at last tick
        self._last_time: float | None = None
        self.saturated_seconds: dict[tuple[str, str], float] = {}
        self.state_seconds = dict.fromkeys(NETWORK_STATES, 0.0)
        # Quiet -> busier transitions: one per all-reduce phase when steps are longer than
        # two ticks. With bytes, it gives the traffic of one burst, which a 15 s scrape of
        # byte counters alone cannot tell from a steady trickle.
        self.bursts = 0
        self.network_state = "quiet"  # of the latest tick
        self.tick_seconds = 0.0  # length of the latest tick
        # The last HISTORY_SECONDS of ticks with their states, oldest first (read on the fast
        # lane, which writes it).
        self.ticks: deque[NetworkTick] = deque(maxlen=HISTORY_TICKS)
        self._nics: dict[str, Nic] = {}  # of the latest tick
        self._left: dict[str, float] = {}  # device -> when it left, while its sums are kept
        # Held by `update` (the fast tick) and `samples` (a scrape): a scrape sees a whole tick.
        self._lock = threading.Lock()

    def update(self, now: float, nics: dict[str, Nic], wire: list[Sample], pauses_now: dict[str, float]) -> None:
        """`wire`: the wire collector's byte counters; `pauses_now`: the pause frames each NIC
        received, summed over priorities by that collector (it makes the per-priority
        series only once a slow interval)."""
        with self._lock:
            self._update(now, nics, wire, pauses_now)

    def _update(self, now: float, nics: dict[str, Nic], wire: list[Sample], pauses_now: dict[str, float]) -> None:
        bytes_now: dict[tuple[str, str], float] = {}
        for s in wire:
            direction = _DIRECTION.get(s.metric.name)
            if direction is not None:
                bytes_now[(s.labels[0], direction)] = s.value

        dt = 0.0 if self._last_time is None else now - self._last_time
        paused = saturated = active = False
        if dt > 0:
            for key, value in bytes_now.items():
                nic = nics.get(key[0])
                last = self._last.get(key)
                if nic is None or last is None or not nic.speed_bytes_per_second:
                    continue
                ratio = (value - last) / dt / nic.speed_bytes_per_second
                if ratio >= SATURATED_RATIO:
                    self.saturated_seconds[key] = self.saturated_seconds.get(key, 0.0) + dt
                if nic.fabric:
                    saturated |= ratio >= SATURATED_RATIO
                    active |= ratio >= ACTIVE_RATIO
            for device, value in pauses_now.items():
                nic = nics.get(device)
                last = self._last_pauses.get(device)
                if nic is not None and nic.fabric and last is not None and value > last:
                    paused = True
            state = "paused" if paused else "saturated" if saturated else "active" if active else "quiet"
            self.state_seconds[state] += dt
            if state != "quiet" and self.network_state == "quiet":
                self.bursts += 1
            self.network_state = state
            ticks = self.ticks
            ticks.append(NetworkTick(now - dt, now, state))
            while ticks[0].end < now - HISTORY_SECONDS:
                ticks.popleft()
        self.tick_seconds = dt
        new_inventory = nics is not self._nics  # discovery returns the same dict while the NICs are the same
        self._last, self._last_pauses, self._last_time, self._nics = bytes_now, pauses_now, now, nics
        if not new_inventory and not self._left:
            return
        # A NIC that left takes its series out of the scrape, but its sums are kept a while: one
        # that comes back (a driver reload, a firmware reset) goes on from them, as a counter
        # must, rather than from zero.
        for key in list(self.saturated_seconds):
            device = key[0]
            if device in nics:
                self._left.pop(device, None)
            elif now - self._left.setdefault(device, now) > FORGET_LEFT_NICS_AFTER:
                del self.saturated_seconds[key]
        for device in [d for d, left in self._left.items() if now - left > FORGET_LEFT_NICS_AFTER]:
            del self._left[device]

    def samples(self) -> list[Sample]:
        """The series as of the latest tick: saturated seconds of each NIC with a known speed
        whose bytes that tick read, seconds in each network state, bursts."""
        with self._lock:
            out = []
            for device, nic in self._nics.items():
                if nic.speed_bytes_per_second:
                    for direction in ("receive", "transmit"):
                        if (device, direction) in self._last:
                            value = self.saturated_seconds.get((device, direction), 0.0)
                            out.append(Sample(NIC_SATURATED_SECONDS, (device, direction), value))
            out.extend(Sample(NODE_NETWORK_STATE_SECONDS, (state,), secs) for state, secs in self.state_seconds.items())
            out.append(Sample(NODE_NETWORK_BURSTS, (), float(self.bursts)))
            return out
