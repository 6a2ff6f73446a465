"""What each NIC port is: gpunet_nic_info and its link speed, from the inventory."""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.root import SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import NIC_FABRIC, NIC_INFO, NIC_LINK_SPEED, NIC_UP


class NicInfoCollector:
    name = "nic_info"

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        for nic in ctx.nics.values():
            rdma_device, port = (nic.rdma.device, nic.rdma.port) if nic.rdma else ("", "")
            samples.append(Sample(NIC_INFO, (nic.device, rdma_device, port, nic.driver, nic.link_layer,
                                             nic.numa_node, nic.pci_address), 1.0))
            samples.append(Sample(NIC_FABRIC, (nic.device,), 1.0 if nic.fabric else 0.0))
            if nic.speed_bytes_per_second:
                samples.append(Sample(NIC_LINK_SPEED, (nic.device,), nic.speed_bytes_per_second))
            if not nic.netdev and nic.rdma is not None:
                # An RDMA port without netdev has no operstate; its port state says it.
                samples.append(Sample(NIC_UP, (nic.device,), 1.0 if nic.rdma.state == "ACTIVE" else 0.0))
        return samples


register("nic_info", "slow", lambda setup: NicInfoCollector(),
         help="what each NIC port is (driver, link layer, NUMA node, PCI address), its link speed, fabric")
