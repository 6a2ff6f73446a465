"""Driver statistics (ethtool -S) beyond the wire: pause durations, discards, errors, and
PHY health (symbol errors, FEC, link-down events). Pause frames and wire bytes come from
the same source but at the fast tick (wire.py)."""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.inventory import Nic
from exporter.readers.ethtool import DriverStatsReader
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from exporter.vendors import GENERIC, counters_for, pick
from gpunet.contract import (
    NIC_FEC_CORRECTED_BIT_ERRORS,
    NIC_FEC_CORRECTED_BLOCKS,
    NIC_FEC_UNCORRECTABLE_BLOCKS,
    NIC_LINK_DOWNED,
    NIC_PFC_PAUSE_DURATION,
    NIC_RECEIVE_DISCARDS,
    NIC_RECEIVE_ERRORS,
    NIC_SYMBOL_ERRORS,
    NIC_TRANSMIT_DISCARDS,
)


class DriverStatsCollector:
    name = "driver_stats"

    def __init__(self, root: Root):
        self.reader = DriverStatsReader(root)
        self._pruned_for: dict[str, Nic] | None = None  # the inventory the reader's caches were last pruned to

    def close(self) -> None:
        self.reader.close()

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        if ctx.nics is not self._pruned_for:  # a new inventory (discovery returns the same dict while none is)
            self._pruned_for = ctx.nics
            # NICs that left the inventory are never read again: drop what the reader keeps for them.
            self.reader.forget_except({nic.netdev for nic in ctx.nics.values() if nic.netdev})
        for nic in ctx.nics.values():
            table = counters_for(nic.driver)
            if not nic.netdev or table is GENERIC or nic.link_layer != "Ethernet":
                continue
            if not self.reader.available(nic.netdev):
                continue
            try:
                stats = self.reader.read(nic.netdev, errors, table.slow_names)
            except SourceError as e:
                errors.append(e)
                continue
            labels = (nic.device,)
            seen = set()
            for name, (direction, priority) in table.pause_duration.items():
                if name in stats and (direction, priority) not in seen:
                    seen.add((direction, priority))
                    samples.append(Sample(NIC_PFC_PAUSE_DURATION, (nic.device, direction, priority),
                                          stats[name] / table.pause_duration_units_per_second))
            for names, metric in ((table.rx_discards, NIC_RECEIVE_DISCARDS),
                                  (table.tx_discards, NIC_TRANSMIT_DISCARDS),
                                  (table.rx_errors, NIC_RECEIVE_ERRORS),
                                  (table.symbol_errors, NIC_SYMBOL_ERRORS),
                                  (table.fec_corrected_bit_errors, NIC_FEC_CORRECTED_BIT_ERRORS),
                                  (table.fec_corrected_blocks, NIC_FEC_CORRECTED_BLOCKS),
                                  (table.fec_uncorrectable_blocks, NIC_FEC_UNCORRECTABLE_BLOCKS),
                                  (table.link_down_events, NIC_LINK_DOWNED)):
                value = pick(stats, names)
                if value is not None:
                    samples.append(Sample(metric, labels, value))
        return samples


register("driver_stats", "slow", lambda setup: DriverStatsCollector(setup.root),
         help="driver statistics (ethtool -S): pause durations, discards, errors, PHY health (symbol errors, FEC, "
              "link-down events)")
