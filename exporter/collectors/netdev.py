"""Netdev link state and kernel statistics (netlink live, sysfs under a fixture root)."""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.counters import MIN_FRAME_BYTES, LinkBound
from exporter.inventory import Nic
from exporter.readers.netdev import NetdevReader, stat_where
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import (
    NIC_CARRIER_CHANGES,
    NIC_MTU,
    NIC_NETDEV_RECEIVE_BYTES,
    NIC_NETDEV_RECEIVE_DROPS,
    NIC_NETDEV_RECEIVE_ERRORS,
    NIC_NETDEV_RECEIVE_PACKETS,
    NIC_NETDEV_TRANSMIT_BYTES,
    NIC_NETDEV_TRANSMIT_DROPS,
    NIC_NETDEV_TRANSMIT_ERRORS,
    NIC_NETDEV_TRANSMIT_PACKETS,
    NIC_UP,
)

STATS = (("rx_bytes", NIC_NETDEV_RECEIVE_BYTES), ("tx_bytes", NIC_NETDEV_TRANSMIT_BYTES),
         ("rx_packets", NIC_NETDEV_RECEIVE_PACKETS), ("tx_packets", NIC_NETDEV_TRANSMIT_PACKETS),
         ("rx_errors", NIC_NETDEV_RECEIVE_ERRORS), ("tx_errors", NIC_NETDEV_TRANSMIT_ERRORS),
         ("rx_dropped", NIC_NETDEV_RECEIVE_DROPS), ("tx_dropped", NIC_NETDEV_TRANSMIT_DROPS))
# Those checked against what the link could carry (counters.LinkBound): bytes by its speed,
# packets by its speed in frames of the shortest. Drops and errors are not: a sender can
# have packets dropped faster than its link carries them.
BYTES = frozenset({"rx_bytes", "tx_bytes"})
PACKETS = frozenset({"rx_packets", "tx_packets"})


class NetdevCollector:
    name = "netdev"

    def __init__(self, root: Root):
        self.root = root
        self.reader = NetdevReader(root)
        self.bound = LinkBound()
        self._pruned_for: dict[str, Nic] | None = None  # the inventory the bound was last pruned to

    def close(self) -> None:
        self.reader.close()

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        if ctx.nics is not self._pruned_for:  # a new inventory (discovery returns the same dict while none is)
            self._pruned_for = ctx.nics
            self.bound.forget_except(ctx.nics)
        nics = {nic.netdev: nic for nic in ctx.nics.values() if nic.netdev}
        samples = []
        for netdev, link in self.reader.links(list(nics), errors).items():
            nic = nics[netdev]
            labels = (nic.device,)
            samples.append(Sample(NIC_UP, labels, 1.0 if link.up else 0.0))
            if link.carrier_changes is not None:
                samples.append(Sample(NIC_CARRIER_CHANGES, labels, link.carrier_changes))
            if link.mtu is not None:
                samples.append(Sample(NIC_MTU, labels, link.mtu))
            for stat, metric in STATS:
                if stat in link.stats:
                    value: float = link.stats[stat]
                    if stat in BYTES or stat in PACKETS:
                        value = self.bound.check((nic.device, stat), value, ctx.now, nic.speed_bytes_per_second,
                                                 lambda: stat_where(self.root, netdev, stat), errors,
                                                 1 if stat in BYTES else MIN_FRAME_BYTES)
                    samples.append(Sample(metric, labels, value))
        return samples


register("netdev", "slow", lambda setup: NetdevCollector(setup.root),
         help="link state, carrier changes, MTU and kernel statistics of each netdev")
