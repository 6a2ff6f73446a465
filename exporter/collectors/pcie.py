"""PCIe links of the NICs and GPUs: the speed and width each trained at and the most it
supports (a NIC at x8 of x16, or at Gen3 in a Gen4 slot, halves its bandwidth)."""

from __future__ import annotations

from exporter.collectors.gpu import GpuSource
from exporter.readers.pci import PcieLink, pcie_link
from exporter.readers.rdma import IB
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import (GPU_PCIE_CURRENT_SPEED, GPU_PCIE_CURRENT_WIDTH, GPU_PCIE_MAX_SPEED, GPU_PCIE_MAX_WIDTH,
                             NIC_PCIE_CURRENT_SPEED, NIC_PCIE_CURRENT_WIDTH, NIC_PCIE_MAX_SPEED, NIC_PCIE_MAX_WIDTH)

NIC_METRICS = (NIC_PCIE_CURRENT_SPEED, NIC_PCIE_MAX_SPEED, NIC_PCIE_CURRENT_WIDTH, NIC_PCIE_MAX_WIDTH)
GPU_METRICS = (GPU_PCIE_CURRENT_SPEED, GPU_PCIE_MAX_SPEED, GPU_PCIE_CURRENT_WIDTH, GPU_PCIE_MAX_WIDTH)


class PcieCollector:
    name = "pcie"

    def __init__(self, root: Root, gpus: GpuSource | None = None):
        self.root = root
        self.gpus = gpus

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        for nic in ctx.nics.values():
            if nic.netdev:
                function_dir = f"sys/class/net/{nic.netdev}/device"
            elif nic.rdma is not None:
                function_dir = f"{IB}/{nic.rdma.device}/device"
            else:
                continue
            samples.extend(_samples(NIC_METRICS, nic.device, pcie_link(self.root, function_dir, errors)))
        for gpu in self.gpus.identities if self.gpus is not None else []:
            if gpu.pci_address:
                link = pcie_link(self.root, f"sys/bus/pci/devices/{gpu.pci_address}", errors)
                samples.extend(_samples(GPU_METRICS, str(gpu.index), link))
        return samples


def _samples(metrics, label: str, link: PcieLink) -> list[Sample]:
    return [Sample(metric, (label,), float(value)) for metric, value in zip(metrics, link) if value is not None]
