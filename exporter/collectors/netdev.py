"""Netdev link state and kernel statistics (netlink live, sysfs under a fixture root)."""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.readers.netdev import NetdevReader
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


class NetdevCollector:
    name = "netdev"

    def __init__(self, root: Root):
        self.reader = NetdevReader(root)

    def close(self) -> None:
        self.reader.close()

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        devices = {nic.netdev: nic.device for nic in ctx.nics.values() if nic.netdev}
        samples = []
        for netdev, link in self.reader.links(list(devices), errors).items():
            labels = (devices[netdev],)
            samples.append(Sample(NIC_UP, labels, 1.0 if link.up else 0.0))
            if link.carrier_changes is not None:
                samples.append(Sample(NIC_CARRIER_CHANGES, labels, link.carrier_changes))
            if link.mtu is not None:
                samples.append(Sample(NIC_MTU, labels, link.mtu))
            for stat, metric in STATS:
                if stat in link.stats:
                    samples.append(Sample(metric, labels, link.stats[stat]))
        return samples


register("netdev", "slow", lambda setup: NetdevCollector(setup.root),
         help="link state, carrier changes, MTU and kernel statistics of each netdev")
