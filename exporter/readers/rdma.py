"""RDMA devices in sysfs: ports, their link layer, rate, netdev, and counters.

``sys/class/infiniband/<dev>/ports/<port>/`` holds ``counters/`` (the InfiniBand
PortCounters, on RoCE ports too), ``hw_counters/`` (the driver's own: ECN, CNP, go-back-N
events) and on older kernels ``counters_ext/`` (64-bit data counters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.root import Root, SourceError

IB = "sys/class/infiniband"
# Counter groups: folders of one port.
PORT_COUNTERS = "counters"  # the InfiniBand PortCounters (on RoCE ports too)
EXTENDED_COUNTERS = "counters_ext"  # 64-bit data counters, on older kernels
HW_COUNTERS = "hw_counters"  # the driver's own


@dataclass(frozen=True)
class RdmaPort:
    device: str  # mlx5_0
    port: str  # "1"
    link_layer: str  # "InfiniBand" | "Ethernet"
    rate_bytes_per_second: float | None
    state: str  # "ACTIVE", "DOWN", ...
    netdev: str  # "" when the port has no netdev

    @property
    def base(self) -> str:
        return f"{IB}/{self.device}/ports/{self.port}"


_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def parse_rate(text: str) -> float | None:
    """'400 Gb/sec (4X NDR)' -> bytes per second."""
    m = _RATE.match(text)
    return float(m.group(1)) * 1e9 / 8 if m else None


def _port_netdev(root: Root, dev: str, port: str) -> str:
    # gid_attrs/ndevs/0 names the netdev of a RoCE port's first GID (and IPoIB on some
    # kernels); device/net/ lists netdevs of the PCI function, with dev_port telling ports
    # apart on multi-port functions.
    ndev = root.read_optional_str(f"{IB}/{dev}/ports/{port}/gid_attrs/ndevs/0")
    if ndev:
        return ndev
    candidates = root.listdir(f"{IB}/{dev}/device/net")
    for name in candidates:
        dev_port = root.read_optional_str(f"{IB}/{dev}/device/net/{name}/dev_port")
        if dev_port is None:
            dev_port = root.read_optional_str(f"sys/class/net/{name}/dev_port")
        if dev_port is None or (dev_port.isdigit() and int(dev_port) + 1 == int(port)):
            return name
    return ""


def list_ports(root: Root, errors: list[SourceError], static: dict | None = None,
               devices: list[str] | None = None, settled: bool = False) -> list[RdmaPort]:
    """Every RDMA port (of `devices`, the listing of sys/class/infiniband where the caller
    has it). `static` memoises, once `settled`, what does not change while a device exists
    (each port's link layer and netdev, each device's ports); rate and state are read every
    time, and a port whose facts read as they did last time is the object made then.
    `settled`: the devices are those the caller saw at its last look. A device just
    registered may not list all its ports yet (the kernel adds them one by one), nor name a
    port's netdev (its GID table fills after it registers), so they are memoised only from
    its second look on."""
    static = {} if static is None else static
    ports = []
    for dev in root.listdir(IB) if devices is None else devices:
        numbers = static.get(f"{IB}/{dev}/ports")
        if numbers is None:
            numbers = [p for p in root.listdir(f"{IB}/{dev}/ports") if p.isdigit()]
            if settled:
                static[f"{IB}/{dev}/ports"] = numbers
        for port in numbers:
            base = f"{IB}/{dev}/ports/{port}"
            try:
                known = static.get(base)
                if known is None:
                    known = (root.read_optional_str(f"{base}/link_layer") or "InfiniBand", _port_netdev(root, dev, port))
                    # A device just registered may not name its netdev yet (its GIDs come later); a
                    # RoCE port always has one, so until it does, it is looked for again.
                    if settled and (known[1] or known[0] != "Ethernet"):
                        static[base] = known
                read = (known, root.read_optional_str(f"{base}/rate"), root.read_optional_str(f"{base}/state"))
                last = static.get((base, "read"))
                if last is not None and last[0] == read:  # as last time (almost always): the same port
                    ports.append(last[1])
                    continue
                rate_text, state_text = read[1], read[2] or ""
                made = RdmaPort(dev, port, known[0], parse_rate(rate_text) if rate_text else None,
                                state_text.partition(":")[2].strip(), known[1])
                static[(base, "read")] = (read, made)
                ports.append(made)
            except SourceError as e:
                errors.append(e)
    return ports


def has_extended_counters(root: Root, port: RdmaPort) -> bool:
    """Whether the port has the 64-bit data counters of counters_ext/."""
    return root.exists(f"{port.base}/{EXTENDED_COUNTERS}/port_xmit_data_64")


def counter_path(port: RdmaPort, group: str, name: str) -> str:
    """Where a counter is, under the root: for messages about its value."""
    return f"{port.base}/{group}/{name}"


def is_placeholder(text: str) -> bool:
    """Whether a counter file's text says the driver has no such counter. Older kernels make
    counters/ for every port and print ``N/A (no PMA)`` in each of its files when the driver
    has no PMA (no ``process_mad``: i40iw, the iWARP driver of node_exporter's issue 966 and
    fixture); newer ones leave counters/ out. A bare ``N/A`` or nothing at all says the same."""
    text = text.strip()
    return not text or text.startswith("N/A")


def _holds_placeholder(root: Root, rel: str) -> bool:
    # Read again only for a counter that did not read as an integer, which is rare but for
    # the ports of such drivers: two reads of a kept-open attribute there.
    try:
        return is_placeholder(root.read_text(rel))
    except SourceError:
        return False


def read_counters(root: Root, port: RdmaPort, group: str, names: tuple[str, ...],
                  errors: list[SourceError]) -> dict[str, int]:
    """The named counters of one group that exist. A counter whose file is absent or holds
    a driver's placeholder (is_placeholder) is absent: no value and no error (drivers differ).
    Malformed ones are reported and skipped."""
    out = {}
    base = f"{port.base}/{group}/"
    for name in names:
        try:
            value = root.read_int_if_present(base + name)
        except SourceError as e:
            if not _holds_placeholder(root, base + name):
                errors.append(e)
            continue
        if value is not None:
            out[name] = value
    return out
