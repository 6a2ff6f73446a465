"""The exporter over fixture nodes: each value checked against the fixture's own files, and
counters followed as the files change between ticks (wraps, resets, vanishing NICs)."""

import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES
from exporter_harness import Node

IB = "sys/class/infiniband"


def ethtool(root: Path, device: str) -> dict[str, int]:
    out = {}
    for line in (root / "ethtool" / f"{device}.txt").read_text().splitlines():
        key, sep, value = line.strip().rpartition(": ")
        if sep and value.isdigit():
            out[key] = int(value)
    return out


def sysfs_int(root: Path, rel: str) -> int:
    return int((root / rel).read_text().strip())


def set_ethtool(root: Path, device: str, **values: int) -> None:
    path = root / "ethtool" / f"{device}.txt"
    lines = []
    for line in path.read_text().splitlines():
        key = line.strip().rpartition(": ")[0]
        lines.append(f"     {key}: {values[key]}" if key in values else line)
    path.write_text("\n".join(lines) + "\n")


# --- roce-mlx5 ---------------------------------------------------------------------------

def test_roce_ports_count_the_wire_not_the_kernel():
    root = FIXTURES / "roce-mlx5"
    node = Node(root).tick().tick(slow=False)
    for dev in ("ens1f0np0", "ens1f1np1"):
        stats = ethtool(root, dev)
        assert node.value("gpunet_nic_transmit_bytes_total", device=dev) == stats["tx_bytes_phy"]
        assert node.value("gpunet_nic_receive_bytes_total", device=dev) == stats["rx_bytes_phy"]
        # RDMA bypasses the kernel: the netdev counters are kept, under their own name.
        kernel = sysfs_int(root, f"sys/class/net/{dev}/statistics/tx_bytes")
        assert node.value("gpunet_nic_netdev_transmit_bytes_total", device=dev) == kernel
        assert kernel < stats["tx_bytes_phy"]


def test_roce_pfc_ecn_cnp_and_loss_counters():
    root = FIXTURES / "roce-mlx5"
    node = Node(root).tick().tick(slow=False)
    stats = ethtool(root, "ens1f0np0")
    hw = f"{IB}/mlx5_0/ports/1/hw_counters"
    assert node.value("gpunet_nic_pfc_pause_frames_total", device="ens1f0np0", direction="transmit",
                      priority="3") == stats["tx_prio3_pause"]
    assert node.value("gpunet_nic_pfc_pause_frames_total", device="ens1f0np0", direction="receive",
                      priority="3") == stats["rx_prio3_pause"]
    assert node.value("gpunet_nic_pfc_pause_duration_seconds_total", device="ens1f0np0", direction="receive",
                      priority="3") == stats["rx_prio3_pause_duration"] / 1e6
    assert node.value("gpunet_nic_ecn_marked_packets_total", device="ens1f0np0") == \
        sysfs_int(root, f"{hw}/np_ecn_marked_roce_packets")
    assert node.value("gpunet_nic_cnp_sent_total", device="ens1f0np0") == sysfs_int(root, f"{hw}/np_cnp_sent")
    assert node.value("gpunet_nic_cnp_received_total", device="ens1f0np0") == sysfs_int(root, f"{hw}/rp_cnp_handled")
    for kind, name in (("out_of_sequence", "out_of_sequence"), ("sequence_error", "packet_seq_err"),
                       ("ack_timeout", "local_ack_timeout_err")):
        assert node.value("gpunet_nic_rdma_loss_events_total", device="ens1f0np0", kind=kind) == \
            sysfs_int(root, f"{hw}/{name}")
    assert node.value("gpunet_nic_receive_discards_total", device="ens1f0np0") == stats["rx_discards_phy"]


def test_nic_info_names_rdma_device_numa_and_pci():
    root = FIXTURES / "roce-mlx5"
    info = Node(root).tick().series("gpunet_nic_info")
    labels = {dict(k)["device"]: dict(k) for k in info}
    assert labels["ens1f1np1"] == {"device": "ens1f1np1", "rdma_device": "mlx5_1", "port": "1",
                                   "driver": "mlx5_core", "link_layer": "Ethernet", "numa_node": "1",
                                   "pci_address": "0000:17:00.1"}
    assert labels["eno1"]["rdma_device"] == "" and labels["eno1"]["driver"] != ""
    assert "lo" not in labels
    speed = Node(root).tick().value("gpunet_nic_link_speed_bytes_per_second", device="ens1f0np0")
    assert speed == sysfs_int(root, "sys/class/net/ens1f0np0/speed") * 1e6 / 8


