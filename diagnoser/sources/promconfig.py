"""The configuration snapshot (diagnoser/model/netconfig.py) from a Prometheus HTTP API.

One instant query per configuration metric at the window's end, `last_over_time(m[window])`:
the server picks each series' latest value, so only one value per series comes back
whatever the window's length. (GPU PCIe speed: its maximum over the window, and GPU busy:
its increase, as the trace reader computes them.)
"""

from __future__ import annotations

import asyncio

from diagnoser.model.netconfig import BUSY, MAX_OVER_WINDOW, METRICS, ConfigSnapshot, snapshot
from gpunet.promapi import PrometheusClient


def _expr(name: str, window: str) -> str:
    if name == BUSY:
        return f"increase({name}[{window}])"
    if name in MAX_OVER_WINDOW:
        return f"max_over_time({name}[{window}])"
    return f"last_over_time({name}[{window}])"


async def config_from_prometheus(client: PrometheusClient, start: float, end: float) -> ConfigSnapshot:
    seconds = max(int(round(end - start)), 1)
    window = f"{seconds}s"
    names = sorted(METRICS)
    answers = await asyncio.gather(*(client.query(_expr(n, window), end) for n in names))
    records = []
    for name, answer in zip(names, answers):
        for series in answer.get("result", []):
            try:
                value = float(series["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if name == BUSY:
                value /= seconds
            records.append((name, series.get("metric", {}), value))
    return snapshot(records)
