"""The exporter over node_exporter's own sysfs fixture (tests/fixtures/node_exporter/README.md):
every value both read equals what node_exporter's end-to-end test expects of it.

The expected values are node_exporter's (its e2e-output.txt, the lines kept in the fixture
folder), never the exporter's: a value the exporter reads wrong cannot make its own
expectation. Units are matched here, one pair at a time: both give bytes (InfiniBand data
counters count 4-octet words; both multiply by 4) and bytes per second.

And what the fixture showed wrong: an iWARP port (i40iw) that prints ``N/A (no PMA)`` in its
PortCounters, and bonds without a ``bonding/mode`` file."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES
from exporter_harness import Node
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).parent / "fixtures" / "node_exporter"
ROOT = HERE / "root"
IB = "sys/class/infiniband"
COLLECTORS = ("rdma", "wire", "bond", "netdev", "nic_info", "inventory")

# node_exporter's InfiniBand PortCounters series -> the exporter's (both: the file's count).
IB_COUNTERS = {
    "node_infiniband_port_errors_received_total": "gpunet_nic_receive_errors_total",  # port_rcv_errors
    "node_infiniband_link_downed_total": "gpunet_nic_link_downed_total",
    "node_infiniband_port_discards_transmitted_total": "gpunet_nic_transmit_discards_total",  # port_xmit_discards
    "node_infiniband_excessive_buffer_overrun_errors_total": "gpunet_nic_receive_discards_total",
    "node_infiniband_symbol_error_total": "gpunet_nic_symbol_errors_total",
    "node_infiniband_port_transmit_wait_total": "gpunet_nic_transmit_wait_ticks_total",  # ticks, as read
}


def expected() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """node_exporter's e2e output, as kept in the fixture folder: {(name, sorted labels): value}."""
    out = {}
    for family in text_string_to_metric_families((HERE / "e2e-output.txt").read_text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def theirs(values: dict, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in values.items() if n == name}


def scraped(root: Path = ROOT, ticks: int = 3) -> Node:
    node = Node(root)
    for t in range(ticks):  # several slow and fast ticks: errors would have piled up
        node.tick(now=100.0 + t)
    return node


def problems(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def copy_of(tmp_path: Path, source: Path = ROOT) -> Path:
    dest = tmp_path / source.name
    shutil.copytree(source, dest, symlinks=True)
    return dest


@pytest.fixture(scope="module")
def node() -> Node:
    return scraped()


# --- every value both read -----------------------------------------------------------------

def test_the_same_infiniband_ports(node):
    ne = expected()
    ports = {(dict(k)["device"], dict(k)["port"]) for k in theirs(ne, "node_infiniband_rate_bytes_per_second")}
    assert ports == {("i40iw0", "1"), ("mlx4_0", "1"), ("mlx4_0", "2")}
    ours = {(dict(k)["rdma_device"], dict(k)["port"]) for k in node.series("gpunet_nic_info") if dict(k)["rdma_device"]}
    assert ours == ports


def test_infiniband_rate_and_state_equal_node_exporter(node):
    ne = expected()
    for labels, rate in theirs(ne, "node_infiniband_rate_bytes_per_second").items():
        d = dict(labels)
        device = f"{d['device']}:{d['port']}"  # an RDMA port without a netdev (docs/metrics.md)
        # Both in bytes per second: "40 Gb/sec (4X QDR)" is 5e9.
        assert node.value("gpunet_nic_link_speed_bytes_per_second", device=device) == rate, device
        # gpunet_nic_up of an RDMA-only port: its state is ACTIVE (state_id 4).
        active = ne[("node_infiniband_state_id", labels)] == 4
        assert node.value("gpunet_nic_up", device=device) == float(active), device


def test_infiniband_data_bytes_equal_node_exporter(node):
    ne = expected()
    compared = 0
    for labels in theirs(ne, "node_infiniband_rate_bytes_per_second"):
        d = dict(labels)
        device = f"{d['device']}:{d['port']}"
        for direction, theirs_now, theirs_legacy in (
                ("receive", "node_infiniband_port_data_received_bytes_total",
                 "node_infiniband_legacy_data_received_bytes_total"),
                ("transmit", "node_infiniband_port_data_transmitted_bytes_total",
                 "node_infiniband_legacy_data_transmitted_bytes_total")):
            # The exporter reads counters_ext/*_64 where the port has them (mlx4), which node_exporter
            # gives as its legacy_ series, else counters/; both already x4, in bytes.
            want = ne.get((theirs_legacy, labels), ne.get((theirs_now, labels)))
            got = node.value(f"gpunet_nic_{direction}_bytes_total", device=device)
            assert got == want, (device, direction)
            compared += want is not None
    assert compared == 4  # mlx4_0's two ports; i40iw0 has no data counters (N/A): neither has a series
    # The unit, once by hand: the fixture's 4-octet words times 4 (node_exporter's value checked above).
    words = int((ROOT / IB / "mlx4_0/ports/1/counters_ext/port_rcv_data_64").read_text())
    assert ne[("node_infiniband_legacy_data_received_bytes_total", (("device", "mlx4_0"), ("port", "1")))] == 4 * words


def test_infiniband_port_counters_equal_node_exporter(node):
    ne = expected()
    compared = 0
    for labels in theirs(ne, "node_infiniband_rate_bytes_per_second"):
        d = dict(labels)
        device = f"{d['device']}:{d['port']}"
        for their_name, our_name in IB_COUNTERS.items():
            # Where node_exporter has no series (a file absent, or N/A on i40iw0) the exporter has none.
            want = ne.get((their_name, labels))
            assert node.value(our_name, device=device) == want, (device, our_name)
            compared += want is not None
    # link_downed on mlx4_0's two ports; port_rcv_errors, port_xmit_discards and the saturated
    # 32-bit port_xmit_wait (4294967295) on its port 1.
    assert compared == 5
    assert node.value("gpunet_nic_transmit_wait_ticks_total", device="mlx4_0:1") == 2**32 - 1


def test_netdevs_equal_node_exporter(node):
    ne = expected()
    # node_exporter's netclass devices (its e2e test ignores the bonds dmz and int; lo comes
    # from /proc/net/dev, which the exporter reads by netlink live and excludes by default).
    devices = {dict(k)["device"] for k in theirs(ne, "node_network_info")}
    assert devices == {"bond0", "eth0"}
    for device in devices:
        labels = (("device", device),)
        assert node.value("gpunet_nic_carrier_changes_total", device=device) == \
            ne[("node_network_carrier_changes_total", labels)], device
        assert node.value("gpunet_nic_mtu_bytes", device=device) == ne[("node_network_mtu_bytes", labels)], device
        # Both bytes per second (sysfs speed is Mb/s: 1000 -> 1.25e8); a speed of -1 is no series in either.
        assert node.value("gpunet_nic_link_speed_bytes_per_second", device=device) == \
            ne.get(("node_network_speed_bytes", labels)), device
        # gpunet_nic_up is operstate up (node_network_up) and carrier (node_network_carrier).
        up = ne[("node_network_up", labels)] == 1 and ne[("node_network_carrier", labels)] == 1
        assert node.value("gpunet_nic_up", device=device) == float(up), device


def test_bond_members_equal_node_exporter(node):
    ne = expected()
    members = node.series("gpunet_bond_member_up")
    bonds = theirs(ne, "node_bonding_slaves")
    assert {dict(k)["master"] for k in bonds} == {"bond0", "dmz", "int"}
    for labels, count in bonds.items():
        bond = dict(labels)["master"]
        mine = [v for k, v in members.items() if dict(k)["bond"] == bond]
        assert len(mine) == count, bond
        assert sum(mine) == ne[("node_bonding_active", labels)], bond
        # No bonding/mode file in this fixture: the mode is unknown, "" (as every unknown label).
        assert node.value("gpunet_bond_info", bond=bond, mode="", xmit_hash_policy="") == 1.0, bond


def test_the_collectors_stay_up_without_errors(node):
    # The i40iw port's N/A counters and the bonds without a mode are no errors: GpunetCollectorDown
    # would page for a healthy node.
    for collector in COLLECTORS:
        assert node.value("gpunet_exporter_collector_up", collector=collector) == 1.0, collector
        assert node.value("gpunet_exporter_collector_errors_total", collector=collector) == 0.0, collector


# --- driver placeholders read as an absent counter -----------------------------------------

@pytest.mark.parametrize("text", ["N/A (no PMA)\n", "N/A\n", "", "\n"])
def test_a_placeholder_counter_is_absent_not_an_error(tmp_path, caplog, text):
    root = copy_of(tmp_path)
    port = root / IB / "mlx4_0/ports/1"
    (port / "counters/port_xmit_wait").write_text(text)
    (port / "counters_ext/port_rcv_data_64").write_text(text)
    node = scraped(root)
    assert node.value("gpunet_nic_transmit_wait_ticks_total", device="mlx4_0:1") is None
    assert node.value("gpunet_nic_receive_bytes_total", device="mlx4_0:1") is None
    # The port's other counters, and the other port, are read as before.
    assert node.value("gpunet_nic_transmit_discards_total", device="mlx4_0:1") == 5.0
    assert node.value("gpunet_nic_transmit_bytes_total", device="mlx4_0:1") == \
        4 * int((port / "counters_ext/port_xmit_data_64").read_text())
    assert node.value("gpunet_nic_receive_bytes_total", device="mlx4_0:2") is not None
    for collector in ("rdma", "wire"):
        assert node.value("gpunet_exporter_collector_up", collector=collector) == 1.0, collector
        assert node.value("gpunet_exporter_collector_errors_total", collector=collector) == 0.0, collector
    assert [p for p in problems(caplog) if IB in p] == []  # (the fixture has no proc/net for the tcp collector)


@pytest.mark.parametrize("text", ["lots\n", "-\n", "12 ticks\n", "0x\n"])
def test_a_malformed_counter_is_still_an_error(tmp_path, caplog, text):
    root = copy_of(tmp_path)
    port = root / IB / "mlx4_0/ports/1"
    (port / "counters/port_xmit_wait").write_text(text)
    (port / "counters_ext/port_rcv_data_64").write_text(text)
    node = scraped(root, ticks=1)
    assert node.value("gpunet_nic_transmit_wait_ticks_total", device="mlx4_0:1") is None
    assert node.value("gpunet_nic_transmit_discards_total", device="mlx4_0:1") == 5.0
    for collector, name in (("rdma", "counters/port_xmit_wait"), ("wire", "counters_ext/port_rcv_data_64")):
        assert node.value("gpunet_exporter_collector_up", collector=collector) == 0.0, collector
        assert node.value("gpunet_exporter_collector_errors_total", collector=collector) == 1.0, collector
        path = str(port / name)
        assert any(path in p and repr(text.strip()) in p for p in problems(caplog)), (path, problems(caplog))


def test_an_unreadable_counter_is_still_an_error(tmp_path, caplog):
    # Not a file: reading it fails (EISDIR), which says nothing of a missing counter.
    root = copy_of(tmp_path)
    wait = root / IB / "mlx4_0/ports/1/counters/port_xmit_wait"
    wait.unlink()
    wait.mkdir()
    node = scraped(root, ticks=1)
    assert node.value("gpunet_exporter_collector_up", collector="rdma") == 0.0
    assert any(str(wait) in p for p in problems(caplog))


# --- a bond without its mode file ----------------------------------------------------------

def test_a_bond_without_a_mode_file_still_has_its_members(tmp_path):
    root = copy_of(tmp_path, FIXTURES / "misconfigured-mlx5")
    net = root / "sys/class/net"
    policy = (net / "bond0/bonding/xmit_hash_policy").read_text().split()[0]
    (net / "bond0/bonding/mode").unlink()
    node = scraped(root, ticks=1)
    assert node.series("gpunet_bond_info") == {(("bond", "bond0"), ("mode", ""), ("xmit_hash_policy", policy)): 1.0}
    members = (net / "bond0/bonding/slaves").read_text().split()
    want = {m: float((net / f"{m}/bonding_slave/mii_status").read_text().strip() == "up") for m in members}
    assert {dict(k)["device"]: v for k, v in node.series("gpunet_bond_member_up").items()} == want
    assert node.value("gpunet_exporter_collector_up", collector="bond") == 1.0


def test_an_empty_mode_file_is_an_error_but_the_members_are_read(tmp_path, caplog):
    root = copy_of(tmp_path, FIXTURES / "misconfigured-mlx5")
    mode = root / "sys/class/net/bond0/bonding/mode"
    mode.write_text("\n")
    node = scraped(root, ticks=1)
    assert len(node.series("gpunet_bond_member_up")) == 2
    assert node.value("gpunet_exporter_collector_up", collector="bond") == 0.0
    assert any(str(mode) in p and "empty" in p for p in problems(caplog))


def test_a_member_is_found_through_the_bonds_own_folder(tmp_path, caplog):
    # node_exporter's fixture has the members' MII status only under the bond: slave_<member>,
    # as old kernels link a member there, and lower_<member> on current ones.
    root = copy_of(tmp_path)
    net = root / "sys/class/net"
    (net / "int/slave_eth5").rename(net / "int/lower_eth5")
    node = scraped(root, ticks=1)
    assert node.series("gpunet_bond_member_up")[(("bond", "int"), ("device", "eth5"))] == 1.0
    assert node.value("gpunet_exporter_collector_up", collector="bond") == 1.0
    # Found nowhere: that member costs only itself, with an error.
    shutil.rmtree(net / "int/lower_eth5")
    node = scraped(root, ticks=1)
    assert {dict(k)["device"] for k in node.series("gpunet_bond_member_up") if dict(k)["bond"] == "int"} == {"eth1"}
    assert node.value("gpunet_exporter_collector_up", collector="bond") == 0.0
    assert any("eth5/bonding_slave/mii_status" in p for p in problems(caplog))
