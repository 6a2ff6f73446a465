"""Driver statistics: the set that ``ethtool -S <dev>`` prints.

Live, they come from the ``SIOCETHTOOL`` ioctl (``ETHTOOL_GSTATS``) on a plain socket; the
names (``ETHTOOL_GSTRINGS``) are fetched once per device and again whenever the driver's
count changes (channels added, driver reloaded). Under a fixture root they are parsed from
``ethtool/<dev>.txt``, the text ``ethtool -S`` prints; the parse is reused while the file
is unchanged.
"""

from __future__ import annotations

import array
import errno
import math
import socket
import struct
import time
from collections.abc import Collection

from exporter.readers.netlink import ethtool_ioctl, ethtool_socket, ioctl_problem
from exporter.root import Root, SourceError, TooBig

ETH_SS_STATS = 1
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_GSTRING_LEN = 32
SSET_INFO = struct.Struct("=IIQI")  # struct ethtool_sset_info with one data[] entry: cmd, reserved, mask, count
GSTRINGS_HEAD = struct.Struct("=III")  # struct ethtool_gstrings: cmd, string_set, len; then the names
GSTATS_HEAD = struct.Struct("=II")  # struct ethtool_stats: cmd, n_stats; then n_stats u64 values
NAMES_REFRESH = 60.0  # seconds between fetches of a device's counter names, live
MAX_PROBLEMS = 10  # malformed lines of a file reported one by one


def parse_ethtool_stats(text: str, where: str) -> tuple[dict[str, float], list[SourceError]]:
    """Parse ``ethtool -S`` output. Malformed lines are reported, never fatal; one that names
    its counter gives it an unknown value (NaN), not none: a sum over counters that holds it
    is then unknown too and its last value stands (exporter/counters.py), where a sum short
    of one part would read as a reset and count the whole sum again. The first MAX_PROBLEMS
    are reported each on its own, the rest in one count (a file of garbage would otherwise
    make an error per line)."""
    stats: dict[str, float] = {}
    problems: list[SourceError] = []
    more = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.endswith("statistics:"):  # "NIC statistics:" header
            continue
        name, sep, value = stripped.rpartition(": ")
        if not sep and stripped.endswith(":"):  # a section title some drivers print
            continue
        try:
            number = int(value)
            if not sep or not name or number < 0:
                raise ValueError
        except ValueError:
            if len(problems) < MAX_PROBLEMS:
                problems.append(SourceError(f"{where}:{lineno}", f"not a 'name: value' line: {stripped[:60]!r}"))
            else:
                more += 1
            if sep and name:
                stats[name] = math.nan
            continue
        stats[name] = number
    if more:
        problems.append(SourceError(where, f"and {more} more lines that are not 'name: value' lines"))
    return stats, problems


