"""shift_trace: a trace moved in time keeps every sample, each moved by the same whole
seconds, its newest at the asked time; its labels move with it."""

import json

import pytest
from test_trace_cli import read_samples, small_trace

from gpunet.trace import shift_labels, shift_trace

REPLAY = __import__("pathlib").Path(__file__).resolve().parent.parent / "replay_data"


@pytest.mark.parametrize("suffix", [".om", ".om.gz"])
def test_shifted_trace_ends_at_the_asked_time(tmp_path, suffix):
    trace = tmp_path / "small.om.gz"
    small_trace(trace)
    out = tmp_path / f"moved{suffix}"
    last = 1_900_000_123.75
    offset = shift_trace(trace, out, last)
    before, after = read_samples(trace), read_samples(out)
    assert offset == int(offset)
    assert max(t for _, t, _ in after) <= last and last - max(t for _, t, _ in after) < 1.0
    assert {(s, round(t + offset, 3), v) for s, t, v in before} == after
    assert len(after) == len(before)
    assert out.read_bytes().rstrip().endswith(b"# EOF") or suffix == ".om.gz"


def test_labels_move_with_the_trace():
    labels = json.loads((REPLAY / "jobs2_shared_storm.labels.json").read_text())
    moved = shift_labels(labels, 1000.0)
    for key in ("incidents", "waited_on"):
        for old, new in zip(labels.get(key, []), moved.get(key, []), strict=True):
            assert new["start"] == old["start"] + 1000 and new["end"] == old["end"] + 1000
            assert new["nodes"] == old["nodes"]
    assert labels["incidents"][0]["start"] != moved["incidents"][0]["start"]  # the original is left alone


def test_a_sample_without_a_timestamp_is_refused_with_its_line(tmp_path):
    bad = tmp_path / "bad.om"
    bad.write_text('# TYPE gpunet_nic_up gauge\ngpunet_nic_up{device="x"} 1 10.0\ngpunet_nic_up{device="x"} 1 x\n# EOF\n')
    with pytest.raises(ValueError, match=r"bad.om:3: sample without a timestamp"):
        shift_trace(bad, tmp_path / "out.om", 100.0)
