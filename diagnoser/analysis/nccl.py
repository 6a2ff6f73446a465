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

import pandas as pd

from diagnoser.analysis.rules import RULES
from diagnoser.analysis.rules.base import confirm_query
from diagnoser.model.report import Finding
from gpunet.words import plural

SLOW = 0.7  # a rank at or below 70% of its communicator's median moved its share slowly
LATE = 1.4  # ... at or above 140%: it arrived late, the others waited for it
MIN_RANKS = 3  # a median of fewer ranks tells nothing
NCCL_ONLY_CONFIDENCE = 0.5  # a finding on NCCL's figures alone, the node counters silent


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


def annotate(findings: list[Finding], notes: list[str], records: pd.DataFrame, instances: list[str],
             start: float, end: float, job_of: dict[str, str] | None = None) -> None:
    """Attach NCCL's evidence to the localised findings naming the same nodes; where no
    finding names an outlier, raise one on NCCL's figures alone (the node counters were
    inconclusive), of the class whose record claims that NCCL signal. `job_of`: instance ->
    job, where the report is per job."""
    per_host = outliers(records, start, end)
    if not len(per_host):
        notes.append("NCCL inspector data given, but no communicator had 3 ranks with figures in this window")
        return
    unmatched = [h for h in per_host.index if instance_of(h, instances) is None]
    if unmatched:
        notes.append(f"NCCL: {plural(len(unmatched), 'host')} matching no node in the window ({', '.join(unmatched[:3])})")
    class_of = {r.nccl_signal: r for r in RULES.values() if r.nccl_signal}
    for host, row in per_host.iterrows():
        kind = "late" if row["ratio"] >= LATE else "slow" if row["ratio"] <= SLOW else None
        node = instance_of(host, instances)
        if kind is None or node is None:
            continue
        ranks = plural(int(row["ranks"]), "rank")
        figure = (f"{row['busbw']:.1f} GB/s over {ranks}, {row['ratio']:.2f}x its communicators' "
                  f"median {row['peer_median']:.1f} GB/s: " +
                  ("it enters the collectives late, the others wait in them" if kind == "late"
                   else "it moves its share slowly (its link or transfer path)"))
        named = [f for f in findings if node in f.nodes and RULES[f.cls].localised]
        for f in named:
            f.evidence.setdefault("nccl_bus_bandwidth", {})[node] = figure  # type: ignore[union-attr,index]
        if named:
            continue
        record = class_of[kind]
        times = records.loc[records["host"] == host, "time"].dropna()
        f_start = max(start, float(times.min())) if len(times) else start
        f_end = min(end, float(times.max())) if len(times) else end
        if f_end <= f_start:
            f_start, f_end = start, end
        findings.append(Finding(record.name, record.title, round(f_start, 3), round(f_end, 3), [node], [],
                                NCCL_ONLY_CONFIDENCE, None,
                                {"nccl_bus_bandwidth": {node: figure},
                                 "from": "NCCL inspector only: the node counters showed no cause"},
                                record.remediation, job=(job_of.get(node, "?") if job_of else None),
                                promql=confirm_query(record, [node])))
