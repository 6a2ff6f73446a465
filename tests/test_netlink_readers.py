"""The live readers on plain sockets (RTM_GETLINK, SIOCETHTOOL), checked against what the
real tools print in the same network namespace: ``ip -j -s -s link show``, ``ethtool -S``
and ``ethtool -a``. Two namespaces joined by a veth pair carry pings; a second pair is left
half down. The readers run in one process inside the namespace for the whole test (their
sockets and counter names are kept between reads, as in the exporter), driven one request
at a time over a pipe."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from netns import ADDR_A, ADDR_B, PREFIX, Netns, why_not_runnable

REPO = Path(__file__).resolve().parent.parent

READER = """
import json, sys
from exporter.readers.ethtool import DriverStatsReader, read_pause
from exporter.readers.netdev import NetdevReader
from exporter.inventory import InventoryOptions, discover
from exporter.root import Root, SourceError
root = Root("/")
links, stats = NetdevReader(root), DriverStatsReader(root)
memo = {}
for line in sys.stdin:
    req, errors = json.loads(line), []
    try:
        if req["op"] == "links":
            out = {n: vars(s) for n, s in links.links(req["names"], errors).items()}
        elif req["op"] == "stats":
            out = stats.read(req["device"], errors, None if req["wanted"] is None else frozenset(req["wanted"]))
        elif req["op"] == "pause":
            out = read_pause(root, req["device"])
        elif req["op"] == "discover":
            out = sorted(discover(root, InventoryOptions(), errors, memo))
        elif req["op"] == "sysfs":
            out = [root.read_int(path) for path in req["paths"]]
        else:
            out = sorted(m for m in ("pyroute2", "ssl", "ctypes") if m in sys.modules)
        answer = {"out": out, "errors": [[e.where, e.what] for e in errors]}
    except SourceError as e:
        answer = {"raised": [e.where, e.what]}
    print(json.dumps(answer), flush=True)
