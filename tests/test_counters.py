"""Counters never decrease: wraps of narrow hardware counters and driver resets."""

import pytest

from exporter import counters as counters_module
from exporter.counters import MonotonicCounters
from exporter.samples import Sample
from gpunet.contract import NIC_RECEIVE_BYTES, NIC_TRANSMIT_BYTES, NIC_UP

WRAP = float(2**32)


def run(values, wrap=None):
    """The exported value after each raw reading; None where nothing was exported yet."""
    counters = MonotonicCounters()
    out = []
    for v in values:
        samples = counters.apply([Sample(NIC_RECEIVE_BYTES, ("eth0",), v, wrap)])
        out.append(samples[0].value if samples else None)
    return out


def test_first_reading_is_the_systems_own_value():
    assert run([123456.0]) == [123456.0]


def test_increases_pass_through_as_deltas():
    assert run([100.0, 150.0, 150.0, 400.0]) == [100.0, 150.0, 150.0, 400.0]


def test_32bit_wrap_counts_the_bytes_across_the_top():
    # 2**32 - 100 -> 50 means 150 more, not a drop.
    assert run([WRAP - 100, 50.0], wrap=WRAP) == [WRAP - 100, WRAP + 50]


def test_reset_adds_the_new_value_instead_of_dropping():
    # A driver reset from 10_000 to 30: the counter restarted and counted 30 since.
    assert run([10_000.0, 30.0, 40.0]) == [10_000.0, 10_030.0, 10_040.0]


def test_decrease_in_lower_half_of_narrow_counter_is_a_reset_not_a_wrap():
    assert run([1000.0, 10.0], wrap=WRAP) == [1000.0, 1010.0]


def test_a_value_past_the_width_that_falls_is_a_reset_never_a_decrease():
    """A "32-bit" counter holding 5e9 cannot have wrapped: back to 10 is a reset, +10."""
    assert run([5e9, 10.0, 20.0], wrap=WRAP) == [5e9, 5e9 + 10, 5e9 + 20]


def test_a_driver_minus_one_or_nan_keeps_the_last_value():
    values = run([1000.0, -1.0, float("nan"), 1500.0])
    assert values == [1000.0, 1000.0, 1000.0, 1500.0]


def test_a_rise_to_infinity_is_no_reading_either():
    """After ticks of the same series (which take the short way), +inf keeps the last value."""
    assert run([1.0, 2.0, 3.0, float("inf"), 4.0]) == [1.0, 2.0, 3.0, 3.0, 4.0]


def test_never_decreases_whatever_the_driver_says():
    import numpy as np

    rng = np.random.default_rng(5)
    raw = [-1.0, float("nan"), *rng.choice([0.0, 5.0, -1.0, WRAP - 3, 6e9, float("nan"), 1e12], size=400)]
    exported = run(raw, wrap=WRAP)
    assert exported[:2] == [None, None]  # nothing read yet: nothing exported
    exported = exported[2:]
    assert all(v is not None and v == v for v in exported)
    assert all(b >= a for a, b in zip(exported, exported[1:]))


def test_gauges_are_untouched():
    counters = MonotonicCounters()
    out = [counters.apply([Sample(NIC_UP, ("eth0",), v)])[0].value for v in (1.0, 0.0, 1.0)]
    assert out == [1.0, 0.0, 1.0]


def test_series_are_independent():
    counters = MonotonicCounters()
    counters.apply([Sample(NIC_RECEIVE_BYTES, ("a",), 100.0), Sample(NIC_RECEIVE_BYTES, ("b",), 5.0)])
    out = counters.apply([Sample(NIC_RECEIVE_BYTES, ("a",), 50.0), Sample(NIC_RECEIVE_BYTES, ("b",), 7.0)])
    assert [s.value for s in out] == [150.0, 7.0]


def test_a_series_that_returns_after_a_gap_keeps_growing():
    counters = MonotonicCounters()
    counters.apply([Sample(NIC_RECEIVE_BYTES, ("a",), 1000.0)])
    counters.apply([])  # the NIC was unreadable for a tick
    out = counters.apply([Sample(NIC_RECEIVE_BYTES, ("a",), 20.0)])  # back, re-created
    assert out[0].value == 1020.0


def reference(ticks):
    """The rule of this module, written plainly: per series, the exported value after each
    tick where it was read; -1 and NaN keep the last value; a fall is a wrap or a reset."""
    state, out = {}, []
    for samples in ticks:
        row = []
        for labels, raw, wrap in samples:
            last = state.get(labels)
            if not 0 <= raw < float("inf"):
                if last is not None:
                    row.append((labels, last[1]))
                continue
            if last is None:
                exported = raw
            elif raw >= last[0]:
                exported = last[1] + raw - last[0]
            elif wrap and wrap / 2 <= last[0] < wrap and raw < wrap / 2:
                exported = last[1] + raw + wrap - last[0]
            else:
                exported = last[1] + raw
            state[labels] = (raw, exported)
            row.append((labels, exported))
        out.append(row)
    return out