class DriverStatsReader:
    """Reads driver statistics of netdevs. One instance per thread (it owns sockets)."""

    def __init__(self, root: Root):
        self.root = root
        self._sock: socket.socket | None = None  # live: the socket the ioctls go through
        self._ioctl: dict[str, _IoctlState] = {}  # live: device -> its ioctl state
        # Fixture: (device, wanted) -> (the file's stat key, those counters, the parse's problems).
        self._parsed: dict[tuple[str, frozenset[str] | None],
                           tuple[tuple[int, int], dict[str, float], list[SourceError]]] = {}
        # Fixture: device -> the stat key of its file, refused as too big, and where and what.
        self._refused: dict[str, tuple[tuple[int, int], str, str]] = {}

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._ioctl.clear()

    def forget_except(self, devices: Collection[str]) -> None:
        """Let go of what is kept for devices not in `devices` (the netdevs of the current
        inventory). A device that leaves is never read again, so its state (live: a value
        buffer of ~34 KB for a ConnectX's ~2,000 counters; fixture: a parse) would otherwise
        stay for as long as the exporter runs, one more for each NIC that comes and goes."""
        for device in self._ioctl.keys() - devices:
            del self._ioctl[device]
        for key in [key for key in self._parsed if key[0] not in devices]:
            del self._parsed[key]
        for device in self._refused.keys() - devices:
            del self._refused[device]

    def available(self, device: str) -> bool:
        if self.root.is_live:
            return True
        return self.root.exists(f"ethtool/{device}.txt")

    def where(self, device: str) -> str:
        """Where a device's counters are read, for messages about their values."""
        return f"ethtool -S {device}" if self.root.is_live else self.root.where(f"ethtool/{device}.txt")

    def read(self, device: str, errors: list[SourceError], wanted: frozenset[str] | None = None) -> dict[str, float]:
        """Driver counters of a device (those in `wanted`, or all); raises SourceError when
        none can be had. A ConnectX prints over 2,000 counters: picking the few wanted ones
        by index keeps a fast-tick read cheap, and keeping only those keeps memory small."""
        if self.root.is_live:
            return self._read_ioctl(device, wanted)
        return self._read_file(device, errors, wanted)

    def _read_file(self, device: str, errors: list[SourceError], wanted: frozenset[str] | None) -> dict[str, float]:
        rel = f"ethtool/{device}.txt"
        key = self.root.stat_key(rel)
        if key is None:
            raise SourceError(str(self.root.path(rel)), "no driver statistics file")
        cached = self._parsed.get((device, wanted))
        if cached is None or cached[0] != key:
            refused = self._refused.get(device)
            if refused is not None and refused[0] == key:  # not read again until it changes
                raise TooBig(refused[1], refused[2])  # anew: an error raised again grows its traceback
            try:
                text = self.root.read_text(rel)
            except TooBig as e:
                self._refused[device] = (key, e.where, e.what)
                raise
            stats, problems = parse_ethtool_stats(text, str(self.root.path(rel)))
            if wanted is not None:
                stats = {name: stats[name] for name in wanted if name in stats}
            cached = (key, stats, problems)
            self._parsed[(device, wanted)] = cached
        errors.extend(cached[2])
        return cached[1]

    def _read_ioctl(self, device: str, wanted: frozenset[str] | None) -> dict[str, float]:
        where = f"ethtool -S {device}"
        try:
            if self._sock is None:
                self._sock = ethtool_socket()
            sock = self._sock
            state = self._ioctl.get(device)
            if state is None:
                state = self._ioctl[device] = _IoctlState()
            # The kernel writes as many values as the driver has *now* into our buffer, so
            # the names (and the buffer) must follow that count. Kernels before the check of
            # n_stats (2024) write the driver's count whatever we ask: the buffer has room for
            # twice the count and 256 more, so that a count that grew between the two calls
            # (channels added, a driver reloaded) is reported below, not written past the end.
            count = _stats_count(sock, device)
            now = time.monotonic()
            if state.count != count or now - state.named_at > NAMES_REFRESH:
                # Also every NAMES_REFRESH seconds: a driver reloaded with as many counters in
                # another order would otherwise be read by the old places.
                state.count = count
                state.named_at = now
                state.buffer = array.array("Q", bytes(GSTATS_HEAD.size + 8 * headroom(count)))  # head: one u64
                state.picks.clear()
            if not count:
                return {}
            # The 2,000 names are fetched only to find the wanted ones' places, then let go.
            names = _stat_names(sock, device, count) if wanted is None or wanted not in state.picks else None
            data = state.buffer
            GSTATS_HEAD.pack_into(data, 0, ETHTOOL_GSTATS, count)
            ethtool_ioctl(sock, device, data)
        except OSError as e:  # ENODEV, EOPNOTSUPP, EPERM...
            self._ioctl.pop(device, None)
            raise SourceError(where, ioctl_problem(e)) from e
        if GSTATS_HEAD.unpack_from(data)[1] != count or names is not None and len(names) != count:
            state.count = None  # names and buffer are fetched again next time
            raise SourceError(where, "the driver's number of counters changed during the read")
        if wanted is None:
            assert names is not None
            return dict(zip(names, data[1:]))
        picks = state.picks.get(wanted)
        if picks is None:
            assert names is not None
            index = {name: i for i, name in enumerate(names)}
            picks = state.picks[wanted] = [(n, index[n] + 1) for n in wanted if n in index]  # +1: the head
        return {name: data[i] for name, i in picks}