"""


def why_not() -> str | None:
    reason = why_not_runnable()
    if reason is None and (shutil.which("ethtool") is None or shutil.which("ping") is None):
        reason = "needs ethtool and ping on PATH"
    return reason


class Reader:
    """The readers in a process inside a namespace."""

    def __init__(self, ns: Netns):
        self.proc = ns.popen([sys.executable, "-c", READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO)

    def ask(self, **req) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            pytest.fail(f"the reader ended: {self.proc.stderr.read()[-2000:] if self.proc.stderr else ''}")
        return json.loads(line)


def ip_link(ns: Netns, dev: str) -> dict:
    return json.loads(ns.run(["ip", "-j", "-s", "-s", "link", "show", "dev", dev]).stdout)[0]


def ethtool_stats(ns: Netns, dev: str) -> dict[str, int]:
    out = {}
    for line in ns.run(["ethtool", "-S", dev]).stdout.splitlines()[1:]:  # after "NIC statistics:"
        name, _, value = line.strip().rpartition(": ")
        out[name] = int(value)
    return out


def ping(ns: Netns, count: int) -> None:
    ns.run(["ping", "-q", "-c", str(count), "-i", "0.01", "-W", "2", ADDR_B], timeout=60)


@pytest.fixture
def pair():
    """Namespace a (gnl0 up, gnl2 up with its peer gnl3 down) and namespace b (gnl1, gnl0's
    peer), IPv6 off so that nothing but our pings (and ARP) crosses the pair."""
    a, b = Netns("nla"), None
    try:
        b = Netns("nlb")
        for ns in (a, b):
            ns.run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])
        a.run(["ip", "link", "add", "gnl0", "numtxqueues", "4", "numrxqueues", "4", "type", "veth",
               "peer", "name", "gnl1", "numtxqueues", "4", "numrxqueues", "4"])
        a.run(["ip", "link", "set", "gnl1", "netns", b.name])
        a.run(["ip", "link", "add", "gnl2", "mtu", "9000", "type", "veth", "peer", "name", "gnl3", "mtu", "9000"])
        a.run(["ip", "addr", "add", f"{ADDR_A}/{PREFIX}", "dev", "gnl0"])
        b.run(["ip", "addr", "add", f"{ADDR_B}/{PREFIX}", "dev", "gnl1"])
        for ns, dev in ((a, "gnl0"), (b, "gnl1"), (a, "gnl2")):
            ns.run(["ip", "link", "set", dev, "up"])
        yield a, b
    finally:
        a.delete()
        if b is not None:
            b.delete()


def within(before: int, read: int, after: int) -> bool:
    return before <= read <= after


@pytest.mark.skipif(why_not() is not None, reason=str(why_not()))
def test_link_dump_matches_ip_link(pair):
    a, _ = pair
    ping(a, 50)
    reader = Reader(a)
    names = ["lo", "gnl0", "gnl2", "gnl3"]
    before = {dev: ip_link(a, dev) for dev in names}
    answer = reader.ask(op="links", names=names)
    after = {dev: ip_link(a, dev) for dev in names}
    assert answer["errors"] == []
    got = answer["out"]
    assert sorted(got) == sorted(names)
    for dev in names:
        ip0, ip1, st = before[dev], after[dev], got[dev]
        assert st["name"] == dev
        assert st["mtu"] == ip1["mtu"]
        assert st["operstate"] == ip1["operstate"].lower()
        assert st["carrier"] == (1 if "LOWER_UP" in ip1["flags"] else 0)
        assert within(ip0["stats64"]["tx"]["carrier_changes"], st["carrier_changes"],
                      ip1["stats64"]["tx"]["carrier_changes"])
        for direction in ("rx", "tx"):
            for field in ("bytes", "packets", "errors", "dropped"):
                assert within(ip0["stats64"][direction][field], st["stats"][f"{direction}_{field}"],
                              ip1["stats64"][direction][field]), (dev, direction, field)
    # What the setup made, as the tools said it: the pings crossed gnl0; gnl2's peer is down.
    assert got["gnl0"]["operstate"] == "up" and got["gnl0"]["stats"]["tx_packets"] >= 50
    assert got["gnl2"]["mtu"] == 9000 and got["gnl2"]["carrier"] == 0 and got["gnl2"]["operstate"] != "up"
    assert got["gnl3"]["operstate"] == "down"

    # The socket is kept: a second dump, after more traffic, still agrees with ip.
    ping(a, 20)
    ip0 = ip_link(a, "gnl0")
    second = reader.ask(op="links", names=["gnl0"])
    ip1 = ip_link(a, "gnl0")
    assert second["errors"] == []
    assert within(ip0["stats64"]["tx"]["packets"], second["out"]["gnl0"]["stats"]["tx_packets"],
                  ip1["stats64"]["tx"]["packets"])
    assert second["out"]["gnl0"]["stats"]["tx_packets"] >= got["gnl0"]["stats"]["tx_packets"] + 20
    assert reader.ask(op="modules")["out"] == []  # neither pyroute2, nor ssl, nor ctypes


@pytest.mark.skipif(why_not() is not None, reason=str(why_not()))
def test_driver_stats_match_ethtool(pair):
    a, _ = pair
    ping(a, 30)
    reader = Reader(a)
    tool = ethtool_stats(a, "gnl0")
    assert "peer_ifindex" in tool and "rx_queue_3_xdp_packets" in tool
    answer = reader.ask(op="stats", device="gnl0", wanted=None)
    assert answer["errors"] == []
    assert answer["out"] == tool  # veth's counters do not move with plain traffic (XDP ones only)
    peer = int(a.run(["cat", "/sys/class/net/gnl0/iflink"]).stdout)
    assert answer["out"]["peer_ifindex"] == peer

    wanted = ["peer_ifindex", "rx_queue_1_drops", "no_such_counter"]
    picked = reader.ask(op="stats", device="gnl0", wanted=wanted)
    assert picked["out"] == {"peer_ifindex": tool["peer_ifindex"], "rx_queue_1_drops": tool["rx_queue_1_drops"]}

    # Fewer queues, fewer counters: the names are fetched again, and the picks follow them.
    if a.run(["ethtool", "-L", "gnl0", "rx", "2", "tx", "2"], check=False).returncode == 0:
        tool = ethtool_stats(a, "gnl0")
        assert "rx_queue_3_xdp_packets" not in tool
        assert reader.ask(op="stats", device="gnl0", wanted=None)["out"] == tool
        assert reader.ask(op="stats", device="gnl0", wanted=wanted)["out"] == \
            {"peer_ifindex": tool["peer_ifindex"], "rx_queue_1_drops": tool["rx_queue_1_drops"]}

    # lo has no driver statistics: ethtool prints none, the reader finds none.
    assert reader.ask(op="stats", device="lo", wanted=None) == {"out": {}, "errors": []}


@pytest.mark.skipif(why_not() is not None, reason=str(why_not()))
def test_pause_matches_ethtool(pair):
    a, _ = pair
    tool = a.run(["ethtool", "-a", "gnl0"], check=False)
    answer = Reader(a).ask(op="pause", device="gnl0")
    if tool.returncode != 0:
        assert "not supported" in (tool.stderr + tool.stdout).lower(), tool.stderr
        assert answer == {"out": None, "errors": []}
    else:
        lines = dict(line.split(":", 1) for line in tool.stdout.splitlines() if ":" in line)
        assert answer["out"] == [lines["RX"].strip() == "on", lines["TX"].strip() == "on"]


@pytest.mark.skipif(why_not() is not None, reason=str(why_not()))
def test_a_vanished_device_is_an_error_naming_it(pair):
    a, _ = pair
    reader = Reader(a)
    assert reader.ask(op="stats", device="gnl0", wanted=["peer_ifindex"])["out"]  # names and socket held
    assert reader.ask(op="links", names=["gnl0"])["errors"] == []
    a.run(["ip", "link", "del", "gnl0"])
    assert a.run(["ip", "link", "show", "dev", "gnl0"], check=False).returncode != 0

    links = reader.ask(op="links", names=["lo", "gnl0"])
    assert sorted(links["out"]) == ["lo"]
    assert links["errors"] == [["netlink link gnl0", "network device vanished"]]
    assert reader.ask(op="stats", device="gnl0", wanted=["peer_ifindex"]) == \
        {"raised": ["ethtool -S gnl0", "network device vanished"]}
    assert reader.ask(op="stats", device="gnl0", wanted=None) == \
        {"raised": ["ethtool -S gnl0", "network device vanished"]}
    assert reader.ask(op="pause", device="gnl0") == {"raised": ["ethtool -a gnl0", "network device vanished"]}
    # The readers carry on with the devices still there.
    assert reader.ask(op="stats", device="gnl2", wanted=None)["out"] == ethtool_stats(a, "gnl2")
    assert reader.ask(op="links", names=["gnl2"])["out"]["gnl2"]["mtu"] == ip_link(a, "gnl2")["mtu"]


@pytest.mark.skipif(why_not() is not None, reason=str(why_not()))
def test_kept_open_sysfs_files_follow_names_on_the_real_kernel(pair):
    """The exporter keeps sysfs counters open and reads them again with pread (exporter/root.py).
    On the kernel's own sysfs: two devices swap names, and after the next discovery each name
    is read from the device that holds it now; a device deleted is an error naming its file."""
    a, _ = pair
    reader = Reader(a)
    mtu = ["sys/class/net/gnl0/mtu", "sys/class/net/gnl2/mtu"]
    assert "gnl0" in reader.ask(op="discover")["out"]
    for _ in range(2):  # the second read keeps them open
        assert reader.ask(op="sysfs", paths=mtu)["out"] == [1500, 9000]
    for dev, new in (("gnl0", "gswap"), ("gnl2", "gnl0"), ("gswap", "gnl2")):
        a.run(["ip", "link", "set", dev, "down"])
        a.run(["ip", "link", "set", dev, "name", new])
    assert [ip_link(a, "gnl0")["mtu"], ip_link(a, "gnl2")["mtu"]] == [9000, 1500]
    reader.ask(op="discover")
    assert reader.ask(op="sysfs", paths=mtu)["out"] == [9000, 1500]
    a.run(["ip", "link", "del", "gnl2"])  # the veth that was gnl0, with its peer in b
    answer = reader.ask(op="sysfs", paths=mtu[1:])
    assert answer["raised"][0].endswith("sys/class/net/gnl2/mtu"), answer
