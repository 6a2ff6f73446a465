"""Findings for people (text, markdown) and for scripts (JSON, contract section 5)."""

from __future__ import annotations

import json

import numpy as np

from diagnoser.audit_report import configuration_lines
from diagnoser.features import Features
from diagnoser.incidents import Incident
from gpunet.window import rfc3339

# What on-call should do, per class. Facts from the reference articles on AI-cluster NICs
# and lossless RoCE fabrics (shared/reference/), in our own words.
REMEDIATION = {
    "network_bandwidth": (
        "The links run at line rate while GPUs wait: the job needs more bandwidth per node than the fabric "
        "gives. Compare the links' measured load with the upgrade path 25G -> 100G -> 200G/400G per NIC, or add "
        "rails (one NIC per GPU, each on the GPU's NUMA node and PCIe switch). Meanwhile: larger gradient "
        "buckets and more compute/communication overlap, gradient compression, or fewer nodes per job."),
    "network_congestion": (
        "The fabric marks and pauses but does not fill the links: congestion in the switches. Check that ECN "
        "(DCQCN) is enabled end to end on the RoCE priority with sane marking thresholds, that PFC is on that "
        "priority only, the oversubscription and ECMP hashing of the uplinks (elephant flows on one path), and "
        "other jobs sharing the spine."),
    "pfc_storm": (
        "The named NIC keeps sending PFC pauses and freezes its neighbours. Drain the node or shut its switch "
        "port now; enable the switch's PFC watchdog (storm protection) fabric-wide. Then look at the host: a "
        "receive path that does not drain (stuck driver or firmware, PCIe errors, NIC on the wrong NUMA node "
        "or a degraded PCIe link), dmesg, the NIC firmware version."),
    "packet_loss": (
        "Go-back-N retransmission (RoCE) or TCP retransmits are stalling the collectives. RoCE needs a "
        "lossless fabric: check PFC on the RoCE priority at every hop and the switch buffer drops. On the "
        "named nodes' links check CRC/symbol errors (a cable or optic going bad), FEC mode, and MTU mismatches "
        "along the path."),
    "link_degraded": (
        "A link runs below its peers, went down, or flaps, and the synchronous job runs at its pace. Check the "
        "speed and width the port negotiated (ethtool / ibstat), reseat or replace the cable or optic (a "
        "flapping link is usually a failing optic: look at its temperature and receive power), and the switch "
        "port's error counters. Drain the node until it is fixed."),
    "gpu_throttle": (
        "The named nodes' GPUs are clock-throttled and the rest of the job waits for them. Check cooling "
        "(inlet temperature, fans, airflow), power capping and the power brake (nvidia-smi -q -d PERFORMANCE), "
        "and drain the node if it cannot hold its clocks."),
    "straggler": (
        "The named nodes compute slower with no throttle or network cause visible. Check CPU frequency and "
        "data-loader NUMA affinity, other processes on the node, GPU PCIe link width, memory errors (ECC, "
        "row remapping); replace the node in the job if it persists."),
    "host_bound": (
        "GPUs idle while the network is quiet and no node stands out: the input pipeline, CPU or storage "
        "(or synchronous checkpointing) cannot keep up. More data-loader workers, prefetching and pinned "
        "memory, faster or cached storage, asynchronous checkpoints."),
}

TITLE = {"network_bandwidth": "Network bandwidth too low for the job", "network_congestion": "Fabric congestion",
         "pfc_storm": "PFC storm", "packet_loss": "Packet loss", "link_degraded": "Degraded link",
         "gpu_throttle": "GPU throttling", "straggler": "Straggler node", "host_bound": "Host-bound (input/CPU/storage)"}


def summary(features: Features) -> dict:
    frame = features.frame
    g = features.cluster
    gpus = frame.node["gpus"].groupby(level="instance").max()
    total = g["gpu_time"].sum(min_count=1)
    idle = (g["idle_frac"] * g["gpu_time"]).sum(min_count=1)
    return {"nodes": len(frame.instances), "gpus": int(np.nansum(gpus)) if len(gpus) else 0,
            "gpu_idle_fraction": round(float(idle / total), 4) if total and np.isfinite(total) and total > 0
            else None}


def to_json(features: Features, incidents: list[Incident], notes: list[str]) -> dict:
    frame = features.frame
    doc = {"source": frame.source, "start": round(frame.start, 3), "end": round(frame.end, 3), **summary(features),
           "findings": []}
    for i in incidents:
        doc["findings"].append({
            "class": i.cls, "start": round(i.start, 3), "end": round(i.end, 3), "nodes": i.nodes,
            "devices": i.devices, "confidence": round(i.confidence, 2),
            "gpu_idle_seconds": round(i.gpu_idle_seconds, 1) if frame.has_gpus else None,
            "evidence": i.evidence, "remediation": REMEDIATION[i.cls]})
    if notes or frame.warnings:
        doc["notes"] = notes + frame.warnings[:20]
    return doc


