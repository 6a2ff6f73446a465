"""NICs as real machines show them: today's link speeds, devices that register in steps,
and NICs that leave for a moment and come back. Driven over fixture trees (tests/fixtures)."""

import shutil

import pytest
from exporter_harness import Node

from exporter.inventory import Nic
from exporter.link_load import FORGET_LEFT_NICS_AFTER, LinkLoad
from exporter.root import Root
from exporter.samples import Sample
from gpunet.contract import NIC_RECEIVE_BYTES, NIC_TRANSMIT_BYTES

IB = "sys/class/infiniband"


@pytest.mark.parametrize("mbps", [100_000, 200_000, 400_000, 800_000])
def test_an_ethernet_nic_without_rdma_has_the_speed_its_driver_reports(node_copy, mbps):
    """A TCP-only node (or one whose RDMA driver is not loaded) has no RDMA rate to fall back
    on: the netdev's speed, in Mb/s, is all there is, and today's NICs report 100000 and up."""
    root = node_copy("e810")
    shutil.rmtree(root / IB)
    device = next(p.name for p in (root / "sys/class/net").iterdir() if p.name != "lo" and (p / "speed").exists())
    (root / f"sys/class/net/{device}/speed").write_text(f"{mbps}\n")
    assert Node(root).tick().value("gpunet_nic_link_speed_bytes_per_second", device=device) == mbps * 1e6 / 8


@pytest.mark.parametrize("unknown", ["-1", "4294967295", "65535", "0"])
def test_a_speed_the_kernel_does_not_know_is_no_speed(node_copy, unknown):
    root = node_copy("e810")
    shutil.rmtree(root / IB)
    device = next(p.name for p in (root / "sys/class/net").iterdir() if p.name != "lo" and (p / "speed").exists())
    (root / f"sys/class/net/{device}/speed").write_text(f"{unknown}\n")
    node = Node(root).tick()
    assert node.value("gpunet_nic_up", device=device) is not None  # the NIC is there
    assert node.value("gpunet_nic_link_speed_bytes_per_second", device=device) is None


def test_a_roce_port_whose_netdev_shows_late_is_not_a_second_nic(node_copy):
    """When the RDMA driver registers a device, its GID table (which names the port's netdev)
    fills a moment later. Discovery in between must not settle on a port without netdev,
    which would serve a second NIC (mlx5_0:1) counting the same traffic again, for good."""
    root = node_copy("roce-mlx5")
    ndevs = root / IB / "mlx5_0/ports/1/gid_attrs/ndevs"
    functions = root / IB / "mlx5_0/device/net"
    shutil.move(ndevs, root / "ndevs.away")
    shutil.move(functions, root / "net.away")
    node = Node(root).tick().tick()  # two looks: the second is settled
    shutil.move(root / "ndevs.away", ndevs)
    shutil.move(root / "net.away", functions)
    node.tick()
    devices = {dict(k)["device"]: dict(k) for k in node.series("gpunet_nic_info")}
    assert "mlx5_0:1" not in devices
    assert devices["ens1f0np0"]["rdma_device"] == "mlx5_0"


def test_an_infiniband_port_without_netdev_is_its_own_nic(node_copy):
    """The same rule keeps a port that has no netdev at all (InfiniBand without IPoIB)."""
    root = node_copy("ib-mlx5")
    node = Node(root).tick().tick().tick()
    assert "mlx5_1:1" in {dict(k)["device"] for k in node.series("gpunet_nic_info")}


def test_discovery_memoises_a_settled_port_but_not_a_roce_port_without_netdev(node_copy):
    from exporter.readers.rdma import list_ports
    root = Root(node_copy("roce-mlx5"))
    static: dict = {}
    list_ports(root, [], static, settled=True)
    assert static[f"{IB}/mlx5_0/ports/1"] == ("Ethernet", "ens1f0np0")
    static.clear()
    list_ports(root, [], static, settled=False)
    assert f"{IB}/mlx5_0/ports/1" not in static


# --- a NIC that leaves and comes back ---------------------------------------------------------

def _nic(device: str) -> Nic:
    return Nic(device, device, None, "mlx5_core", "Ethernet", "0", "", 100e9 / 8, True)


def _tick(load: LinkLoad, now: float, nics: dict[str, Nic], sent: float) -> None:
    wire = [Sample(NIC_TRANSMIT_BYTES, (d,), sent) for d in nics] + [Sample(NIC_RECEIVE_BYTES, (d,), 0.0) for d in nics]
    load.update(now, nics, wire, {})


def _saturated(load: LinkLoad) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in load.samples() if s.metric.name == "gpunet_nic_saturated_seconds_total"}


def test_saturated_seconds_of_a_nic_that_left_for_a_moment_go_on_from_where_they_were():
    """A driver reload takes the NIC out of one discovery: its series leave the scrape, and
    come back as they were, never from zero (a counter that went back would read as a reset)."""
    load, a = LinkLoad(), {"a": _nic("a")}
    line_rate_tick = 100e9 / 8 * 0.2
    for k in range(6):  # five saturated ticks
        _tick(load, 0.2 * k, a, line_rate_tick * k)
    before = _saturated(load)[("a", "transmit")]
    assert before == pytest.approx(1.0)
    _tick(load, 1.2, {}, 0.0)  # gone from one tick
    assert ("a", "transmit") not in _saturated(load)
    _tick(load, 1.4, a, line_rate_tick * 7)
    _tick(load, 1.6, a, line_rate_tick * 8)
    assert _saturated(load)[("a", "transmit")] >= before


