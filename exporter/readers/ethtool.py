"""Driver statistics: the set that ``ethtool -S <dev>`` prints.

Live, they come from the ``SIOCETHTOOL`` ioctl (``ETHTOOL_GSTATS``) through pyroute2; the
names (``ETHTOOL_GSTRINGS``) are fetched once per device and again whenever the driver's
count changes (channels added, driver reloaded). Under a fixture root they are parsed from
``ethtool/<dev>.txt``, the text ``ethtool -S`` prints; the parse is reused while the file
is unchanged.
"""

from __future__ import annotations

from exporter.root import Root, SourceError

ETH_SS_STATS = 1


def parse_ethtool_stats(text: str, where: str) -> tuple[dict[str, int], list[SourceError]]:
    """Parse ``ethtool -S`` output. Malformed lines are skipped and reported, never fatal."""
    stats: dict[str, int] = {}
    problems: list[SourceError] = []
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
            problems.append(SourceError(f"{where}:{lineno}", f"not a 'name: value' line: {stripped[:60]!r}"))
            continue
        stats[name] = number
    return stats, problems


class DriverStatsReader:
    """Reads driver statistics of netdevs. One instance per thread (it owns sockets)."""

    def __init__(self, root: Root):
        self.root = root
        self._ioctl: dict[str, _IoctlState] = {}  # live: device -> its ioctl state
        # Fixture: (device, wanted) -> (the file's stat key, those counters, the parse's problems).
        self._parsed: dict[tuple[str, frozenset[str] | None],
                           tuple[tuple[int, int], dict[str, int], list[SourceError]]] = {}

    def close(self) -> None:
        for state in self._ioctl.values():
            state.handle.close()
        self._ioctl.clear()

    def available(self, device: str) -> bool:
        if self.root.is_live:
            return True
        return self.root.exists(f"ethtool/{device}.txt")

    def read(self, device: str, errors: list[SourceError], wanted: frozenset[str] | None = None) -> dict[str, int]:
        """Driver counters of a device (those in `wanted`, or all); raises SourceError when
        none can be had. A ConnectX prints over 2,000 counters: picking the few wanted ones
        by index keeps a fast-tick read cheap, and keeping only those keeps memory small."""
        if self.root.is_live:
            return self._read_ioctl(device, wanted)
        return self._read_file(device, errors, wanted)

    def _read_file(self, device: str, errors: list[SourceError], wanted: frozenset[str] | None) -> dict[str, int]:
        rel = f"ethtool/{device}.txt"
        key = self.root.stat_key(rel)
        if key is None:
            raise SourceError(str(self.root.path(rel)), "no driver statistics file")
        cached = self._parsed.get((device, wanted))
        if cached is None or cached[0] != key:
            stats, problems = parse_ethtool_stats(self.root.read_text(rel), str(self.root.path(rel)))
            if wanted is not None:
                stats = {name: stats[name] for name in wanted if name in stats}
            cached = (key, stats, problems)
            self._parsed[(device, wanted)] = cached
        errors.extend(cached[2])
        return cached[1]

    def _read_ioctl(self, device: str, wanted: frozenset[str] | None) -> dict[str, int]:
        import ctypes

        from pyroute2.ethtool.ioctl import ETHTOOL_GSTATS, IoctlEthtool, generate_EthtoolGStats

        state = self._ioctl.get(device)
        try:
            if state is None:
                state = self._ioctl[device] = _IoctlState(IoctlEthtool(device))
            handle = state.handle
            # The kernel writes as many values as the driver has *now* into our buffer, so
            # the names (and the buffer) must follow that count, or it would overflow.
            count = handle.get_stringset_length(ETH_SS_STATS)
            if state.count != count:
                state.count = count
                state.buffer = generate_EthtoolGStats(count)(cmd=ETHTOOL_GSTATS)
                state.picks.clear()
            if not count:
                return {}
            # The 2,000 names are fetched only to find the wanted ones' places, then let go.
            names = handle.get_stringset(set_id=ETH_SS_STATS) if wanted is None or wanted not in state.picks else None
            handle.ifreq.gstats = ctypes.cast(ctypes.byref(state.buffer), ctypes.POINTER(None))
            handle.ioctl()
            data = state.buffer.data
            if wanted is None:
                return dict(zip(names, data))
            picks = state.picks.get(wanted)
            if picks is None:
                index = {name: i for i, name in enumerate(names)}
                picks = state.picks[wanted] = [(n, index[n]) for n in wanted if n in index]
            return {name: data[i] for name, i in picks}
        except Exception as e:  # noqa: BLE001 - ENODEV, EOPNOTSUPP, EPERM...
            state = self._ioctl.pop(device, None)
            if state is not None:
                state.handle.close()
            raise SourceError(f"ethtool -S {device}", str(e) or type(e).__name__) from e


class _IoctlState:
    """A device's ethtool socket, its counter count, the value buffer and name->index picks."""

    def __init__(self, handle):
        self.handle = handle
        self.count: int | None = None
        self.buffer = None
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
    import ctypes

    from pyroute2.ethtool.ioctl import IoctlEthtool, NoSuchDevice, NotSupportedError

    class PauseParam(ctypes.Structure):  # struct ethtool_pauseparam
        _fields_ = [("cmd", ctypes.c_uint32), ("autoneg", ctypes.c_uint32), ("rx_pause", ctypes.c_uint32),
                    ("tx_pause", ctypes.c_uint32)]

    param = PauseParam(cmd=ETHTOOL_GPAUSEPARAM)
    handle = IoctlEthtool(device)
    try:
        handle.ifreq.gstats = ctypes.cast(ctypes.byref(param), ctypes.POINTER(None))
        handle.ioctl()
    except NotSupportedError:
        return None
    except NoSuchDevice:
        raise SourceError(f"ethtool -a {device}", "network device vanished") from None
    except OSError as e:
        raise SourceError(f"ethtool -a {device}", e.strerror or str(e)) from e
    finally:
        handle.close()
    return bool(param.rx_pause), bool(param.tx_pause)
