"""Network devices: their kernel statistics and link state.

On a live node (root ``/``) the statistics come from netlink (``RTM_GETLINK`` with 64-bit
``IFLA_STATS64``, one dump for all links, on a NETLINK_ROUTE socket kept between reads);
under a fixture root they come from ``sys/class/net/<dev>/statistics/``, which holds the
same values under the same names.
Static attributes (speed, driver, PCI device) are always read from sysfs under the root.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, field

from exporter.readers.netlink import DUMP_TRIES, NetlinkError, attrs, dump
from exporter.root import Root, SourceError

NET = "sys/class/net"

# The kernel's names, identical in IFLA_STATS64 and in sysfs statistics/.
STAT_NAMES = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors",
              "rx_dropped", "tx_dropped")
ARPHRD_INFINIBAND = 32

RTM_GETLINK = 18
IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
IFLA_IFNAME, IFLA_MTU, IFLA_OPERSTATE, IFLA_STATS64, IFLA_CARRIER, IFLA_CARRIER_CHANGES = 3, 4, 16, 23, 33, 35
# IF_OPER_* by value, as /sys/class/net/<dev>/operstate spells them.
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
# struct rtnl_link_stats64, in the kernel's order (newer kernels append fields).
STATS64_FIELDS = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped",
                  "tx_dropped", "multicast", "collisions", "rx_length_errors", "rx_over_errors", "rx_crc_errors",
                  "rx_frame_errors", "rx_fifo_errors", "rx_missed_errors", "tx_aborted_errors",
                  "tx_carrier_errors", "tx_fifo_errors", "tx_heartbeat_errors", "tx_window_errors",
                  "rx_compressed", "tx_compressed", "rx_nohandler", "rx_otherhost_dropped")
STAT_INDEX = tuple((name, STATS64_FIELDS.index(name)) for name in STAT_NAMES)
NETLINK_TIMEOUT = 2.0
SPEED_UNKNOWN_U16, SPEED_UNKNOWN_U32 = 0xFFFF, 0xFFFFFFFF


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


def list_netdevs(root: Root) -> dict[str, int]:
    """The network devices by name, sorted, each with its entry's inode (Root.entries)."""
    # bonding_masters is a file beside the devices once the bonding module is loaded.
    return {name: inode for name, inode in root.entries(NET).items() if name != "bonding_masters"}


class NetdevReader:
    """Reads link state and statistics; holds its own netlink socket (one per thread)."""

    def __init__(self, root: Root):
        self.root = root
        self._ipr: socket.socket | None = None  # NETLINK_ROUTE, kept between reads
        self._seq = 0

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
        st = LinkState(name)
        operstate = self.root.read_optional_str(f"{base}/operstate")
        if operstate is None and not self.root.exists(base):  # asked only then: a stat less per read
            raise SourceError(str(self.root.path(base)), "network device vanished")
        st.operstate = operstate or "unknown"
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
        wanted = set(names)
        try:
            if self._ipr is None:
                self._ipr = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
                self._ipr.settimeout(NETLINK_TIMEOUT)
            self._seq = (self._seq + DUMP_TRIES) & 0xFFFFFFFF  # a dump may use as many
            msgs = dump(self._ipr, RTM_GETLINK, IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0), self._seq)
        except (OSError, NetlinkError) as e:
            self.close()  # a reply could still come: a new socket never reads it
            what = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            errors.append(SourceError("netlink RTM_GETLINK", what or type(e).__name__))
            return {}
        out = {}
        for msg in msgs:
            st = _link_state(msg, wanted)
            if st is not None:
                out[st.name] = st
        for gone in wanted - out.keys():
            errors.append(SourceError(f"netlink link {gone}", "network device vanished"))
        return out


def stat_where(root: Root, name: str, stat: str) -> str:
    """Where a statistic of a link is read, for messages about its value."""
    return f"netlink {name} {stat}" if root.is_live else root.where(f"{NET}/{name}/statistics/{stat}")


def _link_state(msg: memoryview, wanted: set[str]) -> LinkState | None:
    """The state in one RTM_NEWLINK message, None when it is not a wanted link's."""
    found = dict(attrs(msg[IFINFOMSG.size:]))
    name = os.fsdecode(found.get(IFLA_IFNAME, b"").split(b"\0", 1)[0])
    if name not in wanted:
        return None
    st = LinkState(name)
    operstate = found.get(IFLA_OPERSTATE)
    st.operstate = OPERSTATES[operstate[0]] if operstate and operstate[0] < len(OPERSTATES) else "unknown"
    st.carrier = _uint(found.get(IFLA_CARRIER), "=B")
    st.carrier_changes = _uint(found.get(IFLA_CARRIER_CHANGES), "=I")
    st.mtu = _uint(found.get(IFLA_MTU), "=I")
    stats64 = found.get(IFLA_STATS64, b"")
    count = len(stats64) // 8
    st.stats = {k: struct.unpack_from("=Q", stats64, 8 * i)[0] for k, i in STAT_INDEX if i < count}
    return st


def _uint(value: bytes | None, fmt: str) -> int | None:
    return struct.unpack_from(fmt, value)[0] if value is not None and len(value) >= struct.calcsize(fmt) else None


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
    # The kernel prints SPEED_UNKNOWN as -1; some drivers print it unsigned, as 4294967295, or
    # as the 16-bit 65535 of old. Every other positive value is a speed: 100000 and more
    # are today's NICs.
    return None if speed <= 0 or speed in (SPEED_UNKNOWN_U16, SPEED_UNKNOWN_U32) else speed


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