def test_the_sums_of_a_nic_gone_for_long_are_forgotten():
    """Forgotten however long the inventory stays as it was after it left (discovery hands the
    ticks the same dict while it does)."""
    load, a, without = LinkLoad(), {"a": _nic("a")}, {}
    for k in range(3):
        _tick(load, 0.2 * k, a, 100e9 / 8 * 0.2 * k)
    _tick(load, 1.0, without, 0.0)
    _tick(load, 1.2, without, 0.0)
    assert load.saturated_seconds  # kept a while: it may come back
    _tick(load, 1.0 + FORGET_LEFT_NICS_AFTER + 1, without, 0.0)
    assert not load.saturated_seconds and not load._left


# --- a counter summed from parts, one of them malformed -----------------------------------------

def test_a_sum_with_a_malformed_part_keeps_its_last_value_and_counts_nothing_twice(node_copy):
    """bnxt counts discards per class of service; the exported counter is their sum. A line
    that cannot be read for a moment is an unknown part, not a missing one: a sum short of it
    would read as a reset, and the counter would count the whole sum again once it is back."""
    root = node_copy("bnxt")
    stats = root / "ethtool/ens3f0np0.txt"
    text = stats.read_text()
    parts = {line.split(":")[0].strip(): int(line.split(":")[1]) for line in text.splitlines()
             if line.strip().startswith("rx_discard_packets_cos")}
    assert len(parts) > 1 and sum(parts.values()) > 0
    node = Node(root).tick()
    total = node.value("gpunet_nic_receive_discards_total", device="ens3f0np0")
    assert total == sum(parts.values())
    bad = next(name for name, value in parts.items() if value > 0)
    stats.write_text(text.replace(f"{bad}: {parts[bad]}", f"{bad}: n/a"))
    node.tick()
    assert node.value("gpunet_nic_receive_discards_total", device="ens3f0np0") == total
    stats.write_text(text.replace(f"{bad}: {parts[bad]}", f"{bad}: {parts[bad] + 5}"))
    node.tick()
    assert node.value("gpunet_nic_receive_discards_total", device="ens3f0np0") == total + 5


def test_discovery_hands_back_the_same_inventory_until_a_nic_changes(node_copy):
    """The ticks redo what they keep per inventory only when it changes: discovery returns the
    dict it returned last time while the NICs are the same, and a new one, with the new
    speed, when a link comes back at another speed."""
    from exporter.inventory import InventoryOptions, discover

    root = node_copy("e810")
    shutil.rmtree(root / IB)
    device = next(p.name for p in (root / "sys/class/net").iterdir() if p.name != "lo" and (p / "speed").exists())
    fixture, opts, static = Root(root), InventoryOptions(), {}
    first = discover(fixture, opts, [], static)
    assert discover(fixture, opts, [], static) is first
    (root / f"sys/class/net/{device}/speed").write_text("200000\n")
    changed = discover(fixture, opts, [], static)
    assert changed is not first
    assert changed[device].speed_bytes_per_second == 200_000 * 1e6 / 8
    assert discover(fixture, opts, [], static) is changed


def test_a_port_read_as_before_is_the_same_port_and_one_that_went_down_is_a_new_inventory(node_copy):
    """Discovery reads each RDMA port's rate and state every time: a port whose files read as
    they did is the port of last time (and the inventory the same dict); one that went down,
    or came back at another rate, makes a new inventory that says so."""
    from exporter.inventory import InventoryOptions, discover

    root = node_copy("roce-mlx5")
    fixture, opts, static = Root(root), InventoryOptions(), {}
    first = discover(fixture, opts, [], static)
    again = discover(fixture, opts, [], static)
    assert again is first
    port = root / f"{IB}/mlx5_0/ports/1"
    nic = next(n for n in first.values() if n.rdma is not None and n.rdma.device == "mlx5_0")
    assert nic.rdma is not None and nic.rdma.state == "ACTIVE"
    (port / "state").write_text("1: DOWN\n")
    down = discover(fixture, opts, [], static)
    assert down is not first
    assert down[nic.device].rdma is not None and down[nic.device].rdma.state == "DOWN"
    assert discover(fixture, opts, [], static) is down
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    back = discover(fixture, opts, [], static)
    assert back[nic.device].rdma is not None and back[nic.device].rdma.rate_bytes_per_second == 200e9 / 8


def test_a_device_made_anew_under_its_name_is_a_change_of_devices(node_copy):
    """A driver reload removes a device and makes it again under the same name: discovery
    tells it by its entry (Root.entries), and lets go of what it kept for the old one."""
    from exporter.inventory import PRESENT, InventoryOptions, discover

    root = node_copy("roce-mlx5")
    fixture, opts, static = Root(root), InventoryOptions(), {}
    discover(fixture, opts, [], static)
    before = static[PRESENT]
    discover(fixture, opts, [], static)
    assert static[PRESENT] == before
    net = root / "sys/class/net"
    device = next(p.name for p in net.iterdir() if p.name != "lo" and not p.name.startswith("."))
    shutil.copytree(net / device, net / "copy", symlinks=True)
    shutil.rmtree(net / device)
    (net / "copy").rename(net / device)
    discover(fixture, opts, [], static)
    assert static[PRESENT] != before
    assert [name for name, _ in static[PRESENT][0]] == [name for name, _ in before[0]]
