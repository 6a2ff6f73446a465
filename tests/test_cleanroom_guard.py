"""A regression guard on data the diagnoser was not tuned on: the clean-room generator's
guard set (bench/cleanroom.py, written from the public docs alone), as it comes and
perturbed (bench/perturb.py: Poisson redraws, per-node background multipliers, exporter
restarts, missing scrapes, scrape jitter), diagnosed over shifted windows as
bench/accuracy.py does: every labelled incident found with exactly its culprits, no finding
that matches none, nothing on the healthy trace. And its multi-job guard set: phases of a
job's life and a storm crossing jobs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from diagnoser.evaluate import Score, labels_of, sweep
from diagnoser.pipeline import diagnose_frame
from diagnoser.sources.replay import frame_of, read

BENCH = Path(__file__).resolve().parent.parent / "bench"
LENGTHS = (15 * 60.0, 20 * 60.0)  # the guard traces last 25 minutes
OFFSETS = 2


def bench_module(name: str) -> ModuleType:
    """bench/NAME.py as a module (bench/ is no package), once."""
    key = f"_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key]


def generated(tmp_path_factory, set_name: str) -> Path:
    folder = tmp_path_factory.mktemp(f"cleanroom-{set_name}")
    subprocess.run([sys.executable, str(BENCH / "cleanroom.py"), str(folder), "--set", set_name, "--seed", "7"],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    return folder


@pytest.fixture(scope="module")
def guard_set(tmp_path_factory) -> Path:
    return generated(tmp_path_factory, "guard")


def score(traces: list[Path]) -> Score:
    result = Score()
    for trace in traces:
        for w in sweep(trace, OFFSETS, LENGTHS):
            result.add(f"{trace.name} +{w.start - w.first:.0f}s", w.whole, w.report.to_dict()["findings"], w.cut)
    return result


def assert_matches_labels(result: Score) -> None:
    assert result.misses == [] and result.false_findings == []
    assert sum(result.incidents.values()) >= 3 * OFFSETS  # the three faulty traces' incidents, every window
    assert result.exact == result.named and result.healthy_windows > 0 and result.healthy_with_findings == 0


def test_the_clean_room_guard_set_is_diagnosed_as_labelled(guard_set):
    traces = sorted(guard_set.glob("*.om.gz"))
    assert len(traces) == 4
    assert_matches_labels(score(traces))


def test_the_clean_room_guard_set_perturbed_is_diagnosed_as_labelled(guard_set, tmp_path):
    perturb = bench_module("perturb")
    traces = []
    for trace in sorted(guard_set.glob("*.om.gz")):
        out = tmp_path / trace.name
        perturb.perturb(trace, out, "all", seed=11)
        traces.append(out)
    assert_matches_labels(score(traces))


# Several jobs on one fabric (bench/cleanroom.py --set multijob-guard): a job ending and
# another starting on its nodes, an elastic job going on with a replacement node, a storm
# from one job's NIC that freezes the other job over the spine, and one job's all-to-all
# congesting the uplinks another job's ring crosses.
@pytest.fixture(scope="module")
def multijob_guard_set(tmp_path_factory) -> Path:
    return generated(tmp_path_factory, "multijob-guard")


def test_the_multijob_guard_set_is_diagnosed_as_labelled(multijob_guard_set):
    traces = sorted(multijob_guard_set.glob("*.om.gz"))
    assert [t.name.removesuffix(".om.gz") for t in traces] == ["mjg_a2a_congestion", "mjg_churn_healthy",
                                                               "mjg_elastic_healthy", "mjg_storm_xjob"]
    result = score(traces)
    assert result.misses == [] and result.false_findings == []
    assert sum(result.incidents.values()) >= OFFSETS and result.exact == result.named
    assert result.healthy_windows >= 4 * OFFSETS and result.healthy_with_findings == 0


@pytest.mark.parametrize("name, change", [("mjg_churn_healthy", "the job started"),
                                          ("mjg_elastic_healthy", "joined")])
def test_a_start_or_a_replacement_is_a_phase_not_an_incident(multijob_guard_set, name, change):
    """The new job's loading minutes, or the restart around a replaced node, with GPUs idle
    and the network quiet: every job healthy, the phase named in the notes."""
    trace = multijob_guard_set / f"{name}.om.gz"
    labels = labels_of(trace)
    report = diagnose_frame(frame_of(read(trace))).to_dict()
    assert report["findings"] == [] and report["verdict"] == "healthy"
    assert {j["name"] for j in report["jobs"]} >= {j["name"] for j in labels["jobs"]}
    assert any(change in note and "judged only for faults" in note for note in report["notes"] + [
        n for j in report["jobs"] for n in j.get("notes", [])])


@pytest.mark.parametrize("name", ["mjg_storm_xjob", "mjg_a2a_congestion"])
def test_a_cause_is_reported_once_and_the_job_it_hurt_points_to_it(multijob_guard_set, name):
    """A storm from job A's NIC, or job A's all-to-all filling the uplinks: one finding, in
    job A, listing job B with its GPU idle; job B's section points to it."""
    trace = multijob_guard_set / f"{name}.om.gz"
    labels = labels_of(trace)
    (cause,) = labels["incidents"]
    (waited,) = labels["waited_on"]
    report = diagnose_frame(frame_of(read(trace))).to_dict()
    (finding,) = report["findings"]
    assert finding["class"] == cause["class"] and finding["job"] == cause["job"]
    assert finding["nodes"] == cause["nodes"]
    assert [v["job"] for v in finding["victims"]] == [waited["job"]] and finding["victims"][0]["gpu_idle_seconds"] >= 0
    victim = next(j for j in report["jobs"] if j["name"] == waited["job"])
    assert victim["findings"] == 0
    assert victim["waited_on"]
    for pointer in victim["waited_on"]:
        assert pointer["job"] == cause["job"] and pointer["class"] == cause["class"]
        assert pointer["nodes"] == cause["nodes"] and pointer["start"] < cause["end"] and pointer["end"] > cause["start"]