def test_unknown_driver_still_gets_netdev_bytes_speed_and_tcp():
    root = FIXTURES / "roce-mlx5"
    node = Node(root).tick().tick(slow=False)
    assert node.value("gpunet_nic_transmit_bytes_total", device="eno1") == \
        sysfs_int(root, "sys/class/net/eno1/statistics/tx_bytes")
    assert node.value("gpunet_nic_up", device="eno1") == 1.0
    snmp = (root / "proc/net/snmp").read_text().splitlines()
    tcp_head, tcp_values = [l.split()[1:] for l in snmp if l.startswith("Tcp:")]
    tcp = dict(zip(tcp_head, map(int, tcp_values)))
    assert node.value("gpunet_tcp_retransmitted_segments_total") == tcp["RetransSegs"]
    assert node.value("gpunet_tcp_sent_segments_total") == tcp["OutSegs"]


# --- InfiniBand ----------------------------------------------------------------------------

def test_infiniband_data_counters_are_four_octet_words_and_prefer_64bit():
    root = FIXTURES / "ib-mlx5"
    node = Node(root).tick().tick(slow=False)
    devices = {dict(k)["device"] for k in node.series("gpunet_nic_info")}
    assert "mlx5_1:1" in devices  # a port without netdev is named rdma_device:port
    for device in devices:
        info = next(dict(k) for k in node.series("gpunet_nic_info") if dict(k)["device"] == device)
        port = f"{IB}/{info['rdma_device']}/ports/{info['port']}"
        if (root / port / "counters_ext/port_xmit_data_64").exists():
            expected = sysfs_int(root, f"{port}/counters_ext/port_xmit_data_64") * 4
        else:
            expected = sysfs_int(root, f"{port}/counters/port_xmit_data") * 4
        assert node.value("gpunet_nic_transmit_bytes_total", device=device) == expected, device
        assert node.value("gpunet_nic_link_speed_bytes_per_second", device=device) == 400e9 / 8
        assert info["link_layer"] == "InfiniBand"


def test_ib_data_counter_deltas_are_words(node_copy):
    root = node_copy("ib-mlx5")
    port = next(p for p in (root / IB).glob("*/ports/1") if not (p / "counters_ext").exists())
    start = sysfs_int(root, str((port / "counters/port_xmit_data").relative_to(root)))
    node = Node(root).tick()
    device = next(dict(k)["device"] for k in node.series("gpunet_nic_info")
                  if dict(k)["rdma_device"] == port.parent.parent.name)
    (port / "counters/port_xmit_data").write_text(f"{start + 1000}\n")
    node.tick(slow=False)
    assert node.value("gpunet_nic_transmit_bytes_total", device=device) == (start + 1000) * 4


def test_saturated_32bit_ib_counter_is_reported_not_hidden(node_copy):
    root = node_copy("ib-mlx5")
    port = next(p for p in (root / IB).glob("*/ports/1") if not (p / "counters_ext").exists())
    (port / "counters/port_xmit_data").write_text(f"{2**32 - 1}\n")
    node = Node(root).tick().tick(slow=False)
    assert node.value("gpunet_exporter_collector_up", collector="wire") == 0.0
    device = next(dict(k)["device"] for k in node.series("gpunet_nic_info")
                  if dict(k)["rdma_device"] == port.parent.parent.name)
    assert node.value("gpunet_nic_transmit_bytes_total", device=device) == (2**32 - 1) * 4


def test_mlx5_32bit_q_counter_wrap_keeps_counting(node_copy):
    root = node_copy("roce-mlx5")
    counter = root / IB / "mlx5_0/ports/1/hw_counters/out_of_sequence"
    counter.write_text(f"{2**32 - 7}\n")
    node = Node(root).tick()
    before = node.value("gpunet_nic_rdma_loss_events_total", device="ens1f0np0", kind="out_of_sequence")
    counter.write_text("3\n")
    node.tick()
    after = node.value("gpunet_nic_rdma_loss_events_total", device="ens1f0np0", kind="out_of_sequence")
    assert after - before == 10


