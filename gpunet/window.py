"""Time windows the way users type them: --since 1h, --start/--end as RFC 3339 or Unix time;
and the numbers of the commands' other flags, each checked against its range."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NoReturn

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


LAST_SECOND = 1e11  # Unix seconds in the year 5138: a larger "time" is milliseconds or garbage


def parse_duration(text: str) -> float:
    """'1h', '90m', '1h30m', '15s', '2d' -> seconds (Prometheus' duration syntax)."""
    text = text.strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0 or not 0 < total < LAST_SECOND:
        raise ValueError(f"not a duration: {text!r} (examples: 30m, 1h, 1h30m, 2d)")
    return total


def parse_time(text: str) -> float:
    """RFC 3339 ('2026-01-01T00:00:00Z', offsets allowed) or Unix seconds -> Unix seconds."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        # NaN, infinities and numbers past year 5000 (milliseconds given for seconds) are no time.
        if not 0 <= seconds < LAST_SECOND:
            raise ValueError(f"not a time: {text!r} (Unix seconds from 0 to {LAST_SECOND:.0f}, or RFC 3339)")
        return seconds
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (RFC 3339 like 2026-01-01T10:00:00Z, or Unix seconds)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


BOTH_SINCE_AND_START = "give --since DURATION or --start TIME, not both (--since counts back from --end)"


def resolve(since: str | None, start: str | None, end: str | None, now: float | None = None) -> tuple[float, float]:
    """(start, end) from --since or --start/--end; --end defaults to now."""
    if since and start:  # one of them would be ignored, and the window not the one asked for
        raise ValueError(BOTH_SINCE_AND_START)
    end_t = parse_time(end) if end else (time.time() if now is None else now)
    if start:
        start_t = parse_time(start)
    elif since:
        start_t = end_t - parse_duration(since)
    else:
        raise ValueError("give --since DURATION or --start TIME")
    if start_t >= end_t:
        raise ValueError(f"--start {start} is not before --end {end or '(now)'}: the window is empty")
    return start_t, end_t


def window_problem(since: str | None, start: str | None, end: str | None, server: bool) -> str | None:
    """What is wrong with the window flags, in one line naming the flag (None: nothing), found
    before any work. `server`: the window ends at --end or now, and needs --since or --start;
    a trace's window ends at its last sample, known once it is read."""
    for flag, value, parse in (("--since", since, parse_duration), ("--start", start, parse_time),
                               ("--end", end, parse_time)):
        try:
            if value is not None:
                parse(value)
        except ValueError as e:
            return f"{flag}: {e}"
    if since and start:
        return f"--since: {BOTH_SINCE_AND_START}"
    if server or (start and end):
        try:
            resolve(since, start, end)
        except ValueError as e:
            return str(e)
    return None


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, a mistake told in one line that names the flag ("diagnose: argument
    --timeout: ..."), exit status 2, without the whole usage before it (--help shows that)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def number(low: float, high: float, unit: str = "", parse: Callable[[str], float] = float) -> Callable[[str], float]:
    """An argparse type: a number from `low` to `high`, read by `parse`. NaN, the
    infinities and anything outside the range are refused, in one line that says the range
    (argparse names the flag)."""
    def check(text: str) -> float:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high:  # also false for NaN
            raise argparse.ArgumentTypeError(f"{text!r}: from {low:g} to {high:g}{unit}")
        return value
    return check


def whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`, refused in one line that says
    the range."""
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: from {low} to {high}")
        return value
    return check


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