def add_cost(doc: dict, features: Features, price: float | None = None, currency: str = "") -> None:
    """GPU-hours lost to each finding, and with a price per GPU-hour the money, so that what a
    slow network costs can be set against what an upgrade costs."""
    if not features.frame.has_gpus:
        return
    hours = (lambda seconds: seconds / 3600.0)
    for f in doc["findings"]:
        if f.get("gpu_idle_seconds") is not None:
            f["gpu_hours_idle"] = round(hours(f["gpu_idle_seconds"]), 2)
            if price is not None:
                f["cost"] = round(hours(f["gpu_idle_seconds"]) * price, 2)
    gpu_time = float(features.node["gpu_time"].sum(min_count=1))
    if not np.isfinite(gpu_time) or gpu_time <= 0:
        return
    idle = gpu_time * (doc.get("gpu_idle_fraction") or 0.0)
    lost = min(sum(f.get("gpu_idle_seconds") or 0.0 for f in doc["findings"]), idle)
    per_day = 86400.0 / max(doc["end"] - doc["start"], 1.0)
    cost = {"gpu_hours": round(hours(gpu_time), 2), "gpu_hours_idle": round(hours(idle), 2),
            "gpu_hours_lost_to_findings": round(hours(lost), 2),
            "gpu_hours_lost_per_day": round(hours(lost) * per_day, 1)}
    if price is not None:
        cost.update(gpu_hour_price=price, currency=currency, lost=round(hours(lost) * price, 2),
                    lost_per_day=round(hours(lost) * per_day * price, 2))
    doc["cost"] = cost


def _money(amount: float, doc_cost: dict) -> str:
    currency = doc_cost.get("currency") or ""
    return f"{amount:,.2f}{' ' + currency if currency else ''}"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in list(value.items())[:6])
    return str(value)


def to_text(doc: dict, markdown: bool = False) -> str:
    h = "## " if markdown else ""
    lines = [f"{'# ' if markdown else ''}gpunet diagnosis of {doc['source']}",
             f"window {rfc3339(doc['start'])} .. {rfc3339(doc['end'])}, {doc['nodes']} nodes, {doc['gpus']} GPUs, "
             f"GPU idle {_pct(doc['gpu_idle_fraction'])}", ""]
    if not doc["findings"]:
        lines += ["No bottleneck found: the window looks healthy.", ""]
    for n, f in enumerate(doc["findings"], 1):
        minutes = (f["end"] - f["start"]) / 60
        cost = f"{f['gpu_idle_seconds'] / 3600:.1f} GPU-hours idle" if f["gpu_idle_seconds"] is not None \
            else ("GPU impact not measured (NCCL figures only)" if "nccl_bus_bandwidth" in f["evidence"]
                  else "GPU impact unknown (no GPU series)")
        if "cost" in f:
            cost += f" (= {_money(f['cost'], doc['cost'])})"
        lines.append(f"{h}{n}. {TITLE[f['class']]} ({f['class']}), confidence {f['confidence']:.2f}")
        lines.append(f"   {rfc3339(f['start'])} .. {rfc3339(f['end'])} ({minutes:.0f} min), {cost}")
        if f["nodes"]:
            lines.append(f"   culprits: {', '.join(f['nodes'][:10])}" + (f" ({', '.join(f['devices'][:6])})"
                                                                           if f["devices"] else ""))
        for key, value in f["evidence"].items():
            lines.append(f"   - {key.replace('_', ' ')}: {_fmt(value)}")
        lines.append(f"   what to do: {f['remediation']}")
        lines.append("")
    lines.extend(capacity_and_cost_lines(doc, h))
    lines.extend(configuration_lines(doc, markdown))
    for note in doc.get("notes", [])[:5]:
        lines.append(f"note: {note}")
    if markdown:  # bullets and paragraphs instead of the terminal's indentation
        lines = [l[3:] if l.startswith("   - ") else ("\n" + l[3:] if l.startswith("   ") else l) for l in lines]
    return "\n".join(lines).rstrip() + "\n"


def capacity_and_cost_lines(doc: dict, h: str) -> list[str]:
    lines = []
    cap = doc.get("capacity")
    if cap:
        lines.append(f"{h}Network capacity: {cap['verdict']}")
        # The arithmetic where it matters: an upgrade is advised, or the user gave a model size.
        if cap.get("upgrade_to") or "model" in cap:
            lines.extend(f"   - {step}" for step in cap["arithmetic"])
        lines.append("")
    cost = doc.get("cost")
    if cost and cost["gpu_hours"] > 0:
        line = (f"{h}Cost: {cost['gpu_hours_idle']:,.1f} of {cost['gpu_hours']:,.1f} GPU-hours idle; "
                f"{cost['gpu_hours_lost_to_findings']:,.1f} lost to the findings above")
        if "lost" in cost:
            line += (f" = {_money(cost['lost'], cost)} at {_money(cost['gpu_hour_price'], cost)} per GPU-hour; "
                     f"{_money(cost['lost_per_day'], cost)} a day at this window's rate")
        else:
            line += f", {cost['gpu_hours_lost_per_day']:,.1f} GPU-hours a day at this window's rate"
        lines += [line, ""]
    return lines


def _pct(x) -> str:
    return "unknown" if x is None else f"{100 * x:.1f}%"


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, allow_nan=False, default=str)
