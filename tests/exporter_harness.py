"""Drive the exporter's sampler by hand, tick by tick, over a fixture root."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.inventory import InventoryOptions
from exporter.readers.gpus import GpuSource
from exporter.readers.nvml import FixtureGpus
from exporter.registry import Registry
from exporter.root import Root
from exporter.sampler import Sampler

# Lines whose values depend on the machine or the clock, not on the fixture.
VOLATILE = re.compile(r"^(process_|gpunet_exporter_collector_duration_seconds|"
                      r"gpunet_exporter_collector_last_run_timestamp_seconds|"
                      r"# (HELP|TYPE) (process_|gpunet_exporter_collector_duration_seconds|"
                      r"gpunet_exporter_collector_last_run_timestamp_seconds))")


class Node:
    def __init__(self, root: Path | str, gpus: str | Path | None = None, slow_interval: float = 1.0,
                 workload=None, collectors=None, follow_scrapes: bool = False, **inventory):
        self.registry = Registry(root_label=Path(root).name)
        root_ = Root(root)
        nvml = Path(gpus) if gpus else root_.path("nvml.json")
        source = GpuSource(FixtureGpus(nvml)) if not root_.is_live and nvml.exists() else None
        self.sampler = Sampler(root_, self.registry, InventoryOptions(**inventory), slow_interval=slow_interval,
                               gpus=source, workload=workload, collectors=collectors,
                               follow_scrapes=follow_scrapes)

    def tick(self, slow: bool = True, fast: bool = True, now: float | None = None) -> Node:
        """One tick; `now` puts it at that time on a clock of the test's own."""
        if slow:
            self.sampler.slow_tick(now)
        if fast:
            self.sampler.fast_tick(now)
        return self

    def text(self) -> str:
        return self.registry.render(openmetrics=False).decode()

    def stable_text(self) -> str:
        return "".join(l + "\n" for l in self.text().splitlines() if not VOLATILE.match(l))

    def values(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """{(sample name, sorted labels): value} of the current scrape."""
        out = {}
        for family in text_string_to_metric_families(self.text()):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def value(self, name: str, **labels) -> float | None:
        return self.values().get((name, tuple(sorted(labels.items()))))

    def series(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {k[1]: v for k, v in self.values().items() if k[0] == name}
