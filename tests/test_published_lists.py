"""What a collector returns is never changed afterwards, by it or by the stages after it.

The stages after the collectors tell "the same as last time" by identity before they
compare anything: the counters (exporter/counters.py) answer a list they were given at the
last tick with their last answer, the registry's grouping (exporter/registry.py) reuses the
grouping of the very list it grouped at the last scrape, and the renderer its text of a
family whose samples compare equal. A list changed in place after it was returned would be
served with the answer found for what it held before. So every list a collector (or
link_load, or a collector's `live_samples`) returns, and every list the sampler publishes,
is copied as it is handed on, and each is compared with its copy after more ticks and
scrapes over every fixture node, whose counters move between the ticks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from conftest import FIXTURES

from exporter.cli import make_sampler
from exporter.registry import Registry
from exporter.settings import parse_args

NODES = sorted(p for p in FIXTURES.iterdir() if (p / "sys").is_dir())
# Counter files that move between ticks (the netdev statistics and the RDMA port counters).
MOVING = ("sys/class/net/*/statistics/*", "sys/class/infiniband/*/ports/*/counters/*",
          "sys/class/infiniband/*/ports/*/hw_counters/*")


class Returned:
    """Each list returned by the wrapped callables, with a copy made as it was returned."""

    def __init__(self) -> None:
        self.lists: list[tuple[str, list, list]] = []

    def wrap(self, owner: object, attribute: str, label: str) -> None:
        inner: Callable = getattr(owner, attribute)

        def recorded(*args, **kwargs):
            out = inner(*args, **kwargs)
            self.lists.append((label, out, list(out)))
            return out
        setattr(owner, attribute, recorded)

    def wrap_publish(self, registry: Registry) -> None:
        """The lists the sampler hands the registry (made monotonic: the counters' own)."""
        inner = registry.publish

        def recorded(collector, samples, duration, errors, refreshed=None, live=None):
            for part, got in (("samples", samples), ("refreshed", refreshed)):
                if got is not None:
                    self.lists.append((f"{collector} published ({part})", got, list(got)))
            return inner(collector, samples, duration, errors, refreshed, live)
        registry.publish = recorded  # type: ignore[method-assign]

    def changed(self) -> list[str]:
        out = []
        for label, returned, copy in self.lists:
            if returned != copy:
                at = next((i for i, (a, b) in enumerate(zip(returned, copy)) if a is not b), min(len(returned),
                                                                                               len(copy)))
                out.append(f"{label}: a list of {len(copy)} samples holds {len(returned)} now, first change at {at}")
        return out


def move_counters(node, step: int) -> int:
    """Add `step` to every moving counter file that holds an integer (a negative step sets
    it back, as a driver reload does); how many moved."""
    moved = 0
    for pattern in MOVING:
        for path in node.glob(pattern):
            if not path.is_file():
                continue
            text = path.read_text().strip()
            if text.isdigit():
                path.write_text(f"{max(int(text) + step, 0)}\n")
                moved += 1
    return moved


@pytest.mark.parametrize("fixture", NODES, ids=lambda p: p.name)
def test_no_returned_list_changes_after_it_was_returned(fixture, node_copy):
    node = node_copy(fixture.name)
    registry = Registry(root_label=node.name)
    sampler = make_sampler(parse_args(["--root", str(node)]), registry)
    returned = Returned()
    for collector in [*sampler.link_load_inputs, *sampler.fast, *sampler.slow]:
        returned.wrap(collector, "collect", f"{collector.name}.collect")
        if callable(getattr(collector, "live_samples", None)):
            returned.wrap(collector, "live_samples", f"{collector.name}.live_samples")
    returned.wrap(sampler.link_load, "samples", "link_load.samples")
    returned.wrap_publish(registry)
    moved = 0
    try:
        now = 100.0
        # First as they are (the short paths learn them), then rising, then set back (a reset:
        # the counters carry what they had over), then rising again from there.
        for step in (0, 0, 1000, 2000, -10**12, 500, 700):
            if step:
                moved += move_counters(node, step)
            sampler.slow_tick(now)
            for fast in range(5):
                sampler.fast_tick(now + 0.2 * fast)
                if fast % 2 == 0:
                    registry.render(openmetrics=True, gzipped=True)
                    registry.render(openmetrics=False)
            now += 1.0
    finally:
        asyncio.run(sampler.stop())
    ran = {label for label, _, _ in returned.lists}
    collectors = [*sampler.link_load_inputs, *sampler.fast, *sampler.slow]
    every = {f"{c.name}.collect" for c in collectors}
    every |= {f"{c.name} published (samples)" for c in collectors}
    every |= {f"{c.name}.live_samples" for c in collectors if callable(getattr(c, "live_samples", None))}
    if sampler.link_load_inputs:
        every.add("link_load.samples")
    assert every <= ran, f"never recorded: {sorted(every - ran)}"
    changed = returned.changed()
    assert not changed, "\n".join(changed)
    if (node / "sys/class/net").is_dir() and any(node.glob(MOVING[0])):
        assert moved, "no counter moved: the test would not see a list changed on the long path"
