"""The configuration audit: deployment mistakes that slow or endanger training,
read from the configuration snapshot (diagnoser/config.py), never from a source.

Each check says beside it why the setting matters physically; its thresholds are named.
A check yields one finding listing every node and device it concerns (not one per
device). Facts a node does not export are unknown: said once in a note, never flagged.
InfiniBand ports skip the Ethernet-only checks (PFC, ECN, trust, 802.3x pause, MTU, bonds).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from diagnoser.model.netconfig import ConfigSnapshot
from diagnoser.model.report import ConfigFinding, Finding
from gpunet.words import plural

SEVERITIES = ("high", "medium", "low")
GPU_BUSY_FOR_PCIE = 0.5  # a GPU busy at least half the window should hold its full PCIe speed
ROCE_HEADERS = 96  # GRH + UDP + BTH + extended headers + ICRC the kernel subtracts from the netdev MTU
ROCE_MTUS = (256, 512, 1024, 2048, 4096)  # RoCE path MTUs (IB MTU enumeration)
ROCE_GOOD_MTU = 4096  # below this, every message is cut into more, smaller packets
SPEED_TOLERANCE = 0.99  # a link below 99% of the fleet's usual speed trained lower
SPEED_PARTITION_SHARE = 0.15  # more nodes than this uniformly slower: a partition, not an accident
FLEET_MIN = 3  # NICs needed before "the fleet's usual value" means anything
LACP = ("802.3ad", "4")  # /proc/net/bonding spells it "IEEE 802.3ad Dynamic link aggregation", sysfs "802.3ad 4"
SHOWN = 3  # example details kept per finding


# check -> (severity, title, why it matters, what to do). Facts from the reference articles
# (on AI-cluster NICs, lossless RoCE fabric design and network selection), in
# our own words.
CHECKS = {
    "ecn_off_on_pfc_priority": (
        "high", "ECN/DCQCN off on the lossless (PFC) priority",
        "With PFC on but no ECN reaction, congestion is never signalled early: the only brake left is the pause "
        "frame, which stops the whole priority on the upstream port. Pauses spread hop by hop (head-of-line "
        "blocking for flows that are not congested) and can grow into PFC storms that freeze the ring.",
        "Enable RoCE congestion control on that priority at both points (notification and reaction: e.g. "
        "mlnx_qos / the NIC's roce_np/roce_rp ecn sysfs switches, or the vendor's DCQCN setting), and ECN marking "
        "on the switches' lossless queue, with a marking threshold well below the PFC Xoff threshold so that "
        "DCQCN slows senders before any pause is needed."),
    "roce_without_pfc_or_ecn": (
        "high", "RoCE with neither PFC nor ECN",
        "RoCE's go-back-N recovery assumes a network that neither drops nor stays congested: with no PFC and no "
        "ECN the fabric is lossy and uncontrolled, every switch-buffer overflow costs a retransmission of the "
        "whole window, and all-reduce throughput collapses under load.",
        "Configure the RoCE class end to end: PFC on one dedicated priority (e.g. 3) on NICs and switch ports, "
        "ECN marking on that queue and DCQCN on the NICs, trust DSCP so that packets land in that priority."),
    "pfc_on_several_priorities": (
        "medium", "PFC enabled on more than one priority",
        "Every lossless priority needs its own headroom buffer on every switch port and is one more class that "
        "pauses can spread through; storage or TCP traffic made lossless can then pause the training traffic "
        "(and the reverse).",
        "Keep PFC on the RoCE priority only (mlnx_qos --pfc 0,0,0,1,0,0,0,0 for priority 3) and make the same "
        "choice on the switches."),
    "pfc_priority_mismatch": (
        "medium", "PFC priorities differ across the fleet",
        "A node whose lossless priority is not the fleet's sends RoCE into a lossy queue (drops, go-back-N) or "
        "pauses a queue its peers do not expect to be paused.",
        "Apply the fleet's PFC priority set to the named NICs (and check the provisioning that left them "
        "different)."),
    "trust_mismatch": (
        "medium", "QoS trust mode differs across the fleet",
        "The NIC classifies received packets into priorities by DSCP or by the VLAN PCP bits; a node trusting "
        "the other field puts RoCE in the wrong, lossy queue, where it gets dropped instead of paused.",
        "Set the fleet's trust mode on the named NICs (mlnx_qos --trust dscp) and map the RoCE DSCP to the "
        "lossless priority, as on the switches."),
    "link_pause_with_pfc": (
        "medium", "Global 802.3x pause on while PFC is on",
        "Link-level pause stops every traffic class of the port at once, so a congested bulk flow can freeze the "
        "RoCE class; many NICs ignore PFC while it is on.",
        "Turn global pause off on the fabric NICs (ethtool -A <dev> rx off tx off) and rely on PFC on the RoCE "
        "priority."),
    "nic_numa_without_gpu": (
        "medium", "Fabric NIC on a NUMA node without GPUs",
        "GPUDirect RDMA traffic between a GPU and a NIC on another socket crosses the inter-socket link (or "
        "bounces through host memory): lower bandwidth and higher latency for every collective on that rail.",
        "Move the NIC to a slot under the GPUs' socket (ideally the same PCIe switch as its GPUs), or fix the "
        "NIC-to-GPU mapping (NCCL topology), and pin its interrupts to CPUs of that NUMA node."),
    "gpu_numa_without_nic": (
        "medium", "GPUs on a NUMA node without a fabric NIC",
        "These GPUs reach the fabric only through a NIC on the other socket: their share of every all-reduce "
        "crosses the inter-socket link.",
        "Give each socket's GPUs a NIC on that socket (one rail per GPU pair or per GPU), or check that the "
        "firmware reports the NUMA node right (numa_node -1 or a BIOS setting such as NPS)."),
    "nic_pcie_degraded": (
        "high", "Fabric NIC's PCIe link trained below its maximum",
        "A NIC that trained with fewer lanes or a lower generation (a bad riser or seating, a retimer problem, "
        "a slot wired narrower) cannot move its line rate between the wire and GPU memory: the link looks "
        "healthy while RDMA stalls at the PCIe limit.",
        "Reseat the card or riser, check the slot's wiring and the BIOS's bifurcation and link speed settings, "
        "and that long Gen5 paths have their retimers; lspci -vv shows LnkSta against LnkCap."),
    "nic_pcie_too_slow": (
        "high", "Fabric NIC's PCIe slot slower than its link",
        "At full training the slot gives less than the network link: the NIC can never run at line rate "
        "(e.g. a 400G NIC needs Gen5 x16; Gen4 x16 gives about 250 Gb/s).",
        "Put the NIC in a slot of the generation and width it needs (Gen5 x16 for 400G, Gen4 x16 for 200G), or "
        "run the link at the speed the slot can carry."),
    "gpu_pcie_degraded": (
        "medium", "GPU's PCIe link below its maximum while busy",
        "A busy GPU on fewer lanes or a lower generation moves host and GPUDirect traffic slower: data loading, "
        "checkpoints and the NIC-to-GPU path of every collective. (An idle GPU lowering its PCIe speed is normal "
        "power saving and is not reported.)",
        "Reseat the GPU or its riser, check the slot's bifurcation and retimers, and nvidia-smi -q -d PCIE "
        "under load; drain the node if it does not recover."),
    "link_speed_below_fleet": (
        "high", "Fabric link slower than the fleet's",
        "A synchronous job runs at the pace of its slowest link: one port at half its peers' speed halves the "
        "ring's throughput for everyone.",
        "Check what the port negotiated (ethtool <dev>, ibstat), the cable or optic and the switch port's "
        "configured speed; replace the cable or optic or fix the port speed."),
    "mtu_mismatch": (
        "low", "MTU differs across the fabric",
        "Peers with different MTUs either drop the larger frames (black-holed connections) or send more, "
        "smaller packets; the RoCE path MTU is negotiated down to the smaller side.",
        "Set the fleet's MTU on the named NICs (and check the switch ports carry it end to end)."),
    "roce_small_mtu": (
        "medium", "RoCE fabric MTU too small",
        "The RoCE path MTU is the largest of 256..4096 bytes that fits the netdev MTU less the RoCE headers: at "
        "MTU 1500 it drops to 1024, four times the packets (and per-packet work) of 4096 for the same bytes.",
        "Raise the fabric NICs' MTU to 4200 or 9000 (and the switch ports), so that RoCE runs with a 4096-byte "
        "path MTU."),
    "bond_not_lacp": (
        "medium", "Bond over fabric NICs not in 802.3ad",
        "Active-backup leaves the other ports idle and balance modes without LACP confuse the switch's "
        "forwarding: the node gets a fraction of the bandwidth it was cabled for.",
        "Use mode 4 (802.3ad LACP) with a matching LACP port-channel on the switch."),
    "bond_layer2_hash": (
        "medium", "802.3ad bond hashing on layer 2 only",
        "Hashing on MAC addresses puts all traffic to one peer (a gateway, one ring neighbour) on one member: "
        "the others stay idle.",
        "Set xmit_hash_policy layer3+4 (or encap3+4) so that flows spread over the members."),
    "bond_member_down": (
        "high", "Bond member down",
        "The bond carries on with fewer ports: less bandwidth, and no redundancy left.",
        "Check the member's cable, optic and switch port (ip link, ethtool, the switch's LACP state); replace "
        "what failed."),
}


def pcie_bandwidth(transfers_per_s: float, lanes: float) -> float:
    """Bytes/s a PCIe link carries after line encoding: 8b/10b up to Gen2 (5 GT/s),
    128b/130b from Gen3 (8 GT/s)."""
    encoding = 128 / 130 if transfers_per_s >= 8e9 else 8 / 10
    return transfers_per_s * lanes * encoding / 8


def roce_path_mtu(mtu: float) -> int:
    fits = [m for m in ROCE_MTUS if m <= mtu - ROCE_HEADERS]
    return fits[-1] if fits else 0


def _gbit(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e9:.0f} Gb/s"


def _known(x) -> bool:
    return x is not None and not (isinstance(x, float) and np.isnan(x))


class _View:
    """The snapshot as plain dictionaries, with the fabric and RoCE NICs resolved."""

    def __init__(self, cfg: ConfigSnapshot):
        self.nic = dict(cfg.nic.to_dict("index").items())
        for r in self.nic.values():
            # The exporter's gpunet_nic_fabric where exported, else NICs with an RDMA device.
            r["is_fabric"] = bool(r["fabric"] > 0) if _known(r["fabric"]) else _known(r["rdma_device"])
            r["ethernet"] = r["link_layer"] == "Ethernet"
            r["roce"] = r["is_fabric"] and r["ethernet"] and _known(r["rdma_device"])
        self.fabric = {k: r for k, r in self.nic.items() if r["is_fabric"]}
        self.roce = {k: r for k, r in self.fabric.items() if r["roce"]}
        self.pfc = _nested(cfg.pfc)
        self.ecn = _nested(cfg.ecn)
        self.pause = _nested(cfg.link_pause)
        self.gpu: dict[str, dict[str, dict]] = {}
        for (inst, g), r in cfg.gpu.to_dict("index").items():
            self.gpu.setdefault(inst, {})[g] = r
        self.bond = cfg.bond.to_dict("index")
        self.members: dict[tuple[str, str], dict[str, float]] = {}
        for (inst, b, dev), r in cfg.bond_member.to_dict("index").items():
            self.members.setdefault((inst, b), {})[dev] = r["up"]
        self.job_of = cfg.job_of


def _nested(df: pd.DataFrame) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for key, r in df.to_dict("index").items():
        if _known(r["enabled"]):
            rest = key[2:] if len(key) > 3 else key[2]
            out.setdefault(key[:2], {})[rest] = r["enabled"] > 0
    return out


Hit = tuple[str, str, str]  # (instance, device, what was seen)


def _majority(values: dict) -> object | None:
    """The value more than half of the keys share, if any."""
    if len(values) < FLEET_MIN:
        return None
    value, n = Counter(values.values()).most_common(1)[0]
    return value if n * 2 > len(values) else None


def _usual_among_peers(values: dict[tuple, object], job_of: dict[str, str]) -> dict[tuple, object | None]:
    """Each (instance, device)'s usual value: among its job's nodes where the node's job is
    known (another job may run other hardware by design), the value they all share or their
    majority; else the fleet's."""
    fleet = _majority(values)
    by_job: dict[str | None, dict[tuple, object]] = {}
    for key, value in values.items():
        by_job.setdefault(job_of.get(key[0]), {})[key] = value
    out = {}
    for job, members in by_job.items():
        shared = set(members.values())
        usual = None if job is None else next(iter(shared)) if len(shared) == 1 else _majority(members)
        for key in members:
            out[key] = usual if usual is not None else fleet
    return out


