"""Slow tick: what each GPU is and what else on-call looks at beside its activity: power,
temperature, memory, PCIe throughput, XID errors, and GPM SM/tensor activity (Hopper+)."""

from __future__ import annotations

from exporter.bounded import BoundedCalls
from exporter.collector_registry import register
from exporter.collectors.gpu import as_source_error
from exporter.readers.gpus import GpuSource
from exporter.readers.nvml import GpuDetails
from exporter.root import SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import (
    GPU_DRIVER_INFO,
    GPU_INFO,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    GPU_PCIE_RECEIVE,
    GPU_PCIE_TRANSMIT,
    GPU_POWER,
    GPU_SM_ACTIVE,
    GPU_SM_OCCUPANCY,
    GPU_TEMPERATURE,
    GPU_TENSOR_ACTIVE,
    GPU_XID_ERRORS,
)

DETAILS = (("power_watts", GPU_POWER), ("temperature_celsius", GPU_TEMPERATURE),
           ("memory_used_bytes", GPU_MEMORY_USED), ("memory_total_bytes", GPU_MEMORY_TOTAL),
           ("pcie_transmit_bytes_per_second", GPU_PCIE_TRANSMIT),
           ("pcie_receive_bytes_per_second", GPU_PCIE_RECEIVE))
GPM = (("sm_active", GPU_SM_ACTIVE), ("sm_occupancy", GPU_SM_OCCUPANCY), ("tensor_active", GPU_TENSOR_ACTIVE))


class GpuDetailsCollector:
    name = "gpu_details"

    def __init__(self, source: GpuSource, timeout: float = 0.5):
        self.source = source
        self.timeout = timeout
        self.calls = BoundedCalls("gpunet-nvml-slow")

    def close(self) -> None:
        self.calls.close()

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        self.source.ensure_open()
        backend = self.source.backend
        samples = [Sample(GPU_DRIVER_INFO, (self.source.driver_version or "",), 1.0)]
        calls = {g.index: (lambda i=g.index: backend.details(i)) for g in self.source.identities}
        calls["xid"] = backend.xid_counts
        results = self.calls.run(calls, timeout=self.timeout)
        for ident in self.source.identities:
            gpu = str(ident.index)
            details = results.get(ident.index)
            if not isinstance(details, GpuDetails):
                errors.append(as_source_error(details, ident.index))
                continue  # a lost GPU's info vanishes with the rest of its series
            samples.append(Sample(GPU_INFO, (gpu, ident.uuid, ident.model, ident.pci_address, ident.numa_node), 1.0))
            for attr, metric in DETAILS:
                value = getattr(details, attr)
                if value is not None:
                    samples.append(Sample(metric, (gpu,), value))
            for key, metric in GPM:
                if details.gpm and key in details.gpm:
                    samples.append(Sample(metric, (gpu,), details.gpm[key]))
        xids = results.get("xid")
        if isinstance(xids, dict):
            samples.extend(Sample(GPU_XID_ERRORS, (str(gpu), str(xid)), count)
                           for (gpu, xid), count in sorted(xids.items()))
        elif xids is not None:
            errors.append(as_source_error(xids, -1))
        return samples


register("gpu_details", "slow", lambda setup: GpuDetailsCollector(setup.gpus), needs_gpu=True,
         help="what each GPU is; power, temperature, memory, PCIe throughput, XID errors, GPM activity")
