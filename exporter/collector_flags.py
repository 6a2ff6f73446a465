"""--collector.NAME / --no-collector.NAME, node_exporter's flags: one pair per registered
collector (exporter/collector_registry.py), and --collector.disable-defaults. As settings
(--config, GPUNET_*) they are collector.NAME: true|false or no-collector.NAME: true."""

from __future__ import annotations

import argparse
import re

import exporter.collectors  # noqa: F401  (importing the package registers every collector)
from exporter.collector_registry import Registration, registered

COLLECTOR_FLAG = re.compile(r"^(?:--)?(no-)?collector\.([^=]*)")
DISABLE_DEFAULTS = "disable-defaults"


def collector_dest(name: str) -> str:
    return f"collector_{name}"


def add_collector_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group(
        "collectors", "--collector.NAME turns a collector on, --no-collector.NAME off. A collector that is off "
                      "reads nothing and publishes nothing, not even its gpunet_exporter_collector_up series.")
    group.add_argument(f"--collector.{DISABLE_DEFAULTS}", dest="collector_disable_defaults", action="store_true",
                       help="turn off every collector not named with --collector.NAME")
    for r in registered():
        group.add_argument(f"--collector.{r.name}", dest=collector_dest(r.name), default=None,
                           action=argparse.BooleanOptionalAction, help=f"{r.help} ({how_it_runs(r)})")


REFRESH_FLAGS = {"config": "--config-interval", "workload": "--workload.interval"}


def how_it_runs(r: Registration) -> str:
    if r.refresh is None:
        how = f"{r.tick} tick"
    elif isinstance(r.refresh, str):
        how = f"every {REFRESH_FLAGS[r.refresh]}"
    else:
        how = f"every {r.refresh:g} s"
    if r.needs_gpu:
        how += ", needs a GPU"
    return how + ("; on by default" if r.default_enabled else "; off by default")


def unknown_collector(flag: str) -> str | None:
    """The complaint about a --collector.NAME flag (or collector.NAME setting) whose NAME is
    not registered; None for any other flag."""
    m = COLLECTOR_FLAG.match(flag)
    if m is None:
        return None
    negated, name = m.groups()
    if name in {r.name for r in registered()} or (name == DISABLE_DEFAULTS and not negated):
        return None
    return f"{flag}: no collector named {name!r}; the collectors are {', '.join(r.name for r in registered())}"


def enabled_collectors(args: argparse.Namespace) -> list[str]:
    """The collectors to run: each as its --collector.NAME / --no-collector.NAME says, else as
    its default (off for all with --collector.disable-defaults); --no-gpu turns off those
    that need a GPU."""
    names = []
    for r in registered():
        chosen = getattr(args, collector_dest(r.name))
        on = (r.default_enabled and not args.collector_disable_defaults) if chosen is None else chosen
        if on and not (r.needs_gpu and args.no_gpu):
            names.append(r.name)
    return names