# --- counters over time ----------------------------------------------------------------------

def test_driver_counter_deltas_reset_and_monotonic(node_copy):
    root = node_copy("roce-mlx5")
    start = ethtool(root, "ens1f0np0")["tx_bytes_phy"]
    node = Node(root).tick()
    set_ethtool(root, "ens1f0np0", tx_bytes_phy=start + 10**9)
    node.tick(slow=False)
    assert node.value("gpunet_nic_transmit_bytes_total", device="ens1f0np0") == start + 10**9
    set_ethtool(root, "ens1f0np0", tx_bytes_phy=1234)  # driver reload: counter restarts
    node.tick(slow=False)
    assert node.value("gpunet_nic_transmit_bytes_total", device="ens1f0np0") == start + 10**9 + 1234


def test_nic_vanishing_between_ticks_costs_only_its_series(node_copy):
    root = node_copy("roce-mlx5")
    node = Node(root).tick()
    shutil.rmtree(root / "sys/class/net/ens1f1np1")
    shutil.rmtree(root / IB / "mlx5_1")
    (root / "ethtool/ens1f1np1.txt").unlink()
    node.tick(slow=False)  # the inventory still lists it: the read fails
    assert node.value("gpunet_exporter_collector_up", collector="wire") == 0.0
    assert node.value("gpunet_exporter_collector_errors_total", collector="wire") >= 1
    assert node.value("gpunet_nic_transmit_bytes_total", device="ens1f0np0") is not None
    node.tick()  # rediscovered without it
    assert not any(dict(k).get("device") == "ens1f1np1" for (name, k) in node.values())
    assert node.value("gpunet_exporter_collector_up", collector="wire") == 1.0
    assert node.value("gpunet_nic_transmit_bytes_total", device="ens1f0np0") is not None


def test_a_name_taken_by_another_device_is_read_from_that_device(node_copy):
    """The exporter keeps sysfs files open between reads; when a NIC is renamed and another
    takes its old name, the next discovery lets them go, and the old name's series come
    from the device that holds the name now."""
    root = node_copy("roce-mlx5")
    node = Node(root).tick()
    net = root / "sys/class/net"
    old_mtu = sysfs_int(root, "sys/class/net/ens1f1np1/mtu")
    assert node.value("gpunet_nic_mtu_bytes", device="ens1f1np1") == old_mtu
    (net / "ens1f1np1").rename(net / "ens9np9")
    shutil.copytree(net / "ens9np9", net / "ens1f1np1", symlinks=True)
    (net / "ens1f1np1/mtu").write_text(f"{old_mtu - 500}\n")
    node.tick()
    assert node.value("gpunet_nic_mtu_bytes", device="ens1f1np1") == old_mtu - 500
    assert node.value("gpunet_nic_mtu_bytes", device="ens9np9") == old_mtu



def test_a_port_listed_after_its_device_appeared_is_found(node_copy):
    """The kernel adds a new RDMA device's ports one by one: a port that was not there yet
    when discovery first saw its device is found at the next discovery (a device's ports are
    memoised only from its second look on)."""
    root = node_copy("ib-mlx5")
    device = root / IB / "mlx5_1"
    away = root / "away"
    shutil.move(device, away)
    node = Node(root).tick()
    shutil.move(away, device)  # the device is back with its first port only
    node.tick()
    assert {dict(k)["device"] for k in node.series("gpunet_nic_info")} >= {"ib0", "mlx5_1:1"}
    shutil.copytree(device / "ports/1", device / "ports/2")  # its second port comes up
    node.tick().tick()
    devices = {dict(k)["device"] for k in node.series("gpunet_nic_info")}
    assert "mlx5_1:2" in devices, devices

