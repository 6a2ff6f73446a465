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
from diagnoser.evaluate import Score, inside, labels_of, matches, windows_of
from diagnoser.pipeline import diagnose, diagnose_frame
from diagnoser.sources import Source
from diagnoser.sources.replay import frame_of, read

LENGTHS = (15 * 60.0, 30 * 60.0, 3600.0, 3 * 3600.0)
OFFSETS = 8  # per length: 32 windows, each starting or ending at a different second
SERVED_OFFSETS = 4
SERVED = ("healthy_confounders.om.gz", "pfc_storm.om.gz", "packet_loss_link.om.gz")


def sweep(trace: Path, diagnosis, windows) -> dict[tuple, set]:
    """Diagnose every window, score it against the labels, and return what each labelled
    incident was found as: {incident: {(class, culprits in order)}}."""
    labels = labels_of(trace)["incidents"]
    found: dict[tuple, set] = {}
    for start, end in windows:
        doc = diagnosis(start, end).to_dict()
        judged = doc.get("judged", {"start": start, "end": start})  # the whole windows of the grid
        whole, cut = inside(labels, judged["start"], judged["end"])
        score = Score()
        score.add(trace.name, whole, doc["findings"], cut)
        where = f"{trace.name} window +{start:.0f}..+{end:.0f} s"
        assert not score.misses and not score.false_findings, (where, score.misses, score.false_findings)
        if not labels:
            assert doc["verdict"] == "healthy", (where, doc.get("inconclusive_reasons"))
        for truth in whole:
            f = next(f for f in doc["findings"] if matches(truth, f))
            # Culprits exact where the labels name any: no neighbour named beside the labelled node.
            if RULES[truth["class"]].localised and truth["nodes"]:
                assert set(f["nodes"]) == set(truth["nodes"]), (where, truth, f["nodes"])
            found.setdefault((truth["class"], truth["start"]), set()).add((f["class"], tuple(f["nodes"])))
    return found


@pytest.mark.parametrize("trace", TRACES, ids=[t.name for t in TRACES])
def test_the_same_incidents_at_every_second_and_length(trace):
    parsed = read(trace)
    windows = windows_of(parsed.first, parsed.last, LENGTHS, OFFSETS)
    shifts = {round(s - parsed.first) for s, _ in windows} | {round(parsed.last - e) for _, e in windows}
    assert len(shifts) >= 30, shifts
    found = sweep(trace, lambda s, e: diagnose_frame(frame_of(parsed, start=s, end=e)), windows)
    assert all(len(answers) == 1 for answers in found.values()), found


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
@pytest.mark.parametrize("name", SERVED)
def test_the_same_incidents_from_prometheus_at_every_second_and_length(name, served):
    """The server path over shifted windows: the same incidents as the labels, the same
    culprits in the same order as the file gives for the same window."""
    trace = next(t for t in TRACES if t.name == name)
    url = served(trace)
    parsed = read(trace)
    windows = windows_of(parsed.first, parsed.last, LENGTHS, SERVED_OFFSETS)

    def from_server(start: float, end: float):
        report = diagnose(Source(prometheus=url, start=f"{start:.3f}", end=f"{end:.3f}"))
        from_file = diagnose_frame(frame_of(parsed, start=start, end=end))
        assert [(f.cls, f.nodes) for f in report.findings] == [(f.cls, f.nodes) for f in from_file.findings]
        assert report.verdict == from_file.verdict
        return report

    found = sweep(trace, from_server, windows)
    assert all(len(answers) == 1 for answers in found.values()), found
