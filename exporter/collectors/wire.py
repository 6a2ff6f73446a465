"""Fast tick: what crossed each NIC's wire, RDMA included, and the pause frames it met.

Where a NIC's bytes come from, per port:
  InfiniBand  -> port_rcv_data / port_xmit_data x 4 (counters_ext 64-bit where present);
  Ethernet    -> the driver's physical-port counters (mlx5 rx_bytes_phy, ...), which see
                 RoCE traffic that bypasses the kernel;
  otherwise   -> the netdev statistics.
The choice is made once per NIC and kept: switching sources mid-run would make the
counter jump. A driver read that fails or is malformed makes no choice (the NIC has no bytes
until one reads cleanly): only a clean read without the counter settles on netdev.
Pause frames are read here too, from the same driver read, because the
node's network_state needs them at the fast tick: what it needs, the frames each NIC
received summed over priorities, is handed to link_load at every fast tick
(`received_pauses`); the per-priority series are made only at the fast tick that refreshes
everything once a slow interval (128 samples on 8 NICs, which a scrape every 15 s does not
need five times a second).
"""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.inventory import Nic
from exporter.readers import rdma as rdma_reader
from exporter.readers.ethtool import DriverStatsReader
from exporter.readers.netdev import NetdevReader
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from exporter.vendors import counters_for, pick
from gpunet.contract import NIC_PFC_PAUSE_FRAMES, NIC_RECEIVE_BYTES, NIC_TRANSMIT_BYTES

INF = float("inf")
IB_DATA_UNIT = 4  # InfiniBand data counters count 4-octet words
SATURATED_32 = 2**32 - 1  # 32-bit PortCounters stop here rather than wrap


