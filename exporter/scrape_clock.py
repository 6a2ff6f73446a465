"""When the next scrape will come, so that the slow collectors read just before it.

Prometheus (and vmagent) scrape a target at a fixed interval and at a fixed offset within
it, so the requests of one scraper arrive at times that repeat to within milliseconds.
Knowing them, the slow tick need read its sources only at the ticks before each scrape
rather than at every tick: at a 15 s scrape, two or three reads where there were fifteen.
The scrape still never waits for hardware (docs/architecture.md), and what it gets was read
within one slow interval and a slack of two jitters before it.

Where the next scrape cannot be foretold, `next_expected` answers None and the slow tick
reads every time, as if this did not exist: before an address's rhythm is known (its
first MIN_SCRAPES requests, and for a minute after each request while it is not), while
its gaps disagree, once a scrape is overdue (a scraper gone, or restarted at another
offset), and for DISTRUST_AFTER_SURPRISE after a request came before its time (a second
job or a person behind the same address; a scraper restarted earlier in its interval).
Such a request, which nothing foretold, gets series read up to one scrape interval before
it; `gpunet_exporter_collector_last_run_timestamp_seconds` says when.
"""

from __future__ import annotations

import threading
from collections import deque

MIN_SCRAPES = 4  # three gaps that agree before a rhythm is trusted
# How far a gap may stray from the rhythm: a scraper's timer is exact to milliseconds, but
# its requests arrive through the network and this exporter's event loop.
JITTER_RATIO = 0.05
MIN_JITTER = 0.25  # seconds: scrapes a second or two apart save little anyway
# A request is due at the last one plus the interval, give or take two jitters: the gaps
# agreed to within one, and a few late ones in a row may have stretched the interval by
# about as much. Reads start that early; a request earlier still was not foretold.
SLACK_JITTERS = 2
# An address without a known rhythm holds every tick to reading for a minute after each of
# its requests (someone with curl), or two of its last gaps where longer (a slow scraper
# still learned, or distrusted), and is remembered long enough for a scraper with a 5 min
# interval to show its rhythm.
UNKNOWN_HOLDS_FOR = 60.0
UNKNOWN_FORGOTTEN_AFTER = 1200.0
# A request before its time means that something else shares the address, with a rhythm of
# its own that the last few gaps did not show (a 60 s job beside a 15 s one): the address
# is not trusted for a while, so that such requests get stale series once in that long.
DISTRUST_AFTER_SURPRISE = 1800.0
MAX_SCRAPERS = 64  # addresses followed; a new one beyond them takes the place of the stalest


class _Scraper:
    __slots__ = ("times", "distrusted_until", "_rhythm")

    def __init__(self) -> None:
        self.times: deque[float] = deque(maxlen=MIN_SCRAPES)
        self.distrusted_until = 0.0
        self._rhythm: tuple[float, float, float] | None = None  # of `times`, made when one is added

    def add(self, at: float) -> None:
        self.times.append(at)
        self._rhythm = self._from_times()

    def rhythm(self, now: float) -> tuple[float, float, float] | None:
        """(next scrape due, interval, slack: how early or late it may come) once its last
        gaps agree; None before, and while distrusted. (Asked at every fast tick while a
        refresh waits for the scrape: worked out once per request, not per question.)"""
        return None if now < self.distrusted_until else self._rhythm

    def _from_times(self) -> tuple[float, float, float] | None:
        t = self.times
        if len(t) < MIN_SCRAPES:
            return None
        gaps = sorted(b - a for a, b in zip(t, list(t)[1:]))
        interval = gaps[len(gaps) // 2]  # their median (statistics would cost the exporter half a MB)
        jitter = max(JITTER_RATIO * interval, MIN_JITTER)
        if interval <= 0 or gaps[-1] - interval > jitter or interval - gaps[0] > jitter:
            return None
        # A request that came late by more than the jitter (a stall in the scraper or here) is
        # no rhythm until it has left the last gaps: the next one, on time, is no surprise.
        return t[-1] + interval, interval, SLACK_JITTERS * jitter

    def holds_for(self) -> float:
        """How long after its last request an address without a rhythm holds the reads."""
        t = self.times
        return max(UNKNOWN_HOLDS_FOR, 2 * (t[-1] - t[-2])) if len(t) >= 2 else UNKNOWN_HOLDS_FOR


class ScrapeClock:
    """Scrapes seen, by the scraper's address (`seen`, from the event loop), and the next
    one expected (`next_expected`, from the lanes)."""

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
            rhythm = s.rhythm(now)
            if rhythm is not None and now < rhythm[0] - rhythm[2]:  # before its time: not foretold
                s.distrusted_until = now + DISTRUST_AFTER_SURPRISE
            s.add(now)

    def next_expected(self, now: float) -> tuple[float, float] | None:
        """(time, slack) of the soonest scrape expected from `now` on; None when some
        scraper's next scrape cannot be foretold, or none was seen."""
        with self._lock:
            self._forget(now)
            soonest: tuple[float, float] | None = None
            for s in self._scrapers.values():
                last = s.times[-1]
                if last > now:  # a clock other than the one the scrapes were told on
                    return None
                rhythm = s.rhythm(now)
                if rhythm is None:
                    if now - last <= s.holds_for():
                        return None
                    continue
                due, _, slack = rhythm
                if now > due + slack:  # overdue: gone, or restarted elsewhere in its interval
                    return None
                if soonest is None or due - slack < soonest[0] - soonest[1]:
                    soonest = (due, slack)
            return soonest

    def _forget(self, now: float) -> None:
        """Let go of addresses that stopped: after three of their intervals without a scrape
        (UNKNOWN_FORGOTTEN_AFTER for one whose rhythm is not known)."""
        gone = []
        for address, s in self._scrapers.items():
            rhythm = s.rhythm(now)
            quiet_for = 3 * rhythm[1] if rhythm is not None else UNKNOWN_FORGOTTEN_AFTER
            if now - s.times[-1] > quiet_for:
                gone.append(address)
        for address in gone:
            del self._scrapers[address]


def should_read(clock: ScrapeClock | None, now: float, interval: float, lead: float = 0.0) -> bool:
    """Whether a tick at `now` reads its sources: unless a scrape is foretold and the next
    tick, `interval` from now, would still be done reading (`lead`: how long a read takes)
    before the earliest the scrape may arrive."""
    if clock is None:
        return True
    expected = clock.next_expected(now)
    if expected is None:
        return True
    due, slack = expected
    return due - slack - lead <= now + interval