# --- the checks: each returns its hits and, where facts are missing, one note ---------------

def check_ecn(v: _View) -> tuple[dict[str, list[Hit]], list[str]]:
    hits: dict[str, list[Hit]] = {"ecn_off_on_pfc_priority": [], "roce_without_pfc_or_ecn": []}
    unknown = 0
    for key, _r in v.roce.items():
        pfc, ecn = v.pfc.get(key), v.ecn.get(key)
        if pfc is None:
            unknown += 1
            continue
        on = sorted(p for p, enabled in pfc.items() if enabled and p.isdigit())
        if on:
            if ecn is None:
                unknown += 1
                continue
            off = {p: [pt for pt in ("notification", "reaction") if ecn.get((p, pt)) is False] for p in on}
            # The RoCE priority is the lossless one with ECN: flagged when none of them has it at
            # both points (a second lossless class without ECN is pfc_on_several_priorities').
            if all(off.values()):
                hits["ecn_off_on_pfc_priority"].append(
                    (*key, "; ".join(f"priority {p}: ECN {' and '.join(pts)} point off" for p, pts in off.items())))
        elif ecn is not None and not any(ecn.values()):
            hits["roce_without_pfc_or_ecn"].append((*key, "no PFC priority, no ECN on any priority"))
        elif ecn is None:
            unknown += 1
    return hits, [f"PFC/ECN state unknown on {plural(unknown, 'RoCE NIC')}"] if unknown else []


