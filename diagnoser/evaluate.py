"""Scoring a diagnosis against ground truth (contract section 3 labels).

A labelled incident is detected when a finding has the same class, overlaps it by at
least half of the shorter of the two intervals, and, for localised classes, names every
culprit; in a trace of several jobs (incidents with a `job` key) the finding must also be
reported under that job, unless it is under a group found by behaviour (no workload
information: the group has no name to compare). A finding that matches no labelled
incident is a false finding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from diagnoser.analysis.jobs import UNATTRIBUTED
from diagnoser.analysis.rules import RULES


def matches(truth: dict, finding: dict) -> bool:
    if truth["class"] != finding["class"]:
        return False
    job = finding.get("job")
    if truth.get("job") and job and not job.startswith(UNATTRIBUTED) and job != truth["job"]:
        return False
    overlap = min(truth["end"], finding["end"]) - max(truth["start"], finding["start"])
    if overlap < 0.5 * min(truth["end"] - truth["start"], finding["end"] - finding["start"]):
        return False
    return not RULES[truth["class"]].localised or set(truth.get("nodes", [])) <= set(finding.get("nodes", []))


@dataclass
class Score:
    incidents: dict[str, int] = field(default_factory=dict)
    detected: dict[str, int] = field(default_factory=dict)
    false: dict[str, int] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)
    false_findings: list[str] = field(default_factory=list)

    def add(self, name: str, truth: list[dict], findings: list[dict]) -> None:
        used: set[int] = set()
        for t in truth:
            self.incidents[t["class"]] = self.incidents.get(t["class"], 0) + 1
            hit = [k for k, f in enumerate(findings) if matches(t, f)]
            if hit:
                self.detected[t["class"]] = self.detected.get(t["class"], 0) + 1
                used.update(hit)
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
        return "\n".join(rows)


def labels_of(trace: Path) -> dict:
    return json.loads(Path(str(trace).removesuffix(".om.gz").removesuffix(".om") + ".labels.json").read_text())
