"""A regression guard on data the diagnoser was not tuned on: the clean-room generator's
guard set (bench/cleanroom.py, written from the public docs alone), as it comes and
perturbed (bench/perturb.py: Poisson redraws, per-node background multipliers, exporter
restarts, missing scrapes, scrape jitter), diagnosed over shifted windows as
bench/accuracy.py does: every labelled incident found with exactly its culprits, no finding
that matches none, nothing on the healthy trace."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from diagnoser.evaluate import Score, sweep

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


@pytest.fixture(scope="module")
def guard_set(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cleanroom-guard")
    subprocess.run([sys.executable, str(BENCH / "cleanroom.py"), str(folder), "--set", "guard", "--seed", "7"],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    return folder


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
