"""Writing a simulation as a replay trace (docs/trace-format.md) and its ground truth."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gpunet import contract as C
from gpunet.simulate.engine import Result
from gpunet.trace import TraceWriter, format_fixed, format_ints, timestamp_suffixes

# The families a simulated node exports, in the order they are written, with how values print.
FAMILIES: list[tuple[C.MetricSpec, str]] = [
    (C.COLLECTOR_UP, "int"),
    (C.GPU_BUSY_SECONDS, "ms"), (C.GPU_IDLE_SECONDS, "ms"), (C.GPU_INFO, "int"), (C.GPU_SM_CLOCK, "int"),
    (C.GPU_THROTTLED_SECONDS, "ms"), (C.GPU_UP, "int"), (C.GPU_UTILIZATION, "ratio"),
    (C.NIC_CARRIER_CHANGES, "int"), (C.NIC_CNP_RECEIVED, "int"), (C.NIC_CNP_SENT, "int"),
    (C.NIC_ECN_MARKED, "int"), (C.NIC_INFO, "int"), (C.NIC_LINK_SPEED, "int"),
    (C.NIC_PFC_PAUSE_FRAMES, "int"), (C.NIC_RDMA_LOSS_EVENTS, "int"), (C.NIC_RECEIVE_BYTES, "int"),
    (C.NIC_RECEIVE_DISCARDS, "int"), (C.NIC_RECEIVE_ERRORS, "int"), (C.NIC_SATURATED_SECONDS, "ms"),
    (C.NIC_TRANSMIT_BYTES, "int"), (C.NIC_TRANSMIT_WAIT, "int"), (C.NIC_UP, "int"), (C.NODE_NETWORK_BURSTS, "int"),
    (C.NODE_NETWORK_STATE_SECONDS, "ms"),
    (C.TCP_RETRANSMITTED, "int"), (C.TCP_SENT, "int"),
    # configuration facts (configfacts.py)
    (C.NIC_PFC_ENABLED, "int"), (C.NIC_ECN_ENABLED, "int"), (C.NIC_LINK_PAUSE_ENABLED, "int"),
    (C.NIC_QOS_TRUST_INFO, "int"), (C.NIC_MTU, "int"), (C.NIC_PCIE_CURRENT_SPEED, "int"),
    (C.NIC_PCIE_MAX_SPEED, "int"), (C.NIC_PCIE_CURRENT_WIDTH, "int"), (C.NIC_PCIE_MAX_WIDTH, "int"),
    (C.GPU_PCIE_CURRENT_SPEED, "int"), (C.GPU_PCIE_MAX_SPEED, "int"), (C.GPU_PCIE_CURRENT_WIDTH, "int"),
    (C.GPU_PCIE_MAX_WIDTH, "int"), (C.BOND_INFO, "int"), (C.BOND_MEMBER_UP, "int"),
]


def _format(values: np.ndarray, kind: str) -> list[str]:
    if kind == "int":
        return format_ints(np.round(values).tolist())
    return format_fixed(values.tolist(), 3 if kind == "ms" else 2)


def write_trace(result: Result, path: str | Path, compresslevel: int = 6) -> dict:
    """Write the trace; returns {'series': .., 'samples': .., 'bytes': ..}."""
    spec = result.spec
    job = spec.cluster.job
    n_series = 0
    suffixes = [timestamp_suffixes(node.times.tolist()) for node in result.nodes]
    with TraceWriter(path, compresslevel=compresslevel) as w:
        for metric, kind in FAMILIES:
            name = metric.name
            if not any(name in node.series for node in result.nodes):
                continue
            w.family(name, metric.type, metric.help)
            for i, node in enumerate(result.nodes):
                instance = result.cluster.instances[i]
                for labels, values in node.series.get(name, ()):
                    present = ~np.isnan(values)
                    if not present.any():
                        continue
                    sfx = suffixes[i]
                    if not present.all():
                        sfx = [sfx[j] for j in np.flatnonzero(present)]
                        values = values[present]
                    w.series_formatted(name, {**labels, "instance": instance, "job": job}, _format(values, kind), sfx)
                    n_series += 1
        samples = w.samples
    return {"series": n_series, "samples": samples, "bytes": Path(path).stat().st_size}


def labels_path(trace_path: str | Path) -> Path:
    p = Path(trace_path)
    name = p.name
    for ext in (".om.gz", ".om", ".gz"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    return p.with_name(name + ".labels.json")


def write_labels(result: Result, trace_path: str | Path) -> Path:
    out = labels_path(trace_path)
    out.write_text(json.dumps(result.labels(), indent=1) + "\n")
    return out