def _stats_count(sock: socket.socket, device: str) -> int:
    """How many counters the driver has now (ETHTOOL_GSSET_INFO); 0 when it has none."""
    info = array.array("B", bytes(SSET_INFO.size))
    SSET_INFO.pack_into(info, 0, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0)
    ethtool_ioctl(sock, device, info)
    _, _, mask, count = SSET_INFO.unpack_from(info)
    return count if mask & (1 << ETH_SS_STATS) else 0


def _stat_names(sock: socket.socket, device: str, count: int) -> list[str]:
    """The driver's counter names (ETHTOOL_GSTRINGS), `count` of them or what the driver has
    now if that differs."""
    buffer = array.array("B", bytes(GSTRINGS_HEAD.size + ETH_GSTRING_LEN * headroom(count)))
    GSTRINGS_HEAD.pack_into(buffer, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
    ethtool_ioctl(sock, device, buffer)
    got = min(GSTRINGS_HEAD.unpack_from(buffer)[2], count)
    raw = buffer.tobytes()
    start = GSTRINGS_HEAD.size
    return [raw[start + i * ETH_GSTRING_LEN:start + (i + 1) * ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("latin-1")
            for i in range(got)]


def headroom(count: int) -> int:
    """Entries to allocate for `count` counters (see _read_ioctl)."""
    return 2 * count + 256


class _IoctlState:
    """A device's counter count, the value buffer (a u64 head, then the values) and
    name->index picks."""

    def __init__(self) -> None:
        self.count: int | None = None
        self.named_at = 0.0  # when the names (and picks) were last fetched
        self.buffer = array.array("Q")
        self.picks: dict[frozenset[str], list[tuple[str, int]]] = {}


# --- global 802.3x pause: what ``ethtool -a <dev>`` prints ------------------------------------

ETHTOOL_GPAUSEPARAM = 0x12


def read_pause(root: Root, device: str) -> tuple[bool, bool] | None:
    """(receive, transmit) 802.3x pause enabled; None when the driver has no pause settings
    (veth, IPoIB). Live: the ``SIOCETHTOOL`` ioctl ``ETHTOOL_GPAUSEPARAM``. Under a fixture
    root: ``ethtool/<dev>.pause.txt``, the text ``ethtool -a <dev>`` prints (its ``RX:`` and
    ``TX:`` lines, ``on``/``off``); no file: no pause settings."""
    if root.is_live:
        return _pause_ioctl(device)
    rel = f"ethtool/{device}.pause.txt"
    if not root.exists(rel):
        return None
    where = str(root.path(rel))
    found: dict[str, bool] = {}
    for lineno, line in enumerate(root.read_text(rel).splitlines(), 1):
        key, sep, value = line.partition(":")
        if not sep or key.strip() not in ("RX", "TX"):
            continue  # the title, Autonegotiate, "RX negotiated" (ethtool 6.x)
        if value.strip() not in ("on", "off"):
            raise SourceError(f"{where}:{lineno}", f"expected on or off: {line.strip()[:60]!r}")
        found[key.strip()] = value.strip() == "on"
    if len(found) != 2:
        raise SourceError(where, "no 'RX:' and 'TX:' lines")
    return found["RX"], found["TX"]


def _pause_ioctl(device: str) -> tuple[bool, bool] | None:
    param = array.array("I", [ETHTOOL_GPAUSEPARAM, 0, 0, 0])  # struct ethtool_pauseparam: cmd, autoneg, rx, tx
    try:
        with ethtool_socket() as sock:
            ethtool_ioctl(sock, device, param)
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:
            return None
        raise SourceError(f"ethtool -a {device}", ioctl_problem(e)) from e
    return bool(param[2]), bool(param[3])
