"""Network devices: their kernel statistics and link state.

On a live node (root ``/``) the statistics come from netlink (``RTM_GETLINK`` with 64-bit
``IFLA_STATS64``, one dump for all links) through pyroute2; under a fixture root they come
from ``sys/class/net/<dev>/statistics/``, which holds the same values under the same names.
Static attributes (speed, driver, PCI device) are always read from sysfs under the root.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.root import Root, SourceError

NET = "sys/class/net"

# The kernel's names, identical in IFLA_STATS64 and in sysfs statistics/.
STAT_NAMES = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors",
              "rx_dropped", "tx_dropped")
ARPHRD_INFINIBAND = 32


@dataclass
class LinkState:
    name: str
    operstate: str = "unknown"
    carrier: int | None = None
    carrier_changes: int | None = None
    mtu: int | None = None
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def up(self) -> bool:
        return self.operstate == "up" and self.carrier == 1


def list_netdevs(root: Root) -> list[str]:
    # bonding_masters is a file beside the devices once the bonding module is loaded.
    return [n for n in root.listdir(NET) if n != "bonding_masters"]


class NetdevReader:
    """Reads link state and statistics; holds its own netlink socket (one per thread)."""

    def __init__(self, root: Root):
        self.root = root
        self._ipr = None

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    def links(self, names: list[str], errors: list[SourceError],
              stats: tuple[str, ...] = STAT_NAMES) -> dict[str, LinkState]:
        """State of the named links (with the `stats` wanted, from sysfs); a link that cannot
        be read is left out, with an error."""
        if self.root.is_live:
            return self._links_netlink(names, errors)
        out = {}
        for name in names:
            try:
                out[name] = self._link_sysfs(name, errors, stats)
            except SourceError as e:
                errors.append(e)
        return out

    def _link_sysfs(self, name: str, errors: list[SourceError], stats: tuple[str, ...]) -> LinkState:
        base = f"{NET}/{name}"
        if not self.root.exists(base):
            raise SourceError(str(self.root.path(base)), "network device vanished")
        st = LinkState(name)
        st.operstate = self.root.read_optional_str(f"{base}/operstate") or "unknown"
        # carrier reads EINVAL while the interface is administratively down: no carrier.
        carrier = self.root.read_optional_str(f"{base}/carrier")
        st.carrier = int(carrier) if carrier in ("0", "1") else 0
        st.carrier_changes = self.root.read_int_if_present(f"{base}/carrier_changes")
        st.mtu = self.root.read_int_if_present(f"{base}/mtu")
        for stat in stats:
            try:
                value = self.root.read_int_if_present(f"{base}/statistics/{stat}")
            except SourceError as e:  # costs this statistic only
                errors.append(e)
                continue
            if value is not None:
                st.stats[stat] = value
        return st

    def _links_netlink(self, names: list[str], errors: list[SourceError]) -> dict[str, LinkState]:
        from pyroute2 import IPRoute  # imported here: fixture roots never need netlink

        wanted = set(names)
        try:
            if self._ipr is None:
                self._ipr = IPRoute()
            msgs = self._ipr.get_links()
        except Exception as e:  # noqa: BLE001 - netlink errors come in many types
            self.close()
            errors.append(SourceError("netlink RTM_GETLINK", str(e)))
            return {}
        out = {}
        for msg in msgs:
            name = msg.get_attr("IFLA_IFNAME")
            if name not in wanted:
                continue
            st = LinkState(name)
            st.operstate = str(msg.get_attr("IFLA_OPERSTATE") or "unknown").lower()
            st.carrier = msg.get_attr("IFLA_CARRIER")
            st.carrier_changes = msg.get_attr("IFLA_CARRIER_CHANGES")
            st.mtu = msg.get_attr("IFLA_MTU")
            stats64 = msg.get_attr("IFLA_STATS64") or {}
            st.stats = {k: int(stats64[k]) for k in STAT_NAMES if k in stats64}
            out[name] = st
        for gone in wanted - out.keys():
            errors.append(SourceError(f"netlink link {gone}", "network device vanished"))
        return out


def netdev_type(root: Root, name: str) -> int | None:
    text = root.read_optional_str(f"{NET}/{name}/type")
    return int(text) if text and text.isdigit() else None


def netdev_speed_mbps(root: Root, name: str) -> int | None:
    """Link speed in Mb/s; None when the driver reports none (link down, virtual device)."""
    text = root.read_optional_str(f"{NET}/{name}/speed")
    if text is None:
        return None
    try:
        speed = int(text)
    except ValueError:
        raise SourceError(str(root.path(f"{NET}/{name}/speed")), f"not an integer: {text[:40]!r}") from None
    # The kernel prints SPEED_UNKNOWN as -1 (some drivers: 4294967295 or 65535).
    return speed if 0 < speed < 65535 else None


def pci_device(root: Root, name: str) -> tuple[str, str, str]:
    """(driver, pci_address, numa_node) of a netdev's parent device, '' where unknown."""
    base = f"{NET}/{name}/device"
    driver = pci = numa = ""
    uevent = root.read_optional_str(f"{base}/uevent") or ""
    for line in uevent.splitlines():
        key, _, value = line.partition("=")
        if key == "DRIVER":
            driver = value
        elif key == "PCI_SLOT_NAME":
            pci = value
    if not driver:
        link = root.path(f"{base}/driver")
        if link.is_symlink():
            driver = link.resolve().name
    if not pci:
        dev = root.path(base)
        if dev.is_symlink():
            target = dev.resolve().name
            if target.count(":") == 2:  # 0000:17:00.0
                pci = target
    numa_text = root.read_optional_str(f"{base}/numa_node")
    if numa_text is not None and numa_text.lstrip("-").isdigit() and int(numa_text) >= 0:
        numa = numa_text
    return driver, pci, numa
