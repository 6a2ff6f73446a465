"""The cluster's identity: instance names, NIC ports and GPUs, as the exporter would label them.

Device names follow what the exporter reports on real machines (docs/metrics.md):
ConnectX RoCE ports are netdevs ``ens<slot>f<fn>np<fn>`` with RDMA devices ``mlx5_<n>``,
the management NIC a plain netdev (``eno1``, no RDMA, so not part of the training fabric).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from gpunet.simulate.params import ClusterParams

MGMT_DEVICE = "eno1"


def hostname(style: str, index: int, gpu_model: str = "") -> str:
    """The node's hostname in one of the styles clusters use (index is 0-based)."""
    n = index + 1
    if style == "node":
        return f"node-{n:03d}" if n < 1000 else f"node-{n}"
    if style == "rack":  # gpu-h100-r12-u07: four 4U servers per rack
        model = re.search(r"\b([AHBL]\d{2,3}|GB\d{3})\b", gpu_model)
        short = model.group(1).lower() if model else "gpu"
        return f"gpu-{short}-r{index // 4 + 1:02d}-u{(index % 4) * 4 + 3:02d}"
    if style == "dgx":
        return f"dgx{n:03d}.cluster.local"
    if style == "ip":  # hosts named after their address, 10.0.3.17 -> 10-0-3-17
        return f"10-0-{index // 250}-{index % 250 + 10}"
    raise ValueError(style)


@dataclass(frozen=True)
class NicPort:
    device: str
    rdma_device: str  # "" for the management NIC
    port: str
    driver: str
    numa_node: str
    pci_address: str

    @property
    def fabric(self) -> bool:  # the exporter's default: NICs with an RDMA device decide network_state
        return bool(self.rdma_device)


@dataclass(frozen=True)
class GpuDev:
    index: str
    uuid: str
    pci_address: str
    numa_node: str


def rdma_ports(count: int, first: int = 0) -> list[NicPort]:
    """`count` RoCE ports, two functions per PCI slot as on dual-port ConnectX cards; the
    first half of the rails on NUMA node 0, the rest on node 1 (one rail per GPU pair)."""
    out = []
    for k in range(first, first + count):
        slot, fn = k // 2 + 1, k % 2
        bus = 0x17 + 0x20 * (k // 2)
        numa = "0" if k < max(first + count, 2) / 2 else "1"
        out.append(NicPort(f"ens{slot}f{fn}np{fn}", f"mlx5_{k}", "1", "mlx5_core", numa, f"0000:{bus:02x}:00.{fn}"))
    return out


def mgmt_port(speed_bytes: float) -> NicPort:
    driver = "igb" if speed_bytes <= 1e9 / 8 else "ixgbe" if speed_bytes <= 10e9 / 8 else "bnxt_en"
    return NicPort(MGMT_DEVICE, "", "", driver, "0", "0000:02:00.0")


def gpus(count: int, host: str, nics: int = 2) -> list[GpuDev]:
    """Each GPU on the NUMA node of its rail's NIC (GPU g uses rail g * nics // count)."""
    rails = rdma_ports(nics)
    out = []
    for g in range(count):
        h = hashlib.sha1(f"{host}/{g}".encode()).hexdigest()
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        bus = 0x18 + 0x10 * g
        out.append(GpuDev(str(g), uuid, f"00000000:{bus:02X}:00.0", rails[g * nics // count].numa_node))
    return out


@dataclass
class Cluster:
    params: ClusterParams
    hosts: list[str]
    instances: list[str]
    nics: list[NicPort]  # the RDMA rails, same on every node
    mgmt: NicPort
    gpus: list[list[GpuDev]]  # per node

    @classmethod
    def build(cls, p: ClusterParams) -> Cluster:
        hosts = [hostname(p.hostname_style, i, p.gpu_model) for i in range(p.nodes)]
        return cls(p, hosts, [f"{h}:{p.port}" for h in hosts], rdma_ports(p.nics), mgmt_port(p.mgmt_speed),
                   [gpus(p.gpus, h, p.nics) for h in hosts])

    def spare_port(self) -> NicPort:
        """An extra RDMA port (second function of the last card, or a card of its own)."""
        return rdma_ports(1, first=self.params.nics)[0]
