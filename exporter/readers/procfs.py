"""/proc/net/snmp and /proc/net/netstat: pairs of lines, a header and its values.

    Tcp: RtoAlgorithm RtoMin ... RetransSegs ...
    Tcp: 1 200 ... 4242 ...
"""

from __future__ import annotations

from collections.abc import Collection

from exporter.root import Root, SourceError

SNMP = "proc/net/snmp"  # Ip, Icmp, Tcp, Udp, ...
NETSTAT = "proc/net/netstat"  # TcpExt, IpExt, ...
# Malformed pairs reported before the rest of a table is given up (a file of garbage would
# otherwise make one problem, and one clause of the error, per pair).
MAX_PROBLEMS = 10


def read_snmp(root: Root, protocols: Collection[str] | None = None) -> dict[str, dict[str, int]]:
    return read_snmp_table(root, SNMP, protocols)


def read_netstat(root: Root, protocols: Collection[str] | None = None) -> dict[str, dict[str, int]]:
    return read_snmp_table(root, NETSTAT, protocols)


def read_snmp_table(root: Root, rel: str, protocols: Collection[str] | None = None) -> dict[str, dict[str, int]]:
    """{protocol: {field: value}}, of the `protocols` asked for (all where None: the others
    are neither parsed nor checked; netstat holds hundreds of values, of which a reader
    wants a few). A malformed pair of lines is reported with its line number and leaves
    out that protocol only; after MAX_PROBLEMS of them the rest of the file is left out too."""
    path = str(root.path(rel))
    lines = root.read_text(rel).splitlines()
    out: dict[str, dict[str, int]] = {}
    problems = []
    for i in range(0, len(lines) - 1, 2):
        head_proto, _, head = lines[i].partition(":")
        if protocols is not None and head_proto not in protocols:
            continue
        value_proto, _, values = lines[i + 1].partition(":")
        fields, numbers = head.split(), values.split()
        if head_proto != value_proto or len(fields) != len(numbers):
            problems.append((i + 2, f"{value_proto or '?'} has {len(numbers)} values for {len(fields)} fields"))
            if len(problems) == MAX_PROBLEMS:
                break
            continue
        try:
            out[head_proto] = {f: int(n) for f, n in zip(fields, numbers)}
        except ValueError:
            problems.append((i + 2, f"{head_proto} values are not all integers"))
            if len(problems) == MAX_PROBLEMS:
                break
    if problems:
        del lines  # not kept alive by the error's traceback, which holds this frame
        raise PartialTable(path, out, problems)
    return out


class PartialTable(SourceError):
    """Some protocols of the table were malformed; ``table`` holds the ones that parsed."""

    def __init__(self, path: str, table: dict[str, dict[str, int]], problems: list[tuple[int, str]]):
        super().__init__(f"{path}:{problems[0][0]}", "; ".join(
            what if n == problems[0][0] else f"line {n}: {what}" for n, what in problems))
        self.table = table