def exported(ticks):
    """What MonotonicCounters exports for the same ticks as `reference` reads. A tick that
    reads what the one before read is handed over as the very same list, as a collector
    served from its last read (exporter/refresh.py) hands it."""
    counters = MonotonicCounters()
    out, given, last = [], None, None
    for samples in ticks:
        if samples != last:
            given, last = [Sample(NIC_RECEIVE_BYTES, labels, v, w) for labels, v, w in samples], samples
        out.append([(s.labels, s.value) for s in counters.apply(given)])
    return out


def random_ticks(seed: int, events: float, ticks: int = 1500, churn: bool = True) -> list[list[tuple]]:
    """Ticks of the same NICs for long runs (which apply takes the short way through), broken
    at random (`events`: how often) by NICs that come and go (unless not `churn`), resets,
    wraps, -1, NaN and inf."""
    import random

    rng = random.Random(seed)
    devices = ["a", "b", "c", "d"]
    raw = dict.fromkeys(devices, 0.0)
    out = []
    present = list(devices)
    for _ in range(ticks):
        if churn and rng.random() < events:
            present = sorted(rng.sample(devices, rng.randint(1, len(devices))))
        samples = []
        for d in present:
            raw[d] += rng.choice([0.0, 0.0, 1.0, 1000.0])
            value = raw[d]
            roll = rng.random()
            if roll < events / 3:
                raw[d] = value = rng.choice([0.0, 5.0])  # reset
            elif roll < events / 2:
                value = rng.choice([-1.0, float("nan"), float("inf")])  # no reading this tick
            elif roll < events * 2 / 3:
                raw[d] = value = WRAP - 2  # near the top: the next rise may wrap
            if raw[d] >= WRAP:
                raw[d] -= WRAP
            samples.append(((d,), value, WRAP))
        out.append(samples)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("events", [0.002, 0.02])
def test_ticks_of_the_same_series_agree_with_the_rule_whatever_comes(seed, events):
    """The exported values are the rule's, on the short way (the same series as the tick
    before, every counter rising, some carrying what they gained over a wrap or a reset) and
    on the long one."""
    ticks = random_ticks(seed, events)
    assert exported(ticks) == reference(ticks)


@pytest.mark.parametrize("seed", range(4))
def test_the_same_list_again_and_again_agrees_with_the_rule(monkeypatch, seed):
    """Stretches of ticks that hand over the same list (longer than the forgetting, which
    must not forget what those ticks keep reading), between ticks that change, wrap and reset.
    The same NICs throughout: one gone longer than the forgetting is forgotten, which the
    rule written in `reference` does not do."""
    import random

    monkeypatch.setattr(counters_module, "FORGET_AFTER_TICKS", 150)
    rng = random.Random(seed)
    ticks = []
    for tick in random_ticks(seed, 0.02, 400, churn=False):
        ticks += [tick] * rng.choice([1, 1, 2, 40, 400])
    assert exported(ticks) == reference(ticks)


def test_a_series_twice_in_one_tick_follows_the_rule():
    """A collector's bug, but no reason to export something else than the rule says."""
    ticks = [[(("a",), 5.0, None), (("a",), 10.0, None)], [(("a",), 6.0, None), (("a",), 11.0, None)]] * 3
    assert exported(ticks) == reference(ticks)


def test_series_read_every_tick_are_kept_and_those_gone_are_forgotten(monkeypatch):
    """A series read at every tick (the short way, which writes its state back only now and
    then) is never forgotten; one gone for longer than FORGET_AFTER_TICKS is."""
    monkeypatch.setattr(counters_module, "FORGET_AFTER_TICKS", 150)
    counters = MonotonicCounters()
    for tick in range(1, 1000):
        samples = [Sample(NIC_RECEIVE_BYTES, ("kept",), float(tick))]
        if tick <= 10:
            samples.append(Sample(NIC_RECEIVE_BYTES, ("gone",), float(tick)))
        out = counters.apply(samples)
        assert [s.value for s in out][:1] == [float(tick)]
    assert len(counters) == 1  # "gone" forgotten, "kept" not
    out = counters.apply([Sample(NIC_RECEIVE_BYTES, ("kept",), 2000.0), Sample(NIC_TRANSMIT_BYTES, ("kept",), 1.0)])
    assert [s.value for s in out] == [2000.0, 1.0]  # the long way finds "kept" where it was left


def test_gauges_among_counters_pass_as_they_came():
    mixed = MonotonicCounters()
    for v in (1.0, 0.0, 1.0, 0.0):
        out = mixed.apply([Sample(NIC_UP, ("a",), v), Sample(NIC_RECEIVE_BYTES, ("a",), 10.0)])
        assert [s.value for s in out] == [v, 10.0]


