"""PCIe links of the NICs and GPUs: the speed and width each trained at and the most it
supports (a NIC at x8 of x16, or at Gen3 in a Gen4 slot, halves its bandwidth)."""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.readers.gpus import GpuSource
from exporter.readers.pci import PcieLink, address_pcie_link, netdev_pcie_link, rdma_pcie_link
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import (
    GPU_PCIE_CURRENT_SPEED,
    GPU_PCIE_CURRENT_WIDTH,
    GPU_PCIE_MAX_SPEED,
    GPU_PCIE_MAX_WIDTH,
    NIC_PCIE_CURRENT_SPEED,
    NIC_PCIE_CURRENT_WIDTH,
    NIC_PCIE_MAX_SPEED,
    NIC_PCIE_MAX_WIDTH,
)

NIC_METRICS = (NIC_PCIE_CURRENT_SPEED, NIC_PCIE_MAX_SPEED, NIC_PCIE_CURRENT_WIDTH, NIC_PCIE_MAX_WIDTH)
GPU_METRICS = (GPU_PCIE_CURRENT_SPEED, GPU_PCIE_MAX_SPEED, GPU_PCIE_CURRENT_WIDTH, GPU_PCIE_MAX_WIDTH)


class PcieCollector:
    name = "pcie"

    def __init__(self, root: Root, gpus: GpuSource | None = None):
        self.root = root
        self.gpus = gpus

    def refresh_key(self) -> tuple[str, ...]:
        """Besides the NICs, what forces a fresh read when it changes: the GPUs' addresses."""
        return tuple(g.pci_address for g in self.gpus.identities) if self.gpus is not None else ()

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        for nic in ctx.nics.values():
            if nic.netdev:
                link = netdev_pcie_link(self.root, nic.netdev, errors)
            elif nic.rdma is not None:
                link = rdma_pcie_link(self.root, nic.rdma.device, errors)
            else:
                continue
            samples.extend(_samples(NIC_METRICS, nic.device, link))
        for gpu in self.gpus.identities if self.gpus is not None else []:
            if gpu.pci_address:
                link = address_pcie_link(self.root, gpu.pci_address, errors)
                samples.extend(_samples(GPU_METRICS, str(gpu.index), link))
        return samples


def _samples(metrics, label: str, link: PcieLink) -> list[Sample]:
    return [Sample(metric, (label,), float(value)) for metric, value in zip(metrics, link) if value is not None]


register("pcie", "slow", lambda setup: PcieCollector(setup.root, setup.gpus), refresh="config",
         help="PCIe links of the NICs and GPUs: speed and width trained and the most supported")
