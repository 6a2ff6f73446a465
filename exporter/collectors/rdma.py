"""RDMA port counters (readers/rdma.py): ECN marks, CNPs, go-back-N loss events (hw_counters)
and the InfiniBand PortCounters (counters/). Wire bytes are the wire collector's."""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.readers import rdma as rdma_reader
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from exporter.vendors import counters_for, pick
from gpunet.contract import (
    NIC_CNP_RECEIVED,
    NIC_CNP_SENT,
    NIC_ECN_MARKED,
    NIC_LINK_DOWNED,
    NIC_RDMA_LOSS_EVENTS,
    NIC_RDMA_OUT_OF_BUFFER,
    NIC_RECEIVE_DISCARDS,
    NIC_RECEIVE_ERRORS,
    NIC_SYMBOL_ERRORS,
    NIC_TRANSMIT_DISCARDS,
    NIC_TRANSMIT_WAIT,
)

# InfiniBand PortCounters, the same on every HCA. On Ethernet ports the driver's own
# statistics say these things better, so they are read on InfiniBand ports only.
IB_PORT_COUNTERS = (("port_rcv_errors", NIC_RECEIVE_ERRORS), ("link_downed", NIC_LINK_DOWNED),
                    ("port_xmit_discards", NIC_TRANSMIT_DISCARDS),
                    ("excessive_buffer_overrun_errors", NIC_RECEIVE_DISCARDS),
                    ("symbol_error", NIC_SYMBOL_ERRORS), ("port_xmit_wait", NIC_TRANSMIT_WAIT))


class RdmaCollector:
    name = "rdma"

    def __init__(self, root: Root):
        self.root = root

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        for nic in ctx.nics.values():
            if nic.rdma is None:
                continue
            labels = (nic.device,)
            table = counters_for(nic.driver, nic.rdma.device)
            hw = rdma_reader.read_counters(self.root, nic.rdma, rdma_reader.HW_COUNTERS, table.hw_counter_names,
                                           errors)
            for names, metric in ((table.ecn_marked, NIC_ECN_MARKED), (table.cnp_sent, NIC_CNP_SENT),
                                  (table.cnp_received, NIC_CNP_RECEIVED),
                                  (table.out_of_buffer, NIC_RDMA_OUT_OF_BUFFER)):
                value = pick(hw, names)
                if value is not None:
                    samples.append(Sample(metric, labels, value, table.hw_counter_wrap))
            for kind, names in table.loss.items():
                value = pick(hw, names)
                if value is not None:
                    samples.append(Sample(NIC_RDMA_LOSS_EVENTS, (nic.device, kind), value, table.hw_counter_wrap))
            if nic.link_layer == "InfiniBand":
                names = tuple(n for n, _ in IB_PORT_COUNTERS)
                pc = rdma_reader.read_counters(self.root, nic.rdma, rdma_reader.PORT_COUNTERS, names, errors)
                for name, metric in IB_PORT_COUNTERS:
                    if name in pc:
                        # PortCounters saturate, never wrap (a saturated 32-bit port_xmit_wait stops rising:
                        # kernels with extended counters read it 64 bits wide).
                        samples.append(Sample(metric, labels, pc[name]))
        return samples


register("rdma", "slow", lambda setup: RdmaCollector(setup.root),
         help="RDMA port counters: ECN marks, CNPs, loss events, out-of-buffer, InfiniBand PortCounters "
              "(incl. port_xmit_wait, symbol errors)")
