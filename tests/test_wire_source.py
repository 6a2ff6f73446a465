"""Where a NIC's wire bytes come from, decided once and kept: a driver read that fails at
that first look decides nothing. And what the driver-statistics readers keep per device
goes with the device when it leaves the inventory."""

from __future__ import annotations

import array
import logging
import shutil
import struct

from exporter_harness import Node
from test_fixture_nodes import IB, ethtool, sysfs_int

from exporter.readers import ethtool as ethtool_reader
from exporter.readers.ethtool import DriverStatsReader
from exporter.root import Root

DEV = "ens1f0np0"
# The wire collector alone: driver_stats reads the same file, and a problem is logged once,
# by whichever collector met it first.
WIRE_ONLY = ["wire"]


def test_a_malformed_driver_counter_at_the_first_read_is_reported_and_not_settled_on(node_copy, caplog):
    """rx_bytes_phy unreadable at the first tick: reported as the wire collector's error,
    naming the file; the NIC's bytes do not fall back to the netdev statistics (which miss
    RDMA traffic); once the file is repaired they come from the driver's counter."""
    root = node_copy("roce-mlx5")
    path = root / "ethtool" / f"{DEV}.txt"
    good = path.read_text()
    phy = ethtool(root, DEV)["rx_bytes_phy"]
    path.write_text(good.replace(f"rx_bytes_phy: {phy}\n", f"rx_bytes_phy: {phy} bytes\n"))
    with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
        node = Node(root, collectors=WIRE_ONLY).tick()
    assert node.value("gpunet_exporter_collector_up", collector="wire") == 0.0
    assert node.value("gpunet_exporter_collector_errors_total", collector="wire") >= 1
    assert any("collector wire" in r.getMessage() and str(path) in r.getMessage() and "rx_bytes_phy" in r.getMessage()
               for r in caplog.records), caplog.text
    kernel = sysfs_int(root, f"sys/class/net/{DEV}/statistics/rx_bytes")
    assert node.value("gpunet_nic_receive_bytes_total", device=DEV) != kernel
    # The other port is not held back by it.
    assert node.value("gpunet_nic_receive_bytes_total", device="ens1f1np1") == ethtool(root, "ens1f1np1")["rx_bytes_phy"]

    path.write_text(good)
    node.tick(slow=False)
    assert node.value("gpunet_nic_receive_bytes_total", device=DEV) == phy
    assert node.value("gpunet_nic_transmit_bytes_total", device=DEV) == ethtool(root, DEV)["tx_bytes_phy"]
    assert node.value("gpunet_exporter_collector_up", collector="wire") == 1.0


def test_a_driver_read_that_fails_at_the_first_look_is_reported_and_not_settled_on(node_copy, caplog):
    """The driver's statistics cannot be read at all at the first tick (a directory where the
    file belongs stands in for an ethtool ioctl that fails for a moment): an error naming
    them, and the driver's counters once they can be read."""
    root = node_copy("roce-mlx5")
    path = root / "ethtool" / f"{DEV}.txt"
    good = path.read_text()
    path.unlink()
    path.mkdir()
    with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
        node = Node(root, collectors=WIRE_ONLY).tick()
    assert node.value("gpunet_exporter_collector_up", collector="wire") == 0.0
    assert any("collector wire" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records), caplog.text

    path.rmdir()
    path.write_text(good)
    node.tick(slow=False)
    assert node.value("gpunet_nic_receive_bytes_total", device=DEV) == ethtool(root, DEV)["rx_bytes_phy"]
    assert node.value("gpunet_exporter_collector_up", collector="wire") == 1.0


# --- per-device state of NICs that left ------------------------------------------------------

def _kept(reader: DriverStatsReader) -> set[str]:
    return {device for device, _ in reader._parsed} | set(reader._ioctl)


def test_a_nic_that_leaves_is_let_go_by_the_driver_stats_readers(node_copy):
    root = node_copy("roce-mlx5")
    node = Node(root).tick().tick(slow=False)
    wire = node.sampler.collector("wire").driver_stats
    slow = node.sampler.collector("driver_stats").reader
    assert _kept(wire) == _kept(slow) == {"ens1f0np0", "ens1f1np1"}
    shutil.rmtree(root / "sys/class/net/ens1f1np1")
    shutil.rmtree(root / IB / "mlx5_1")
    (root / "ethtool/ens1f1np1.txt").unlink()
    node.tick().tick(slow=False)  # rediscovered without it
    assert _kept(wire) == _kept(slow) == {"ens1f0np0"}
    assert node.value("gpunet_nic_transmit_bytes_total", device="ens1f0np0") == ethtool(root, "ens1f0np0")["tx_bytes_phy"]


NAMES = [f"counter_{i}" for i in range(2000)]  # a ConnectX's worth


def _fake_driver(sock, device: str, buffer: array.array) -> None:
    """The SIOCETHTOOL answers of a driver with NAMES, each counting its own index."""
    cmd = struct.unpack_from("=I", buffer)[0]
    if cmd == ethtool_reader.ETHTOOL_GSSET_INFO:
        ethtool_reader.SSET_INFO.pack_into(buffer, 0, cmd, 0, 1 << ethtool_reader.ETH_SS_STATS, len(NAMES))
    elif cmd == ethtool_reader.ETHTOOL_GSTRINGS:
        ethtool_reader.GSTRINGS_HEAD.pack_into(buffer, 0, cmd, ethtool_reader.ETH_SS_STATS, len(NAMES))
        start, width = ethtool_reader.GSTRINGS_HEAD.size, ethtool_reader.ETH_GSTRING_LEN
        for i, name in enumerate(NAMES):
            buffer[start + i * width:start + (i + 1) * width] = array.array("B", name.encode().ljust(width, b"\0"))
    elif cmd == ethtool_reader.ETHTOOL_GSTATS:
        ethtool_reader.GSTATS_HEAD.pack_into(buffer, 0, cmd, len(NAMES))
        buffer[1:1 + len(NAMES)] = array.array("Q", range(len(NAMES)))


def test_live_ioctl_state_of_a_device_no_longer_listed_is_let_go(monkeypatch):
    """Live, each device read keeps a value buffer (~34 KB for 2,000 counters) and its picks:
    those of a device no longer in the inventory go, the others' stay and still read."""
    monkeypatch.setattr(ethtool_reader, "ethtool_ioctl", _fake_driver)
    monkeypatch.setattr(ethtool_reader, "ethtool_socket", lambda: None)
    reader = DriverStatsReader(Root("/"))
    wanted = frozenset({"counter_7", "counter_1999"})
    for device in ("ens1f0np0", "ens1f1np1"):
        assert reader.read(device, [], wanted) == {"counter_7": 7, "counter_1999": 1999}
    assert set(reader._ioctl) == {"ens1f0np0", "ens1f1np1"}
    kept = reader._ioctl["ens1f0np0"]
    reader.forget_except({"ens1f0np0"})
    assert set(reader._ioctl) == {"ens1f0np0"}
    assert reader._ioctl["ens1f0np0"] is kept
    assert reader.read("ens1f0np0", [], wanted) == {"counter_7": 7, "counter_1999": 1999}
