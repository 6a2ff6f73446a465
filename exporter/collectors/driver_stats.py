"""Driver statistics (ethtool -S) beyond the wire: pause durations, discards, errors, and
PHY health (symbol errors, FEC, link-down events). Pause frames and wire bytes come from
the same source but at the fast tick (wire.py)."""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.inventory import Nic
from exporter.readers.ethtool import DriverStatsReader
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from exporter.vendors import GENERIC, DriverCounters, counters_for, first_present
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
    MetricSpec,
)

# Of a NIC's statistics, what makes each sample: (metric, labels, the names whose values it
# sums, the unit they count in per second of the contract's unit).
Plan = list[tuple[MetricSpec, tuple[str, ...], tuple[str, ...], float]]


def plan(table: DriverCounters, device: str, stats: dict[str, float]) -> Plan:
    """The samples a driver's statistics make, for a set of names present: the names `pick`
    would take for each metric (vendors.first_present), and the first name present for each
    (direction, priority) of the pause durations."""
    out: Plan = []
    for (direction, priority), aliases in table.pause_duration_aliases:
        names = first_present(stats, aliases)
        if names is not None:
            out.append((NIC_PFC_PAUSE_DURATION, (device, direction, priority), names,
                        table.pause_duration_units_per_second))
    for alternatives, metric in ((table.rx_discards, NIC_RECEIVE_DISCARDS),
                                 (table.tx_discards, NIC_TRANSMIT_DISCARDS),
                                 (table.rx_errors, NIC_RECEIVE_ERRORS),
                                 (table.symbol_errors, NIC_SYMBOL_ERRORS),
                                 (table.fec_corrected_bit_errors, NIC_FEC_CORRECTED_BIT_ERRORS),
                                 (table.fec_corrected_blocks, NIC_FEC_CORRECTED_BLOCKS),
                                 (table.fec_uncorrectable_blocks, NIC_FEC_UNCORRECTABLE_BLOCKS),
                                 (table.link_down_events, NIC_LINK_DOWNED)):
        names = first_present(stats, alternatives)
        if names is not None:
            out.append((metric, (device,), names, 1.0))
    return out


class DriverStatsCollector:
    name = "driver_stats"

    def __init__(self, root: Root):
        self.reader = DriverStatsReader(root)
        self._pruned_for: dict[str, Nic] | None = None  # the inventory the reader's caches were last pruned to
        # netdev -> the names its statistics had, and the plan made for them: a driver's set of
        # counters changes only when it is reloaded or reconfigured (channels, PFC).
        self._plans: dict[str, tuple[set[str], DriverCounters, Plan]] = {}

    def close(self) -> None:
        self.reader.close()

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        if ctx.nics is not self._pruned_for:  # a new inventory (discovery returns the same dict while none is)
            self._pruned_for = ctx.nics
            # NICs that left the inventory are never read again: drop what the reader keeps for them.
            netdevs = {nic.netdev for nic in ctx.nics.values() if nic.netdev}
            self.reader.forget_except(netdevs)
            for gone in self._plans.keys() - netdevs:
                del self._plans[gone]
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
            known = self._plans.get(nic.netdev)
            if known is None or known[0] != stats.keys() or known[1] is not table:
                known = self._plans[nic.netdev] = (set(stats), table, plan(table, nic.device, stats))
            for metric, labels, names, units in known[2]:
                value = stats[names[0]] if len(names) == 1 else sum(stats[n] for n in names)
                samples.append(Sample(metric, labels, value / units if units != 1.0 else value))
        return samples


register("driver_stats", "slow", lambda setup: DriverStatsCollector(setup.root),
         help="driver statistics (ethtool -S): pause durations, discards, errors, PHY health (symbol errors, FEC, "
              "link-down events)")
