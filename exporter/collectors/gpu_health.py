"""Every 30 s (the configuration interval): each GPU's health, what tells a sick GPU from a
slow network: memory ECC errors, row remapping (pending, failed) and NVLink errors.

Not on every slow tick: these counters move on a scale of minutes, and reading them costs
NVML calls per NVLink (up to 18 links times 6 calls on a GPU of today), which on 8 GPUs
would be most of a slow tick's NVML time.
"""

from __future__ import annotations

from exporter.bounded import BoundedCalls
from exporter.collector_registry import register
from exporter.collectors.gpu import as_source_error
from exporter.readers.gpus import GpuSource
from exporter.readers.nvml import GpuHealth
from exporter.root import SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import (
    GPU_ECC_ERRORS,
    GPU_NVLINK_ERRORS,
    GPU_REMAPPED_ROWS,
    GPU_ROW_REMAP_FAILED,
    GPU_ROW_REMAP_PENDING,
)


class GpuHealthCollector:
    name = "gpu_health"

    def __init__(self, source: GpuSource, timeout: float = 2.0):
        self.source = source
        self.timeout = timeout
        self.calls = BoundedCalls("gpunet-nvml-health")

    def close(self) -> None:
        self.calls.close()

    def refresh_key(self) -> tuple[str, ...]:
        """Read again at once when the GPUs change (one lost, one back)."""
        return tuple(g.uuid for g in self.source.identities)

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        self.source.ensure_open()
        backend = self.source.backend
        results = self.calls.run({g.index: (lambda i=g.index: backend.health(i)) for g in self.source.identities},
                                 timeout=self.timeout)
        samples: list[Sample] = []
        for ident in self.source.identities:
            health = results.get(ident.index)
            if isinstance(health, GpuHealth):
                samples += health_samples(str(ident.index), health)
            else:
                errors.append(as_source_error(health, ident.index))
        return samples


def health_samples(gpu: str, health: GpuHealth) -> list[Sample]:
    """ECC, row remapping and NVLink series, those the GPU supports."""
    out = [Sample(GPU_ECC_ERRORS, (gpu, kind), n) for kind, n in (health.ecc_errors or {}).items()]
    out += [Sample(GPU_REMAPPED_ROWS, (gpu, cause), n) for cause, n in (health.remapped_rows or {}).items()]
    if health.row_remap_pending is not None:
        out.append(Sample(GPU_ROW_REMAP_PENDING, (gpu,), float(health.row_remap_pending)))
    if health.row_remap_failed is not None:
        out.append(Sample(GPU_ROW_REMAP_FAILED, (gpu,), float(health.row_remap_failed)))
    out += [Sample(GPU_NVLINK_ERRORS, (gpu, kind), n) for kind, n in (health.nvlink_errors or {}).items()]
    return out


register("gpu_health", "slow", lambda setup: GpuHealthCollector(setup.gpus), refresh="config", needs_gpu=True,
         help="each GPU's memory ECC errors, row remapping and NVLink errors (every --config-interval)")
