"""The registry's families: every sample published, each family's in label order, whatever
the collectors publish from one scrape to the next (the grouping of the last scrape is
reused only where a collector's series are the same)."""

import random

from exporter.counters import MonotonicCounters
from exporter.registry import Registry
from exporter.samples import KnownSeries, Sample
from gpunet.contract import NIC_RECEIVE_BYTES, NIC_TRANSMIT_BYTES, NIC_UP


def expected(published: dict[str, list[Sample]]) -> dict[str, list[tuple]]:
    """Written plainly: the samples of every collector by family name, in label order."""
    out: dict[str, list[tuple]] = {}
    for samples in published.values():
        for s in samples:
            out.setdefault(s.metric.name, []).append((s.labels, s.value))
    return {name: sorted(group) for name, group in out.items()}


def nic_families(registry: Registry) -> dict[str, list[tuple]]:
    return {f.name: [(s[1], s[2]) for s in f.samples] for f in registry.families()
            if f.name in (NIC_RECEIVE_BYTES.name, NIC_TRANSMIT_BYTES.name, NIC_UP.name)}


def test_families_follow_what_each_collector_publishes_scrape_after_scrape():
    rng = random.Random(3)
    registry = Registry()
    devices = ["eth0", "eth1", "ib0", "mlx5_2:1"]
    published: dict[str, list[Sample]] = {}
    for scrape in range(300):
        for collector in ("wire", "netdev"):
            if collector in published and rng.random() < 0.3:
                # The very list again, as a collector served from its last read hands it.
                registry.publish(collector, published[collector], 0.001, 0)
                continue
            present = devices if rng.random() < 0.8 else rng.sample(devices, rng.randint(0, 3))
            order = list(present)
            if rng.random() < 0.1:
                rng.shuffle(order)  # same series, another order
            metrics = [NIC_RECEIVE_BYTES, NIC_TRANSMIT_BYTES] if collector == "wire" else [NIC_UP]
            if collector == "netdev" and rng.random() < 0.2:
                metrics.append(NIC_RECEIVE_BYTES)  # a family two collectors make
            # (A family two collectors make has series of its own in each.)
            samples = [Sample(m, (d if collector == "wire" or m is NIC_UP else f"{d}-nd",), float(rng.randint(0, 9)))
                       for d in order for m in metrics]
            published[collector] = samples
            registry.publish(collector, samples, 0.001, 0)
        got = nic_families(registry)
        assert got == expected(published), f"scrape {scrape}"


def test_families_follow_what_the_counters_hand_on_scrape_after_scrape():
    """As the sampler publishes: each collector's samples through its MonotonicCounters,
    which tell the registry where their series are those of the last tick (KnownSeries);
    NICs come, go and change places, and every scrape has every sample in its place."""
    rng = random.Random(11)
    registry = Registry()
    devices = ["eth0", "eth1", "ib0", "mlx5_2:1"]
    counters = {"wire": MonotonicCounters(), "netdev": MonotonicCounters()}
    published: dict[str, list[Sample]] = {}
    told = 0
    for scrape in range(300):
        for collector, metrics in (("wire", [NIC_RECEIVE_BYTES, NIC_TRANSMIT_BYTES]), ("netdev", [NIC_UP])):
            present = devices if rng.random() < 0.7 else rng.sample(devices, rng.randint(0, 3))
            order = list(present)
            if rng.random() < 0.1:
                rng.shuffle(order)
            samples = [Sample(m, (d,), float(10 * scrape + rng.randint(0, 9))) for d in order for m in metrics]
            out = counters[collector].apply(samples)
            last = published.get(collector)
            told += isinstance(out, KnownSeries) and isinstance(last, KnownSeries) and out.series is last.series
            published[collector] = out
            registry.publish(collector, out, 0.001, 0)
        assert nic_families(registry) == expected(published), f"scrape {scrape}"
    assert told > 100  # the series told most scrapes, not compared
