"""Scoring a diagnosis against ground truth (docs/trace-format.md labels).

A labelled incident is detected when a finding has the same class, overlaps it by at
least half of the shorter of the two intervals, and, for localised classes, names every
culprit; in a trace of several jobs (incidents with a `job` key) the finding must also be
reported under that job, unless it is under a group found by behaviour (no workload
information: the group has no name to compare). A finding that matches no labelled
incident is a false finding.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from diagnoser.analysis.jobs import UNATTRIBUTED
from diagnoser.analysis.rules import RULES
from diagnoser.model.report import Report
from diagnoser.pipeline import diagnose_frame
from diagnoser.sources.replay import Trace, frame_of, read

# The window lengths on-call asks for (--since 15m, 30m, 1h, 3h).
LENGTHS = (15 * 60.0, 30 * 60.0, 3600.0, 3 * 3600.0)


def matches(truth: dict, finding: dict) -> bool:
    if truth["class"] != finding["class"]:
        return False
    job = finding.get("job")
    if truth.get("job") and job and not job.startswith(UNATTRIBUTED) and job != truth["job"]:
        return False
    if _overlap(truth, finding) < 0.5 * min(truth["end"] - truth["start"], finding["end"] - finding["start"]):
        return False
    return _culprits_match(truth, finding)


def of_cut(finding: dict, cut: list[dict]) -> bool:
    """Whether a finding is of an incident the window holds only part of (same class and
    culprits, overlapping what the window saw): neither right nor wrong."""
    return any(t["class"] == finding["class"] and _overlap(t, finding) > 0 and _culprits_match(t, finding)
               for t in cut)


def _overlap(a: dict, b: dict) -> float:
    return min(a["end"], b["end"]) - max(a["start"], b["start"])


def _culprits_match(truth: dict, finding: dict) -> bool:
    return not RULES[truth["class"]].localised or set(truth.get("nodes", [])) <= set(finding.get("nodes", []))


@dataclass
class Score:
    incidents: dict[str, int] = field(default_factory=dict)
    detected: dict[str, int] = field(default_factory=dict)
    false: dict[str, int] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)
    false_findings: list[str] = field(default_factory=list)
    # Detected incidents that name culprits (labels with nodes), and those whose finding names
    # exactly the labelled ones (no neighbour beside them).
    named: int = 0
    exact: int = 0
    healthy_windows: int = 0  # diagnoses of a window with no labelled incident in it at all
    healthy_with_findings: int = 0

    def add(self, name: str, truth: list[dict], findings: list[dict], cut: list[dict] | None = None) -> None:
        """Score one diagnosis. `cut`: labelled incidents the window holds only part of; a
        finding of one of them (same class and culprits, overlapping what was seen) is
        neither a detection nor a false finding."""
        used = {k for k, f in enumerate(findings) if of_cut(f, cut or [])}
        if not truth and not cut:
            self.healthy_windows += 1
            self.healthy_with_findings += bool(findings)
        for t in truth:
            self.incidents[t["class"]] = self.incidents.get(t["class"], 0) + 1
            hit = [k for k, f in enumerate(findings) if matches(t, f)]
            if hit:
                self.detected[t["class"]] = self.detected.get(t["class"], 0) + 1
                used.update(hit)
                if RULES[t["class"]].localised and t.get("nodes"):
                    self.named += 1
                    self.exact += any(set(findings[k]["nodes"]) == set(t["nodes"]) for k in hit)
            else:
                self.misses.append(f"{name}: {t['class']} {t.get('nodes', [])}")
        for k, f in enumerate(findings):
            if k not in used:
                self.false[f["class"]] = self.false.get(f["class"], 0) + 1
                self.false_findings.append(f"{name}: {f['class']} {f['nodes']}")

    @property
    def recall(self) -> float:
        total = sum(self.incidents.values())
        return sum(self.detected.values()) / total if total else 1.0

    @property
    def precision(self) -> float:
        found = sum(self.detected.values()) + sum(self.false.values())
        return sum(self.detected.values()) / found if found else 1.0

    def table(self) -> str:
        classes = sorted(set(self.incidents) | set(self.false))
        rows = [f"{'class':20} {'incidents':>9} {'detected':>9} {'false':>6}"]
        for c in classes:
            rows.append(f"{c:20} {self.incidents.get(c, 0):9} {self.detected.get(c, 0):9} {self.false.get(c, 0):6}")
        rows.append(f"{'all':20} {sum(self.incidents.values()):9} {sum(self.detected.values()):9} "
                    f"{sum(self.false.values()):6}")
        rows.append(f"recall {self.recall:.3f}  precision {self.precision:.3f}")
        if self.named:
            rows.append(f"culprits exact in {self.exact} of {self.named} detections that name culprits")
        if self.healthy_windows:
            rows.append(f"windows without any incident: {self.healthy_windows}, "
                        f"{self.healthy_with_findings} of them with a finding")
        return "\n".join(rows)


# Seconds between two shifted windows: prime, so that shifts fall on different seconds of
# any grid step the diagnoser uses (20 s to an hour: none is a multiple of 29).
SHIFT = 29


def windows_of(first: float, last: float, lengths: tuple[float, ...], offsets: int) -> list[tuple[float, float]]:
    """Windows over a trace covering first..last: for each length, `offsets` windows whose
    start moves by SHIFT seconds at a time (each length from a phase of its own, so that no
    two windows of the sweep start on the same second); a window longer than the trace
    starts at its start and its end moves instead."""
    out = []
    # A trace too short for SHIFT moves its windows by less, within half its length.
    unit = min(SHIFT, max(1, int((last - first) / 2 / (offsets + 1))))
    for j, length in enumerate(lengths):
        for k in range(offsets):
            shift = k * unit + j * max(1, unit // 4)
            if first + length + shift <= last:
                out.append((first + shift, first + shift + length))
            else:
                out.append((first, last - shift))
    return out


def inside(incidents: list[dict], start: float, end: float) -> tuple[list[dict], list[dict]]:
    """(incidents wholly inside [start, end], incidents it cuts). Give the span the
    diagnosis judged (its document's `judged`: the whole windows of the grid), not the one
    asked for: what lies in the partial windows at either end was not judged either way."""
    whole = [t for t in incidents if t["start"] >= start and t["end"] <= end]
    cut = [t for t in incidents if t not in whole and t["end"] > start and t["start"] < end]
    return whole, cut


@dataclass
class Shifted:
    """One window of a sweep: what was asked, the diagnosis, and the labelled incidents
    wholly inside the span it judged and those it cuts."""
    start: float
    end: float
    report: Report
    whole: list[dict]
    cut: list[dict]
    first: float  # the trace's first and last samples, for saying where a window lies in it
    last: float


def from_file(parsed: Trace, start: float, end: float) -> Report:
    """What `diagnose --replay` finds in [start, end] (the same pipeline, in-process)."""
    return diagnose_frame(frame_of(parsed, start=start, end=end))


def sweep(trace: Path, offsets: int, lengths: tuple[float, ...] = LENGTHS,
          diagnosis: Callable[[Trace, float, float], Report] = from_file) -> Iterator[Shifted]:
    """Diagnose a labelled trace, read once, over shifted windows (windows_of), each with the
    labelled incidents inside what it judged: what bench/accuracy.py, diagnoser.calibrate
    and tests/test_shifts.py score. `diagnosis` may read another source of the same data."""
    parsed = read(trace)
    labels = labels_of(trace)["incidents"]
    for start, end in windows_of(parsed.first, parsed.last, lengths, offsets):
        report = diagnosis(parsed, start, end)
        whole, cut = inside(labels, *(report.summary.judged or (start, start)))
        yield Shifted(start, end, report, whole, cut, parsed.first, parsed.last)


def labels_of(trace: Path) -> dict:
    return json.loads(Path(str(trace).removesuffix(".om.gz").removesuffix(".om") + ".labels.json").read_text())
