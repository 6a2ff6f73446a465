"""The configuration facts a node's exporter reports, as constant gauges, and the
configuration faults that change them on chosen nodes (--config-fault, params.ConfigFaultSpec).

Healthy by default, as a well-run RoCE fabric is set up: PFC on the RoCE priority only, ECN
(DCQCN) at both points on it, trust DSCP, no 802.3x pause on the fabric, MTU 4200 (9000
when the job runs over TCP sockets), NICs at PCIe Gen4 x16 up to 200G and Gen5 x16 above,
GPUs at Gen5 x16 (an unused GPU idles at Gen1, as real GPUs save power), NUMA placement as
cluster.py gives it (each GPU on its rail's NUMA node). No bond unless a fault adds one.

Config faults change facts only, never the physics: a link speed fault is link_degraded's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpunet import contract as C
from gpunet.simulate.params import ConfigFaultSpec, SimSpec

GEN1, GEN4, GEN5 = 2.5e9, 16e9, 32e9  # PCIe transfers/s per lane
MGMT_PCIE = (8e9, 8)  # the management NIC: Gen3 x8


def nic_pcie_gen(speed_bytes: float) -> float:
    """The generation a NIC of that link speed is built for: Gen4 x16 carries ~250 Gb/s."""
    return GEN4 if speed_bytes * 8 <= 200e9 else GEN5


def _applies(fault: ConfigFaultSpec, node: int) -> bool:
    return node in fault.culprits


def emit(spec: SimSpec, ports: list, mgmt, gpus: list, node: int, used: np.ndarray, n: int,
         add: Callable[[str, dict, np.ndarray], None]) -> None:
    """Add the node's configuration gauges (constant over the trace) through `add`."""
    ones = np.ones(n)
    f, cl = spec.fabric, spec.cluster
    prio = f.pfc_priority
    faults = [x for x in spec.config_faults if _applies(x, node)]
    mtu = 4200.0 if spec.job.transport == "rdma" else 9000.0
    gen = nic_pcie_gen(cl.nic_speed)
    nic_pcie = {p.device: [gen, gen, 16.0, 16.0] for p in ports}  # current, max speed; current, max width
    nic = {p.device: {"pfc": {prio}, "ecn": {(prio, "notification"), (prio, "reaction")}, "trust": "dscp",
                      "pause": set(), "mtu": mtu} for p in ports}
    gpu_pcie = {g.index: [GEN5 if used[k] else GEN1, GEN5, 16.0, 16.0] for k, g in enumerate(gpus)}
    bond = None
    for x in faults:
        o = x.params
        rails = [p.device for p in ports][:int(o["nics"])] if "nics" in o else [p.device for p in ports]
        chosen = [g.index for g in gpus][:int(o["gpus"])] if "gpus" in o else [g.index for g in gpus]
        for dev in rails:
            d = nic[dev]
            if x.kind == "ecn_off":
                points = ("notification", "reaction") if o.get("point", "both") == "both" else (o["point"],)
                d["ecn"] -= {(o.get("priority", prio), pt) for pt in points}
            elif x.kind == "no_pfc_ecn":
                d["pfc"], d["ecn"] = set(), set()
            elif x.kind == "pfc_extra":
                d["pfc"].add(o.get("priority", "4"))
            elif x.kind == "trust":
                d["trust"] = o.get("value", "pcp")
            elif x.kind == "link_pause":
                d["pause"] = set(C.DIRECTIONS) if o.get("direction", "both") == "both" else {o["direction"]}
            elif x.kind == "mtu":
                d["mtu"] = float(o.get("mtu", "1500"))
            elif x.kind in ("pcie_width", "pcie_speed") and o.get("target", "nic") == "nic":
                if x.kind == "pcie_width":
                    nic_pcie[dev][2] = float(o.get("width", "8"))
                else:
                    nic_pcie[dev][0] = float(o.get("speed", "8")) * 1e9
        if x.kind in ("pcie_width", "pcie_speed") and o.get("target") == "gpu":
            for g in chosen:
                if x.kind == "pcie_width":
                    gpu_pcie[g][2] = float(o.get("width", "8"))
                else:
                    gpu_pcie[g][0] = min(gpu_pcie[g][0], float(o.get("speed", "8")) * 1e9)
        if x.kind == "bond":
            bond = (o.get("mode", "802.3ad"), o.get("hash", "layer3+4"), int(o.get("down", "0")))

    for p in ports:
        d, dev = nic[p.device], {"device": p.device}
        if f.infiniband:  # no DCB, no 802.3x, no trust mode: only the port's MTU and PCIe
            add(C.NIC_MTU.name, dev, 4096.0 * ones)
            _pcie(add, dev, nic_pcie[p.device], ones, gpu=False)
            continue
        for q in range(8):
            add(C.NIC_PFC_ENABLED.name, {**dev, "priority": str(q)}, float(str(q) in d["pfc"]) * ones)
            for pt in C.ECN_POINTS:
                add(C.NIC_ECN_ENABLED.name, {**dev, "priority": str(q), "point": pt},
                    float((str(q), pt) in d["ecn"]) * ones)
        for direction in C.DIRECTIONS:
            add(C.NIC_LINK_PAUSE_ENABLED.name, {**dev, "direction": direction}, float(direction in d["pause"]) * ones)
        add(C.NIC_QOS_TRUST_INFO.name, {**dev, "trust": d["trust"]}, ones)
        add(C.NIC_MTU.name, dev, d["mtu"] * ones)
        _pcie(add, dev, nic_pcie[p.device], ones, gpu=False)
    # the management NIC: 802.3x pause on, as many LOMs ship (it carries no RoCE, so that is fine)
    dev = {"device": mgmt.device}
    for direction in C.DIRECTIONS:
        add(C.NIC_LINK_PAUSE_ENABLED.name, {**dev, "direction": direction}, ones)
    add(C.NIC_MTU.name, dev, 1500 * ones)
    _pcie(add, dev, [MGMT_PCIE[0], MGMT_PCIE[0], MGMT_PCIE[1], MGMT_PCIE[1]], ones, gpu=False)
    for g in gpus:
        _pcie(add, {"gpu": g.index}, gpu_pcie[g.index], ones, gpu=True)
    if bond is not None and len(ports) >= 2:
        mode, policy, down = bond
        add(C.BOND_INFO.name, {"bond": "bond0", "mode": mode, "xmit_hash_policy": policy}, ones)
        for k, p in enumerate(ports[:2]):
            add(C.BOND_MEMBER_UP.name, {"bond": "bond0", "device": p.device}, float(k >= down) * ones)


