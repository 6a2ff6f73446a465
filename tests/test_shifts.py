"""Same data, same answer: on-call asks at any second and for any length of window, and the
diagnosis of every incident wholly inside it must not move; a healthy trace is healthy at
every one of them. Every committed trace is swept over windows of 15 minutes to 3 hours
whose start (or, where the window outgrows the trace, whose end) moves by odd numbers of
seconds, so that no two windows fall on the same second of the diagnoser's grid.

The ground truth is the trace's labels (written by the simulator or the recorder from the
fault it injected), never a diagnosis: each window is scored against them, and the classes
and culprits found for one incident must be the same in every window that holds it.
bench/accuracy.py runs the same sweep with more offsets (30 per length) for its figures.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_diagnoser import TRACES

from diagnoser.analysis.rules import RULES
from diagnoser.evaluate import Score, from_file, labels_of, matches, sweep
from diagnoser.pipeline import diagnose
from diagnoser.sources import Source

OFFSETS = 8  # per length: 32 windows, each starting or ending at a different second
SERVED_OFFSETS = 4
SERVED = ("healthy_confounders.om.gz", "pfc_storm.om.gz", "packet_loss_link.om.gz")


def scored(trace: Path, offsets: int, diagnosis=from_file) -> tuple[dict[tuple, set], set[int]]:
    """Diagnose every shifted window, score it against the labels, and return what each
    labelled incident was found as ({incident: {(class, culprits in order)}}) and the shifts
    tried (seconds from the trace's start to a window's start, and from its end to the trace's)."""
    healthy = not labels_of(trace)["incidents"]
    found: dict[tuple, set] = {}
    shifts: set[int] = set()
    for w in sweep(trace, offsets, diagnosis=diagnosis):
        shifts |= {round(w.start - w.first), round(w.last - w.end)}
        doc = w.report.to_dict()
        score = Score()
        score.add(trace.name, w.whole, doc["findings"], w.cut)
        where = f"{trace.name} window +{w.start - w.first:.0f}..+{w.end - w.first:.0f} s"
        assert not score.misses and not score.false_findings, (where, score.misses, score.false_findings)
        if healthy:
            assert doc["verdict"] == "healthy", (where, doc.get("inconclusive_reasons"))
        for truth in w.whole:
            f = next(f for f in doc["findings"] if matches(truth, f))
            # Culprits exact where the labels name any: no neighbour named beside the labelled node.
            if RULES[truth["class"]].localised and truth["nodes"]:
                assert set(f["nodes"]) == set(truth["nodes"]), (where, truth, f["nodes"])
            found.setdefault((truth["class"], truth["start"]), set()).add((f["class"], tuple(f["nodes"])))
    return found, shifts


@pytest.mark.parametrize("trace", TRACES, ids=[t.name for t in TRACES])
def test_the_same_incidents_at_every_second_and_length(trace):
    found, shifts = scored(trace, OFFSETS)
    assert len(shifts) >= 30, shifts
    assert all(len(answers) == 1 for answers in found.values()), found


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
@pytest.mark.parametrize("name", SERVED)
def test_the_same_incidents_from_prometheus_at_every_second_and_length(name, served):
    """The server path over shifted windows: the same incidents as the labels, the same
    culprits in the same order as the file gives for the same window."""
    trace = next(t for t in TRACES if t.name == name)
    url = served(trace)

    def from_server(parsed, start: float, end: float):
        report = diagnose(Source(prometheus=url, start=f"{start:.3f}", end=f"{end:.3f}"))
        file_report = from_file(parsed, start, end)
        assert [(f.cls, f.nodes) for f in report.findings] == [(f.cls, f.nodes) for f in file_report.findings]
        assert report.verdict == file_report.verdict
        return report

    found, _ = scored(trace, SERVED_OFFSETS, from_server)
    assert all(len(answers) == 1 for answers in found.values()), found
