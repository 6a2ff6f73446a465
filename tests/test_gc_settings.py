"""The exporter's garbage-collector settings: a tick's samples, freed by reference counting,
set off no collection (with CPython's default thresholds they set one off every tick or so)."""

import gc

from exporter_harness import Node

from exporter import gc_settings


def collections_over_ticks(node: Node, seconds: int) -> int:
    before = sum(s["collections"] for s in gc.get_stats())
    for second in range(1, seconds + 1):
        node.sampler.slow_tick(float(second))
        for k in range(5):
            node.sampler.fast_tick(second + 0.2 * k)
        node.registry.render(openmetrics=True, gzipped=True)
    return sum(s["collections"] for s in gc.get_stats()) - before


def test_ticks_and_scrapes_set_off_no_collection(node_copy):
    node_copy("roce-mlx5")
    node = Node(node_copy("h100-8gpu")).tick(now=0.0)
    default = gc.get_threshold()
    try:
        gc.collect()
        assert collections_over_ticks(node, 40) >= 5  # CPython's 700: a collection every few ticks
        gc_settings.set_thresholds()
        gc.collect()
        assert collections_over_ticks(node, 40) <= 1
    finally:
        gc.set_threshold(*default)
