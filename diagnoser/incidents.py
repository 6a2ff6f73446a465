"""Windows into incidents: consecutive windows of one class on the same culprits are one
incident, with a start, an end, a confidence and the GPU idle seconds it cost. A condition
that holds for the whole window is one finding, not one per window."""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnoser.classify import WindowFinding

LOCALISED = {"pfc_storm", "packet_loss", "link_degraded", "gpu_throttle", "straggler"}
MAX_GAP_WINDOWS = 1  # a single quiet window inside an incident does not split it
MIN_SECONDS = 60.0  # shorter blips (a few retransmits in one 20 s window) are not incidents


@dataclass
class Incident:
    cls: str
    start: float
    end: float
    nodes: list[str]
    devices: list[str]
    confidence: float
    gpu_idle_seconds: float
    windows: int
    evidence: dict = field(default_factory=dict)


def merge(findings: list[WindowFinding], step: float) -> list[Incident]:
    incidents: list[Incident] = []
    open_: dict[str, list[tuple[Incident, float, set[str]]]] = {}
    for f in sorted(findings, key=lambda f: (f.window, f.cls)):
        candidates = open_.setdefault(f.cls, [])
        if f.evidence.get("suppressed_by"):
            # The class's signal held but a stronger cause explains it here: it bridges an
            # incident of this class across the window, but starts none.
            for entry in candidates:
                incident, last_window, culprits = entry
                if f.window - last_window <= (MAX_GAP_WINDOWS + 1) * step + 1e-6:
                    candidates.remove(entry)
                    candidates.append((incident, f.window, culprits))
                    break
            continue
        target = None
        for entry in candidates:
            incident, last_window, culprits = entry
            if f.window - last_window > (MAX_GAP_WINDOWS + 1) * step + 1e-6:
                continue
            if not culprits or not f.nodes or culprits & set(f.nodes):
                target = entry
                break
        if target is None:
            incident = Incident(f.cls, f.window, f.window + step, list(f.nodes), list(f.devices), f.confidence,
                                _num(f.idle_seconds), 1, dict(f.evidence))
            incidents.append(incident)
            candidates.append((incident, f.window, set(f.nodes)))
            continue
        incident, _, culprits = target
        incident.end = f.window + step
        incident.nodes = sorted(set(incident.nodes) | set(f.nodes))
        incident.devices = sorted(set(incident.devices) | set(f.devices))
        incident.confidence = (incident.confidence * incident.windows + f.confidence) / (incident.windows + 1)
        incident.gpu_idle_seconds += _num(f.idle_seconds)
        incident.windows += 1
        if _num(f.idle_seconds) >= _num(incident.evidence.get("_peak_idle", 0)):
            incident.evidence = dict(f.evidence)  # show the worst window's figures
            incident.evidence["_peak_idle"] = _num(f.idle_seconds)
        candidates.remove(target)
        candidates.append((incident, f.window, culprits | set(f.nodes)))
    incidents = [i for i in incidents if i.end - i.start >= MIN_SECONDS - 1e-6]
    for incident in incidents:
        incident.evidence.pop("_peak_idle", None)
        if incident.cls not in LOCALISED:
            incident.nodes = []
    return sorted(incidents, key=lambda i: -i.gpu_idle_seconds if i.gpu_idle_seconds == i.gpu_idle_seconds else 0)


def _num(x) -> float:
    return float(x) if x is not None and x == x else 0.0


def periodic_stalls(incidents: list[Incident], step: float) -> tuple[list[Incident], list[Incident]]:
    """Split out brief quiet stalls that recur at a regular period: checkpoints (or another
    scheduled pause), a normal part of training, not a host-bound fault. Returns (kept,
    stalls)."""
    short = [i for i in incidents if i.cls == "host_bound" and i.end - i.start <= 2 * step + 1e-6]
    if len(short) < 3:
        return incidents, []
    starts = sorted(i.start for i in short)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    mean = sum(gaps) / len(gaps)
    spread = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    if mean <= 0 or spread > 0.35 * mean:
        return incidents, []
    return [i for i in incidents if i not in short], short


# A finding whose signal a root cause produces at its edges (a window half inside a storm
# shows its pauses without the storm's full rate) is that cause's symptom, not a second one.
EXPLAINED_BY = {"network_congestion": {"pfc_storm", "packet_loss", "link_degraded"},
                "straggler": {"gpu_throttle", "link_degraded"},
                "host_bound": {"link_degraded", "pfc_storm", "packet_loss"},
                "network_bandwidth": {"link_degraded", "straggler", "gpu_throttle"}}


def absorb_symptoms(incidents: list[Incident], step: float) -> list[Incident]:
    kept = []
    for a in incidents:
        causes = EXPLAINED_BY.get(a.cls, set())
        if any(b.cls in causes and b.start - step <= a.start + 1e-6 and a.end <= b.end + step + 1e-6
               for b in incidents if b is not a):
            continue
        kept.append(a)
    return kept
