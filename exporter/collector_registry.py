"""Which collectors exist and how the sampler runs each.

Every collector module registers itself when it is imported, beside its own code, as
node_exporter's registerCollector does; exporter/collectors/__init__.py imports them all.
The sampler builds its collectors from this list, and cli.py its --collector.<name> flags.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from exporter.readers.gpus import GpuSource
from exporter.root import Root
from exporter.samples import Collector
from exporter.workload_options import WorkloadOptions

Tick = Literal["fast", "slow"]
# None: every tick. "config": every --config-interval seconds, "workload": every
# --workload.interval seconds, a number: every that many seconds; in between (and until
# the NICs change) the last answer is served again (exporter/refresh.py).
Refresh = Literal["config", "workload"] | float | None

NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class CollectorSetup:
    """What a factory may use to build its collector."""

    root: Root
    gpus: GpuSource | None  # None on a node without GPUs: collectors that need one are not built
    fast_interval: float
    config_interval: float
    workload: WorkloadOptions


@dataclass(frozen=True)
class Registration:
    name: str  # the collector label of its samples' gpunet_exporter_collector_* series
    tick: Tick
    factory: Callable[[CollectorSetup], Collector]
    help: str  # one line for --help
    refresh: Refresh = None
    needs_gpu: bool = False
    default_enabled: bool = True
    # Its samples are what link_load.py derives saturated seconds and the node's
    # network_state from: it runs first in the fast tick, before the other fast collectors.
    feeds_link_load: bool = False


_registered: dict[str, Registration] = {}


def register(name: str, tick: Tick, factory: Callable[[CollectorSetup], Collector], help: str, *,
             refresh: Refresh = None, needs_gpu: bool = False, default_enabled: bool = True,
             feeds_link_load: bool = False) -> None:
    """Add a collector; called once, at import time, by the collector's own module."""
    if not NAME.match(name):
        raise ValueError(f"collector name {name!r}: lower case letters, digits and _ only")
    if name in _registered:
        raise ValueError(f"collector {name!r} is registered twice")
    if tick not in ("fast", "slow"):
        raise ValueError(f"collector {name!r}: tick must be 'fast' or 'slow', not {tick!r}")
    if not (refresh is None or refresh in ("config", "workload")
            or (isinstance(refresh, (int, float)) and not isinstance(refresh, bool) and refresh > 0)):
        raise ValueError(f"collector {name!r}: refresh must be None, 'config', 'workload' or seconds > 0")
    if feeds_link_load and tick != "fast":
        raise ValueError(f"collector {name!r}: what feeds link_load must run at the fast tick")
    _registered[name] = Registration(name, tick, factory, help, refresh, needs_gpu, default_enabled,
                                     feeds_link_load)


def registered() -> list[Registration]:
    """Every registered collector, in the order they registered (the order they run in)."""
    return list(_registered.values())


def default_names() -> list[str]:
    return [r.name for r in _registered.values() if r.default_enabled]
