"""How people read a finding's evidence: each key of the JSON document's `evidence`
(docs/diagnose.md) with a label in words and the unit of its figures.

The keys are the report's (the JSON keeps them as they are, for scripts); the rules produce
them (diagnoser/analysis/rules/*.py, nccl.py for NCCL's figures, audit.py for the
configuration cross-reference), and the renderers read the report and nothing else, so the
words for the keys live here, grouped by the file that produces them.
tests/test_html_report.py holds every key that file can produce to a label here.
"""

from __future__ import annotations

from dataclasses import dataclass

EVIDENCE_ITEMS_SHOWN = 6  # entries of a per-node evidence figure


@dataclass(frozen=True)
class Label:
    """What one evidence figure is, and its unit: "%" for a share of time or of a total
    (the JSON keeps the fraction, people read a percentage), else written after each number
    ("/s", " Gb/s", "x the job's baseline")."""

    words: str
    unit: str = ""


SHARE = "%"

LABELS: dict[str, Label] = {
    # Most classes: the window's GPU idle and the fabric's load.
    "gpu_idle": Label("GPU idle", SHARE),
    "link_utilisation": Label("link utilisation (median node)", SHARE),
    # network_bandwidth
    "gpu_idle_saturated": Label("GPU idle while the links ran at line rate", SHARE),
    "saturated_time": Label("time the links ran at line rate (median node)", SHARE),
    "nic_speed_gbps": Label("NIC speed", " Gb/s"),
    "link_sizing": Label("link sizing"),
    # network_congestion
    "ecn_marks_per_gb": Label("ECN marks per GB moved (median node)"),
    "fabric_ecn_marks_per_gb": Label("ECN marks per GB moved, the rest of the fabric's usual"),
    "credit_wait_per_gb_times_baseline": Label("credit wait per GB", "x the job's baseline"),
    "credit_wait_per_gb_times_fabric": Label("credit wait per GB", "x the rest of the fabric's"),
    "pauses_received_per_s": Label("PFC pauses received, all nodes", "/s"),
    "pauses_received_per_s_per_nic": Label("PFC pauses received per fabric NIC", "/s"),
    "gpu_idle_active_or_paused": Label("GPU idle while the links ran below line rate or stood paused", SHARE),
    # pfc_storm
    "pause_tx_per_s": Label("PFC pauses sent", "/s"),
    "pauses_sent": Label("PFC pauses sent in the window"),
    "nodes_receiving_pauses": Label("nodes receiving pauses"),
    "gpu_idle_paused": Label("GPU idle while the links stood paused", SHARE),
    # packet_loss
    "loss_events_per_s": Label("RDMA loss events, all nodes", "/s"),
    "tcp_retransmit_ratio": Label("TCP segments retransmitted", SHARE),
    "node_loss_events": Label("RDMA loss events in the window"),
    "node_tcp_retransmits": Label("TCP retransmits in the window"),
    "job_loss_events_p_value": Label("chance of the job's loss events at its usual rate (p-value)"),
    "tcp_share_of_bytes_sent": Label("bytes sent that TCP carried, at least", SHARE),
    # link_degraded
    "links": Label("links"),
    "node_link_speed_gbps": Label("link speed", " Gb/s"),
    "node_carrier_changes": Label("carrier changes in the window"),
    # gpu_throttle
    "throttled_fraction": Label("time throttled", SHARE),
    "throttled_gpus": Label("throttled GPUs"),
    "sm_clock_mhz": Label("SM clock", " MHz"),
    # straggler
    "node_gpu_idle": Label("GPU idle of the node", SHARE),
    # host_bound
    "gpu_idle_quiet": Label("GPU idle with the network quiet", SHARE),
    "baseline_gpu_idle_quiet": Label("GPU idle with the network quiet, the job's baseline", SHARE),
    "storage_nic_utilisation": Label("storage and management NIC utilisation (median node)", SHARE),
    "baseline_storage_nic_utilisation": Label("storage and management NIC utilisation, the job's baseline", SHARE),
    # nccl.py
    "nccl_bus_bandwidth": Label("NCCL bus bandwidth"),
    "from": Label("found by"),
    # audit.py
    "configuration": Label("configuration findings on these nodes"),
}


def label(key: str) -> Label:
    """The key's label; a key without one (a rule's new figure) reads as its words."""
    return LABELS.get(key) or Label(key.replace("_", " "), SHARE if _looks_like_share(key) else "")


def _looks_like_share(key: str) -> bool:
    return "gpu_idle" in key or key.endswith(("utilisation", "_fraction", "saturated_time"))


def evidence_line(key: str, value: object) -> str:
    """'credit wait per GB: 186x the job's baseline', 'GPU idle: 35.6%'."""
    lab = label(key)
    return f"{lab.words}: {figure(value, lab.unit)}"


def number(value: float, unit: str = "") -> str:
    """A figure with its unit: shares as percentages (three significant digits below 0.1%,
    so that no share that is not zero reads 0.0%), counts with thousands separators."""
    if unit == SHARE:
        pct = 100 * value
        return f"{pct:.1f}%" if pct == 0 or abs(pct) >= 0.1 else f"{pct:.2g}%"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return text + unit


def figure(value: object, unit: str = "") -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}{unit if unit != SHARE else ''}"
    if isinstance(value, float):
        return number(value, unit)
    if isinstance(value, dict) and {"count", "expected"} <= value.keys():  # a culprit's events as a count
        expected, ratio, p = value["expected"], value.get("ratio"), value.get("p_value")
        if not isinstance(expected, float):
            return f"{figure(value['count'])} (no peers to compare)"
        times = f", {figure(ratio)}x" if isinstance(ratio, float) else ""
        chance = f", p {'< 1e-12' if p < 1e-12 else f'= {p:.2g}'}" if isinstance(p, float) else ""
        return f"{figure(value['count'])} (its peers' rate predicts {figure(expected)}{times}{chance})"
    if isinstance(value, dict) and {"value", "peers_median"} <= value.keys():  # a culprit against its peers
        ratio = value.get("ratio")
        times = f", {figure(ratio)}x" if isinstance(ratio, float) else ""
        return f"{figure(value['value'], unit)} (peers' median {figure(value['peers_median'], unit)}{times})"
    if isinstance(value, dict):
        shown = list(value.items())[:EVIDENCE_ITEMS_SHOWN]
        more = f" and {len(value) - len(shown)} more" if len(value) > len(shown) else ""
        return ", ".join(f"{k} {figure(v, unit)}" for k, v in shown) + more
    if value is None:
        return "unknown"
    return str(value)
