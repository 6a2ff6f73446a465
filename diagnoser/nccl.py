"""NCCL's own view of the collectives, where it is available: the inspector profiler plugin
(NCCL_PROFILER_PLUGIN=libnccl-profiler-inspector.so, NCCL_INSPECTOR_ENABLE=1) with
NCCL_INSPECTOR_PROM_DUMP writes, per GPU, a text file in the Prometheus exposition format
(nccl_inspector_metrics_<GPU UUID>.prom, rewritten every dump interval, >= 30 s) with the
last completed collective of each communicator:

    nccl_bus_bandwidth_gbs{comm_id="..",hostname="..",rank="3",nranks="16",n_nodes="2",
        gpu_device_id="GPU3",collective="AllReduce",coll_sn="..",timestamp="2026-01-01T00:10:00Z",
        message_size="1.00GB",slurm_job="..",slurm_job_id=".."} 151.2

(also nccl_algorithm_bandwidth_gbs and nccl_collective_exec_time_microseconds). The same
lines reach Prometheus through node_exporter's textfile collector.

What the figure says. Each rank times the collective from its own kernel's start to its
end. In one communicator the ranks move the same bytes, so their bus bandwidths agree,
except:
  - a rank far BELOW its communicator's median moved its share slowly: its own link or
    transfers are slow (a degraded or lossy port, a slow PCIe path);
  - a rank far ABOVE the median started the collective late, after the others had been
    waiting in it: it computes slower, a straggler (the others' time includes the wait).
Ranks are compared only inside one communicator and one collective and message size:
bandwidth depends on both.
"""

from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd

from diagnoser.frame import NCCL_BUS_BANDWIDTH as METRIC
from diagnoser.frame import NCCL_COLUMNS as COLUMNS
from diagnoser.frame import nccl_key
from diagnoser.report import REMEDIATION

SLOW = 0.7  # a rank at or below 70% of its communicator's median moved its share slowly
LATE = 1.4  # ... at or above 140%: it arrived late, the others waited for it
MIN_RANKS = 3  # a median of fewer ranks tells nothing
LOCAL_CLASSES = ("straggler", "link_degraded", "packet_loss", "gpu_throttle", "pfc_storm")
_LINE = re.compile(r"^(\S+?\{.*\}|\S+)\s+(\S+)(?:\s+(\S+))?\s*$")


def parse(text: str, origin: str = "") -> pd.DataFrame:
    """The bus-bandwidth samples of one exposition text."""
    from diagnoser.sources.replay import parse_series

    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.startswith(METRIC):
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"{origin}:{lineno}: not an exposition sample: {line[:120]!r}")
        try:
            name, labels = parse_series(m.group(1))
            value = float(m.group(2))
        except ValueError as e:
            raise ValueError(f"{origin}:{lineno}: {e}") from None
        if name != METRIC or not np.isfinite(value):
            continue
        when = _when(labels.get("timestamp", ""))
        if not np.isfinite(when) and m.group(3):
            when = float(m.group(3)) / 1000.0  # exposition timestamps are milliseconds
        rows.append((*nccl_key(labels), value, when))
    return pd.DataFrame(rows, columns=COLUMNS)


def _when(text: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return float("nan")


def read_dumps(paths: list[str]) -> pd.DataFrame:
    """Samples from dump files, or folders of them (*.prom)."""
    frames = []
    for p in map(Path, paths):
        files = sorted(p.glob("*.prom")) if p.is_dir() else [p]
        if p.is_dir() and not files:
            raise ValueError(f"{p}: no .prom files (NCCL_INSPECTOR_PROM_DUMP output) in the folder")
        for f in files:
            frames.append(parse(f.read_text(encoding="utf-8", errors="replace"), str(f)))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def outliers(records: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    """Per host: its ranks' bus bandwidth over their communicators' medians (the median of
    that ratio over its ranks and collectives), and the figures behind it."""
    r = records[~(records["time"] < start) & ~(records["time"] > end)]  # unknown times are kept
    if not len(r):
        return pd.DataFrame(columns=("ratio", "busbw", "peer_median", "ranks"))
    key = ["comm", "collective", "size"]
    per_rank = r.groupby([*key, "rank", "host"], as_index=False)["busbw"].median()
    med = per_rank.groupby(key)["busbw"].transform("median")
    n = per_rank.groupby(key)["busbw"].transform("count")
    per_rank = per_rank.assign(median=med, ratio=per_rank["busbw"] / med.where(med > 0))[n >= MIN_RANKS]
    per_rank = per_rank.dropna(subset=["ratio"])
    return per_rank.groupby("host").agg(ratio=("ratio", "median"), busbw=("busbw", "median"),
                                        peer_median=("median", "median"), ranks=("rank", "nunique"))


def instance_of(host: str, instances: list[str]) -> str | None:
    """The node whose instance names this host (with or without port and domain)."""
    short = host.split(".")[0]
    for i in instances:
        name = i.rsplit(":", 1)[0] if i.count(":") == 1 or i.startswith("[") else i
        if name == host or name.split(".")[0] == short:
            return i
    return None


def annotate(doc: dict, records: pd.DataFrame, instances: list[str], start: float, end: float) -> None:
    """Attach NCCL's evidence to the findings naming the same nodes; where no finding names
    an outlier, raise one on NCCL's figures alone (the node counters were inconclusive)."""
    per_host = outliers(records, start, end)
    notes = doc.setdefault("notes", [])
    if not len(per_host):
        notes.append("NCCL inspector data given, but no communicator had 3 ranks with figures in this window")
        return
    unmatched = [h for h in per_host.index if instance_of(h, instances) is None]
    if unmatched:
        notes.append(f"NCCL: {len(unmatched)} host(s) match no node in the window ({', '.join(unmatched[:3])})")
    job_of = {i: j["name"] for j in doc.get("jobs", []) for i in j.get("instances", [])}
    for host, row in per_host.iterrows():
        kind = "late" if row["ratio"] >= LATE else "slow" if row["ratio"] <= SLOW else None
        node = instance_of(host, instances)
        if kind is None or node is None:
            continue
        figure = (f"{row['busbw']:.1f} GB/s over {int(row['ranks'])} rank(s), {row['ratio']:.2f}x its communicators' "
                  f"median {row['peer_median']:.1f} GB/s: " +
                  ("it enters the collectives late, the others wait in them" if kind == "late"
                   else "it moves its share slowly (its link or transfer path)"))
        named = [f for f in doc["findings"] if node in f.get("nodes", []) and f["class"] in LOCAL_CLASSES]
        for f in named:
            f["evidence"].setdefault("nccl_bus_bandwidth", {})[node] = figure
        if named:
            continue
        cls = "straggler" if kind == "late" else "link_degraded"
        times = records.loc[records["host"] == host, "time"].dropna()
        f_start = max(start, float(times.min())) if len(times) else start
        f_end = min(end, float(times.max())) if len(times) else end
        if f_end <= f_start:
            f_start, f_end = start, end
        finding = {"class": cls, "start": round(f_start, 3), "end": round(f_end, 3), "nodes": [node],
                   "devices": [], "confidence": 0.5, "gpu_idle_seconds": None,
                   "evidence": {"nccl_bus_bandwidth": {node: figure},
                                "from": "NCCL inspector only: the node counters showed no cause"},
                   "remediation": REMEDIATION[cls]}
        if job_of:
            finding = {"job": job_of.get(node, "?"), **finding}
        doc["findings"].append(finding)
    if not notes:
        doc.pop("notes")
