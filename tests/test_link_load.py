"""Saturated seconds and network_state at the fast tick, from byte counters."""

from exporter.inventory import Nic
from exporter.link_load import LinkLoad
from exporter.samples import Sample
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
