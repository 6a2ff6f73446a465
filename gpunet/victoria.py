"""Load a trace into VictoriaMetrics through its Prometheus text import API.

The import wants timestamps in milliseconds; a trace holds seconds. The trace is streamed
in chunks of whole lines (a 1,024-node hour is some 15 GB of text: it is never held at
once), and the timestamps of each chunk are rewritten by one regular expression where they
have the simulator's and exporter's three decimals, line by line otherwise.
"""

from __future__ import annotations

import gzip
import re
import urllib.request
from pathlib import Path

CHUNK_BYTES = 32 << 20
_MILLIS = re.compile(rb" (\d+)\.(\d{3})$", re.MULTILINE)


def victoria_command(data: Path, listen: str, *extra: str) -> list[str]:
    """victoria-metrics on DATA; backfilled traces are old, so retention is long."""
    return ["victoria-metrics", f"-storageDataPath={data}", f"-httpListenAddr={listen}", "-retentionPeriod=100y",
            *extra]


def to_millis(chunk: bytes) -> bytes:
    """Whole lines of a trace (comments included) -> import lines with millisecond stamps."""
    lines = chunk.count(b"\n") - chunk.count(b"\n#") - chunk.startswith(b"#")
    converted, n = _MILLIS.subn(rb" \1\2", chunk)
    if n == lines:
        return converted
    out = []
    for line in chunk.splitlines():
        if line and not line.startswith(b"#"):
            series, value, ts = line.rsplit(b" ", 2)
            out.append(b"%s %s %d\n" % (series, value, round(float(ts) * 1000)))
    return b"".join(out)


def import_trace(trace: Path, url: str, chunk_bytes: int = CHUNK_BYTES, timeout: float = 600.0) -> None:
    """Post the trace to URL/api/v1/import/prometheus, then flush so queries see it all."""
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rb") as f:
        rest = b""
        while block := f.read(chunk_bytes):
            block = rest + block
            cut = block.rfind(b"\n") + 1
            rest = block[cut:]
            _post(url + "/api/v1/import/prometheus", to_millis(block[:cut]), timeout)
        if rest:
            _post(url + "/api/v1/import/prometheus", to_millis(rest + b"\n"), timeout)
    urllib.request.urlopen(url + "/internal/force_flush", timeout=timeout).close()


def _post(url: str, body: bytes, timeout: float) -> None:
    urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=timeout).close()
