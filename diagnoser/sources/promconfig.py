"""The configuration snapshot (diagnoser/model/netconfig.py) from a Prometheus HTTP API.

One instant query per configuration metric at the window's end, `last_over_time(m[window])`:
the server picks each series' latest value, so only one value per series comes back
whatever the window's length. (GPU PCIe speed: its maximum over the window, and GPU busy:
its increase, as the trace reader computes them.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from diagnoser.model.netconfig import BUSY, MAX_OVER_WINDOW, METRICS, ConfigSnapshot, snapshot
from gpunet.promapi import PrometheusClient


def _expr(name: str, window: str) -> str:
    """The query for one metric; $M: where the caller puts an instance matcher."""
    if name == BUSY:
        return f"increase({name}{{$M}}[{window}])"
    if name in MAX_OVER_WINDOW:
        return f"max_over_time({name}{{$M}}[{window}])"
    return f"last_over_time({name}{{$M}}[{window}])"


Instant = Callable[[str], Awaitable[list[dict]]]


async def config_from_prometheus(client: PrometheusClient, start: float, end: float,
                                 instant: Instant | None = None) -> ConfigSnapshot:
    """`instant`: runs a query (with $M) at `end` and gives every series answered; the
    diagnoser's own splits it by node group where the server refuses it over a limit."""
    seconds = max(int(round(end - start)), 1)
    window = f"{seconds}s"
    names = sorted(METRICS)

    async def whole(expr: str) -> list[dict]:
        return (await client.query(expr.replace("$M", ""), end)).get("result", [])

    answers = await asyncio.gather(*((instant or whole)(_expr(n, window)) for n in names))
    records = []
    for name, answer in zip(names, answers):
        for series in answer:
            try:
                value = float(series["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if name == BUSY:
                value /= seconds
            records.append((name, series.get("metric", {}), value))
    return snapshot(records)
