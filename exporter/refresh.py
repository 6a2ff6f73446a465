"""Facts that change rarely (PFC, trust, ECN, PCIe links) are read every `interval`
seconds, or at once when the inventory changes; in between the collector's last samples
and problems are served again, so they cost almost nothing per tick."""

from __future__ import annotations

from exporter.root import SourceError
from exporter.samples import Collector, Sample, TickContext

DEFAULT_INTERVAL = 30.0


class Refreshed:
    def __init__(self, collector: Collector, interval: float = DEFAULT_INTERVAL):
        self.collector = collector
        self.name = collector.name
        self.interval = interval
        # Besides the NICs, what forces a read when it changes: the collector's refresh_key()
        # where it has one (the PCIe collector: the GPUs' PCI addresses).
        self.extra_key = getattr(collector, "refresh_key", lambda: None)
        self._due: float | None = None
        self._key: object = None
        self._samples: list[Sample] = []
        self._errors: list[SourceError] = []

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        key = (tuple((n.device, n.netdev, n.rdma and (n.rdma.device, n.rdma.port), n.pci_address)
                     for n in ctx.nics.values()), self.extra_key())
        if self._due is None or ctx.now >= self._due or key != self._key:
            fresh: list[SourceError] = []
            self._samples = self.collector.collect(ctx, fresh)  # a raise is retried next tick
            self._errors, self._key, self._due = fresh, key, ctx.now + self.interval
        errors.extend(self._errors)  # still wrong until read again: the collector stays down
        # The same list until the next read: what comes after (exporter/counters.py, the
        # scrape's grouping) knows it by identity and does not look at it again. Nothing
        # after a collector changes the list it returned.
        return self._samples

    def close(self) -> None:
        close = getattr(self.collector, "close", None)
        if close is not None:
            close()
