"""Windows into incidents: consecutive windows of one class on the same culprits are one
incident, with a start, an end, a confidence and the GPU idle seconds it cost. A condition
that holds for the whole window is one finding, not one per window. Then what the rules'
records say of incidents: symptoms inside their cause's incident are dropped, and what a
class calls normal operation (a checkpoint's periodic stalls) is left out with a note."""

from __future__ import annotations

from diagnoser.analysis.rules import RULES
from diagnoser.model.findings import Incident, WindowFinding

MAX_GAP_WINDOWS = 1  # a single quiet window inside an incident does not split it
MIN_SECONDS = 60.0  # shorter blips (a few retransmits in one 20 s window) are not incidents
# A culprit carries at least half as much of the effect, over the incident, as the worst one
# (as within one window: the rules name nodes at half the worst node's figure or more).
CULPRIT_SHARE = 0.5


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
        piece = Incident(f.cls, f.window, f.window + step, list(f.nodes), list(f.devices), f.confidence,
                         _num(f.idle_seconds), 1, dict(f.evidence), dict(f.effect))
        if target is None:
            incidents.append(piece)
            candidates.append((piece, f.window, set(f.nodes)))
            continue
        incident, _, culprits = target
        if piece.gpu_idle_seconds >= _num(incident.evidence.get("_peak_idle", 0)):
            incident.evidence = {**piece.evidence, "_peak_idle": piece.gpu_idle_seconds}  # the worst window's figures
        _join(incident, piece)
        candidates.remove(target)
        candidates.append((incident, f.window, culprits | set(f.nodes)))
    incidents = [i for i in incidents if i.end - i.start >= MIN_SECONDS - 1e-6]
    for incident in incidents:
        incident.evidence.pop("_peak_idle", None)
        incident.nodes = ranked_culprits(incident) if RULES[incident.cls].localised else []
    return sorted(incidents, key=lambda i: -i.gpu_idle_seconds if i.gpu_idle_seconds == i.gpu_idle_seconds else 0)


def ranked_culprits(incident: Incident) -> list[str]:
    """The incident's culprits, the one that carries the most of the effect first; a node that
    carried a small part of it over the incident (a neighbour that also saw some loss, one
    window's outlier) is not one."""
    if not incident.effect:
        return sorted(incident.nodes)
    top = max(incident.effect.values())
    kept = [n for n, e in incident.effect.items() if e >= CULPRIT_SHARE * top]
    return sorted(kept, key=lambda n: (-incident.effect[n], n))


def _join(into: Incident, other: Incident) -> None:
    """`other` made part of `into`: its span, culprits, devices, GPU idle and effect added,
    the confidence weighed by windows. (Evidence is the caller's choice.)"""
    into.start, into.end = min(into.start, other.start), max(into.end, other.end)
    into.nodes = sorted(set(into.nodes) | set(other.nodes))
    into.devices = sorted(set(into.devices) | set(other.devices))
    into.confidence = (into.confidence * into.windows + other.confidence * other.windows) / \
        (into.windows + other.windows)
    into.gpu_idle_seconds += other.gpu_idle_seconds
    into.windows += other.windows
    for node, effect in other.effect.items():
        into.effect[node] = into.effect.get(node, 0.0) + effect


def _num(x) -> float:
    return float(x) if x is not None and x == x else 0.0


def join_edges(incidents: list[Incident], step: float) -> list[Incident]:
    """A one-window incident that touches a longer one of the same class is its edge, and
    joins it: in the window where a fault starts or ends, each node's scrapes catch it at a
    different moment, so that window may show only a neighbour's share (the node whose last
    scrape fell after the fault's end). Its effect is added, and the culprits ranked again."""
    kept = sorted(incidents, key=lambda i: (i.cls, i.start))
    out: list[Incident] = []
    for i in kept:
        host = next((o for o in out if o.cls == i.cls and (i.windows == 1 or o.windows == 1)
                     and max(o.start, i.start) - min(o.end, i.end) <= MAX_GAP_WINDOWS * step + 1e-6), None)
        if host is None:
            out.append(i)
            continue
        if host.windows == 1 and i.windows > 1:  # keep the longer one's evidence
            host.evidence = i.evidence
        _join(host, i)
        if RULES[host.cls].localised:
            host.nodes = ranked_culprits(host)
    return sorted(out, key=lambda i: -i.gpu_idle_seconds if i.gpu_idle_seconds == i.gpu_idle_seconds else 0)


def absorb_symptoms(incidents: list[Incident], step: float) -> list[Incident]:
    """Drop an incident whose class another incident's class explains (its record's
    `explains`), where it lies within that incident (give or take one window): a window
    half inside a storm shows its pauses without the storm's full rate."""
    kept = []
    for a in incidents:
        if any(a.cls in RULES[b.cls].explains and b.start - step <= a.start + 1e-6 and a.end <= b.end + step + 1e-6
               for b in incidents if b is not a):
            continue
        kept.append(a)
    return kept


def leave_out_normal(incidents: list[Incident], step: float) -> tuple[list[Incident], list[str]]:
    """Each class's incident filter (what its record calls normal operation): the incidents
    kept and a note for each kind left out."""
    notes = []
    for record in RULES.values():
        if record.incident_filter is not None:
            incidents, note = record.incident_filter(incidents, step)
            if note:
                notes.append(note)
    return incidents, notes


def incidents_of(findings: list[WindowFinding], step: float) -> tuple[list[Incident], list[str]]:
    """Window findings into the incidents to report, and notes on what was left out."""
    return leave_out_normal(absorb_symptoms(join_edges(merge(findings, step), step), step), step)
