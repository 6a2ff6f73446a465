"""When the next scrape will come, so that the slow collectors read just before it.

Prometheus (and vmagent) scrape a target at a fixed interval and at a fixed offset within
it, so the requests of one scraper arrive at times that repeat to within milliseconds.
Knowing them, the slow tick need read its sources only at the tick before each scrape
rather than at every tick: at a 15 s scrape, one read where there were fifteen. The scrape
still never waits for hardware (docs/architecture.md), and what it gets was read within
one slow interval and a little before it, as with a read at every tick.

Where the next scrape cannot be foretold, `next_expected` answers None and the slow tick
reads every time, as if this did not exist: before a scraper's rhythm is known (its first
MIN_SCRAPES requests), while its gaps disagree (several scrapers behind one address, a
person with curl), and once a scrape is overdue (a scraper restarted with another offset,
or gone). So only a scrape that comes early, against a rhythm that held until then, can
get series older than that: once, then the rhythm is learned again.
"""

from __future__ import annotations

import threading
from collections import deque

MIN_SCRAPES = 4  # three gaps that agree before a rhythm is trusted
# How far a gap may stray from the rhythm: a scraper's timer is exact to milliseconds, but
# its requests arrive through the network and this exporter's event loop.
JITTER_RATIO = 0.05
MIN_JITTER = 0.25  # seconds: scrapes a second or two apart save little anyway
UNKNOWN_FORGOTTEN_AFTER = 60.0  # seconds: an address with no rhythm (yet) counts this long
MAX_SCRAPERS = 64  # addresses followed; a new one beyond them takes the place of the stalest


class _Scraper:
    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times: deque[float] = deque(maxlen=MIN_SCRAPES)

    def rhythm(self) -> tuple[float, float] | None:
        """(interval, jitter) once its last gaps agree; None before."""
        if len(self.times) < MIN_SCRAPES:
            return None
        t = self.times
        gaps = sorted(b - a for a, b in zip(t, list(t)[1:]))
        interval = gaps[len(gaps) // 2]  # their median (statistics would cost the exporter half a MB)
        jitter = max(JITTER_RATIO * interval, MIN_JITTER)
        if interval <= 0 or any(abs(g - interval) > jitter for g in gaps):
            return None
        return interval, jitter


class ScrapeClock:
    """Scrapes seen, by the scraper's address (`seen`, from the event loop), and the next
    one expected (`next_expected`, from the slow lane)."""

    def __init__(self) -> None:
        self._scrapers: dict[str, _Scraper] = {}
        self._lock = threading.Lock()

    def seen(self, scraper: str, now: float) -> None:
        """A scrape from `scraper` (its address) arrived at `now` (monotonic seconds)."""
        with self._lock:
            s = self._scrapers.get(scraper)
            if s is None:
                self._forget(now)
                if len(self._scrapers) >= MAX_SCRAPERS:  # many addresses: the newcomer has no rhythm yet anyway
                    del self._scrapers[min(self._scrapers, key=lambda a: self._scrapers[a].times[-1])]
                s = self._scrapers[scraper] = _Scraper()
            s.times.append(now)

    def next_expected(self, now: float) -> tuple[float, float] | None:
        """(time, jitter) of the soonest scrape expected from `now` on; None when some
        scraper's next scrape cannot be foretold, or none was seen."""
        with self._lock:
            self._forget(now)
            if not self._scrapers:
                return None
            soonest: tuple[float, float] | None = None
            for s in self._scrapers.values():
                rhythm = s.rhythm()
                if rhythm is None:
                    return None
                interval, jitter = rhythm
                due = s.times[-1] + interval
                if now > due + jitter:  # overdue: restarted elsewhere in its interval, or gone
                    return None
                if soonest is None or due - jitter < soonest[0] - soonest[1]:
                    soonest = (due, jitter)
            return soonest

    def _forget(self, now: float) -> None:
        """Let go of addresses that stopped: after three of their intervals without a scrape
        (UNKNOWN_FORGOTTEN_AFTER for one whose rhythm is not known)."""
        gone = []
        for address, s in self._scrapers.items():
            rhythm = s.rhythm()
            quiet_for = 3 * rhythm[0] if rhythm is not None else UNKNOWN_FORGOTTEN_AFTER
            if now - s.times[-1] > quiet_for:
                gone.append(address)
        for address in gone:
            del self._scrapers[address]


def should_read(clock: ScrapeClock | None, now: float, interval: float) -> bool:
    """Whether a slow tick at `now` reads its sources: unless a scrape is foretold and the
    next tick, `interval` from now, still comes before the earliest it may arrive."""
    if clock is None:
        return True
    expected = clock.next_expected(now)
    if expected is None:
        return True
    due, jitter = expected
    return due - jitter <= now + interval