def check_pfc(v: _View) -> tuple[dict[str, list[Hit]], list[str]]:
    hits: dict[str, list[Hit]] = {"pfc_on_several_priorities": [], "pfc_priority_mismatch": [],
                                  "trust_mismatch": [], "link_pause_with_pfc": []}
    sets = {}
    for key in v.roce:
        if key in v.pfc:
            sets[key] = tuple(sorted(p for p, on in v.pfc[key].items() if on and p.isdigit()))
    for key, prios in sets.items():
        if len(prios) > 1:  # each lossless priority: its own headroom, one more path for pauses
            hits["pfc_on_several_priorities"].append((*key, f"PFC on priorities {','.join(prios)}"))
    usual_of = _usual_among_peers(sets, v.job_of)
    for key, prios in sets.items():
        usual = usual_of[key]
        # Reported once: several priorities, or no PFC and no ECN at all, are their own findings.
        uncontrolled = not prios and key in v.ecn and not any(v.ecn[key].values())
        if usual is not None and prios != usual and len(prios) <= 1 and not uncontrolled:
            hits["pfc_priority_mismatch"].append(
                (*key, f"PFC on {','.join(prios) or 'no priority'} where its peers have {','.join(usual) or 'none'}"))
    trust = {k: r["trust"] for k, r in v.roce.items() if _known(r["trust"])}
    usual_of = _usual_among_peers(trust, v.job_of)
    for key, t in trust.items():
        if usual_of[key] is not None and t != usual_of[key]:
            hits["trust_mismatch"].append((*key, f"trust {t} where its peers trust {usual_of[key]}"))
    for key, r in v.fabric.items():
        if not r["ethernet"] or key not in v.pause or key not in v.pfc:
            continue
        directions = sorted(d for d, on in v.pause[key].items() if on)
        if directions and any(v.pfc[key].values()):
            hits["link_pause_with_pfc"].append((*key, f"802.3x pause on ({'/'.join(directions)}) with PFC on"))
    return hits, []