def numa_of(spec: SimSpec, node: int, port) -> str:
    """The NUMA node the node's NIC reports (a nic_numa fault moves it)."""
    numa = port.numa_node
    for x in spec.config_faults:
        if x.kind == "nic_numa" and _applies(x, node):
            rails = int(x.params["nics"]) if "nics" in x.params else None
            index = int(port.rdma_device.removeprefix("mlx5_")) if port.rdma_device.startswith("mlx5_") else -1
            if index >= 0 and (rails is None or index < rails):
                numa = x.params.get("numa", "2")
    return numa


def _pcie(add, labels: dict, facts: list[float], ones: np.ndarray, gpu: bool) -> None:
    cur_s, max_s, cur_w, max_w = facts
    metrics = (C.GPU_PCIE_CURRENT_SPEED, C.GPU_PCIE_MAX_SPEED, C.GPU_PCIE_CURRENT_WIDTH, C.GPU_PCIE_MAX_WIDTH) if gpu \
        else (C.NIC_PCIE_CURRENT_SPEED, C.NIC_PCIE_MAX_SPEED, C.NIC_PCIE_CURRENT_WIDTH, C.NIC_PCIE_MAX_WIDTH)
    for m, value in zip(metrics, (cur_s, max_s, cur_w, max_w)):
        add(m.name, labels, value * ones)
