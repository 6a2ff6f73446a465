"""Which NIC ports the node has, and what they are.

A NIC port is a netdev (with or without an RDMA device behind it) or an RDMA port with no
netdev, named ``<rdma_device>:<port>`` (docs/metrics.md). Discovery runs on the slow
tick, so NICs that come and go are followed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from exporter.readers import netdev as netdev_reader
from exporter.readers import rdma as rdma_reader
from exporter.readers.rdma import RdmaPort
from exporter.root import Root, SourceError

# Container and VM plumbing: hundreds of these on a Kubernetes node, none of them a NIC.
DEFAULT_EXCLUDE = r"^(lo|veth[0-9a-f]{6,}|cali[0-9a-f]+|docker\d+|cni\d+|flannel\.\d+|virbr\d+|tunl\d+)$"
PRESENT = "present"  # the key under which discovery memoises the devices it last saw, with their inodes
LAST = "last"  # and what it last found: (the facts read, the options, the NICs made of them)


@dataclass(frozen=True)
class Nic:
    device: str  # the contract's `device` label
    netdev: str  # "" for an RDMA port without netdev
    rdma: RdmaPort | None
    driver: str
    link_layer: str
    numa_node: str
    pci_address: str
    speed_bytes_per_second: float | None
    fabric: bool  # part of the training fabric (decides the node's network_state)


@dataclass
class InventoryOptions:
    include: str | None = None  # regex of device names to keep (all when None)
    exclude: str | None = DEFAULT_EXCLUDE
    link_speeds: dict[str, float] = field(default_factory=dict)  # device -> bytes/s, overrides the driver
    fabric: list[str] | None = None  # devices of the training fabric; default: those with RDMA


def discover(root: Root, opts: InventoryOptions, errors: list[SourceError],
             static: dict | None = None) -> dict[str, Nic]:
    """The NICs now. `static` (kept by the caller between calls) memoises what does not
    change while a device exists: driver, PCI address, NUMA node, RDMA mapping. Speeds,
    states and the device listing itself are read every time; where nothing changed, the
    dict returned is the one returned last time."""
    static = {} if static is None else static
    include = re.compile(opts.include) if opts.include else None
    exclude = re.compile(opts.exclude) if opts.exclude else None

    def wanted(device: str) -> bool:
        if include is not None:
            return bool(include.search(device))
        return not (exclude and exclude.search(device))

    # The devices by name and by what each name leads to: one that came, went, was renamed
    # or swapped names with another, or a driver reloaded, changes this, and then what was
    # memoised and the files kept open (exporter/root.py) are let go.
    netdevs = netdev_reader.list_netdevs(root)
    rdma_devices = root.entries(rdma_reader.IB)
    present = (tuple(netdevs.items()), tuple(rdma_devices.items()))
    changed = static.get(PRESENT) != present
    if changed:
        static.clear()
        static[PRESENT] = present
    root.forget_open_files(devices_changed=changed)

    ports = rdma_reader.list_ports(root, errors, static, list(rdma_devices), settled=not changed)
    port_of_netdev = {p.netdev: p for p in ports if p.netdev}
    found: list[tuple[str, str, RdmaPort | None, str, str, str, str, float | None]] = []
    for name in netdevs:
        if not wanted(name):
            continue
        port = port_of_netdev.get(name)
        known = static.get(f"net/{name}")
        if known is None:
            known = static[f"net/{name}"] = (*netdev_reader.pci_device(root, name),
                                              netdev_reader.netdev_type(root, name))
        driver, pci, numa, arp_type = known
        if port is not None:
            link_layer = port.link_layer
        else:
            link_layer = "InfiniBand" if arp_type == netdev_reader.ARPHRD_INFINIBAND else "Ethernet"
        try:
            mbps = netdev_reader.netdev_speed_mbps(root, name)
        except SourceError as e:
            errors.append(e)
            mbps = None
        speed = mbps * 1e6 / 8 if mbps else None
        if port is not None and (link_layer == "InfiniBand" or speed is None):
            # The IB rate is the port's own; IPoIB's netdev speed is not always right.
            speed = port.rate_bytes_per_second or speed
        found.append((name, name, port, driver, link_layer, numa, pci, speed))

    for port in ports:
        if port.netdev:
            continue
        device = f"{port.device}:{port.port}"
        if not wanted(device):
            continue
        driver, pci, numa = _rdma_pci_device(root, port.device)
        found.append((device, "", port, driver, port.link_layer, numa, pci, port.rate_bytes_per_second))

    # What was found is what was found last time (almost always; the ports are the very
    # objects of last time where nothing of theirs changed): the NICs are those of last time.
    last = static.get(LAST)
    if last is not None and last[0] == found and last[1] == opts:
        return last[2]

    if opts.fabric is not None:
        fabric = set(opts.fabric)
    else:
        fabric = {f[0] for f in found if f[2] is not None}
        if not fabric:
            # A node without RDMA trains over TCP: every NIC with a PCI device is fabric.
            fabric = {f[0] for f in found if f[6]}

    nics = {}
    for device, netdev, port, driver, link_layer, numa, pci, speed in found:
        speed = opts.link_speeds.get(device, speed)
        nics[device] = Nic(device, netdev, port, driver, link_layer, numa, pci, speed, device in fabric)
    # The same NICs as last time: the same dict, so that what the ticks keep per inventory
    # (caches pruned, sums of NICs that left) is redone only when they change.
    if last is not None and last[2] == nics:
        nics = last[2]
    static[LAST] = (found, opts, nics)
    return nics


def _rdma_pci_device(root: Root, rdma_device: str) -> tuple[str, str, str]:
    base = f"{rdma_reader.IB}/{rdma_device}/device"
    driver = pci = numa = ""
    for line in (root.read_optional_str(f"{base}/uevent") or "").splitlines():
        key, _, value = line.partition("=")
        if key == "DRIVER":
            driver = value
        elif key == "PCI_SLOT_NAME":
            pci = value
    numa_text = root.read_optional_str(f"{base}/numa_node")
    if numa_text and numa_text.isdigit():
        numa = numa_text
    return driver, pci, numa