def test_two_devices_that_swap_names_are_each_read_by_its_new_name(node_copy):
    """The same names before and after, each leading to the other device: discovery tells
    by what each name leads to, and lets the kept files and what it memoised go."""
    root = node_copy("roce-mlx5")
    net = root / "sys/class/net"
    (net / "ens1f0np0/mtu").write_text("9000\n")
    (net / "ens1f1np1/mtu").write_text("4200\n")
    node = Node(root).tick().tick()
    assert node.value("gpunet_nic_mtu_bytes", device="ens1f0np0") == 9000
    (net / "ens1f0np0").rename(net / "swap")
    (net / "ens1f1np1").rename(net / "ens1f0np0")
    (net / "swap").rename(net / "ens1f1np1")
    node.tick()
    assert node.value("gpunet_nic_mtu_bytes", device="ens1f0np0") == 4200
    assert node.value("gpunet_nic_mtu_bytes", device="ens1f1np1") == 9000


def test_a_huge_attribute_file_costs_its_series_not_the_memory(node_copy):
    """A 50 MB file where a counter belongs (a runaway or hostile file): read no further than
    a few MiB, reported as the collector's error, the other NICs' series kept."""
    import resource

    root = node_copy("roce-mlx5")
    node = Node(root).tick()
    huge = root / "ethtool/ens1f1np1.txt"
    huge.write_bytes(b"     tx_bytes_phy: 1\n" * ((50 << 20) // 21))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    node.tick(slow=False)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown < 100 * 1024, f"peak RSS grew by {grown / 1024:.0f} MiB"
    assert node.value("gpunet_exporter_collector_up", collector="wire") == 0.0
    assert node.value("gpunet_nic_transmit_bytes_total", device="ens1f0np0") is not None


# --- vendors -------------------------------------------------------------------------------

# E810 (irdma gen 2) has no go-back-N counters at all; Broadcom has all three.
LOSS_KINDS = {"bnxt": {"out_of_sequence", "sequence_error", "ack_timeout"}, "e810": set()}


def test_every_vendor_fixture_maps_wire_bytes_pfc_and_loss():
    for name in ("bnxt", "e810"):
        root = FIXTURES / name
        node = Node(root).tick().tick(slow=False)
        rdma_nics = [dict(k) for k in node.series("gpunet_nic_info") if dict(k)["rdma_device"]]
        assert rdma_nics, name
        for info in rdma_nics:
            dev = info["device"]
            kernel = sysfs_int(root, f"sys/class/net/{dev}/statistics/tx_bytes")
            wire = node.value("gpunet_nic_transmit_bytes_total", device=dev)
            assert wire is not None and wire > kernel, (name, dev)  # the wire counter, not the kernel's
            assert node.value("gpunet_nic_pfc_pause_frames_total", device=dev, direction="transmit",
                              priority="3") is not None, (name, dev)
            kinds = {dict(k)["kind"] for k in node.series("gpunet_nic_rdma_loss_events_total")
                     if dict(k)["device"] == dev}
            assert kinds == LOSS_KINDS[name], (name, dev)
            assert node.value("gpunet_nic_cnp_received_total", device=dev) is not None, (name, dev)


# --- bad input -------------------------------------------------------------------------------

def test_broken_node_loses_only_what_is_broken():
    root = FIXTURES / "broken"
    node = Node(root).tick().tick(slow=False)
    values = node.values()
    assert values  # still serves
    assert node.value("gpunet_exporter_collector_up", collector="tcp") == 0.0
    assert node.value("gpunet_exporter_collector_errors_total", collector="tcp") >= 1
    assert node.value("gpunet_exporter_collector_up", collector="netdev") == 0.0
    devices = {dict(k)["device"] for k in node.series("gpunet_nic_info")}
    healthy = [d for d in devices if node.value("gpunet_nic_up", device=d) is not None]
    assert healthy  # the NICs that read fine keep their series


def test_a_source_that_blocks_costs_only_its_collector(node_copy):
    """A read that never returns (a FIFO stands in for a sysfs file stuck in a driver):
    the netdev collector is set aside as hung, the others go on, the tick is not held."""
    import os
    import time

    root = node_copy("roce-mlx5")
    stat = root / "sys/class/net/eno1/statistics/rx_dropped"
    node = Node(root, slow_interval=0.2).tick()
    stat.unlink()
    os.mkfifo(stat)  # open() blocks until a writer comes: none will, until the test ends
    try:
        started = time.monotonic()
        node.tick(slow=True, fast=False)
        assert time.monotonic() - started < 2.0
        assert node.value("gpunet_exporter_collector_up", collector="netdev") == 0.0
        assert node.value("gpunet_exporter_collector_up", collector="tcp") == 1.0
        assert node.value("gpunet_tcp_sent_segments_total") is not None
        node.tick(slow=True, fast=True)  # still hung: set aside, the rest goes on
        assert node.value("gpunet_exporter_collector_up", collector="rdma") == 1.0
        assert node.value("gpunet_nic_transmit_bytes_total", device="ens1f0np0") is not None
    finally:
        with open(stat, "w"):  # release the blocked reader
            pass


def test_phy_health_and_ib_transmit_wait_are_the_drivers_counters():
    """Symbol errors, FEC and link-down events as each driver names them (bnxt: all of them;
    mlx5: no FEC blocks in ethtool -S), and InfiniBand's port_xmit_wait and symbol_error."""
    bnxt = ethtool(FIXTURES / "bnxt", "ens3f0np0")
    node = Node(FIXTURES / "bnxt").tick()
    assert node.value("gpunet_nic_symbol_errors_total", device="ens3f0np0") == bnxt["rx_pcs_symbol_err"]
    assert node.value("gpunet_nic_fec_corrected_bit_errors_total", device="ens3f0np0") == bnxt["rx_corrected_bits"]
    assert node.value("gpunet_nic_fec_corrected_blocks_total", device="ens3f0np0") == bnxt["rx_fec_corrected_blocks"]
    assert node.value("gpunet_nic_fec_uncorrectable_blocks_total",
                      device="ens3f0np0") == bnxt["rx_fec_uncorrectable_blocks"]
    assert node.value("gpunet_nic_link_downed_total", device="ens3f0np0") == bnxt["link_down_events"]
    mlx5 = ethtool(FIXTURES / "roce-mlx5", "ens1f0np0")
    node = Node(FIXTURES / "roce-mlx5").tick()
    assert node.value("gpunet_nic_fec_corrected_bit_errors_total", device="ens1f0np0") == mlx5["rx_corrected_bits_phy"]
    assert node.value("gpunet_nic_link_downed_total", device="ens1f0np0") == mlx5["link_down_events_phy"]
    assert not node.series("gpunet_nic_fec_corrected_blocks_total")  # mlx5 keeps them out of ethtool -S
    counters = FIXTURES / "ib-mlx5" / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    node = Node(FIXTURES / "ib-mlx5").tick()
    assert node.value("gpunet_nic_transmit_wait_ticks_total", device="ib0") == int((counters / "port_xmit_wait").read_text())
    assert node.value("gpunet_nic_symbol_errors_total", device="ib0") == int((counters / "symbol_error").read_text())


def test_driver_counters_that_appear_or_go_are_followed(node_copy):
    """PFC turned on for one more priority prints its counters from then on; a driver
    reloaded without some counters prints none (or another of a metric's names): the series
    follow at the next read."""
    root = node_copy("roce-mlx5")
    node = Node(root).tick()

    def durations():
        return {dict(k)["priority"]: v for k, v in node.series("gpunet_nic_pfc_pause_duration_seconds_total").items()
                if dict(k)["device"] == "ens1f0np0" and dict(k)["direction"] == "receive"}

    assert durations() == {"3": pytest.approx(98.123456)}
    path = root / "ethtool" / "ens1f0np0.txt"
    path.write_text(path.read_text() + "     rx_prio5_pause_duration: 2500000\n")
    node.tick()
    assert durations() == {"3": pytest.approx(98.123456), "5": pytest.approx(2.5)}
    assert node.value("gpunet_nic_fec_corrected_bit_errors_total", device="ens1f0np0") == 123456789
    assert node.value("gpunet_nic_symbol_errors_total", device="ens1f0np0") == 0  # rx_pcs_symbol_err_phy
    set_ethtool(root, "ens1f0np0", rx_symbol_err_phy=7)
    gone = ("rx_corrected_bits_phy", "rx_pcs_symbol_err_phy")
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                            if line.strip().rpartition(": ")[0] not in gone))
    node.tick()
    assert node.value("gpunet_nic_fec_corrected_bit_errors_total", device="ens1f0np0") is None
    assert node.value("gpunet_nic_symbol_errors_total", device="ens1f0np0") == 7  # the second name, now
    assert durations() == {"3": pytest.approx(98.123456), "5": pytest.approx(2.5)}
