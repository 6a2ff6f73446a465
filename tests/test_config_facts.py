"""Configuration facts: PFC, 802.3x pause, trust, ECN per priority, PCIe links,
bonds. Every expected value is read from the fixture's own files here, the way the driver
or the tool prints it; malformed files cost only their own series; a live namespace runs
the netlink and ioctl paths."""

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES
from exporter_harness import Node
from netns import Netns, why_not_runnable

PRIOS = [str(p) for p in range(8)]
REPO = Path(__file__).resolve().parent.parent


def series(node: Node, name: str, device: str | None = None) -> dict:
    """{labels without `device`: value} of one metric (for one device)."""
    out = {}
    for labels, value in node.series(name).items():
        d = dict(labels)
        if device is None or d.pop("device", None) == device:
            out[tuple(sorted(d.items()))] = value
    return out


def pause_file(root: Path, dev: str) -> dict[str, float]:
    values = {}
    for line in (root / "ethtool" / f"{dev}.pause.txt").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RX", "TX"):
            values["receive" if key == "RX" else "transmit"] = 1.0 if value.strip() == "on" else 0.0
    return values


def gt_per_s(text: str) -> float:
    return float(text.split()[0]) * 1e9  # "32.0 GT/s PCIe"


def problems(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- QoS from the fixture files ----------------------------------------------------------

@pytest.mark.parametrize("name", ["roce-mlx5", "bnxt", "e810", "misconfigured-mlx5"])
def test_pfc_trust_and_pause_equal_the_dcb_and_ethtool_files(name):
    root = FIXTURES / name
    node = Node(root).tick(now=100.0)
    pfc_files = sorted((root / "dcb").glob("*.pfc.json"))
    assert pfc_files
    for path in pfc_files:
        dev = path.name.removesuffix(".pfc.json")
        prio_pfc = json.loads(path.read_text())["prio_pfc"]
        assert series(node, "gpunet_nic_pfc_enabled", dev) == \
            {(("priority", str(p)),): float(on) for p, on in enumerate(prio_pfc)}
        app = root / "dcb" / f"{dev}.app.json"
        trust = "dscp" if app.exists() and json.loads(app.read_text()).get("dscp_prio") else "pcp"
        assert series(node, "gpunet_nic_qos_trust_info", dev) == {(("trust", trust),): 1.0}
    for path in sorted((root / "ethtool").glob("*.pause.txt")):
        dev = path.name.removesuffix(".pause.txt")
        assert series(node, "gpunet_nic_link_pause_enabled", dev) == \
            {(("direction", d),): v for d, v in pause_file(root, dev).items()}
    # No DCB file (igb, lo, bonds): no PFC or trust series at all, not zeros.
    with_dcb = {p.name.removesuffix(".pfc.json") for p in pfc_files}
    assert {dict(k)["device"] for k in node.series("gpunet_nic_pfc_enabled")} == with_dcb
    assert node.value("gpunet_exporter_collector_up", collector="qos") == 1.0


def test_mlx5_ecn_per_priority_and_point_equals_sysfs():
    root = FIXTURES / "roce-mlx5"
    node = Node(root).tick(now=100.0)
    for dev in ("ens1f0np0", "ens1f1np1"):
        expected = {}
        for folder, point in (("roce_np", "notification"), ("roce_rp", "reaction")):
            for prio in PRIOS:
                text = (root / f"sys/class/net/{dev}/ecn/{folder}/enable/{prio}").read_text()
                expected[(("point", point), ("priority", prio))] = float(int(text))
        assert series(node, "gpunet_nic_ecn_enabled", dev) == expected
        assert expected[(("point", "reaction"), ("priority", "3"))] == 1.0  # the fixture's meaning
    assert series(node, "gpunet_nic_ecn_enabled", "eno1") == {}  # igb: unknown, not disabled


def test_bnxt_re_configfs_ecn_applies_to_roce_prio_at_both_points():
    root = FIXTURES / "bnxt"
    cc = root / "sys/kernel/config/bnxt_re/bnxt_re0/ports/1/cc"
    enabled, prio = int((cc / "ecn_enable").read_text(), 16), int((cc / "roce_prio").read_text(), 16)
    node = Node(root).tick(now=100.0)
    assert series(node, "gpunet_nic_ecn_enabled", "ens3f0np0") == {
        (("point", "notification"), ("priority", str(prio))): float(enabled),
        (("point", "reaction"), ("priority", str(prio))): float(enabled)}


def test_irdma_configfs_dcqcn_is_device_wide_at_the_reaction_point():
    root = FIXTURES / "e810"
    enabled = int((root / "sys/kernel/config/irdma/rocep75s0f0/roce_dcqcn_enable").read_text())
    node = Node(root).tick(now=100.0)
    assert series(node, "gpunet_nic_ecn_enabled", "ens5f0") == \
        {(("point", "reaction"), ("priority", p)): float(enabled) for p in PRIOS}


def test_infiniband_node_has_no_qos_series():
    node = Node(FIXTURES / "ib-mlx5").tick(now=100.0)
    for name in ("gpunet_nic_pfc_enabled", "gpunet_nic_ecn_enabled", "gpunet_nic_qos_trust_info",
                 "gpunet_nic_link_pause_enabled"):
        assert node.series(name) == {}, name
    assert node.value("gpunet_exporter_collector_up", collector="qos") == 1.0


# --- PCIe ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["roce-mlx5", "ib-mlx5", "bnxt", "e810", "misconfigured-mlx5"])
def test_nic_pcie_links_equal_sysfs(name):
    root = FIXTURES / name
    node = Node(root).tick(now=100.0)
    devices = {dict(k)["device"] for k in node.series("gpunet_nic_info")}
    checked = 0
    for dev in devices:
        rdma, _, _ = dev.partition(":")
        folder = root / (f"sys/class/infiniband/{rdma}/device" if ":" in dev else f"sys/class/net/{dev}/device")
        if not (folder / "current_link_speed").exists():
            assert node.value("gpunet_nic_pcie_current_link_width", device=dev) is None
            continue
        checked += 1
        for kind in ("current", "max"):
            assert node.value(f"gpunet_nic_pcie_{kind}_link_transfers_per_second", device=dev) == \
                gt_per_s((folder / f"{kind}_link_speed").read_text())
            assert node.value(f"gpunet_nic_pcie_{kind}_link_width", device=dev) == \
                int((folder / f"{kind}_link_width").read_text())
    assert checked >= 1


def test_rdma_only_port_pcie_comes_from_its_rdma_device():
    root = FIXTURES / "ib-mlx5"
    node = Node(root).tick(now=100.0)
    width = int((root / "sys/class/infiniband/mlx5_1/device/current_link_width").read_text())
    assert node.value("gpunet_nic_pcie_current_link_width", device="mlx5_1:1") == width


def test_gpu_pcie_links_come_from_the_gpus_pci_devices():
    root = FIXTURES / "h100-8gpu"
    node = Node(root).tick(now=100.0)
    gpus = json.loads((root / "nvml.json").read_text())["gpus"]
    assert len(gpus) == 8
    for gpu in gpus:
        bus_id = gpu["pci_bus_id"].lower()
        folder = root / "sys/bus/pci/devices" / f"{bus_id.split(':', 1)[0][-4:]}:{bus_id.split(':', 1)[1]}"
        for kind in ("current", "max"):
            assert node.value(f"gpunet_gpu_pcie_{kind}_link_transfers_per_second", gpu=str(gpu["index"])) == \
                gt_per_s((folder / f"{kind}_link_speed").read_text())
            assert node.value(f"gpunet_gpu_pcie_{kind}_link_width", gpu=str(gpu["index"])) == \
                int((folder / f"{kind}_link_width").read_text())


def test_unknown_pcie_values_give_no_series_and_no_error(node_copy, caplog):
    root = node_copy("roce-mlx5")
    dev = root / "sys/class/net/ens1f0np0/device"
    (dev / "current_link_speed").write_text("Unknown\n")
    (dev / "current_link_width").write_text("255\n")
    node = Node(root).tick(now=100.0)
    assert node.value("gpunet_nic_pcie_current_link_transfers_per_second", device="ens1f0np0") is None
    assert node.value("gpunet_nic_pcie_current_link_width", device="ens1f0np0") is None
    assert node.value("gpunet_nic_pcie_max_link_width", device="ens1f0np0") == int((dev / "max_link_width").read_text())
    assert node.value("gpunet_exporter_collector_up", collector="pcie") == 1.0
    assert not [p for p in problems(caplog) if "pcie" in p]


def _behind_a_port(root: Path, netdev: str, port_speed: str, port_width: int, trained: str) -> None:
    """Put the netdev's PCI function in a folder of the port above it, as sysfs lays them out
    (sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0, which sys/class/net/<dev>/device leads
    to), the port supporting `port_speed` and `port_width`, the function trained at `trained`."""
    port = root / "sys/devices/pci0000:16/0000:16:02.0"
    port.mkdir(parents=True)
    (port / "max_link_speed").write_text(f"{port_speed}\n")
    (port / "max_link_width").write_text(f"{port_width}\n")
    device = root / f"sys/class/net/{netdev}/device"
    shutil.move(device, port / "0000:17:00.0")
    device.symlink_to("../../../devices/pci0000:16/0000:16:02.0/0000:17:00.0")
    (port / "0000:17:00.0/current_link_speed").write_text(f"{trained}\n")


def test_a_card_in_a_slower_or_narrower_slot_can_train_no_higher_than_the_slot(node_copy):
    """A Gen5 x16 NIC in a Gen4 slot wired x8 trains at Gen4 x8 by design: the most its link
    can is the slot's, so the link is not degraded (the alert compares the two)."""
    root = node_copy("roce-mlx5")
    own = root / "sys/class/net/ens1f0np0/device"
    assert gt_per_s((own / "max_link_speed").read_text()) == 32e9 and int((own / "max_link_width").read_text()) == 16
    _behind_a_port(root, "ens1f0np0", "16.0 GT/s PCIe", 8, "16.0 GT/s PCIe")
    (own / "current_link_width").write_text("8\n")
    node = Node(root).tick(now=100.0)
    assert node.value("gpunet_nic_pcie_max_link_transfers_per_second", device="ens1f0np0") == 16e9
    assert node.value("gpunet_nic_pcie_current_link_transfers_per_second", device="ens1f0np0") == 16e9
    assert node.value("gpunet_nic_pcie_max_link_width", device="ens1f0np0") == 8
    assert node.value("gpunet_nic_pcie_current_link_width", device="ens1f0np0") == 8
    assert node.value("gpunet_exporter_collector_up", collector="pcie") == 1.0


def test_a_card_that_trained_below_a_port_as_fast_as_itself_is_degraded(node_copy):
    root = node_copy("roce-mlx5")
    _behind_a_port(root, "ens1f0np0", "32.0 GT/s PCIe", 16, "16.0 GT/s PCIe")
    node = Node(root).tick(now=100.0)
    assert node.value("gpunet_nic_pcie_max_link_transfers_per_second", device="ens1f0np0") == 32e9
    assert node.value("gpunet_nic_pcie_current_link_transfers_per_second", device="ens1f0np0") == 16e9
    assert node.value("gpunet_nic_pcie_max_link_width", device="ens1f0np0") == 16


def test_only_a_pci_function_under_a_pci_port_is_capped(tmp_path):
    """A netdev of an mlx5 sub-function sits in a folder of its PCI function, which is no port
    above it; a function that tells no maximum of its own gets none from the port."""
    from exporter.readers.pci import pcie_link, upstream_port
    from exporter.root import Root

    port = tmp_path / "sys/devices/pci0000:16/0000:16:02.0"
    function = port / "0000:17:00.0"
    sub_function = function / "mlx5_core.sf.2"
    sub_function.mkdir(parents=True)
    for folder, speed in ((port, "16.0 GT/s PCIe"), (function, "32.0 GT/s PCIe")):
        (folder / "max_link_speed").write_text(speed + "\n")
    root = Root(tmp_path)
    assert upstream_port(root, "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0") == \
        "sys/devices/pci0000:16/0000:16:02.0"
    assert upstream_port(root, "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0/mlx5_core.sf.2") is None
    assert upstream_port(root, "sys/devices/pci0000:16/0000:16:02.0") is None  # under the root complex
    errors: list = []
    assert pcie_link(root, "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0/mlx5_core.sf.2", errors) == \
        (None, None, None, None)
    (function / "max_link_speed").unlink()  # the function tells no maximum: the port's says nothing of it
    assert pcie_link(root, "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0", errors).max_speed is None
    assert not errors


# --- the misconfigured node ---------------------------------------------------------------

def test_misconfigured_node_shows_each_fault_from_its_files():
    root = FIXTURES / "misconfigured-mlx5"
    net = root / "sys/class/net"
    node = Node(root).tick(now=100.0)
    # ECN off on the priority that has PFC.
    pfc = json.loads((root / "dcb/ens1f0np0.pfc.json").read_text())["prio_pfc"]
    prio = str(pfc.index(True))
    for folder, point in (("roce_np", "notification"), ("roce_rp", "reaction")):
        on = float(int((net / f"ens1f0np0/ecn/{folder}/enable/{prio}").read_text()))
        assert on == 0.0
        assert node.value("gpunet_nic_ecn_enabled", device="ens1f0np0", priority=prio, point=point) == on
    # A NIC trained at fewer lanes than it has.
    current = int((net / "ens1f1np1/device/current_link_width").read_text())
    most = int((net / "ens1f1np1/device/max_link_width").read_text())
    assert current < most
    assert node.value("gpunet_nic_pcie_current_link_width", device="ens1f1np1") == current
    assert node.value("gpunet_nic_pcie_max_link_width", device="ens1f1np1") == most
    # MTU 1500 on a fabric port.
    mtu = int((net / "ens1f0np0/mtu").read_text())
    assert mtu == 1500 and node.value("gpunet_nic_fabric", device="ens1f0np0") == 1.0
    assert node.value("gpunet_nic_mtu_bytes", device="ens1f0np0") == mtu
    # An active-backup bond with one member down.
    mode, policy = ((net / f"bond0/bonding/{f}").read_text().split()[0] for f in ("mode", "xmit_hash_policy"))
    assert node.series("gpunet_bond_info") == \
        {(("bond", "bond0"), ("mode", mode), ("xmit_hash_policy", policy)): 1.0}
    members = (net / "bond0/bonding/slaves").read_text().split()
    expected = {m: float((net / f"{m}/bonding_slave/mii_status").read_text().strip() == "up") for m in members}
    assert {dict(k)["device"]: v for k, v in node.series("gpunet_bond_member_up").items()} == expected
    assert sorted(expected.values()) == [0.0, 1.0]
    assert "bonding_masters" not in {dict(k)["device"] for k in node.series("gpunet_nic_info")}


# --- bad input costs only its own series --------------------------------------------------

def test_malformed_ecn_file_costs_only_its_series(node_copy, caplog):
    root = node_copy("roce-mlx5")
    bad = root / "sys/class/net/ens1f0np0/ecn/roce_np/enable/3"
    bad.write_text("on\n")
    node = Node(root).tick(now=100.0)
    assert node.value("gpunet_nic_ecn_enabled", device="ens1f0np0", priority="3", point="notification") is None
    assert node.value("gpunet_nic_ecn_enabled", device="ens1f0np0", priority="3", point="reaction") == 1.0
    assert node.value("gpunet_nic_pfc_enabled", device="ens1f0np0", priority="3") == 1.0
    assert node.value("gpunet_exporter_collector_up", collector="qos") == 0.0
    assert node.value("gpunet_exporter_collector_errors_total", collector="qos") == 1.0
    assert any(str(bad) in p and "not an integer" in p for p in problems(caplog))


def test_malformed_dcb_and_pause_files_name_the_file_and_line(node_copy, caplog):
    root = node_copy("roce-mlx5")
    pfc = root / "dcb/ens1f1np1.pfc.json"
    pfc.write_text('{"pfc_cap":8,\n"prio_pfc":[true,true,\n')  # cut short
    pause = root / "ethtool/ens1f0np0.pause.txt"
    pause.write_text(pause.read_text().replace("RX:\t\toff", "RX:\t\tmaybe"))
    node = Node(root).tick(now=100.0)
    assert series(node, "gpunet_nic_pfc_enabled", "ens1f1np1") == {}
    assert series(node, "gpunet_nic_qos_trust_info", "ens1f1np1") == {}
    assert len(series(node, "gpunet_nic_pfc_enabled", "ens1f0np0")) == 8  # the other port is whole
    assert series(node, "gpunet_nic_link_pause_enabled", "ens1f0np0") == {}
    assert len(series(node, "gpunet_nic_link_pause_enabled", "ens1f1np1")) == 2
    assert len(series(node, "gpunet_nic_ecn_enabled", "ens1f1np1")) == 16
    found = problems(caplog)
    assert any(f"{pfc}:3" in p and "not JSON" in p for p in found), found
    line = next(i for i, l in enumerate(pause.read_text().splitlines(), 1) if "maybe" in l)
    assert any(f"{pause}:{line}" in p and "on or off" in p for p in found), found


def test_malformed_pcie_file_costs_only_its_value(node_copy, caplog):
    root = node_copy("roce-mlx5")
    bad = root / "sys/class/net/ens1f1np1/device/current_link_speed"
    bad.write_text("fast\n")
    node = Node(root).tick(now=100.0)
    assert node.value("gpunet_nic_pcie_current_link_transfers_per_second", device="ens1f1np1") is None
    assert node.value("gpunet_nic_pcie_current_link_width", device="ens1f1np1") == 16.0
    assert node.value("gpunet_nic_pcie_current_link_transfers_per_second", device="ens1f0np0") == 32e9
    assert node.value("gpunet_exporter_collector_up", collector="pcie") == 0.0
    assert any(str(bad) in p and "not a PCIe speed" in p for p in problems(caplog))


def test_a_bond_member_that_vanished_costs_only_itself(node_copy, caplog):
    root = node_copy("misconfigured-mlx5")
    shutil.rmtree(root / "sys/class/net/eno2/bonding_slave")
    node = Node(root).tick(now=100.0)
    assert len(node.series("gpunet_bond_info")) == 1
    assert {dict(k)["device"] for k in node.series("gpunet_bond_member_up")} == {"eno1"}
    assert node.value("gpunet_exporter_collector_up", collector="bond") == 0.0
    assert any("eno2/bonding_slave/mii_status" in p for p in problems(caplog))


# --- refresh: read every 30 s, or when the NICs change ------------------------------------

def test_facts_are_reread_after_the_interval_or_when_a_nic_vanishes(node_copy):
    root = node_copy("roce-mlx5")
    node = Node(root).tick(now=100.0)
    prio3 = {"device": "ens1f0np0", "priority": "3"}
    assert node.value("gpunet_nic_pfc_enabled", **prio3) == 1.0
    path = root / "dcb/ens1f0np0.pfc.json"
    doc = json.loads(path.read_text())
    doc["prio_pfc"][3] = False
    path.write_text(json.dumps(doc))
    node.tick(now=110.0)  # within the interval: the cached answer
    assert node.value("gpunet_nic_pfc_enabled", **prio3) == 1.0
    node.tick(now=131.0)  # past it: read again
    assert node.value("gpunet_nic_pfc_enabled", **prio3) == 0.0
    # A NIC that vanishes takes its series with it at once, without an error.
    shutil.rmtree(root / "sys/class/net/ens1f1np1")
    shutil.rmtree(root / "sys/class/infiniband/mlx5_1")
    node.tick(now=132.0)
    for name in ("gpunet_nic_pfc_enabled", "gpunet_nic_ecn_enabled", "gpunet_nic_pcie_max_link_width"):
        assert series(node, name, "ens1f1np1") == {}, name
        assert series(node, name, "ens1f0np0") != {}, name
    assert node.value("gpunet_exporter_collector_up", collector="qos") == 1.0
    assert node.value("gpunet_exporter_collector_up", collector="pcie") == 1.0


# --- live: a namespace of this machine ------------------------------------------------------

LIVE_SCRIPT = """
import json, sys
sys.path.insert(0, "tests")
from exporter_harness import Node
node = Node("/").tick().tick(slow=False)
names = ("gpunet_nic_pfc_enabled", "gpunet_nic_qos_trust_info", "gpunet_nic_link_pause_enabled",
         "gpunet_nic_ecn_enabled", "gpunet_bond_info", "gpunet_bond_member_up", "gpunet_nic_info")
out = {n: [[dict(k), v] for k, v in node.series(n).items()] for n in names}
out["up"] = {c: node.value("gpunet_exporter_collector_up", collector=c) for c in ("qos", "pcie", "bond")}
print(json.dumps(out))
"""


def run_exporter_in(ns: Netns) -> dict:
    proc = ns.run([sys.executable, "-c", LIVE_SCRIPT], timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.skipif(why_not_runnable() is not None, reason=str(why_not_runnable()))
def test_live_veth_has_no_dcb_and_no_error(monkeypatch):
    monkeypatch.chdir(REPO)
    ns = Netns("cfg")
    try:
        ns.run(["ip", "link", "add", "gcf0", "type", "veth", "peer", "name", "gcf1"])
        ns.run(["ip", "link", "set", "gcf0", "up"])
        ns.run(["ip", "link", "set", "gcf1", "up"])
        out = run_exporter_in(ns)
    finally:
        ns.delete()
    assert {s[0]["device"] for s in out["gpunet_nic_info"]} >= {"gcf0", "gcf1"}
    for name in ("gpunet_nic_pfc_enabled", "gpunet_nic_qos_trust_info", "gpunet_nic_link_pause_enabled",
                 "gpunet_nic_ecn_enabled", "gpunet_bond_info"):
        assert out[name] == [], name
    assert out["up"] == {"qos": 1.0, "pcie": 1.0, "bond": 1.0}


def bonding_available() -> bool:
    if why_not_runnable() is not None:
        return False
    ns = Netns("bprobe")
    try:
        return ns.run(["ip", "link", "add", "gbp0", "type", "bond"], check=False).returncode == 0
    finally:
        ns.delete()


@pytest.mark.skipif(not bonding_available(), reason="needs root, ip, and a kernel with bonding (CONFIG_BONDING)")
def test_live_bond_in_a_namespace(monkeypatch):
    monkeypatch.chdir(REPO)
    ns = Netns("bond")
    try:
        ns.run(["ip", "link", "add", "bond0", "type", "bond", "mode", "802.3ad"])
        for a, b in (("gbm0", "gbp0"), ("gbm1", "gbp1")):
            ns.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
            ns.run(["ip", "link", "set", a, "master", "bond0"])
            ns.run(["ip", "link", "set", b, "up"])
        ns.run(["ip", "link", "set", "bond0", "up"])
        sysfs = {f: ns.run(["cat", f"/sys/class/net/bond0/bonding/{f}"]).stdout.split()[0]
                 for f in ("mode", "xmit_hash_policy")}
        mii = {m: ns.run(["cat", f"/sys/class/net/{m}/bonding_slave/mii_status"]).stdout.strip()
               for m in ("gbm0", "gbm1")}
        out = run_exporter_in(ns)
    finally:
        ns.delete()
    assert sysfs["mode"] == "802.3ad"
    assert out["gpunet_bond_info"] == [[{"bond": "bond0", "mode": sysfs["mode"],
                                         "xmit_hash_policy": sysfs["xmit_hash_policy"]}, 1.0]]
    assert sorted((s[0]["device"], s[1]) for s in out["gpunet_bond_member_up"]) == \
        sorted((m, 1.0 if status == "up" else 0.0) for m, status in mii.items())
    assert out["up"]["bond"] == 1.0


def test_config_interval_flag_sets_how_often_facts_are_read(node_copy):
    from exporter.cli import make_sampler
    from exporter.registry import Registry
    from exporter.settings import build_parser

    root = node_copy("roce-mlx5")
    registry = Registry(root_label="x")
    sampler = make_sampler(build_parser().parse_args(["--root", str(root), "--config-interval", "5"]), registry)
    sampler.slow_tick(now=100.0)
    path = root / "dcb/ens1f0np0.pfc.json"
    doc = json.loads(path.read_text())
    doc["prio_pfc"] = [True] * 8
    path.write_text(json.dumps(doc))
    sampler.slow_tick(now=106.0)  # 6 s later: past a 5 s interval, well within the default 30 s
    text = registry.render(openmetrics=False).decode()
    assert 'gpunet_nic_pfc_enabled{device="ens1f0np0",priority="0"} 1.0' in text
