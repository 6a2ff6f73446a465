"""NIC QoS configuration: PFC per priority, 802.3x pause, trust (pcp/dscp) and RoCE
congestion control (ECN) per priority and point. Facts that change rarely: the sampler
runs this collector through exporter.refresh.Refreshed."""

from __future__ import annotations

from exporter.readers.dcb import read_dcb
from exporter.readers.ethtool import read_pause
from exporter.readers.roce_cc import ecn_enabled
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import NIC_ECN_ENABLED, NIC_LINK_PAUSE_ENABLED, NIC_PFC_ENABLED, NIC_QOS_TRUST_INFO


class QosCollector:
    name = "qos"

    def __init__(self, root: Root):
        self.root = root

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        for nic in ctx.nics.values():
            labels = (nic.device,)
            if nic.netdev:
                samples.extend(self._dcb(nic.netdev, labels, errors))
                samples.extend(self._pause(nic.netdev, labels, errors))
            rdma, port = (nic.rdma.device, nic.rdma.port) if nic.rdma else ("", "")
            ecn = ecn_enabled(self.root, nic.netdev, rdma, port, errors)
            samples.extend(Sample(NIC_ECN_ENABLED, (nic.device, prio, point), 1.0 if on else 0.0)
                           for (prio, point), on in sorted(ecn.items()))
        return samples

    def _dcb(self, netdev: str, labels: tuple[str], errors: list[SourceError]) -> list[Sample]:
        try:
            dcb = read_dcb(self.root, netdev)
        except SourceError as e:
            errors.append(e)
            return []
        if dcb is None:
            return []
        samples = []
        if dcb.pfc_enabled is not None:
            samples.extend(Sample(NIC_PFC_ENABLED, (*labels, str(p)), 1.0 if on else 0.0)
                           for p, on in enumerate(dcb.pfc_enabled))
        if dcb.trust is not None:
            samples.append(Sample(NIC_QOS_TRUST_INFO, (*labels, dcb.trust), 1.0))
        return samples

    def _pause(self, netdev: str, labels: tuple[str], errors: list[SourceError]) -> list[Sample]:
        try:
            pause = read_pause(self.root, netdev)
        except SourceError as e:
            errors.append(e)
            return []
        if pause is None:
            return []
        return [Sample(NIC_LINK_PAUSE_ENABLED, (*labels, direction), 1.0 if on else 0.0)
                for direction, on in zip(("receive", "transmit"), pause)]
