"""Counters never decrease: wraps of narrow hardware counters and driver resets."""

from exporter.counters import MonotonicCounters
from exporter.samples import Sample
from gpunet.contract import NIC_RECEIVE_BYTES, NIC_UP

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