def test_the_series_compared_are_handed_on_the_same_while_they_stay():
    """A tick whose series are those of the last one says so (KnownSeries: the very list of
    series of last time), so that a scrape need not compare them again; a tick with another
    series (a NIC come) hands on a new list, which names them."""
    from exporter.samples import SERIES, KnownSeries

    counters = MonotonicCounters()

    def tick(devices, value):
        return counters.apply([Sample(NIC_RECEIVE_BYTES, (d,), value) for d in devices] + [Sample(NIC_UP, ("eth0",), 1.0)])

    first = tick(["eth0", "eth1"], 10.0)
    assert isinstance(first, KnownSeries) and first.series == list(map(SERIES, first))
    second = tick(["eth0", "eth1"], 20.0)
    assert isinstance(second, KnownSeries) and second.series is first.series
    assert [s.value for s in second] == [20.0, 20.0, 1.0]
    third = tick(["eth0", "eth1", "eth2"], 30.0)
    assert isinstance(third, KnownSeries) and third.series is not first.series
    assert third.series == list(map(SERIES, third))
    reset = tick(["eth0", "eth1", "eth2"], 5.0)  # a reset: the long way, the same series
    assert [s.value for s in reset] == [35.0, 35.0, 35.0, 1.0]
    assert isinstance(reset, KnownSeries) and reset.series == third.series


# --- readings a link could not have carried (LinkBound) -----------------------------------------

GBIT = 1e9 / 8  # bytes per second of a 1 Gb/s link


def bounded(readings, speed=GBIT, unit_bytes=1):
    """(what each reading of a counter exports, the errors reported), one reading a second,
    through LinkBound and MonotonicCounters as a collector and the sampler take them."""
    from exporter.counters import LinkBound

    bound, counters = LinkBound(), MonotonicCounters()
    out, errors = [], []
    for second, raw in enumerate(readings):
        value = bound.check(("eno1", "tx_bytes"), raw, float(second), speed, lambda: "/x/statistics/tx_bytes", errors,
                            unit_bytes)
        samples = counters.apply([Sample(NIC_TRANSMIT_BYTES, ("eno1",), value)])
        out.append(samples[0].value if samples else None)
    return out, [str(e) for e in errors]


def test_one_absurd_reading_is_not_counted_and_the_next_goes_on_from_the_last():
    """1e25 for one tick, then the real value again: the counter goes on as if the tick had
    read the value before it (it was counted as about 1e25 for good)."""
    out, errors = bounded([1000.0, 2000.0, 1e25, 3000.0, 4000.0])
    assert out == [1000.0, 2000.0, 2000.0, 3000.0, 4000.0]
    assert errors == ["/x/statistics/tx_bytes: read 1e+25, more than any 64-bit counter holds: not counted"]


def test_a_rise_past_what_the_link_carries_is_refused_once_however_long_it_lasts():
    """1 Gb/s for a second, twice over and 2 s of slack: 5e8 bytes at most. A rise of 1e12 is
    refused at each reading, reported once; the counter stands, then goes on without a jump."""
    out, errors = bounded([1000.0, 1e12, 1e12 + 5, 1e12 + 10, 2000.0, 3000.0])
    assert out == [1000.0, 1000.0, 1000.0, 1000.0, 2000.0, 3000.0]
    assert len(errors) == 3 and len(set(errors)) == 1, errors  # one error, so one warning (the sampler logs it once)
    assert "read 1e+12, more than the link could carry since the last reading (1000, 1 s before)" in errors[0]


def test_what_the_link_carries_is_taken_with_its_margin():
    ceiling = GBIT * 2 * (1 + 2)  # twice the speed over the second since, and the 2 s of slack
    out, errors = bounded([0.0, ceiling, 2 * ceiling + 1])
    assert out == [0.0, ceiling, ceiling] and len(errors) == 1


def test_a_counter_that_stood_still_may_rise_by_all_the_time_it_stood():
    """A driver's copy of its counters that froze for a minute, then caught up."""
    out, errors = bounded([0.0] * 60 + [GBIT * 60])
    assert out[-1] == GBIT * 60 and not errors


def test_packets_are_bounded_by_the_shortest_frame():
    from exporter.counters import MIN_FRAME_BYTES

    ceiling = GBIT / MIN_FRAME_BYTES * 2 * 3
    out, errors = bounded([0.0, ceiling + 1], unit_bytes=MIN_FRAME_BYTES)
    assert out == [0.0, 0.0] and len(errors) == 1


def test_a_fall_is_taken_as_a_reset_and_a_link_without_a_speed_still_has_a_bound():
    out, errors = bounded([5e9, 10.0, 20.0], speed=None)
    assert out == [5e9, 5e9 + 10, 5e9 + 20] and not errors
    out, errors = bounded([0.0, 1e19], speed=None)  # 8 Tb/s taken for an unknown speed
    assert out == [0.0, 0.0] and len(errors) == 1


def test_a_first_reading_past_any_counter_is_no_reading():
    out, errors = bounded([2.0**64, 500.0, 600.0])
    assert out == [None, 500.0, 600.0] and len(errors) == 1
