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
from exporter.counters import MIN_FRAME_BYTES, LinkBound
from exporter.inventory import Nic
from exporter.readers import rdma as rdma_reader
from exporter.readers.ethtool import DriverStatsReader
from exporter.readers.netdev import NetdevReader, stat_where
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from exporter.vendors import counters_for, first_present, pick
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
        self.bound = LinkBound()  # readings past what a link could carry are not taken

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
            self.bound.forget_except(ctx.nics)
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
                    self._from_driver(nic, samples, errors, received_pauses, ctx)
                else:
                    self._from_ib(nic, source, samples, errors, ctx.now)
            except SourceError as e:
                errors.append(e)
        if via_netdev:
            links = self.netdev.links([n.netdev for n in via_netdev], errors, ("rx_bytes", "tx_bytes"))
            for nic in via_netdev:
                link = links.get(nic.netdev)
                if link is None:
                    continue
                for stat, metric in (("rx_bytes", NIC_RECEIVE_BYTES), ("tx_bytes", NIC_TRANSMIT_BYTES)):
                    if stat in link.stats:
                        value = self.bound.check((nic.device, metric.name), link.stats[stat], ctx.now,
                                                 nic.speed_bytes_per_second, lambda: stat_where(self.root, nic.netdev, stat),
                                                 errors)
                        samples.append(Sample(metric, (nic.device,), value))
        return samples

    def _from_driver(self, nic: Nic, samples: list[Sample], errors: list[SourceError],
                     received_pauses: dict[str, float], ctx: TickContext) -> None:
        table = counters_for(nic.driver)
        stats = self.driver_stats.read(nic.netdev, errors, table.wire_names)
        device, now, speed = nic.device, ctx.now, nic.speed_bytes_per_second
        for metric, alternatives in ((NIC_RECEIVE_BYTES, table.wire_rx_bytes),
                                     (NIC_TRANSMIT_BYTES, table.wire_tx_bytes)):
            names = first_present(stats, alternatives)  # what pick() sums, named in a message about it
            if names is not None:
                raw = stats[names[0]] if len(names) == 1 else sum(stats[n] for n in names)
                samples.append(Sample(metric, (device,), self.bound.check(
                    (device, metric.name), raw, now, speed,
                    lambda: f"{self.driver_stats.where(nic.netdev)}: {'+'.join(names)}", errors)))
        per_priority = ctx.refresh_all
        # One walk of the aliases: every pause counter on the tick that makes the per-priority
        # series, else only the received ones, which the network state needs.
        received = 0.0
        found = False
        for (direction, priority), names in table.pause_frame_aliases if per_priority else table.received_pause_aliases:
            for name in names:  # the first alias present wins
                value = stats.get(name)
                if value is not None:
                    if per_priority:  # the counter, checked; link_load asks only whether the raw sum grew
                        samples.append(Sample(NIC_PFC_PAUSE_FRAMES, (device, direction, priority), self.bound.check(
                            (device, name), value, now, speed,
                            lambda: f"{self.driver_stats.where(nic.netdev)}: {name}", errors, MIN_FRAME_BYTES)))
                    if direction == "receive" and 0 <= value < INF:  # a driver's -1 or NaN is no reading
                        received += value
                        found = True
                    break
        if found:
            received_pauses[device] = received

    def _from_ib(self, nic: Nic, source: str, samples: list[Sample], errors: list[SourceError], now: float) -> None:
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
            value = self.bound.check((nic.device, metric.name), values[name] * IB_DATA_UNIT, now,
                                     nic.speed_bytes_per_second,
                                     lambda: rdma_reader.counter_path(nic.rdma, group, name), errors)
            samples.append(Sample(metric, (nic.device,), value))


# Registered like the others, but the sampler runs it first in each fast tick: link_load.py
# derives saturated seconds and the node's network_state from its samples, and the GPU
# collector splits idle time by that state. Turned off, there are no link_load series and
# GPU idle time is all counted as "quiet".
register("wire", "fast", lambda setup: WireCollector(setup.root), feeds_link_load=True,
         help="bytes on each NIC's wire (RDMA included) and pause frames, from which saturated seconds and "
              "network_state are derived; off, neither is exported and GPU idle time all counts as 'quiet'")