def check_numa(v: _View) -> tuple[dict[str, list[Hit]], list[str]]:
    hits: dict[str, list[Hit]] = {"nic_numa_without_gpu": [], "gpu_numa_without_nic": []}
    unknown = set()
    nodes = {inst for inst, _ in v.fabric}
    for inst in sorted(nodes):
        nics = {dev: r["numa_node"] for (i, dev), r in v.fabric.items() if i == inst}
        gpus = {g: r["numa_node"] for g, r in v.gpu.get(inst, {}).items()}
        if not gpus:
            continue  # no GPU facts: nothing to compare with
        nic_numa = {n for n in nics.values() if _known(n)}
        gpu_numa = {n for n in gpus.values() if _known(n)}
        if not nic_numa or not gpu_numa:
            unknown.add(inst)
            continue
        if len(nic_numa | gpu_numa) < 2:
            continue  # a single-NUMA node: nothing can be on the wrong one
        for dev, n in sorted(nics.items()):
            if _known(n) and n not in gpu_numa:
                hits["nic_numa_without_gpu"].append(
                    (inst, dev, f"NIC on NUMA {n}, GPUs on {','.join(sorted(gpu_numa))}"))
        if nic_numa - gpu_numa:
            continue  # a NIC on the wrong socket: one cause, reported above, not again for its GPUs
        for g, n in sorted(gpus.items(), key=lambda x: (len(x[0]), x[0])):
            if _known(n) and n not in nic_numa:
                hits["gpu_numa_without_nic"].append(
                    (inst, f"gpu{g}", f"GPU on NUMA {n}, fabric NICs on {','.join(sorted(nic_numa))}"))
    return hits, [f"NUMA placement unknown on {plural(len(unknown), 'node')} (numa_node not reported)"] if unknown else []