class WireCollector:
    name = "wire"
    refreshed_series = frozenset({NIC_PFC_PAUSE_FRAMES.name})

    def __init__(self, root: Root):
        self.root = root
        self.netdev = NetdevReader(root)
        self.driver_stats = DriverStatsReader(root)
        self._source: dict[str, str] = {}  # device -> "ib_ext" | "ib" | "driver" | "netdev"
        self._pruned_for: dict[str, Nic] | None = None  # the inventory the caches were last pruned to
        # device -> pause frames received, summed over priorities, as read by the latest
        # collect (a new dict each time: link_load keeps the last one). Raw, not made
        # monotonic: link_load asks only whether it grew since the last tick.
        self.received_pauses: dict[str, float] = {}

    def close(self) -> None:
        self.netdev.close()
        self.driver_stats.close()

    def _choose_source(self, nic: Nic, errors: list[SourceError]) -> str | None:
        """Where the NIC's bytes come from; None when that cannot be told yet (the driver's
        counters could not be read cleanly), to be asked again at the next tick."""
        if nic.rdma is not None and (nic.link_layer == "InfiniBand" or not nic.netdev):
            if rdma_reader.has_extended_counters(self.root, nic.rdma):
                return "ib_ext"
            return "ib"
        table = counters_for(nic.driver)
        if table.wire_rx_bytes and self.driver_stats.available(nic.netdev):
            problems: list[SourceError] = []
            try:
                stats = self.driver_stats.read(nic.netdev, problems, table.wire_names)
            except SourceError as e:
                # A failed read (a transient ioctl error) says nothing about the counter:
                # settling on netdev here would miss the RDMA traffic for good.
                errors.append(e)
                return None
            if pick(stats, table.wire_rx_bytes) is not None:
                # The read's problems, if any, are reported by _from_driver's read in this tick.
                return "driver"
            errors.extend(problems)
            if problems:
                return None  # the counter may be on a malformed line: ask again once it reads clean
        return "netdev"

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        if ctx.nics is not self._pruned_for:  # a new inventory (discovery returns the same dict while none is)
            self._pruned_for = ctx.nics
            for gone in self._source.keys() - ctx.nics.keys():
                del self._source[gone]
            # NICs that left the inventory are never read again: drop what the reader keeps for them.
            self.driver_stats.forget_except({nic.netdev for nic in ctx.nics.values() if nic.netdev})
        samples: list[Sample] = []
        via_netdev: list[Nic] = []
        self.received_pauses = received_pauses = {}
        for device, nic in ctx.nics.items():
            source = self._source.get(device)
            if source is None:
                source = self._choose_source(nic, errors)
                if source is None:
                    # No bytes this tick rather than netdev's: a later switch to the driver's
                    # counter (RDMA included) would show as a burst of all the RDMA traffic so far.
                    continue
                self._source[device] = source
            try:
                if source == "netdev":
                    via_netdev.append(nic)
                elif source == "driver":
                    self._from_driver(nic, samples, errors, received_pauses, ctx.refresh_all)
                else:
                    self._from_ib(nic, source, samples, errors)
            except SourceError as e:
                errors.append(e)
        if via_netdev:
            links = self.netdev.links([n.netdev for n in via_netdev], errors, ("rx_bytes", "tx_bytes"))
            for nic in via_netdev:
                link = links.get(nic.netdev)
                if link is None:
                    continue
                if "rx_bytes" in link.stats:
                    samples.append(Sample(NIC_RECEIVE_BYTES, (nic.device,), link.stats["rx_bytes"]))
                if "tx_bytes" in link.stats:
                    samples.append(Sample(NIC_TRANSMIT_BYTES, (nic.device,), link.stats["tx_bytes"]))
        return samples

    def _from_driver(self, nic: Nic, samples: list[Sample], errors: list[SourceError],
                     received_pauses: dict[str, float], per_priority: bool) -> None:
        table = counters_for(nic.driver)
        stats = self.driver_stats.read(nic.netdev, errors, table.wire_names)
        rx, tx = pick(stats, table.wire_rx_bytes), pick(stats, table.wire_tx_bytes)
        if rx is not None:
            samples.append(Sample(NIC_RECEIVE_BYTES, (nic.device,), rx))
        if tx is not None:
            samples.append(Sample(NIC_TRANSMIT_BYTES, (nic.device,), tx))
        # One walk of the aliases: every pause counter on the tick that makes the per-priority
        # series, else only the received ones, which the network state needs.
        received = 0.0
        found = False
        device = nic.device
        for (direction, priority), names in table.pause_frame_aliases if per_priority else table.received_pause_aliases:
            for name in names:  # the first alias present wins
                value = stats.get(name)
                if value is not None:
                    if per_priority:
                        samples.append(Sample(NIC_PFC_PAUSE_FRAMES, (device, direction, priority), value))
                    if direction == "receive" and 0 <= value < INF:  # a driver's -1 or NaN is no reading
                        received += value
                        found = True
                    break
        if found:
            received_pauses[device] = received

    def _from_ib(self, nic: Nic, source: str, samples: list[Sample], errors: list[SourceError]) -> None:
        assert nic.rdma is not None
        if source == "ib_ext":
            group, names = rdma_reader.EXTENDED_COUNTERS, ("port_rcv_data_64", "port_xmit_data_64")
        else:
            # 64-bit on current kernels and HCAs (extended PortCounters behind the same name).
            group, names = rdma_reader.PORT_COUNTERS, ("port_rcv_data", "port_xmit_data")
        values = rdma_reader.read_counters(self.root, nic.rdma, group, names, errors)
        for name, metric in zip(names, (NIC_RECEIVE_BYTES, NIC_TRANSMIT_BYTES)):
            if name not in values:
                continue
            if values[name] == SATURATED_32 and group == rdma_reader.PORT_COUNTERS:
                # An HCA without extended counters: the 32-bit counter stopped at its top
                # and no longer moves. Say so; the value is kept but its rate will read 0.
                errors.append(SourceError(rdma_reader.counter_path(nic.rdma, group, name),
                                          "32-bit counter saturated at 4294967295 (no extended counters)"))
            samples.append(Sample(metric, (nic.device,), values[name] * IB_DATA_UNIT))


# Registered like the others, but the sampler runs it first in each fast tick: link_load.py
# derives saturated seconds and the node's network_state from its samples, and the GPU
# collector splits idle time by that state. Turned off, there are no link_load series and
# GPU idle time is all counted as "quiet".
register("wire", "fast", lambda setup: WireCollector(setup.root), feeds_link_load=True,
         help="bytes on each NIC's wire (RDMA included) and pause frames, from which saturated seconds and "
              "network_state are derived; off, neither is exported and GPU idle time all counts as 'quiet'")
