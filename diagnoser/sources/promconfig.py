"""The configuration snapshot (diagnoser/model/netconfig.py) from a Prometheus HTTP API.

One instant query per configuration metric at the window's end, `last_over_time(m[window])`:
the server picks each series' latest value, so only one value per series comes back
whatever the window's length. (GPU PCIe speed: its maximum over the window, and GPU busy:
its increase, as the trace reader computes them.) Each answer is read compactly
(sources/vector.py) and added to the snapshot as it comes, then dropped: at 2,048 nodes the
answers are some 700,000 series, 115 MB of JSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from diagnoser.model.netconfig import BUSY, MAX_OVER_WINDOW, METRICS, ConfigSnapshot, SnapshotBuilder, labels_read
from diagnoser.sources import vector
from gpunet.promapi import PrometheusClient


def _expr(name: str, window: str) -> str:
    """The query for one metric; $M: where the caller puts an instance matcher."""
    if name == BUSY:
        return f"increase({name}{{$M}}[{window}])"
    if name in MAX_OVER_WINDOW:
        return f"max_over_time({name}{{$M}}[{window}])"
    return f"last_over_time({name}{{$M}}[{window}])"


# Runs a query (with $M) at the window's end, and hands each answer's result (a
# vector.Vector, or json.loads' list of series) to the callback as soon as it is read.
Instant = Callable[[str, Callable[[object], None]], Awaitable[None]]


async def config_from_prometheus(client: PrometheusClient, start: float, end: float,
                                 instant: Instant | None = None) -> ConfigSnapshot:
    """`instant`: the diagnoser's own, which asks by node group and splits a query the server
    refuses over a limit; by default one query over every node."""
    seconds = max(int(round(end - start)), 1)
    window = f"{seconds}s"
    builder = SnapshotBuilder()

    async def whole(expr: str, fold: Callable[[object], None]) -> None:
        fold((await client.query(expr.replace("$M", ""), end, decode=vector.decode_vector)).get("result", []))

    def folder(name: str) -> Callable[[object], None]:
        wanted = labels_read(name)

        def fold(result: object) -> None:
            for labels, value in vector.series(result, wanted):
                builder.add(name, labels, value / seconds if name == BUSY else value)
        return fold

    await asyncio.gather(*((instant or whole)(_expr(n, window), folder(n)) for n in sorted(METRICS)))
    return builder.build()