def check_pcie(v: _View) -> tuple[dict[str, list[Hit]], list[str]]:
    hits: dict[str, list[Hit]] = {"nic_pcie_degraded": [], "nic_pcie_too_slow": [], "gpu_pcie_degraded": []}
    unknown_nic, unknown_gpu = 0, 0
    for key, r in v.fabric.items():
        cur_s, max_s, cur_w, max_w = r["pcie_speed"], r["pcie_max_speed"], r["pcie_width"], r["pcie_max_width"]
        if not all(_known(x) and x > 0 for x in (cur_s, max_s, cur_w, max_w)):
            unknown_nic += 1
            continue
        trained = pcie_bandwidth(cur_s, cur_w)
        link = r["speed"] if _known(r["speed"]) and r["speed"] > 0 else None
        short = f", {_gbit(trained)} < link {_gbit(link)}" if link and trained < link else ""
        if cur_w < max_w or cur_s < max_s:
            hits["nic_pcie_degraded"].append(
                (*key, f"PCIe {cur_s / 1e9:g} GT/s x{cur_w:.0f} of {max_s / 1e9:g} GT/s x{max_w:.0f}{short}"))
        elif short:
            hits["nic_pcie_too_slow"].append((*key, f"PCIe {cur_s / 1e9:g} GT/s x{cur_w:.0f}{short}"))
    for inst, gpus in v.gpu.items():
        for g, r in gpus.items():
            cur_s, max_s, cur_w, max_w = r["pcie_speed"], r["pcie_max_speed"], r["pcie_width"], r["pcie_max_width"]
            if not any(_known(x) for x in (cur_s, max_s, cur_w, max_w)):
                continue  # the exporter gives no PCIe facts for GPUs (counted once below)
            seen = []
            if _known(cur_w) and _known(max_w) and cur_w < max_w:
                seen.append(f"x{cur_w:.0f} of x{max_w:.0f}")
            if _known(cur_s) and _known(max_s) and cur_s < max_s:
                if not _known(r["busy"]):
                    unknown_gpu += 1
                elif r["busy"] >= GPU_BUSY_FOR_PCIE:  # idle GPUs lower their link speed: normal
                    seen.append(f"{cur_s / 1e9:g} of {max_s / 1e9:g} GT/s while {100 * r['busy']:.0f}% busy")
            if seen:
                hits["gpu_pcie_degraded"].append((inst, f"gpu{g}", "PCIe " + ", ".join(seen)))
    notes = []
    if unknown_nic:
        notes.append(f"PCIe link unknown on {plural(unknown_nic, 'fabric NIC')}")
    if unknown_gpu:
        notes.append(f"{plural(unknown_gpu, 'GPU')} below their PCIe speed with busy time unknown: not judged")
    return hits, notes


