"""Reads through a Root: sysfs attributes read more than once are kept open and read again
from their start, so these tests change the files between reads in every way a driver or a
fixture writer can and check each read gives what the file holds now, by its path."""

import os
import shutil

import pytest

from exporter.root import Root, SourceError

STAT = "sys/class/net/eth0/statistics/rx_bytes"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def node(tmp_path):
    (tmp_path / STAT).parent.mkdir(parents=True)
    (tmp_path / STAT).write_text("100\n")
    return tmp_path


def read_twice(root: Root, rel: str) -> int:
    """The second read keeps the file open."""
    first = root.read_int(rel)
    assert root.read_int(rel) == first
    return first


def test_a_value_rewritten_in_place_is_read_anew(node):
    root = Root(node)
    assert read_twice(root, STAT) == 100
    (node / STAT).write_text("250\n")
    assert root.read_int(STAT) == 250
    (node / STAT).write_text("7\n")  # shorter than before: no old digits left over
    assert root.read_int(STAT) == 7


def test_a_file_replaced_by_a_rename_is_read_anew(node):
    root = Root(node)
    assert read_twice(root, STAT) == 100
    tmp = node / (STAT + ".tmp")
    tmp.write_text("999\n")
    os.replace(tmp, node / STAT)
    assert root.read_int(STAT) == 999


def test_a_removed_file_reads_as_missing_and_its_descriptor_is_closed(node):
    root = Root(node)
    assert read_twice(root, STAT) == 100
    before = open_fds()
    (node / STAT).unlink()
    assert root.read_int_if_present(STAT) is None
    with pytest.raises(SourceError, match="rx_bytes"):
        root.read_int(STAT)
    assert open_fds() == before - 1
    (node / STAT).write_text("5\n")  # the device came back
    assert root.read_int(STAT) == 5


def test_a_renamed_device_is_read_by_its_new_name_once_discovery_saw_the_change(node):
    """A kept-open file follows its device through a rename; a read by path must give
    whatever holds that name now, once discovery has seen the devices change."""
    root = Root(node)
    assert read_twice(root, STAT) == 100
    net = node / "sys/class/net"
    (net / "eth0").rename(net / "eth9")
    shutil.copytree(net / "eth9", net / "eth0")
    (net / "eth0/statistics/rx_bytes").write_text("42\n")
    root.forget_open_files(devices_changed=True)
    assert root.read_int(STAT) == 42
    assert root.read_int("sys/class/net/eth9/statistics/rx_bytes") == 100


def test_files_kept_open_are_bounded_and_let_go(node, monkeypatch):
    import exporter.root as root_module
    monkeypatch.setattr(root_module, "MAX_OPEN_ATTRIBUTES", 3)
    stats = node / "sys/class/net/eth0/statistics"
    for i in range(10):
        (stats / f"c{i}").write_text(f"{i}\n")
    root = Root(node)
    before = open_fds()
    for _ in range(3):
        assert [root.read_int(f"sys/class/net/eth0/statistics/c{i}") for i in range(10)] == list(range(10))
    assert open_fds() == before + 3
    root.forget_open_files(devices_changed=False)  # nothing changed, and not a minute old
    assert open_fds() == before + 3
    root.forget_open_files(devices_changed=True)
    assert open_fds() == before


def test_only_sysfs_read_again_is_kept_open(node):
    """/proc tables are generated anew at each open, and fixture files outside sys/ (ethtool
    text, nvml.json) are parsed only when their stat changes: neither is kept open; nor is
    what is read once (a device's type, PCI address, NUMA node)."""
    (node / "proc/net").mkdir(parents=True)
    (node / "proc/net/snmp").write_text("Tcp: RtoAlgorithm\nTcp: 1\n")
    root = Root(node)
    before = open_fds()
    root.read_text("proc/net/snmp")
    root.read_text("proc/net/snmp")
    root.read_int(STAT)
    assert open_fds() == before
    root.read_int(STAT)
    assert open_fds() == before + 1


def test_a_live_sysfs_attribute_kept_open_follows_the_counter():
    """On the machine's own sysfs: the loopback's received bytes, read twice through one
    kept-open file around traffic, move as the kernel's own count does."""
    import socket

    root = Root("/")
    rel = "sys/class/net/lo/statistics/rx_bytes"
    first = root.read_int(rel)
    root.read_int(rel)
    assert rel in root._open
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(10):
            s.sendto(b"x" * 1000, ("127.0.0.1", 9))
    second = root.read_int(rel)
    with open("/" + rel) as f:
        kernel = int(f.read())
    assert first + 10 * 1000 <= second <= kernel


def test_nothing_is_kept_open_under_a_low_file_limit(node, monkeypatch):
    """At LimitNOFILE=100 the room is the HTTP connections' and the exporter's own."""
    import resource
    monkeypatch.setattr(resource, "getrlimit", lambda which: (100, 100))
    root = Root(node)
    before = open_fds()
    assert read_twice(root, STAT) == 100
    assert open_fds() == before


def test_a_kept_file_that_starts_failing_reports_its_path(node):
    """sysfs answers EINVAL for a value it has not now (a link's speed while it is down):
    here the file becomes a folder, which a read by its path reports with the path."""
    root = Root(node)
    assert read_twice(root, STAT) == 100
    (node / STAT).unlink()
    (node / STAT).mkdir()
    with pytest.raises(SourceError, match="rx_bytes"):
        root.read_int(STAT)


def test_entries_name_each_entry_by_its_own_inode_sorted_and_an_absent_folder_is_empty(node):
    """What discovery tells devices apart by: a symbolic link's own inode (sysfs makes a
    device's link anew with the device), not its target's; `.keep` is no entry."""
    net = node / "sys/class/net"
    (node / "devices/eth1").mkdir(parents=True)
    (net / "eth1").symlink_to(node / "devices/eth1")
    (net / ".keep").write_text("")
    root = Root(node)
    entries = root.entries("sys/class/net")
    assert list(entries) == ["eth0", "eth1"]
    assert entries["eth0"] == os.stat(net / "eth0").st_ino
    assert entries["eth1"] == os.lstat(net / "eth1").st_ino != os.stat(net / "eth1").st_ino
    (net / "eth1").unlink()
    (net / "eth1").symlink_to(node / "devices/eth1")  # the same target, a link made anew
    assert root.entries("sys/class/net")["eth1"] == os.lstat(net / "eth1").st_ino
    assert root.entries("sys/class/nothing") == {}
