"""The PCIe link of a PCI function: the speed and width it trained at and the most it
can, from its sysfs folder (``current_link_speed``, ``max_link_speed``,
``current_link_width``, ``max_link_width``).

The most a link can train at is the lower of what its two ends support: the function's own
``max_link_*`` and those of the port above it (the root port or switch port whose folder
holds the function's, on a live node where ``sys/bus/pci/devices/<address>`` leads). A
Gen5 x16 card in a Gen4 slot, or in an x16 slot wired x8, trains at Gen4 or x8 by design:
that is the platform's limit, not a link that came up degraded.

Speeds read ``16.0 GT/s PCIe`` (older kernels: ``8 GT/s``, ``2.5 GT/s``), in transfers
per second per lane; ``Unknown`` (a function whose link the kernel cannot tell) and a
width of 0 or 255 (no link trained) are unknown; an absent file is unknown too (a virtual
device, an old kernel).
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from exporter.readers.netdev import NET
from exporter.readers.rdma import IB
from exporter.root import Root, SourceError

PCI_DEVICES = "sys/bus/pci/devices"
SPEED = re.compile(r"(\d+(?:\.\d+)?) GT/s\b")
NO_LINK_WIDTHS = (0, 255)
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class PcieLink(NamedTuple):
    current_speed: float | None  # transfers/s per lane (16e9 = Gen4)
    max_speed: float | None  # the most the link can: the lower of the function's and its port's
    current_width: int | None
    max_width: int | None


def pcie_link(root: Root, function_dir: str, errors: list[SourceError]) -> PcieLink:
    """The link of the PCI function whose sysfs folder is `function_dir` (under the root).
    A malformed file costs only its own value (an error is appended)."""
    max_speed = _speed(root, f"{function_dir}/max_link_speed", errors)
    max_width = _width(root, f"{function_dir}/max_link_width", errors)
    port = upstream_port(root, function_dir)
    if port is not None:
        max_speed = _lower(max_speed, _speed(root, f"{port}/max_link_speed", errors))
        max_width = _lower(max_width, _width(root, f"{port}/max_link_width", errors))
    return PcieLink(_speed(root, f"{function_dir}/current_link_speed", errors), max_speed,
                    _width(root, f"{function_dir}/current_link_width", errors), max_width)


def upstream_port(root: Root, function_dir: str) -> str | None:
    """The folder (under the root) of the PCI port above a function: the folder that holds
    the function's real one, where it is named like a PCI address; None where there is none
    (a root complex's own device, a virtual device, a fixture without the hierarchy)."""
    base = os.path.realpath(root.base)
    real = os.path.realpath(root.path(function_dir))
    parent = os.path.dirname(real)
    # Both named like PCI addresses: a netdev of a sub-function or a virtio device sits in a
    # folder of its PCI function, which is no port of its own.
    if not (PCI_ADDRESS.match(os.path.basename(real)) and PCI_ADDRESS.match(os.path.basename(parent))) \
            or os.path.commonpath([base, parent]) != base:
        return None
    return os.path.relpath(parent, base)


def _lower(own, port):
    """The function's own maximum, lowered to the port's where both are known (a function
    that tells no maximum gets none: the port's alone would say nothing of the function)."""
    return own if own is None or port is None else min(own, port)


def netdev_pcie_link(root: Root, netdev: str, errors: list[SourceError]) -> PcieLink:
    """The link of a netdev's PCI function."""
    return pcie_link(root, f"{NET}/{netdev}/device", errors)


def rdma_pcie_link(root: Root, rdma_device: str, errors: list[SourceError]) -> PcieLink:
    """The link of an RDMA device's PCI function (an InfiniBand port without a netdev)."""
    return pcie_link(root, f"{IB}/{rdma_device}/device", errors)


def address_pcie_link(root: Root, pci_address: str, errors: list[SourceError]) -> PcieLink:
    """The link of the PCI function at an address (0000:17:00.0), a GPU's for instance."""
    return pcie_link(root, f"{PCI_DEVICES}/{pci_address}", errors)


def _speed(root: Root, rel: str, errors: list[SourceError]) -> float | None:
    text = root.read_optional_str(rel)
    if text is None or text.startswith("Unknown"):
        return None
    match = SPEED.match(text)
    if match is None:
        errors.append(SourceError(str(root.path(rel)), f"not a PCIe speed: {text[:40]!r}"))
        return None
    return float(match.group(1)) * 1e9


def _width(root: Root, rel: str, errors: list[SourceError]) -> int | None:
    try:
        width = root.read_int_if_present(rel)
    except SourceError as e:
        errors.append(e)
        return None
    return None if width is None or width in NO_LINK_WIDTHS else width
