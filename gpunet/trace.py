"""Replay traces (contract section 3): OpenMetrics text with a timestamp on every sample.

    # TYPE gpunet_nic_transmit_bytes counter
    # HELP gpunet_nic_transmit_bytes Bytes sent on the wire, RDMA included.
    gpunet_nic_transmit_bytes_total{device="ib0",instance="node-001:9845",job="gpunet"} 1.5e+12 1767225600.000
    ...
    # EOF

Each family is written once, its series one after the other, each series' samples in
increasing time: the form `promtool tsdb create-blocks-from openmetrics` loads. A path
ending in .gz is gzip-compressed. The simulator and `gpunet-trace export` write through
this module; the diagnoser has its own fast reader.
"""

from __future__ import annotations

import gzip
import io
import math
from pathlib import Path
from typing import Iterable, Sequence

from gpunet.contract import BY_NAME


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label(str(v))}"' for k, v in sorted(labels.items())) + "}"


def format_value(value: float) -> str:
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def family_of(sample_name: str, type_: str) -> str:
    return sample_name.removesuffix("_total") if type_ == "counter" else sample_name


class TraceWriter:
    """Writes a trace family by family. Usage:

        with TraceWriter("x.om.gz") as w:
            w.family("gpunet_nic_up", "gauge")
            w.series("gpunet_nic_up", {"instance": "n1:9845", "job": "gpunet", "device": "ib0"}, ts, values)
    """

    def __init__(self, path: str | Path, compresslevel: int = 6):
        self.path = Path(path)
        raw = open(self.path, "wb")
        self._raw = raw
        self._gz = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=compresslevel) if self.path.suffix == ".gz" \
            else None
        self._out = io.TextIOWrapper(self._gz or raw, encoding="utf-8", newline="\n", write_through=False)
        self._families: set[str] = set()
        self._current: tuple[str, str] | None = None  # (family, type)
        self.samples = 0

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def family(self, sample_name: str, type_: str | None = None, help_: str | None = None) -> None:
        """Start the family that `sample_name` belongs to; type and help default to the contract's."""
        spec = BY_NAME.get(sample_name)
        type_ = type_ or (spec.type if spec else "gauge")
        help_ = help_ if help_ is not None else (spec.help if spec else "")
        family = family_of(sample_name, type_)
        if family in self._families:
            raise ValueError(f"family {family} written twice: a trace keeps each family contiguous")
        self._families.add(family)
        self._current = (family, type_)
        self._out.write(f"# TYPE {family} {type_}\n")
        if help_:
            self._out.write(f"# HELP {family} {help_}\n")

    def series(self, sample_name: str, labels: dict[str, str], timestamps: Sequence[float],
               values: Sequence[float]) -> None:
        if self._current is None or family_of(sample_name, self._current[1]) != self._current[0]:
            raise ValueError(f"{sample_name}: call family() first")
        prefix = sample_name + format_labels(labels) + " "
        self._out.write("".join(f"{prefix}{format_value(v)} {t:.3f}\n" for t, v in zip(timestamps, values)
                                if v is not None))
        self.samples += len(timestamps)

    def close(self) -> None:
        if self._out.closed:
            return
        self._out.write("# EOF\n")
        self._out.flush()
        self._out.detach()
        if self._gz is not None:
            self._gz.close()
        self._raw.close()


def write_series(path: str | Path, series: Iterable[tuple[str, dict[str, str], Sequence[float], Sequence[float]]],
                 types: dict[str, str] | None = None) -> int:
    """Write (sample_name, labels, timestamps, values) tuples, grouping them by family."""
    by_name: dict[str, list] = {}
    for name, labels, ts, vs in series:
        by_name.setdefault(name, []).append((labels, ts, vs))
    with TraceWriter(path) as w:
        for name in sorted(by_name):
            w.family(name, (types or {}).get(name))
            for labels, ts, vs in sorted(by_name[name], key=lambda item: sorted(item[0].items())):
                w.series(name, labels, ts, vs)
        return w.samples
