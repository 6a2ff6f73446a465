"""Instant-query answers read compactly: each series kept as its label set's JSON text and
its value in a float array, not as the dicts json.loads builds. The configuration snapshot
asks some 700,000 series at 2,048 nodes (PFC and ECN flags per NIC and priority); as dicts,
with every answer held until the last came, they were most of a diagnosis' memory and, in
the garbage collector's passes over them, a third of its time. A reader then takes only
the labels it needs (`labels`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

_SERIES = re.compile(rb'\{"metric":(\{[^{}]*\}),"value":\[[^\[\]",]*,"([^"\\]*)"\]\}')


@dataclass
class Vector:
    """An instant vector: series k has the labels of `metrics[k]` (a JSON object's text) and
    the value `values[k]`."""
    metrics: list[bytes]
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.metrics)

    def __getitem__(self, part: slice) -> Vector:
        return Vector(self.metrics[part], self.values[part])


def decode_vector(body: bytes) -> object:
    """An instant query's answer, its result a Vector, read by one regular expression and
    numpy's float parser. Any answer of another shape (an error, a matrix, a label value
    with braces) goes to json.loads, as any other answer."""
    if not body.startswith(b'{"status":"success"') or b'"resultType":"vector"' not in body[:200]:
        return json.loads(body)
    found = _SERIES.findall(body)
    if len(found) != body.count(b'{"metric":'):
        return json.loads(body)
    try:
        values = np.array([value for _, value in found], dtype=bytes).astype(float) if found else np.empty(0)
    except ValueError:  # a value numpy does not read ("1e"): the standard parser says what
        return json.loads(body)
    return {"status": "success", "data": {"resultType": "vector",
                                          "result": Vector([metric for metric, _ in found], values)}}


@lru_cache(maxsize=64)
def _label(name: str) -> re.Pattern[bytes]:
    # The label's value where it holds no escape (a label set with a backslash anywhere is
    # read by json.loads instead, so a quote inside a value never ends the match early).
    return re.compile(b'"' + re.escape(name.encode()) + rb'":"([^"\\]*)"')


def labels(metric: bytes, names: tuple[str, ...]) -> dict[str, str]:
    """The labels `names` of one series' label set (JSON text); absent ones left out."""
    if b"\\" in metric:
        every = json.loads(metric)
        return {n: every[n] for n in names if isinstance(every.get(n), str)}
    out = {}
    for name in names:
        found = _label(name).search(metric)
        if found is not None:
            out[name] = found.group(1).decode("utf-8", "replace")
    return out


def _column(vec: Vector, joined: bytes, name: str) -> list[str] | None:
    """Label `name` of every series of `vec` by one search of their label sets joined, where
    every one has it (a label set holds a name once, and none holds a backslash: no value
    can hide a `"name":"`); None where some lack it."""
    found = _label(name).findall(joined)
    if len(found) != len(vec):
        return None
    text: dict[bytes, str] = {}  # a few distinct values (devices, priorities), each decoded once
    return [text.get(v) or text.setdefault(v, v.decode("utf-8", "replace")) for v in found]


def series(result: object, names: tuple[str, ...]) -> Iterator[tuple[dict[str, str], float]]:
    """(labels `names`, value) of each series of an instant query's result: a Vector, or the
    list of series json.loads gives (a series without a number for a value is skipped)."""
    if isinstance(result, Vector):
        joined = b"\n".join(result.metrics)
        columns = None if b"\\" in joined else [_column(result, joined, name) for name in names]
        if columns is None or any(column is None for column in columns):
            for metric, value in zip(result.metrics, result.values.tolist()):
                yield labels(metric, names), value
            return
        for row, value in zip(zip(*columns), result.values.tolist()):
            yield dict(zip(names, row)), value
        return
    for one in result if isinstance(result, list) else ():
        try:
            value = float(one["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        metric = one.get("metric", {})
        yield {n: metric[n] for n in names if isinstance(metric.get(n), str)}, value
