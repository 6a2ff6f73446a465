"""TCP segments and retransmits of the node (readers/procfs.py: the snmp and netstat tables)."""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.readers.procfs import PartialTable, read_netstat, read_snmp
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import TCP_RECEIVED, TCP_RETRANSMITTED, TCP_SENT, TCP_TIMEOUTS

SNMP_FIELDS = (("Tcp", "RetransSegs", TCP_RETRANSMITTED), ("Tcp", "OutSegs", TCP_SENT),
               ("Tcp", "InSegs", TCP_RECEIVED))
NETSTAT_FIELDS = (("TcpExt", "TCPTimeouts", TCP_TIMEOUTS),)
# (reader, the protocols it parses, the fields taken from them)
TABLES = tuple((read, frozenset(proto for proto, _, _ in fields), fields)
               for read, fields in ((read_snmp, SNMP_FIELDS), (read_netstat, NETSTAT_FIELDS)))


class TcpCollector:
    name = "tcp"

    def __init__(self, root: Root):
        self.root = root

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        for read, protocols, fields in TABLES:
            try:
                table = read(self.root, protocols)
            except PartialTable as e:
                errors.append(e)
                table = e.table
            except SourceError as e:
                errors.append(e)
                continue
            for proto, field, metric in fields:
                value = table.get(proto, {}).get(field)
                if value is not None:
                    samples.append(Sample(metric, (), value))
        return samples


register("tcp", "slow", lambda setup: TcpCollector(setup.root),
         help="the node's TCP segments, retransmits and timeouts")