def check_links(v: _View) -> tuple[dict[str, list[Hit]], list[str]]:
    hits: dict[str, list[Hit]] = {"link_speed_below_fleet": [], "mtu_mismatch": [], "roce_small_mtu": []}
    notes = []
    speeds = {k: r["speed"] for k, r in v.fabric.items() if _known(r["speed"]) and r["speed"] > 0}
    usual_of = _usual_among_peers(speeds, v.job_of)
    if any(u is not None for u in usual_of.values()):
        slow = {k: s for k, s in speeds.items() if usual_of[k] is not None and s < SPEED_TOLERANCE * usual_of[k]}
        fastest = {}
        for (inst, _), s in speeds.items():
            fastest[inst] = max(fastest.get(inst, 0.0), s)
        # Nodes of no known job are compared with the whole fleet: there, many uniformly
        # slower nodes are a partition built so (another job's hardware): said in a note,
        # not flagged. A port slower than its node's other rails trained low (rails are
        # cabled alike), and so did one slower than its own job's.
        unjobbed = {inst for inst, _ in slow if inst not in v.job_of}
        nodes = {inst for inst, _ in speeds}
        by_design = len(unjobbed) > max(1, SPEED_PARTITION_SHARE * len(nodes))
        for key, s in slow.items():
            if not by_design or key[0] in v.job_of or s < SPEED_TOLERANCE * fastest[key[0]]:
                hits["link_speed_below_fleet"].append((*key, f"{_gbit(s)} where its peers run {_gbit(usual_of[key])}"))
        if by_design and len(hits["link_speed_below_fleet"]) < len(slow):
            usual = _majority(speeds)
            notes.append(f"{len(unjobbed)} nodes run their fabric below the fleet's {_gbit(usual)}: taken as a "
                         f"partition built so (over {SPEED_PARTITION_SHARE:.0%} of the nodes), not flagged")
    elif len(speeds) >= FLEET_MIN and len(set(speeds.values())) > 1:
        notes.append("fabric link speeds are split with no majority: speeds not compared")
    small = set()
    for key, r in v.roce.items():
        if _known(r["mtu"]) and roce_path_mtu(r["mtu"]) < ROCE_GOOD_MTU:
            small.add(key)
            hits["roce_small_mtu"].append((*key, f"MTU {r['mtu']:.0f}: RoCE path MTU {roce_path_mtu(r['mtu'])}"))
    mtus = {k: r["mtu"] for k, r in v.fabric.items() if r["ethernet"] and _known(r["mtu"])}
    usual_of = _usual_among_peers(mtus, v.job_of)
    for key, m in mtus.items():
        usual_mtu = usual_of[key]
        if usual_mtu is not None and m != usual_mtu and key not in small:  # too small for RoCE: its own finding
            hits["mtu_mismatch"].append((*key, f"MTU {m:.0f} where its peers use {usual_mtu:.0f}"))
    return hits, notes


