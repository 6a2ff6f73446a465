"""The configuration audit: each check on hand-built fixture traces and on simulated
traces with injected configuration faults; healthy configurations give nothing; the same
answer from a real Prometheus as from the file. Expectations come from how the traces were
built, never from the audit's own output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_diagnoser import diagnose

from diagnoser.analysis.audit import CHECKS, audit, pcie_bandwidth, roce_path_mtu
from diagnoser.sources.replay import frame_from_trace
from gpunet import contract as C
from gpunet.simulate.engine import simulate
from gpunet.simulate.output import write_trace
from gpunet.simulate.params import ClusterParams, SimSpec, parse_config_fault, parse_confounder, parse_fault

T0 = 1767225600.0
NICS = {"ens1f0np0": "0", "ens1f1np1": "1"}  # device -> NUMA node
GPUS = {"0": "0", "1": "0", "2": "1", "3": "1"}  # gpu -> NUMA node
NODES = [f"gpu-{i:02d}:9845" for i in range(1, 7)]


# --- fixture fleets: a dict {(name, labels): value or [values at T0, +15, +30]} ---------------

def healthy_fleet(link_layer: str = "Ethernet") -> dict:
    fleet = {}

    def put(name, value, **labels):
        fleet[(name, tuple(sorted(labels.items())))] = value

    for inst in NODES:
        for dev, numa in NICS.items():
            put(C.NIC_INFO.name, 1, instance=inst, device=dev, rdma_device=f"mlx5_{dev[5]}", port="1",
                driver="mlx5_core", link_layer=link_layer, numa_node=numa, pci_address="")
            put(C.NIC_LINK_SPEED.name, 25e9, instance=inst, device=dev)
            put(C.NIC_MTU.name, 4200 if link_layer == "Ethernet" else 2044, instance=inst, device=dev)
            put(C.NIC_PCIE_CURRENT_SPEED.name, 16e9, instance=inst, device=dev)
            put(C.NIC_PCIE_MAX_SPEED.name, 16e9, instance=inst, device=dev)
            put(C.NIC_PCIE_CURRENT_WIDTH.name, 16, instance=inst, device=dev)
            put(C.NIC_PCIE_MAX_WIDTH.name, 16, instance=inst, device=dev)
            if link_layer != "Ethernet":
                continue  # InfiniBand: no DCB
            for q in range(8):
                put(C.NIC_PFC_ENABLED.name, int(q == 3), instance=inst, device=dev, priority=str(q))
                for point in C.ECN_POINTS:
                    put(C.NIC_ECN_ENABLED.name, int(q == 3), instance=inst, device=dev, priority=str(q), point=point)
            for d in C.DIRECTIONS:
                put(C.NIC_LINK_PAUSE_ENABLED.name, 0, instance=inst, device=dev, direction=d)
            put(C.NIC_QOS_TRUST_INFO.name, 1, instance=inst, device=dev, trust="dscp")
        # a management NIC with 802.3x pause on and MTU 1500: not the fabric, never flagged
        put(C.NIC_INFO.name, 1, instance=inst, device="eno1", rdma_device="", port="", driver="igb",
            link_layer="Ethernet", numa_node="0", pci_address="")
        put(C.NIC_LINK_SPEED.name, 1.25e8, instance=inst, device="eno1")
        put(C.NIC_MTU.name, 1500, instance=inst, device="eno1")
        for d in C.DIRECTIONS:
            put(C.NIC_LINK_PAUSE_ENABLED.name, 1, instance=inst, device="eno1", direction=d)
        for gpu, numa in GPUS.items():
            put(C.GPU_INFO.name, 1, instance=inst, gpu=gpu, uuid=f"GPU-{inst}-{gpu}", model="H100", pci_address="",
                numa_node=numa)
            put(C.GPU_BUSY_SECONDS.name, [100.0, 115.0, 130.0], instance=inst, gpu=gpu)  # busy all along
            put(C.GPU_PCIE_CURRENT_SPEED.name, 32e9, instance=inst, gpu=gpu)
            put(C.GPU_PCIE_MAX_SPEED.name, 32e9, instance=inst, gpu=gpu)
            put(C.GPU_PCIE_CURRENT_WIDTH.name, 16, instance=inst, gpu=gpu)
            put(C.GPU_PCIE_MAX_WIDTH.name, 16, instance=inst, gpu=gpu)
    return fleet


def put(fleet: dict, name: str, value, **labels) -> None:
    """Set a series (replacing the one with the same identity labels)."""
    fleet[(name, tuple(sorted(labels.items())))] = value


def drop(fleet: dict, name: str, **match) -> None:
    for key in [k for k in fleet if k[0] == name and all(dict(k[1]).get(a) == b for a, b in match.items())]:
        del fleet[key]


def write(fleet: dict, path: Path) -> Path:
    by_name: dict[str, list] = {}
    for (name, labels), value in fleet.items():
        by_name.setdefault(name, []).append((labels, value))
    lines = []
    for name, series in by_name.items():
        family = name.removesuffix("_total")
        lines.append(f"# TYPE {family} {'counter' if name.endswith('_total') else 'gauge'}")
        for labels, value in series:
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            values = value if isinstance(value, list) else [value] * 3
            lines += [f"{name}{{{text}}} {v} {T0 + 15 * j:.3f}" for j, v in enumerate(values)]
    lines.append("# EOF")
    path.write_text("\n".join(lines) + "\n")
    return path


def audited(fleet: dict, tmp_path: Path) -> tuple[dict, list[str]]:
    """{check: {node: [devices]}} and the notes, from the trace of `fleet`."""
    findings, notes = audit(frame_from_trace(write(fleet, tmp_path / "fleet.om")).config)
    return {f.check: f.devices for f in findings}, notes


def test_healthy_fleet_gives_nothing(tmp_path):
    found, notes = audited(healthy_fleet(), tmp_path)
    assert found == {} and notes == []


def test_infiniband_skips_ethernet_checks(tmp_path):
    found, notes = audited(healthy_fleet("InfiniBand"), tmp_path)
    assert found == {} and not any("PFC" in n for n in notes), notes


def mutate_ecn_reaction(f):
    put(f, C.NIC_ECN_ENABLED.name, 0, instance=NODES[1], device="ens1f0np0", priority="3", point="reaction")
    return {"ecn_off_on_pfc_priority": {NODES[1]: ["ens1f0np0"]}}


def mutate_no_pfc_no_ecn(f):
    for dev in NICS:
        drop(f, C.NIC_PFC_ENABLED.name, instance=NODES[2], device=dev)
        drop(f, C.NIC_ECN_ENABLED.name, instance=NODES[2], device=dev)
        for q in range(8):
            put(f, C.NIC_PFC_ENABLED.name, 0, instance=NODES[2], device=dev, priority=str(q))
            for point in C.ECN_POINTS:
                put(f, C.NIC_ECN_ENABLED.name, 0, instance=NODES[2], device=dev, priority=str(q), point=point)
    return {"roce_without_pfc_or_ecn": {NODES[2]: sorted(NICS)}}


def mutate_pfc_two_priorities(f):
    put(f, C.NIC_PFC_ENABLED.name, 1, instance=NODES[3], device="ens1f1np1", priority="4")
    return {"pfc_on_several_priorities": {NODES[3]: ["ens1f1np1"]}}


def mutate_pfc_other_priority(f):
    put(f, C.NIC_PFC_ENABLED.name, 0, instance=NODES[0], device="ens1f0np0", priority="3")
    put(f, C.NIC_PFC_ENABLED.name, 1, instance=NODES[0], device="ens1f0np0", priority="5")
    for point in C.ECN_POINTS:
        put(f, C.NIC_ECN_ENABLED.name, 1, instance=NODES[0], device="ens1f0np0", priority="5", point=point)
    return {"pfc_priority_mismatch": {NODES[0]: ["ens1f0np0"]}}


def mutate_trust_pcp(f):
    drop(f, C.NIC_QOS_TRUST_INFO.name, instance=NODES[4])
    for dev in NICS:
        put(f, C.NIC_QOS_TRUST_INFO.name, 1, instance=NODES[4], device=dev, trust="pcp")
    return {"trust_mismatch": {NODES[4]: sorted(NICS)}}


def mutate_link_pause(f):
    put(f, C.NIC_LINK_PAUSE_ENABLED.name, 1, instance=NODES[5], device="ens1f1np1", direction="transmit")
    return {"link_pause_with_pfc": {NODES[5]: ["ens1f1np1"]}}


def _numa(f, inst, dev, numa):
    drop(f, C.NIC_INFO.name, instance=inst, device=dev)
    put(f, C.NIC_INFO.name, 1, instance=inst, device=dev, rdma_device=f"mlx5_{dev[5]}", port="1",
        driver="mlx5_core", link_layer="Ethernet", numa_node=numa, pci_address="")


def mutate_nic_numa(f):
    _numa(f, NODES[1], "ens1f1np1", "2")  # GPUs are on 0 and 1
    return {"nic_numa_without_gpu": {NODES[1]: ["ens1f1np1"]}}


def mutate_gpu_numa(f):
    _numa(f, NODES[2], "ens1f1np1", "0")  # both NICs on 0: GPUs 2 and 3 (NUMA 1) have none
    return {"gpu_numa_without_nic": {NODES[2]: ["gpu2", "gpu3"]}}


def mutate_single_numa_node(f):
    for dev in NICS:
        _numa(f, NODES[3], dev, "0")
    for gpu in GPUS:
        drop(f, C.GPU_INFO.name, instance=NODES[3], gpu=gpu)
        put(f, C.GPU_INFO.name, 1, instance=NODES[3], gpu=gpu, uuid="u", model="H100", pci_address="", numa_node="0")
    return {}


def mutate_numa_unknown(f):
    _numa(f, NODES[3], "ens1f0np0", "-1")
    _numa(f, NODES[3], "ens1f1np1", "-1")
    return {}


def mutate_nic_x8(f):
    put(f, C.NIC_PCIE_CURRENT_WIDTH.name, 8, instance=NODES[4], device="ens1f0np0")
    return {"nic_pcie_degraded": {NODES[4]: ["ens1f0np0"]}}


def mutate_nic_gen3(f):
    put(f, C.NIC_PCIE_CURRENT_SPEED.name, 8e9, instance=NODES[0], device="ens1f1np1")
    return {"nic_pcie_degraded": {NODES[0]: ["ens1f1np1"]}}


def mutate_400g_in_gen4_slots(f):
    for inst in NODES:
        for dev in NICS:
            put(f, C.NIC_LINK_SPEED.name, 50e9, instance=inst, device=dev)  # 400G; Gen4 x16 gives ~252 Gb/s
    return {"nic_pcie_too_slow": {inst: sorted(NICS) for inst in NODES}}


def mutate_idle_gpu_at_gen1(f):
    put(f, C.GPU_PCIE_CURRENT_SPEED.name, 2.5e9, instance=NODES[1], gpu="3")
    put(f, C.GPU_BUSY_SECONDS.name, [50.0, 50.0, 50.0], instance=NODES[1], gpu="3")  # idle all along
    return {}


def mutate_busy_gpu_at_gen3(f):
    put(f, C.GPU_PCIE_CURRENT_SPEED.name, 8e9, instance=NODES[1], gpu="2")
    return {"gpu_pcie_degraded": {NODES[1]: ["gpu2"]}}


def mutate_idle_gpu_x8(f):
    put(f, C.GPU_PCIE_CURRENT_WIDTH.name, 8, instance=NODES[2], gpu="1")
    put(f, C.GPU_BUSY_SECONDS.name, [50.0, 50.0, 50.0], instance=NODES[2], gpu="1")
    return {"gpu_pcie_degraded": {NODES[2]: ["gpu1"]}}


def mutate_100g_among_200g(f):
    put(f, C.NIC_LINK_SPEED.name, 12.5e9, instance=NODES[5], device="ens1f0np0")
    return {"link_speed_below_fleet": {NODES[5]: ["ens1f0np0"]}}


def mutate_mtu_9000(f):
    put(f, C.NIC_MTU.name, 9000, instance=NODES[3], device="ens1f0np0")
    put(f, C.NIC_MTU.name, 9000, instance=NODES[3], device="ens1f1np1")
    return {"mtu_mismatch": {NODES[3]: sorted(NICS)}}


def mutate_mtu_1500(f):
    put(f, C.NIC_MTU.name, 1500, instance=NODES[4], device="ens1f1np1")
    return {"roce_small_mtu": {NODES[4]: ["ens1f1np1"]}}


def _bond(f, inst, mode, policy, members):
    put(f, C.BOND_INFO.name, 1, instance=inst, bond="bond0", mode=mode, xmit_hash_policy=policy)
    for dev, up in members.items():
        put(f, C.BOND_MEMBER_UP.name, up, instance=inst, bond="bond0", device=dev)


def mutate_healthy_bond(f):
    _bond(f, NODES[0], "802.3ad", "layer3+4", {"ens1f0np0": 1, "ens1f1np1": 1})
    _bond(f, NODES[1], "active-backup", "layer2", {"eno1": 1, "eno2": 1})  # management: not judged
    return {}


def mutate_bond_active_backup(f):
    _bond(f, NODES[2], "active-backup", "layer2", {"ens1f0np0": 1, "ens1f1np1": 1})
    return {"bond_not_lacp": {NODES[2]: ["bond0"]}}


def mutate_bond_layer2(f):
    _bond(f, NODES[3], "802.3ad", "layer2", {"ens1f0np0": 1, "ens1f1np1": 1})
    return {"bond_layer2_hash": {NODES[3]: ["bond0"]}}


def mutate_bond_member_down(f):
    _bond(f, NODES[4], "802.3ad", "layer3+4", {"ens1f0np0": 1, "ens1f1np1": 0})
    return {"bond_member_down": {NODES[4]: ["bond0"]}}


MUTATIONS = [v for k, v in dict(globals()).items() if k.startswith("mutate_")]


@pytest.mark.parametrize("mutate", MUTATIONS, ids=[m.__name__[7:] for m in MUTATIONS])
def test_each_misconfiguration_gives_exactly_its_finding(mutate, tmp_path):
    fleet = healthy_fleet()
    expected = mutate(fleet)
    found, _ = audited(fleet, tmp_path)
    assert found == expected


def test_every_check_is_exercised():
    checks = set()
    for m in MUTATIONS:
        checks |= set(m(healthy_fleet()))
    assert checks == set(CHECKS)


def test_a_slower_partition_is_a_note_not_a_finding(tmp_path):
    fleet = healthy_fleet()
    for inst in NODES[:2]:  # a third of the fleet, whole nodes at 25G: built so
        for dev in NICS:
            put(fleet, C.NIC_LINK_SPEED.name, 25e9 / 8, instance=inst, device=dev)
    found, notes = audited(fleet, tmp_path)
    assert found == {} and any("partition" in n for n in notes), notes
    put(fleet, C.NIC_LINK_SPEED.name, 25e9 / 16, instance=NODES[0], device="ens1f0np0")  # one port below its node's
    found, _ = audited(fleet, tmp_path)
    assert found == {"link_speed_below_fleet": {NODES[0]: ["ens1f0np0"]}}


def _jobs(fleet: dict, job_of: dict[str, str]) -> None:
    for inst, job in job_of.items():
        for gpu in GPUS:
            put(fleet, C.GPU_WORKLOAD_INFO.name, 1, instance=inst, gpu=gpu, workload=f"team/{job}",
                source="kubernetes", namespace="team", pod=f"{job}-worker-0", container="trainer")


def test_peers_are_the_jobs_nodes(tmp_path):
    # One node serves a job of its own on 10G hardware: built so, not a slow link. Within
    # the big job, one node at 10G is still flagged.
    fleet = healthy_fleet()
    _jobs(fleet, dict.fromkeys(NODES[:5], "big") | {NODES[5]: "small"})
    for dev in NICS:
        put(fleet, C.NIC_LINK_SPEED.name, 10e9 / 8, instance=NODES[5], device=dev)
        put(fleet, C.NIC_MTU.name, 9000, instance=NODES[5], device=dev)
    found, _ = audited(fleet, tmp_path)
    assert found == {}, found
    put(fleet, C.NIC_LINK_SPEED.name, 10e9 / 8, instance=NODES[0], device="ens1f0np0")
    found, _ = audited(fleet, tmp_path)
    assert found == {"link_speed_below_fleet": {NODES[0]: ["ens1f0np0"]}}
    # Without the workload information the lone node is compared with the fleet (its speed
    # is then judged by the partition rule, its MTU by the fleet's).
    drop(fleet, C.GPU_WORKLOAD_INFO.name)
    found, _ = audited(fleet, tmp_path)
    assert found["mtu_mismatch"] == {NODES[5]: sorted(NICS)}, found


def test_unknown_numa_is_a_note_not_a_finding(tmp_path):
    fleet = healthy_fleet()
    mutate_numa_unknown(fleet)
    found, notes = audited(fleet, tmp_path)
    assert found == {} and any("NUMA placement unknown on 1 node" in n for n in notes), notes


def test_without_configuration_series_one_note(tmp_path):
    fleet = {k: v for k, v in healthy_fleet().items()
             if k[0] in (C.NIC_INFO.name, C.NIC_LINK_SPEED.name, C.GPU_INFO.name, C.GPU_BUSY_SECONDS.name)}
    found, notes = audited(fleet, tmp_path)
    assert found == {} and len(notes) == 1 and "no configuration facts" in notes[0], notes


def test_reconfigured_within_the_window_is_unknown(tmp_path):
    fleet = healthy_fleet()
    put(fleet, C.NIC_QOS_TRUST_INFO.name, [1, 1, float("nan")], instance=NODES[0], device="ens1f0np0", trust="dscp")
    put(fleet, C.NIC_QOS_TRUST_INFO.name, [float("nan"), float("nan"), 1], instance=NODES[0], device="ens1f0np0",
        trust="pcp")
    found, notes = audited(fleet, tmp_path)
    assert found == {} and any("changed within the window" in n for n in notes), notes


def test_pcie_arithmetic():
    # Gen4 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s (252 Gb/s): enough for 200G, not for 400G
    assert pcie_bandwidth(16e9, 16) == pytest.approx(16e9 * 16 * 128 / 130 / 8)
    assert pcie_bandwidth(5e9, 8) == pytest.approx(5e9 * 8 * 0.8 / 8)
    assert roce_path_mtu(1500) == 1024 and roce_path_mtu(4200) == 4096 and roce_path_mtu(9000) == 4096


# --- simulated traces ---------------------------------------------------------------------------

SIM_FAULTS = {  # config fault -> the finding it must give: check, node index, devices
    "pcie_width:culprits=1,width=8,nics=1": ("nic_pcie_degraded", 1, ["ens1f0np0"]),
    "ecn_off:culprits=2,point=reaction": ("ecn_off_on_pfc_priority", 2, "all"),
    "mtu:culprits=3,mtu=9000": ("mtu_mismatch", 3, "all"),
    "bond:culprits=4,mode=active-backup": ("bond_not_lacp", 4, ["bond0"]),
    "nic_numa:culprits=5,numa=0": ("gpu_numa_without_nic", 5, ["gpu4", "gpu5", "gpu6", "gpu7"]),
    "pcie_speed:culprits=6,target=gpu,speed=16,gpus=1": ("gpu_pcie_degraded", 6, ["gpu0"]),
    "link_pause:culprits=7": ("link_pause_with_pfc", 7, "all"),
    "trust:culprits=8,value=pcp": ("trust_mismatch", 8, "all"),
    "pfc_extra:culprits=9,priority=4,nics=2": ("pfc_on_several_priorities", 9, ["ens1f0np0", "ens1f1np1"]),
    "no_pfc_ecn:culprits=10": ("roce_without_pfc_or_ecn", 10, "all"),
    "mtu:culprits=11,mtu=1500,nics=1": ("roce_small_mtu", 11, ["ens1f0np0"]),
    "nic_numa:culprits=12,numa=3,nics=1": ("nic_numa_without_gpu", 12, ["ens1f0np0"]),
    "pcie_width:culprits=13,target=gpu,width=8,gpus=2": ("gpu_pcie_degraded", 13, ["gpu0", "gpu1"]),
}
SIM_NODES = 16


def simulated(tmp_path: Path, config_faults: list[str], faults: list[str] = (), confounders: list[str] = (),
              nodes: int = SIM_NODES, name: str = "sim.om.gz"):
    spec = SimSpec(cluster=ClusterParams(nodes=nodes), duration=1200.0,
                   faults=[parse_fault(x, 1200.0) for x in faults],
                   confounders=[parse_confounder(x) for x in confounders],
                   config_faults=[parse_config_fault(x) for x in config_faults])
    result = simulate(spec)
    path = tmp_path / name
    write_trace(result, path)
    return result, path


def expected_findings(result, table: dict) -> dict:
    rails = sorted(p.device for p in result.cluster.nics)
    out: dict[str, dict[str, list[str]]] = {}
    for check, node, devices in table.values():
        out.setdefault(check, {})[result.cluster.instances[node]] = rails if devices == "all" else devices
    return out


def audit_json(*args: str) -> dict:
    result = diagnose(*args, "--audit", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_simulated_healthy_fleet_gives_no_config_finding(tmp_path):
    # idle GPUs (Gen1 while idle), a spare port down, an exporter restart: all healthy configuration
    _, path = simulated(tmp_path, [], confounders=["unused_gpus:nodes=2,gpus=2", "spare_port:nodes=1",
                                                   "exporter_restart:nodes=1,at=10m"], nodes=6)
    doc = audit_json("--replay", str(path))
    assert doc["configuration"] == [] and not doc.get("notes"), doc


def test_simulated_misconfigurations_each_give_their_finding(tmp_path):
    result, path = simulated(tmp_path, list(SIM_FAULTS), faults=["link_degraded:start=0,dur=all,nics=1,speed=100G,"
                                                                 "culprits=14"],
                             confounders=["unused_gpus:nodes=#0,gpus=2"])
    doc = audit_json("--replay", str(path))
    found: dict[str, dict[str, list[str]]] = {}
    for f in doc["configuration"]:
        for node, devices in f["devices"].items():
            found.setdefault(f["check"], {}).setdefault(node, []).extend(devices)
    expected = expected_findings(result, SIM_FAULTS)
    slow = result.faults[0]
    expected["link_speed_below_fleet"] = {result.cluster.instances[14]: [result.cluster.nics[k].device
                                                                         for k in slow.nics]}
    # gpu_pcie_degraded twice in the table: one finding naming both nodes
    assert {k: {n: sorted(d) for n, d in v.items()} for k, v in found.items()} == \
        {k: {n: sorted(d) for n, d in v.items()} for k, v in expected.items()}
    # worst first
    order = [("high", "medium", "low").index(f["severity"]) for f in doc["configuration"]]
    assert order == sorted(order)


def test_runtime_culprit_carries_its_configuration(tmp_path):
    _, path = simulated(tmp_path, ["pcie_width:culprits=3,width=8"], faults=["pfc_storm:start=5m,dur=8m,culprits=3"],
                        nodes=8)
    result = diagnose("--replay", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    storm = [f for f in doc["findings"] if f["class"] == "pfc_storm"]
    assert storm and "node-004:9845" in storm[0]["nodes"]
    assert "nic_pcie_degraded" in storm[0]["evidence"]["configuration"]
    assert [f["check"] for f in doc["configuration"]] == ["nic_pcie_degraded"]
    text = diagnose("--replay", str(path)).stdout
    assert "Configuration (1 finding" in text and text.index("Configuration (") > text.index("1. PFC storm")


def test_audit_text_is_compact_for_a_large_fleet(tmp_path):
    _, path = simulated(tmp_path, ["mtu:culprits=" + "+".join(str(i) for i in range(0, 40, 2)) + ",mtu=9000"],
                        nodes=64)
    result = diagnose("--replay", str(path), "--audit")
    assert result.returncode == 0, result.stderr
    assert "20 nodes, 80 devices" in result.stdout and "and 16 more nodes" in result.stdout
    assert len(result.stdout.splitlines()) < 15


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_prometheus_gives_the_files_audit(tmp_path, served):
    result, path = simulated(tmp_path, list(SIM_FAULTS), confounders=["unused_gpus:nodes=#0,gpus=2"])
    from_file = audit_json("--replay", str(path))
    start, end = result.spec.start_time, result.spec.start_time + result.spec.duration
    url = served(path)
    from_server = audit_json("--prometheus", url, "--start", f"{start:.3f}", "--end", f"{end:.3f}")
    def key(doc):
        return ([(f["check"], f["devices"]) for f in doc["configuration"]])
    assert key(from_server) == key(from_file) and key(from_file)
    # ... and inside the full diagnosis from the server
    full = diagnose("--prometheus", url, "--start", f"{start:.3f}", "--end", f"{end:.3f}", "--format", "json")
    assert full.returncode == 0, full.stderr
    assert key(json.loads(full.stdout)) == key(from_file)
