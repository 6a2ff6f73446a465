"""Saturated seconds and network_state at the fast tick, from byte counters."""

import pytest

from exporter.inventory import Nic
from exporter.link_load import LinkLoad, time_in_states
from exporter.samples import NetworkTick, Sample
from gpunet.contract import NIC_RECEIVE_BYTES, NIC_TRANSMIT_BYTES

SPEED = 100e9 / 8  # 100 Gb/s in bytes per second
TICK = 0.2


def nic(device, fabric=True, speed=SPEED):
    return Nic(device, device, None, "mlx5_core", "Ethernet", "0", "", speed, fabric)


def feed(load, nics, per_tick):
    """per_tick: list of {device: (tx_ratio, rx_pause_increment)}; returns the last samples."""
    tx = dict.fromkeys(nics, 0.0)
    pauses = dict.fromkeys(nics, 0.0)
    out = None
    states = []
    for i, step in enumerate([{}] + per_tick):
        samples = []
        for d in nics:
            ratio, pause = step.get(d, (0.0, 0))
            tx[d] += ratio * SPEED * TICK
            pauses[d] += pause
            samples += [Sample(NIC_TRANSMIT_BYTES, (d,), tx[d]), Sample(NIC_RECEIVE_BYTES, (d,), 0.0)]
        load.update(i * TICK, nics, samples, dict(pauses))
        out = load.samples()
        states.append(load.network_state)
    return out, states[1:]


def by_labels(samples, name):
    return {s.labels: s.value for s in samples if s.metric.name == name}


def test_saturated_seconds_count_ticks_at_or_above_90_percent():
    nics = {"a": nic("a")}
    ratios = [0.95, 0.95, 0.5, 0.91, 0.89, 0.0]
    out, states = feed(LinkLoad(), nics, [{"a": (r, 0)} for r in ratios])
    expected = TICK * sum(r >= 0.9 for r in ratios)
    sat = by_labels(out, "gpunet_nic_saturated_seconds_total")
    assert abs(sat[("a", "transmit")] - expected) < 1e-9
    assert sat[("a", "receive")] == 0.0
    assert states == ["saturated", "saturated", "active", "saturated", "active", "quiet"]


def test_first_match_wins_paused_before_saturated():
    nics = {"a": nic("a"), "b": nic("b")}
    _, states = feed(LinkLoad(), nics, [{"a": (0.95, 3)}, {"a": (0.95, 0), "b": (0.0, 1)}, {"b": (0.06, 0)},
                                        {"b": (0.04, 0)}])
    assert states == ["paused", "paused", "active", "quiet"]


def test_management_nic_does_not_set_network_state():
    nics = {"fabric": nic("fabric"), "mgmt": nic("mgmt", fabric=False)}
    out, states = feed(LinkLoad(), nics, [{"mgmt": (0.99, 5)}] * 3)
    assert states == ["quiet"] * 3
    # ... but its own saturation is still counted.
    assert abs(by_labels(out, "gpunet_nic_saturated_seconds_total")[("mgmt", "transmit")] - 3 * TICK) < 1e-9


def test_state_seconds_add_up_to_wall_time():
    nics = {"a": nic("a")}
    steps = [{"a": (r, p)} for r, p in [(0.95, 0), (0.2, 0), (0.0, 0), (0.0, 2), (0.99, 0)]]
    out, _ = feed(LinkLoad(), nics, steps)
    state_seconds = by_labels(out, "gpunet_node_network_state_seconds_total")
    assert abs(sum(state_seconds.values()) - len(steps) * TICK) < 1e-9
    assert abs(state_seconds[("paused",)] - TICK) < 1e-9
    assert abs(state_seconds[("saturated",)] - 2 * TICK) < 1e-9


def test_nic_without_speed_has_no_saturated_series():
    nics = {"a": nic("a", speed=None)}
    out, states = feed(LinkLoad(), nics, [{"a": (0.99, 0)}])
    assert by_labels(out, "gpunet_nic_saturated_seconds_total") == {}
    assert states == ["quiet"]


def test_bursts_count_quiet_to_busier_transitions():
    # Three communication phases (one paused, one only 'active'), each followed by quiet
    # ticks; a phase that stays busy across ticks is one burst, not one per tick.
    nics = {"a": nic("a")}
    ratios = [(0.95, 0), (0.95, 0), (0.0, 0), (0.0, 0), (0.3, 0), (0.0, 0), (0.0, 2), (0.96, 0), (0.0, 0)]
    out, states = feed(LinkLoad(), nics, [{"a": r} for r in ratios])
    expected = sum(1 for prev, cur in zip(["quiet"] + states, states) if prev == "quiet" and cur != "quiet")
    assert expected == 3
    assert by_labels(out, "gpunet_node_network_bursts_total") == {(): 3.0}


def test_a_management_nic_burst_is_not_a_fabric_burst():
    nics = {"fabric": nic("fabric"), "mgmt": nic("mgmt", fabric=False)}
    out, _ = feed(LinkLoad(), nics, [{"mgmt": (0.99, 0)}, {}, {"mgmt": (0.99, 0)}])
    assert by_labels(out, "gpunet_node_network_bursts_total") == {(): 0.0}


def test_the_last_ticks_are_kept_with_their_states_end_to_end():
    load = LinkLoad()
    nics = {"eth0": nic("eth0")}
    _, states = feed(load, nics, [{"eth0": (0.0, 0)}, {"eth0": (0.0, 5)}, {"eth0": (0.95, 0)}])
    assert [(t.start, t.end, t.state) for t in load.ticks] == [
        (0.0, 0.2, "quiet"), (0.2, 0.4, "paused"), (0.4, pytest.approx(0.6), "saturated")]
    assert [t.state for t in load.ticks] == states


@pytest.mark.parametrize(("start", "end"), [(0.05, 0.13), (0.1, 0.9), (-0.3, 0.25), (0.55, 1.4), (-1.0, 2.0),
                                            (0.2, 0.4), (0.7, 0.8)])
def test_time_in_states_is_the_overlap_with_each_tick(start, end):
    ticks = [NetworkTick(0.0, 0.2, "quiet"), NetworkTick(0.2, 0.4, "paused"), NetworkTick(0.4, 0.6, "active")]
    got = time_in_states(ticks, [t.end for t in ticks], start, end)
    # On a fine grid: before the first tick counts as the first, after the last as the last.
    expected: dict[str, float] = {}
    step = 1e-4
    for k in range(round((end - start) / step)):
        x = start + (k + 0.5) * step
        tick = ticks[0] if x <= 0.0 else ticks[-1] if x > 0.6 else next(t for t in ticks if t.start < x <= t.end)
        expected[tick.state] = expected.get(tick.state, 0.0) + step
    assert {s: v for s, v in got.items() if v > 1e-9} == pytest.approx(expected, abs=1e-3)
    assert time_in_states([], [], start, end) == {"quiet": pytest.approx(end - start)}


def test_the_ticks_kept_cover_the_last_ten_seconds_whatever_the_fast_interval():
    load = LinkLoad()
    nics = {"eth0": nic("eth0")}
    for i in range(1500):  # 15 s at 0.01 s
        load.update(i * 0.01, nics, [Sample(NIC_TRANSMIT_BYTES, ("eth0",), 0.0)], {"eth0": 0.0})
    assert load.ticks[-1].end == pytest.approx(14.99)
    assert 9.99 <= load.ticks[-1].end - load.ticks[0].start <= 10.02