def check_bonds(v: _View) -> tuple[dict[str, list[Hit]], list[str]]:
    hits: dict[str, list[Hit]] = {"bond_not_lacp": [], "bond_layer2_hash": [], "bond_member_down": []}
    for (inst, bond), r in v.bond.items():
        members = v.members.get((inst, bond), {})
        carries_data = (inst, bond) in v.fabric or any((inst, d) in v.fabric for d in members)
        mode, policy = r["mode"], r["xmit_hash_policy"]
        if carries_data and _known(mode):
            lacp = "802.3ad" in str(mode) or str(mode).strip() in LACP
            if not lacp:
                hits["bond_not_lacp"].append((inst, bond, f"mode {mode}"))
            elif _known(policy) and str(policy).split()[0] == "layer2":
                hits["bond_layer2_hash"].append((inst, bond, f"802.3ad with xmit_hash_policy {policy}"))
        down = sorted(d for d, up in members.items() if _known(up) and up == 0)
        if down:
            members_down = "member" if len(down) == 1 else "members"
            hits["bond_member_down"].append((inst, bond, f"{members_down} down: {', '.join(down)}"))
    return hits, []


ALL_CHECKS = (check_ecn, check_pfc, check_numa, check_pcie, check_links, check_bonds)


def audit(cfg: ConfigSnapshot) -> tuple[list[ConfigFinding], list[str]]:
    """Findings, worst first (severity, then nodes affected), and notes on what is unknown."""
    view = _View(cfg)
    notes = list(cfg.notes)
    if cfg.empty:
        return [], ["no configuration series in the window: the configuration audit is unknown"]
    facts = any(not t.empty for t in (cfg.pfc, cfg.ecn, cfg.link_pause, cfg.bond)) or \
        cfg.nic[["mtu", "trust", "pcie_width", "pcie_speed"]].notna().any().any()
    if not facts:  # an exporter without the configuration collectors: one note, not one per check
        notes.append("no configuration facts (PFC/ECN, trust, MTU, PCIe, bonds) in the window: those checks are "
                     "unknown; NUMA placement and link speeds were checked")
    findings = []
    for check in ALL_CHECKS:
        hits, missing = check(view)
        notes.extend(n for n in missing if facts or not n.startswith(("PFC/ECN", "PCIe")))
        for name, found in hits.items():
            if found:
                findings.append(_finding(name, found))
    findings.sort(key=lambda f: (SEVERITIES.index(f.severity), -len(f.nodes), f.check))
    return findings, notes


def _finding(check: str, hits: list[Hit]) -> ConfigFinding:
    severity, title, why, fix = CHECKS[check]
    devices: dict[str, list[str]] = {}
    for inst, dev, _ in sorted(hits):
        devices.setdefault(inst, []).append(dev)
    details = Counter(what for _, _, what in hits)
    detail = "; ".join(f"{what}" + (f" (x{n})" if n > 1 else "") for what, n in details.most_common(SHOWN))
    if len(details) > SHOWN:
        detail += f"; and {len(details) - SHOWN} more"
    evidence = {"nodes": len(devices), "devices": len(hits),
                "seen": [f"{inst} {dev}: {what}" for inst, dev, what in sorted(hits)[:SHOWN]]}
    return ConfigFinding(check, severity, title, sorted(devices), devices, detail, evidence, why, fix)


XREF_SHOWN = 4  # configuration facts added to a runtime finding's evidence
XREF_DEVICES = 4  # devices named per node in it


def cross_reference(findings: list[Finding], configuration: list[ConfigFinding]) -> None:
    """Each runtime finding's culprits' configuration findings, in its evidence: a PFC storm
    on a node whose ECN is off says so."""
    for runtime in findings:
        related = []
        for node in runtime.nodes:
            for f in configuration:
                if node in f.devices:
                    related.append(f"{node}: {f.check} ({', '.join(f.devices[node][:XREF_DEVICES])})")
        if related:
            runtime.evidence["configuration"] = "; ".join(related[:XREF_SHOWN]) + (
                f"; and {len(related) - XREF_SHOWN} more" if len(related) > XREF_SHOWN else "")
