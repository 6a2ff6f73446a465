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
        self._ioctl: dict[str, object] = {}  # live: device -> IoctlEthtool with cached names
        self._parsed: dict[str, tuple[tuple[int, int], dict[str, int], list[SourceError]]] = {}

    def close(self) -> None:
        for handle in self._ioctl.values():
            handle.close()  # type: ignore[attr-defined]
        self._ioctl.clear()

    def available(self, device: str) -> bool:
        if self.root.is_live:
            return True
        return self.root.exists(f"ethtool/{device}.txt")

    def read(self, device: str, errors: list[SourceError]) -> dict[str, int]:
        """All driver counters of a device; raises SourceError when none can be had."""
        if self.root.is_live:
            return self._read_ioctl(device)
        return self._read_file(device, errors)

    def _read_file(self, device: str, errors: list[SourceError]) -> dict[str, int]:
        rel = f"ethtool/{device}.txt"
        key = self.root.stat_key(rel)
        if key is None:
            raise SourceError(str(self.root.path(rel)), "no driver statistics file")
        cached = self._parsed.get(device)
        if cached is None or cached[0] != key:
            stats, problems = parse_ethtool_stats(self.root.read_text(rel), str(self.root.path(rel)))
            cached = (key, stats, problems)
            self._parsed[device] = cached
        errors.extend(cached[2])
        return cached[1]

    def _read_ioctl(self, device: str) -> dict[str, int]:
        from pyroute2.ethtool.ioctl import IoctlEthtool

        handle = self._ioctl.get(device)
        try:
            if handle is None:
                handle = self._ioctl[device] = IoctlEthtool(device)
            # The kernel writes as many values as the driver has *now* into our buffer, so
            # the names must be refreshed whenever that count changes, or it would overflow.
            count = handle.get_stringset_length(ETH_SS_STATS)
            if handle.stat_names is not None and len(handle.stat_names) != count:
                handle.stat_names = None
            if count == 0:
                return {}
            return dict(handle.get_statistics())
        except Exception as e:  # noqa: BLE001 - ENODEV, EOPNOTSUPP, EPERM...
            handle = self._ioctl.pop(device, None)
            if handle is not None:
                handle.close()
            raise SourceError(f"ethtool -S {device}", str(e) or type(e).__name__) from e
