"""NIC QoS configuration: PFC per priority, 802.3x pause, trust (pcp/dscp) and RoCE
congestion control (ECN) per priority and point. Facts that change rarely: registered with
refresh="config", the sampler runs it every --config-interval (exporter/refresh.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from exporter.collector_registry import register
from exporter.readers.dcb import read_dcb
from exporter.readers.ethtool import read_pause
from exporter.readers.roce_cc import ecn_enabled
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import NIC_ECN_ENABLED, NIC_LINK_PAUSE_ENABLED, NIC_PFC_ENABLED, NIC_QOS_TRUST_INFO

T = TypeVar("T")


class QosCollector:
    name = "qos"

    def __init__(self, root: Root):
        self.root = root

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        for nic in ctx.nics.values():
            device = nic.device
            dcb = _costs_itself(lambda: read_dcb(self.root, nic.netdev), errors) if nic.netdev else None
            if dcb is not None and dcb.pfc_enabled is not None:
                samples.extend(Sample(NIC_PFC_ENABLED, (device, str(p)), float(on))
                               for p, on in enumerate(dcb.pfc_enabled))
            if dcb is not None and dcb.trust is not None:
                samples.append(Sample(NIC_QOS_TRUST_INFO, (device, dcb.trust), 1.0))
            pause = _costs_itself(lambda: read_pause(self.root, nic.netdev), errors) if nic.netdev else None
            if pause is not None:
                samples.extend(Sample(NIC_LINK_PAUSE_ENABLED, (device, direction), float(on))
                               for direction, on in zip(("receive", "transmit"), pause))
            rdma, port = (nic.rdma.device, nic.rdma.port) if nic.rdma else ("", "")
            ecn = ecn_enabled(self.root, nic.netdev, rdma, port, errors)
            samples.extend(Sample(NIC_ECN_ENABLED, (device, prio, point), float(on))
                           for (prio, point), on in sorted(ecn.items()))
        return samples


def _costs_itself(read: Callable[[], T | None], errors: list[SourceError]) -> T | None:
    """A source that cannot be read costs only its own series: None, with the error kept."""
    try:
        return read()
    except SourceError as e:
        errors.append(e)
        return None


register("qos", "slow", lambda setup: QosCollector(setup.root), refresh="config",
         help="QoS configuration: PFC per priority, 802.3x pause, trust, ECN")
