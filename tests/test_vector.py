"""The compact reader of instant-query answers (diagnoser/sources/vector.py) against the
standard JSON parser: every shape of answer gives the same labels and values, the fast path
or the fallback, and an answer of another shape is json.loads' own."""

from __future__ import annotations

import json
import math

import pytest

from diagnoser.sources.vector import Vector, decode_vector, series


def _answer(result: list[dict], kind: str = "vector") -> bytes:
    # As the servers write it: compact, no spaces.
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}},
                      separators=(",", ":"), ensure_ascii=False).encode()


def _expected(body: bytes, names: tuple[str, ...]) -> list[tuple[dict, float]]:
    """What the answer says, by the standard parser."""
    out = []
    for one in json.loads(body)["data"]["result"]:
        out.append(({n: one["metric"][n] for n in names if n in one["metric"]}, float(one["value"][1])))
    return out


def _same(got: list[tuple[dict, float]], want: list[tuple[dict, float]]) -> None:
    assert len(got) == len(want)
    for (labels, value), (want_labels, want_value) in zip(got, want):
        assert labels == want_labels
        assert (math.isnan(value) and math.isnan(want_value)) or value == want_value


NAMES = ("instance", "device", "priority")
PLAIN = [{"metric": {"__name__": "gpunet_nic_pfc_enabled", "device": f"ens{d}", "instance": f"node-{n}:9845",
                     "job": "gpunet", "priority": str(p)}, "value": [1767227699.993, str((n + p) % 2)]}
         for n in range(3) for d in range(2) for p in range(8)]


def test_a_plain_answer_reads_as_json_loads_reads_it_and_compactly():
    body = _answer(PLAIN)
    decoded = decode_vector(body)
    assert isinstance(decoded, dict) and isinstance(decoded["data"]["result"], Vector)
    _same(list(series(decoded["data"]["result"], NAMES)), _expected(body, NAMES))


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e3", "-0.5", "0"])
def test_every_value_the_servers_write(value):
    body = _answer([{"metric": {"instance": "a:1"}, "value": [1.5, value]}])
    _same(list(series(decode_vector(body)["data"]["result"], NAMES)), _expected(body, NAMES))


@pytest.mark.parametrize("label", ['a "quoted" \\ name', "ünïcode-ens1", "brace{d}", 'x","device":"forged', ""])
def test_label_values_that_need_escapes_or_braces(label):
    # A quote, a backslash, a brace or a forged label inside a value: the same labels as
    # json.loads gives, through the slow path or the fallback.
    body = _answer([*PLAIN[:3], {"metric": {"device": label, "instance": "node-9:9845", "priority": "3"},
                                 "value": [1.0, "1"]}, *PLAIN[3:6]])
    _same(list(series(decode_vector(body)["data"]["result"], NAMES)), _expected(body, NAMES))


def test_series_without_a_label_read_one_by_one():
    rows = [{"metric": {"instance": "a:1", "device": "d0"}, "value": [1, "1"]},
            {"metric": {"instance": "b:1"}, "value": [1, "0"]}]
    body = _answer(rows)
    _same(list(series(decode_vector(body)["data"]["result"], NAMES)), _expected(body, NAMES))


@pytest.mark.parametrize("body", [
    b'{"status":"error","errorType":"bad_data","error":"parse error"}',
    _answer([{"metric": {"instance": "a:1"}, "values": [[1, "1"], [2, "2"]]}], kind="matrix"),
    b'{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}',
    _answer([]),
])
def test_other_answers_are_json_loads_own(body):
    decoded = decode_vector(body)
    result = decoded["data"]["result"] if decoded.get("status") == "success" else None
    if isinstance(result, Vector):
        assert len(result) == 0 == len(json.loads(body)["data"]["result"])
    else:
        assert decoded == json.loads(body)


def test_a_value_numpy_cannot_read_falls_back():
    body = _answer([{"metric": {"instance": "a:1"}, "value": [1, "1"]},
                    {"metric": {"instance": "b:1"}, "value": [1, "not a number"]}])
    decoded = decode_vector(body)
    assert decoded == json.loads(body)
    # ... and the series without a number is skipped, as before.
    assert list(series(decoded["data"]["result"], NAMES)) == [({"instance": "a:1"}, 1.0)]
