"""The tidy frame from any engine serving the Prometheus HTTP API, aggregated by the server.

The server does the work: one `increase()`/`avg_over_time()` range query per column,
summed by instance (and joined with the fabric NICs) in PromQL, evaluated once per window.
Queries are split by node group and by time and run concurrently; a query the server
refuses over one of its limits (samples, series or points per query) is halved, by nodes
and then by time, and run again, with a warning that says so. Only the NICs of suspect
nodes (pauses, loss, flaps, a slow or down link) are then read per device. Never is every
raw series of the cluster pulled.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diagnoser.model.columns import (
    COLUMNS,
    INCREASE,
    NCCL_BUS_BANDWIDTH,
    NCCL_COLUMNS,
    WORKLOAD_COLUMNS,
    Column,
    nccl_key,
)
from diagnoser.model.frame import FINE, Frame, assemble, choose_step, data_window, fine_table, window_edges
from diagnoser.model.netconfig import ConfigSnapshot
from diagnoser.sources import recorded as rec
from diagnoser.sources.promconfig import config_from_prometheus
from diagnoser.sources.vector import decode_vector
from gpunet import contract as c
from gpunet.promapi import PRESENCE_METRIC, PromError, PrometheusClient, PromLimitError, where_data_is
from gpunet.promql import regex_literal
from gpunet.window import rfc3339

NODE_GROUP = 200  # instances per query: keeps each answer a few MB on a 1000-node cluster
WINDOWS_PER_QUERY = 120  # time split: windows per range query
MAX_SUSPECTS = 64
# Device names a matcher may list (a fleet's fabric NICs are a few names); past it, the
# fabric is joined on (the same answer): a server naming every NIC apart must not make each
# query's text megabytes.
MAX_FABRIC_NAMES = 256
# A query keeps at most this many distinct keys (series, in an instant query) per node
# asked for, and never fewer than MIN_KEYS: see _cap.
KEYS_PER_NODE = 1024
MIN_KEYS = 4096
MAX_SPLITS = 6  # halvings of a query refused over a server limit: at most 64 pieces of it
# Counters whose samples tell the scrape interval, in the order tried: one series per node
# first (the cheapest query), then counters every GPU node and every node serve (the TCP
# collector may be off). Every series of a target is scraped at the same times.
SCRAPE_PROBES = (c.TCP_SENT.name, c.GPU_BUSY_SECONDS.name, c.NIC_TRANSMIT_BYTES.name)
# The interval assumed where no probe has samples: Prometheus's default, and the longest in
# common use. A guess too long only makes windows coarser; one too short gives windows of a
# single sample each, where increase() has nothing to subtract (every window NaN).
SCRAPE_FALLBACK = 60.0
# The NIC columns read per device for suspect nodes: what localises a culprit NIC.
NIC_DRILL_DOWN = ("speed", "up", "pfc_", "rdma_loss", "carrier_changes", "tx_bytes", "rx_bytes")


# Each window is [edge, next edge), the same windows a trace is cut into (a sample on an edge
# starts the window it opens): every selector is read 1 ms before the edge (`$O`), as the
# engines' own windows are (edge - range, edge]. A counter's growth in a window is then the
# difference of its last samples before the two edges, exactly as a trace's samples give
# it, on PromQL engines and MetricsQL alike (no extrapolation, no first sample counted from
# zero); a decrease is a reset, and the counter's value after it is what it grew by.
BEFORE_EDGE = " offset 1ms"

_SERIES = re.compile(rb'\{"metric":(\{[^{}]*\}),"values":\[(.*?)\]\}')


def _matrix(body: bytes) -> object:
    """A range query's answer with each series' points as an array of (time, value) rows,
    read from the JSON text by one regular expression and numpy's float parser: at 1,024
    nodes json.loads took 14 s of the diagnosis, building a list and two objects per point.
    Any answer of another shape (an error, a label value with braces) goes to json.loads."""
    if not body.startswith(b'{"status":"success"') or b'"resultType":"matrix"' not in body[:200]:
        return json.loads(body)
    result = []
    for match in _SERIES.finditer(body):
        numbers = match.group(2).translate(None, b'[]"')
        points = np.array(numbers.split(b","), dtype=bytes).astype(float) if numbers else np.empty(0)
        result.append({"metric": json.loads(match.group(1)), "values": points.reshape(-1, 2)})
    if len(result) != body.count(b'{"metric":'):
        return json.loads(body)
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _increase(metric: str, selector: str = "$M") -> str:
    """A counter's growth within each window, per series (see BEFORE_EDGE); absent where the
    series had no sample before the window."""
    # The last sample within $L (a window, and at least two scrapes): an explicit lookback,
    # where a bare selector's is the engine's own (MetricsQL's depends on the query step and
    # misses samples on a step finer than the scrapes; PromQL's 5 minutes reads more).
    now = f"last_over_time({metric}{{{selector}}}[$L]$O)"
    before = f"last_over_time({metric}{{{selector}}}[$L] offset $B)"
    return f"(({now} - {before}) >= 0 or ({now} < {before}))"


def _nic_expr(col: Column, labels: tuple[str, ...]) -> str:
    """One NIC column per device: the increase of a counter, the mean or minimum of a gauge."""
    if col.how == INCREASE:
        return f"sum by ({', '.join(labels)}) ({_increase(col.metric)})"
    return f"{'avg' if col.how == 'mean' else 'min'}_over_time({col.metric}{{$M}}[$S])"


def _expression(template: str, matcher: str, window: float, scrape: float) -> str:
    """`template` for one query: $M the instance matcher, $S the window, $O and $B the offsets
    of the window's end and start (BEFORE_EDGE), $L how far back a last sample is looked for;
    a range selector ends where the window does. $W: the window less 1 ms, without the offset
    (recorded series, whose windows start and end on a record: recorded.py)."""
    ms = int(round(window * 1000))
    lookback = max(ms, int(round(2 * scrape * 1000)))
    return (template.replace("[$S])", "[$S]$O)").replace("$M", matcher).replace("$S", f"{ms}ms")
            .replace("$O", BEFORE_EDGE).replace("$B", f"{ms + 1}ms").replace("$L", f"{lookback}ms")
            .replace("$W", f"{ms - 1}ms"))


def _cap(nodes: int) -> int:
    """The most distinct series (or keys) one query over `nodes` nodes keeps: well past what
    a node serves of any metric (NICs x priorities, GPUs x workloads, NCCL ranks x
    collectives), and what bounds the rows a server's answer of a hundred thousand series
    makes (each a float per window, every query's held until the frame is built)."""
    return max(MIN_KEYS, KEYS_PER_NODE * nodes)


_METRIC_NAME = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


def _named(template: str) -> str:
    """A query by the metric it reads, for a warning (the PromQL runs to hundreds of characters)."""
    found = _METRIC_NAME.search(template)
    return found.group(1) if found else template[:80]


class _Rows:
    """The answers of one query folded into {labels -> one value per window}, as they come.
    A series no query of this family can answer is dropped and counted: one on an instance
    not asked for, where the key holds the instance; a key past _cap."""

    def __init__(self, labels: tuple[str, ...], nodes: list[str], windows: np.ndarray, step: float, add: bool):
        self.labels, self.windows, self.step, self.add = labels, windows, step, add
        self.at = labels.index("instance") if "instance" in labels else None
        self.asked = set(nodes)
        self.cap = _cap(len(nodes))
        self.out: dict[tuple, np.ndarray] = {}
        self._keys: set[tuple] = set()  # every key kept, over the parts too
        self.foreign = self.over = 0

    def fold(self, results: list[dict], into: dict[tuple, np.ndarray]) -> None:
        windows, step = self.windows, self.step
        first = windows[0] + step
        for result in results:
            for series in result.get("result", []):
                key = tuple(series["metric"].get(label, "") for label in self.labels)
                if self.at is not None and key[self.at] not in self.asked:
                    self.foreign += 1
                    continue
                row = into.get(key)
                if row is None:
                    if key not in self._keys and len(self._keys) >= self.cap:
                        self.over += 1
                        continue
                    self._keys.add(key)
                    row = into[key] = np.full(len(windows), np.nan)
                points = series.get("values", [])
                if not isinstance(points, np.ndarray):
                    points = np.array(points, dtype=float).reshape(-1, 2)
                # Each point to its window: the windows are evenly spaced; a time the
                # server moved (not one asked for) is dropped.
                i = np.rint((points[:, 0] - first) / step).astype(int)
                inside = (i >= 0) & (i < len(windows))
                inside[inside] = np.abs(points[inside, 0] - (windows[i[inside]] + step)) < 0.0015
                i, values = i[inside], points[inside, 1]
                row[i] = np.where(np.isnan(row[i]), values, row[i] + values) if self.add else values

    def add_up(self, parts: list[dict[tuple, np.ndarray]]) -> None:
        """The node groups' sums added up, in the groups' order; a window none answered stays NaN."""
        for part in parts:
            for key, row in part.items():
                total = self.out.get(key)
                if total is None:
                    self.out[key] = row
                else:
                    self.out[key] = np.where(np.isnan(total), row, np.where(np.isnan(row), total, total + row))


class _Queries:
    """The queries of one diagnosis, by node group and by time; each query the server
    refuses over a limit is halved until it passes (at most MAX_SPLITS times), and said so.
    Every expression is one whose node groups combine: a series per node, or a sum (added
    up here), never an aggregate that cannot be split (a quantile: see _median)."""

    def __init__(self, client: PrometheusClient, start: float, end: float, instances: list[str],
                 progress: Callable[[str], None]):
        self.client, self.start, self.end, self.instances, self.progress = client, start, end, instances, progress
        self.step, self.windows = 0.0, np.empty(0)  # set once the scrape interval is known
        self.scrape = SCRAPE_FALLBACK
        self.splits = 0  # queries refused over a server limit, halved and run again
        self._said: set[str] = set()

    async def instant(self, template: str) -> list[dict]:
        """Every series `template` (with $M: the instance matcher) answers at the window's
        end: one query while the server takes it, node groups where it does not (an
        aggregate across nodes then comes back once per group: the caller combines them).
        At most as many series as a query over the nodes can honestly answer (_cap)."""
        answers = await self._run(template, None, None, 0.0)
        cap = _cap(len(self.instances))
        kept = [series for answer in answers for series in answer.get("result", [])]
        if len(kept) > cap:
            self.progress(f"warning: the server answered {len(kept)} series to a query of {_named(template)} over "
                          f"{len(self.instances)} nodes, more than {cap}: the first {cap} kept")
            del kept[cap:]
        return kept

    async def by(self, template: str, labels: tuple[str, ...], instances: list[str] | None = None,
                 step: float | None = None, windows: np.ndarray | None = None,
                 add: bool = False) -> dict[tuple, np.ndarray]:
        """Run `template` (with $M: the instance matcher, $S: the window in seconds) over
        every window; {labels -> one value per window}. `add`: the expression sums across
        nodes, so the node groups' answers for one key are added up."""
        step = step or self.step
        windows = self.windows if windows is None else windows
        nodes = instances or self.instances
        groups: list[list[str] | None] = [None] if instances is None and len(nodes) <= NODE_GROUP else [
            nodes[i:i + NODE_GROUP] for i in range(0, len(nodes), NODE_GROUP)]
        rows = _Rows(labels, nodes, windows, step, add)
        # Sums over several node groups are kept per group, then added in the groups' order:
        # the same total whichever group answered first.
        parts: list[dict[tuple, np.ndarray]] = [{} for _ in groups] if add and len(groups) > 1 else [rows.out] * len(groups)

        async def fold(g: int, window_slice: np.ndarray) -> None:
            # Each answer is folded in as soon as it is parsed (no await in between): only the
            # answers in flight are held, not every answer of every query running at once (a
            # server answering each just under the cap would have them past a gigabyte).
            rows.fold(await self._run(template, groups[g], window_slice, step), parts[g])

        await asyncio.gather(*(fold(g, windows[k:k + WINDOWS_PER_QUERY])
                               for g in range(len(groups)) for k in range(0, len(windows), WINDOWS_PER_QUERY)))
        if parts[0] is not rows.out:
            rows.add_up(parts)
        if rows.foreign or rows.over:
            self.progress(f"warning: the server answered series no query of {_named(template)} over these "
                          f"{len(nodes)} nodes can have: {rows.foreign} on instances not asked for, {rows.over} "
                          f"past {rows.cap} keys: dropped")
        return rows.out

    async def _run(self, template: str, group: list[str] | None, windows: np.ndarray | None, step: float,
                   depth: int = 0, decode: Callable[[bytes], object] = json.loads) -> list[dict]:
        """One query for the nodes of `group` (None: no matcher), over `windows` (a range
        query) or at the end (None: an instant one); where the server refuses it over a
        limit, its halves: by nodes while a group has two and the limit is not on points per
        series, else by time. `decode`: an instant query's parser (sources/vector.py)."""
        matcher = "" if group is None else 'instance=~"' + "|".join(regex_literal(i) for i in group) + '"'
        expr = _expression(template, matcher, step if windows is not None else self.end - self.start, self.scrape)
        try:
            if windows is None:
                return [await self.client.query(expr, self.end, decode=decode)]
            return [await self.client.query_range(expr, float(windows[0] + step), float(windows[-1] + step), step,
                                                  decode=_matrix)]
        except PromLimitError as refused:
            if group is None:
                group = self.instances
            limit = refused.limit
            by_nodes = not refused.per_series and len(group) > 1
            if depth >= MAX_SPLITS or not (by_nodes or (windows is not None and len(windows) > 1)):
                raise
            halves: list[tuple[list[str] | None, np.ndarray | None]]
            if by_nodes:
                half = len(group) // 2
                halves = [(group[:half], windows), (group[half:], windows)]
                how = f"{len(group)} nodes into groups of {half} and {len(group) - half}"
            else:
                assert windows is not None
                half = len(windows) // 2
                halves = [(group, windows[:half]), (group, windows[half:])]
                how = f"{len(windows)} windows into {half} and {len(windows) - half}"
            self.splits += 1
            said = f"warning: the server refused a query over its limit ({limit}): split {how}"
            if said not in self._said:  # one line per kind of split, not one per query
                self._said.add(said)
                self.progress(said)
            parts = await asyncio.gather(*(self._run(template, g, w, step, depth + 1, decode) for g, w in halves))
            return [result for part in parts for result in part]


async def _fabric_selector(q: _Queries) -> tuple[str, str]:
    """PromQL for the fabric NICs (labels instance, device), and how it was chosen."""
    client, start, end = q.client, q.start, q.end
    names = set(await client.label_values("__name__", ['{__name__=~"gpunet_nic_(fabric|info)"}'], start, end))
    if c.NIC_FABRIC.name in names:
        return f"max by (instance, device) (last_over_time({c.NIC_FABRIC.name}{{$M}}[$S]) == 1)", "gpunet_nic_fabric"
    # The index alone answers (a series list of every RDMA NIC would pass VictoriaMetrics'
    # -search.maxSeries of 30,000 past some 3,700 nodes of 8 NICs).
    if await client.label_values("rdma_device", [f'{c.NIC_INFO.name}{{rdma_device!=""}}'], start, end):
        return f'max by (instance, device) (last_over_time({c.NIC_INFO.name}{{rdma_device!="",$M}}[$S]))', \
            "NICs with an RDMA device"
    # Neither: a TCP job. Its data NIC is the one that moved the most bytes (the management
    # NIC carries scrapes); the same rule as for a trace.
    span = f"{int(end - start)}s"
    moved = await q.instant(f"topk by (instance) (1, increase({c.NIC_TRANSMIT_BYTES.name}{{$M}}[{span}]) + ignoring() "
                            f"increase({c.NIC_RECEIVE_BYTES.name}{{$M}}[{span}]))")
    devices = sorted({r["metric"].get("device", "") for r in moved} - {""})
    if not devices:
        return "", "all NICs (no RDMA device, no gpunet_nic_fabric)"
    pattern = "|".join(regex_literal(d) for d in devices)
    return (f'count by (instance, device) (last_over_time({c.NIC_TRANSMIT_BYTES.name}{{device=~"{pattern}",$M}}[$S]))',
            f"the busiest NIC of each node ({', '.join(devices[:4])})")


async def _instances(client: PrometheusClient, start: float, end: float, progress: Callable[[str], None]) -> list[str]:
    """The nodes: every instance of a gpunet series; where the server refuses to look through
    every series (VictoriaMetrics: -search.maxUniqueTimeseries, 300,000 by default, some 500
    nodes of 8 GPUs and 8 NICs), the instances of the series every exporter serves."""
    try:
        return sorted(await client.label_values("instance", ['{__name__=~"gpunet_.*"}'], start, end))
    except PromLimitError as refused:
        progress(f"warning: the server refused to list the nodes of every gpunet series over its limit "
                 f"({refused.limit}): nodes listed from {PRESENCE_METRIC}")
        return sorted(await client.label_values("instance", [PRESENCE_METRIC], start, end))


async def _fabric_devices(q: _Queries, fabric: str) -> list[str] | None:
    """The fabric NICs' device names where they pick the fabric NICs of every node (a fleet
    built alike: the fabric is the same names everywhere, and no other NIC bears one of
    them), over the whole range; else None (the fabric is then joined on, per window)."""
    span = f"{int(q.end - q.start)}s"
    fabric_nics, all_nics = await asyncio.gather(
        q.instant(fabric.replace("$S", span)),
        q.instant(f"count by (instance, device) (last_over_time({c.NIC_UP.name}{{$M}}[{span}]))"))
    chosen = {(r["metric"].get("instance", ""), r["metric"].get("device", "")) for r in fabric_nics}
    names = {device for _, device in chosen}
    others = {(r["metric"].get("instance", ""), r["metric"].get("device", "")) for r in all_nics} - chosen
    if not names or "" in names or len(names) > MAX_FABRIC_NAMES or any(device in names for _, device in others):
        return None
    return sorted(names)


@dataclass
class _Span:
    first: float  # the first sample, or the window's start where the data reaches back to it
    last: float  # the last sample at or before the window's end
    scrape_interval: float


async def _data_span(q: _Queries) -> _Span | None:
    """Where the data lies in the range asked for, and the scrape interval, from the first
    probe counter that has samples (None where none has): the facts a trace gives (see
    model/frame.py data_window), so that a server that has just started, or stopped, is judged
    on the part it holds, on windows fitted to its scrapes. Per node the number of samples and
    the last one; the interval and the first sample from the raw samples of the node that
    started first."""
    span = f"{int(round((q.end - q.start) * 1000))}ms"
    for metric in SCRAPE_PROBES:
        counts, lasts = await asyncio.gather(
            q.instant(f"max by (instance) (count_over_time({metric}{{$M}}[{span}]))"),
            q.instant(f"max by (instance) (timestamp({metric}{{$M}}))"))
        count = {r["metric"].get("instance", ""): float(r["value"][1]) for r in counts if float(r["value"][1]) > 1}
        if not count:
            continue
        last = {r["metric"].get("instance", ""): float(r["value"][1]) for r in lasts}
        # The node whose samples reach furthest back: its last sample less its count of
        # intervals (the interval roughly known yet: the range over the longest count).
        rough = (q.end - q.start) / max(count.values())
        earliest = min(count, key=lambda i: last.get(i, q.end) - (count[i] - 1) * rough)
        raw = await q.client.query(f'{metric}{{instance=~"{regex_literal(earliest)}"}}[{span}]', q.end)
        stamps = [np.array([float(t) for t, _ in series.get("values", [])]) for series in raw.get("result", [])]
        stamps = [t for t in stamps if len(t) > 1]
        if not stamps:
            continue
        interval = float(np.median([np.median(np.diff(t)) for t in stamps]))
        first = min(float(t[0]) for t in stamps)
        if first <= q.start + interval:  # whether the data reaches back to the start, in any node
            first = q.start
        else:
            before = await q.client.query(f"max(timestamp({metric}))", q.start + interval)
            if before.get("result"):
                first = q.start
        final = max([float(t[-1]) for t in stamps] + [t for t in last.values() if t <= q.end])
        return _Span(first, final, interval)
    return None


def _whole(x: float) -> bool:
    return x > 1 - 1e-6 and abs(x - round(x)) < 1e-3


def _records_step(start: float, end: float, scrape: float, interval: float) -> float:
    """The windows of a diagnosis from the records: the raw series' where they hold whole
    intervals of the records (the same windows either way: the rules judge windows of a
    given length, and a longer one can hide or make a finding), else longer ones."""
    step = choose_step(start, end, scrape)
    return step if _whole(step / interval) else choose_step(start, end, max(scrape, interval))


async def _fine_by(q: _Queries, template: str, labels: tuple[str, ...], fine_step: float, fine_windows: np.ndarray,
                   every: float | None, add: bool = False) -> dict[tuple, np.ndarray]:
    """`template` over the fine windows. Records of an interval longer than a fine window
    (1 minute, against 15 s windows for windows of a minute) are read per interval and
    spread evenly over the fine windows they hold: the fine grain is then the interval's."""
    k = int(round(every / fine_step)) if every and every > fine_step * (1 + 1e-6) else 1
    if k == 1:
        return await q.by(template, labels, step=fine_step, windows=fine_windows, add=add)
    answer = await q.by(template, labels, step=every, windows=fine_windows[::k], add=add)
    return {key: np.repeat(values / k, k)[:len(fine_windows)] for key, values in answer.items()}


async def _records_interval(q: _Queries, mode: str, scrape: float) -> tuple[float, float] | None:
    """(interval, phase) of the per-node records (recorded.py) where the node frame is read
    from them: they exist over the window, and its windows (and their quarters, the fine
    grain) are whole multiples of their interval. The phase is where their evaluations fall
    within the interval (a rule engine's own offset): the windows are moved by it, so that
    each record lands in the window whose growth it holds. None: the raw series are read
    (`mode` auto, with a line saying why; `on` is an error instead)."""
    if mode == "off":
        return None
    found = await rec.recorded_span(q.client, q.start, q.end)
    if isinstance(found, str):
        why = found
    else:
        interval, first, last = found
        end = min(q.end, last)  # a rule engine evaluates after the scrapes: judged up to its last record
        step = _records_step(q.start, end, scrape, interval)
        phase = round(first % interval, 3)
        edges, partial = window_edges(q.start - phase, end - phase, step)
        edges = edges + phase
        if partial:
            why = f"the recorded series ({rfc3339(first)} .. {rfc3339(last)}) hold no whole window of {step:.0f}s"
        elif not _whole(step / interval) or not (_whole(step / FINE / interval) or _whole(interval * FINE / step)):
            why = f"windows of {step:.0f}s and their quarters do not hold whole intervals of the records ({interval:g}s)"
        elif first > edges[0] + 1.5 * interval:
            why = f"the recorded series begin at {rfc3339(first)}, after the first window ({rfc3339(edges[0])})"
        else:
            q.end = end
            q.progress(f"reading the recorded per-node series ({rec.GROUP}, every {interval:g}s)")
            return interval, phase
    if mode == "on":
        raise PromError(f"{q.client.url}: --recording-rules on: {why}")
    q.progress(f"reading the raw series: {why}")
    return None


async def frame_from_prometheus(client: PrometheusClient, start: float, end: float,
                                progress: Callable[[str], None] = lambda m: None,
                                recording_rules: str = "auto", config: ConfigSnapshot | None = None) -> Frame:
    """The tidy frame of [start, end]. `recording_rules`: auto reads the node columns from
    the per-node records where they exist over the window (recorded.py), on insists on
    them, off reads the raw series. `config`: the configuration snapshot, already read
    (its facts are then not asked again)."""
    instances = await _instances(client, start, end, progress)
    if not instances:
        raise PromError(f"{client.url}: no gpunet series between {rfc3339(start)} and {rfc3339(end)}; "
                        f"{await where_data_is(client, time.time())}")
    q = _Queries(client, start, end, instances, progress)
    found = await _data_span(q)
    warnings: list[str] = []
    asked: tuple[float, float] | None = None
    if found is None:
        scrape = SCRAPE_FALLBACK
        warnings.append(f"no samples of {', '.join(SCRAPE_PROBES)} to tell the scrape interval by: assumed "
                        f"{SCRAPE_FALLBACK:.0f}s (windows of {choose_step(start, end, scrape):.0f}s)")
        progress(f"warning: {warnings[-1]}")
    else:
        scrape = q.scrape = found.scrape_interval
        try:
            start, end, notes = data_window(start, end, found.first, found.last, scrape, "the data")
        except ValueError as e:
            raise PromError(f"{client.url}: {e}") from None
        warnings += notes
        if (start, end) != (q.start, q.end):
            asked = (q.start, q.end)
        q.start, q.end = start, end
    data_end = q.end
    every, phase = await _records_interval(q, recording_rules, scrape) or (None, 0.0)
    end = q.end
    step = _records_step(start, end, scrape, every) if every else choose_step(start, end, scrape)
    edges, partial = window_edges(start - phase, end - phase, step)
    edges = edges + phase
    windows = edges[:-1]
    q.step, q.windows = float(edges[1] - edges[0]) if partial else step, windows
    step = q.step
    fabric, fabric_how = await _fabric_selector(q)
    # Recorded: only the suspects' NICs are read per device, joined on the fabric (listing the
    # fabric's device names would read every NIC's series).
    devices = await _fabric_devices(q, fabric) if fabric and not every else None
    progress(f"{len(instances)} nodes, {len(windows)} windows of {step:.0f}s, fabric: {fabric_how}"
             + (f" (the same {len(devices)} device names on every node)" if devices else ""))

    def on_fabric(inner: str, keep: bool = True) -> str:
        if not fabric:
            return inner if keep else f"({inner}) unless on() vector(1)"
        if devices:  # a label matcher: a third of the server's work of a join, per window, on every query
            pattern = "|".join(regex_literal(d) for d in devices)
            return inner.replace("{$M}", f'{{device{"=~" if keep else "!~"}"{pattern}",$M}}')
        return f"({inner}) * on (instance, device) group_left () ({fabric})" if keep else \
            f"({inner}) unless on (instance, device) ({fabric})"

    # Every counter column of the mapping, summed per node on the server (NIC counters over
    # the node's fabric NICs), then the columns that need a rule of their own.
    counters: dict[str, tuple[Column, tuple[str, ...]]] = {}
    queries: dict[str, tuple[str, tuple[str, ...]]] = {}
    for col in COLUMNS:
        if col.how != INCREASE:
            continue
        labels = ("instance", col.split_by) if col.split_by else ("instance",)
        expr = _increase(col.metric)
        queries[col.metric] = (f"sum by ({', '.join(labels)}) ({on_fabric(expr) if col.table == 'nic' else expr})",
                               labels)
        if every and col.metric in rec.SUMMED:
            queries[col.metric] = (rec.summed(rec.increase_name(col.metric), labels, step, every), labels)
        counters[col.metric] = (col, labels)
    transmitted, received = _increase(c.NIC_TRANSMIT_BYTES.name), _increase(c.NIC_RECEIVE_BYTES.name)
    queries |= {
        "throttled": (f"sum by (instance) (max by (instance, gpu) ({_increase(c.GPU_THROTTLED_SECONDS.name)}))",
                      ("instance",)),
        "gpus": (f"count by (instance) (last_over_time({c.GPU_BUSY_SECONDS.name}{{$M}}[$S]))", ("instance",)),
        "sm_clock": (f"avg by (instance) (avg_over_time({c.GPU_SM_CLOCK.name}{{$M}}[$S]))", ("instance",)),
        "capacity": ("sum by (instance) (" + on_fabric(f"avg_over_time({c.NIC_LINK_SPEED.name}{{$M}}[$S])") + ")",
                     ("instance",)),
        "nics_down": ("count by (instance) ((" + on_fabric(f"min_over_time({c.NIC_UP.name}{{$M}}[$S])") +
                      ") == 0)", ("instance",)),
        "fabric_nics": (f"count by (instance) ({fabric or 'last_over_time(' + c.NIC_UP.name + '{$M}[$S])'})",
                        ("instance",)),
        # The other NICs' busier direction, as a trace's (model/frame.py).
        "other_bytes": ("sum by (instance) (" + on_fabric(
            f"(({transmitted}) >= ({received})) or ({received})", keep=False) + ")",
                        ("instance",)),
        "other_capacity": ("sum by (instance) (" + on_fabric(
            f"avg_over_time({c.NIC_LINK_SPEED.name}{{$M}}[$S])", keep=False) + ")", ("instance",)),
    }
    if every:
        queries |= rec.node_queries(step, every)
    names = list(queries)
    results = await asyncio.gather(*(q.by(*queries[n]) for n in names))
    progress(f"{client.requests} queries for the node frame")
    answers = dict(zip(names, results))
    node_cols: dict[str, dict[str, np.ndarray]] = {i: {} for i in instances}
    for name, series in answers.items():
        for key, values in series.items():
            instance = key[0]
            if instance not in node_cols:
                continue
            if name in counters:
                col, labels = counters[name]
                column = col.name_for(dict(zip(labels, key)))
                if column is not None:
                    node_cols[instance][column] = values
            elif name in ("capacity", "other_capacity"):  # link speed (bytes/s) x the window
                node_cols[instance][name] = values * step
            else:
                node_cols[instance][name] = values
    has_gpus = bool(answers[c.GPU_BUSY_SECONDS.name])
    for cols in node_cols.values():
        if "nics_down" not in cols and "capacity" in cols:
            cols["nics_down"] = np.where(np.isfinite(cols["capacity"]), 0.0, np.nan)  # none matched == 0

    # Peers' link speed, per window, over every fabric NIC of the cluster: how many NICs
    # have each speed (a count adds up over node groups; a quantile would not), then the
    # median of those here.
    speeds = await q.by(rec.SPEED_COUNTS if every else 'count_values("speed", ' +
                        on_fabric(f"avg_over_time({c.NIC_LINK_SPEED.name}{{$M}}[$S])") + ")", ("speed",), add=True)
    speed_median = _median(speeds, len(windows))

    # Finer grain for the cluster's GPU time (sustained vs brief stalls).
    fine_step = step / FINE
    fine_windows = windows[0] + fine_step * np.arange(len(windows) * FINE)  # as a trace's: model/frame.py
    fine_read = max(fine_step, every or 0.0)  # records are read per interval at the finest
    busy_by, idle_by = _gpu_time(every, fine_read)
    fine_busy, fine_idle = await asyncio.gather(
        _fine_by(q, busy_by(()), (), fine_step, fine_windows, every, add=True),
        _fine_by(q, idle_by(("network_state",)), ("network_state",), fine_step, fine_windows, every, add=True))
    fine_cols = {"busy": next(iter(fine_busy.values()), np.full(len(fine_windows), np.nan))}
    for (state,), values in fine_idle.items():
        fine_cols[f"idle_{state}"] = values
    fine = pd.DataFrame(fine_cols, index=pd.Index(fine_windows, name="window")) if has_gpus else pd.DataFrame()

    # Drill down to the NICs of suspect nodes only.
    suspects = _suspects(node_cols, step)
    nic_rows: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    if suspects:
        progress(f"drilling down into the NICs of {len(suspects)} suspect nodes")
        drilled = [col for col in COLUMNS if col.table == "nic" and (col.column in NIC_DRILL_DOWN)]
        labels_of = {col.metric: ("instance", "device", col.split_by) if col.split_by else ("instance", "device")
                     for col in drilled}
        per_device = await asyncio.gather(*(q.by(on_fabric(_nic_expr(col, labels_of[col.metric])),
                                                 labels_of[col.metric], suspects) for col in drilled))
        for col, series in zip(drilled, per_device):
            for key, values in series.items():
                column = col.name_for(dict(zip(labels_of[col.metric], key)))
                if column is not None:
                    nic_rows.setdefault(key[:2], {"fabric": np.full(len(windows), True)})[column] = values
    # ... and into the GPUs of throttled nodes.
    throttled = [i for i, cols in node_cols.items() if _peak(cols.get("throttled")) > 0][:MAX_SUSPECTS]
    gpu_rows: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    if throttled:
        per_gpu = await asyncio.gather(*(q.by(expr, ("instance", "gpu"), throttled) for expr in (
            f"max by (instance, gpu) ({_increase(c.GPU_THROTTLED_SECONDS.name)})",
            f"avg by (instance, gpu) (avg_over_time({c.GPU_SM_CLOCK.name}{{$M}}[$S]))")))
        for column, series in zip(("throttled", "sm_clock"), per_gpu):
            for key, values in series.items():
                gpu_rows.setdefault(key, {})[column] = values
    workloads, node_fine = await _jobs_inputs(q, has_gpus, fine_step, fine_windows, every)
    nccl = await _nccl(q)
    if config is None:
        config = await config_from_prometheus(client, start, end,
                                              lambda template, fold: _instant_by_groups(q, template, fold))
    frame = assemble(f"prometheus:{client.url}", start, end, step, scrape, windows, node_cols, nic_rows, has_gpus,
                     fine, speed_median, warnings, gpu_rows)
    frame.workloads, frame.node_fine, frame.nccl = workloads, node_fine, nccl
    frame.config, frame.partial, frame.asked = config, partial, asked
    # Series that no node can be given (recording rules or remote writes that dropped it).
    try:
        frame.without_instance = len(await client.series(['{__name__=~"gpunet_.+",instance=""}'], start, end))
    except PromLimitError as refused:
        progress(f"warning: the server refused to count the series without an instance over its limit "
                 f"({refused.limit}): not counted")
    if has_gpus:
        frame.gpu_seconds = await (_recorded_gpu_seconds(q, frame.node, every, data_end) if every else
                                   _gpu_seconds(q, frame.node, partial))
    split = f", {q.splits} split to fit the server's limits" if q.splits else ""
    progress(f"{client.requests} queries in all{split}, {client.bytes_received / 1e6:.1f} MB received "
             f"({client.bytes_decoded / 1e6:.1f} MB of JSON)")
    return frame


async def _gpu_seconds(q: _Queries, node: pd.DataFrame, partial: bool) -> tuple[float, float]:
    """GPU busy and idle seconds over the whole range: the whole windows' (already read), and
    the partial windows at either end read over windows shorter than a scrape interval, so
    that each series counts from its first sample in the range, as a trace's does, even where
    it has none before the range (a server that has just started)."""
    idle_columns = [f"idle_{state}" for state in c.NETWORK_STATES if f"idle_{state}" in node]
    busy = float(np.nansum(node["busy"])) if "busy" in node and not partial else 0.0
    idle = float(np.nansum(node[idle_columns].to_numpy())) if idle_columns and not partial else 0.0
    ends = [(q.start, q.end)] if partial else [(q.start, float(q.windows[0])), (float(q.windows[-1]) + q.step, q.end)]
    for a, b in ends:
        more_busy, more_idle = await _gpu_seconds_between(q, a, b)
        busy, idle = busy + more_busy, idle + more_idle
    return busy, idle


async def _gpu_seconds_between(q: _Queries, a: float, b: float) -> tuple[float, float]:
    """GPU busy and idle seconds in [a, b), over windows of half a scrape interval."""
    span_ms = int(round((b - a) * 1000))
    if span_ms <= 0:
        return 0.0, 0.0
    n = max(1, int(np.ceil(2 * span_ms / 1000 / q.scrape)))
    step_ms = span_ms // n  # whole milliseconds (the offsets' unit); the last window takes the rest
    pieces = [(step_ms / 1000, a + step_ms / 1000 * np.arange(n - 1)),
              ((span_ms - (n - 1) * step_ms) / 1000, np.array([a + (n - 1) * step_ms / 1000]))]
    totals = [0.0, 0.0]
    for step, windows in pieces:
        if not len(windows):
            continue
        answers = await asyncio.gather(*(q.by(f"sum({_increase(m)})", (), step=step, windows=windows, add=True)
                                         for m in (c.GPU_BUSY_SECONDS.name, c.GPU_IDLE_SECONDS.name)))
        for k, answer in enumerate(answers):
            totals[k] += float(sum(np.nansum(v) for v in answer.values()))
    return totals[0], totals[1]


async def _nccl(q: _Queries) -> pd.DataFrame:
    """NCCL inspector bus bandwidth per rank over the window, where its dump is scraped (one
    series per collective: averaged on the server)."""
    labels = ("hostname", "instance", "rank", "comm_id", "collective", "message_size")
    answer = await q.instant(f"avg by ({', '.join(labels)}) "
                             f"(avg_over_time({NCCL_BUS_BANDWIDTH}{{$M}}[{int(round(q.end - q.start))}s]))")
    rows = [(*nccl_key(r["metric"]), float(r["value"][1]), float("nan")) for r in answer]
    return pd.DataFrame(rows, columns=NCCL_COLUMNS)


def _gpu_time(every: float | None, window: float
              ) -> tuple[Callable[[tuple[str, ...]], str], Callable[[tuple[str, ...]], str]]:
    """Templates of GPU busy and idle time within windows of `window` seconds, by the labels
    given: from the raw series, or from the per-node records of interval `every`."""
    def by(metric: str) -> Callable[[tuple[str, ...]], str]:
        def template(labels: tuple[str, ...]) -> str:
            if every:
                return rec.summed(rec.increase_name(metric), labels, window, every)
            return f"sum{' by (' + ', '.join(labels) + ')' if labels else ''} ({_increase(metric)})"
        return template
    return by(c.GPU_BUSY_SECONDS.name), by(c.GPU_IDLE_SECONDS.name)


async def config_by_groups(client: PrometheusClient, start: float, end: float,
                           progress: Callable[[str], None] = lambda m: None) -> ConfigSnapshot:
    """The configuration snapshot of [start, end] alone (`diagnose --audit`, the service's
    own schedule), asked per node group as a diagnosis asks it."""
    instances = await _instances(client, start, end, progress)
    q = _Queries(client, start, end, instances, progress)
    return await config_from_prometheus(
        client, start, end, (lambda template, fold: _instant_by_groups(q, template, fold)) if instances else None)


async def _instant_by_groups(q: _Queries, template: str, fold: Callable[[object], None]) -> None:
    """An instant query over every node's series (the configuration facts: some 350 series a
    node of 8 NICs and 8 GPUs), asked per node group at once: the whole cluster's answer
    (some 100 MB of JSON at 2,048 nodes) would pass the client's cap on one answer, and be
    read whole, then halved and read again, before it passed. Each answer is read compactly
    (sources/vector.py) and folded in as it comes; at most _cap series in all are kept."""
    groups: list[list[str] | None] = [None] if len(q.instances) <= NODE_GROUP else [
        q.instances[i:i + NODE_GROUP] for i in range(0, len(q.instances), NODE_GROUP)]
    cap = _cap(len(q.instances))
    kept = over = 0

    async def one(group: list[str] | None) -> None:
        nonlocal kept, over
        for answer in await q._run(template, group, None, 0.0, decode=decode_vector):
            result = answer.get("result", [])
            room = max(cap - kept, 0)
            if len(result) > room:
                over += len(result) - room
                result = result[:room]
            kept += len(result)
            fold(result)

    await asyncio.gather(*(one(group) for group in groups))
    if over:
        q.progress(f"warning: the server answered {kept + over} series to a query of {_named(template)} over "
                   f"{len(q.instances)} nodes, more than {cap}: the first {cap} kept")


async def _recorded_gpu_seconds(q: _Queries, node: pd.DataFrame, every: float, data_end: float
                                ) -> tuple[float, float]:
    """GPU busy and idle seconds over the whole range from the records: the whole windows'
    (already read), and the parts of the range before and after them, read per record
    interval; an interval the range holds only part of counts for that part. The raw data
    runs up to one interval past the last record (the rule engine evaluates behind the
    scrapes): that end counts at the last interval's rates (busy and idle add up to the
    GPUs' wall time, whatever their split)."""
    idle_columns = [f"idle_{state}" for state in c.NETWORK_STATES if f"idle_{state}" in node]
    totals = [float(np.nansum(node["busy"])) if "busy" in node else 0.0,
              float(np.nansum(node[idle_columns].to_numpy())) if idle_columns else 0.0]
    first, last = float(q.windows[0]), float(q.windows[-1]) + q.step
    lead = np.arange(first - every, q.start - every + 1e-6, -every)[::-1]  # intervals [t, t + every) before
    trail = np.arange(last, q.end - 1e-6, every)  # and after, the last one maybe cut by the range's end
    busy_by, idle_by = _gpu_time(every, every)
    for windows in (lead, trail):
        if not len(windows):
            continue
        share = np.clip((np.minimum(windows + every, q.end) - np.maximum(windows, q.start)) / every, 0.0, 1.0)
        answers = await asyncio.gather(*(q.by(template(()), (), step=every, windows=windows, add=True)
                                         for template in (busy_by, idle_by)))
        for k, answer in enumerate(answers):
            totals[k] += float(sum(np.nansum(values * share) for values in answer.values()))
    if data_end > q.end:
        final = np.array([q.end - every])
        answers = await asyncio.gather(*(q.by(template(()), (), step=every, windows=final, add=True)
                                         for template in (busy_by, idle_by)))
        for k, answer in enumerate(answers):
            totals[k] += float(sum(np.nansum(values) for values in answer.values())) * (data_end - q.end) / every
    return totals[0], totals[1]


async def _jobs_inputs(q: _Queries, has_gpus: bool, fine_step: float, fine_windows: np.ndarray,
                       every: float | None = None):
    """What splits the cluster into jobs (diagnoser/jobs.py): which workload held which GPU
    in which window (aggregated on the server), and each node's GPU time at the fine grain."""
    info = await q.by(f"max by (instance, gpu, workload, source, namespace) "
                      f"(max_over_time({c.GPU_WORKLOAD_INFO.name}{{$M}}[$S]))",
                      ("instance", "gpu", "workload", "source", "namespace"))
    rows = [(*key, float(w)) for key, values in info.items() for w in q.windows[np.nan_to_num(values) > 0]]
    workloads = pd.DataFrame(rows, columns=WORKLOAD_COLUMNS)
    node_fine = pd.DataFrame()
    if has_gpus and len(q.instances) > 1:
        busy_by, idle_by = _gpu_time(every, max(fine_step, every or 0.0))
        busy, idle = await asyncio.gather(
            _fine_by(q, busy_by(("instance",)), ("instance",), fine_step, fine_windows, every),
            _fine_by(q, idle_by(("instance", "network_state")), ("instance", "network_state"), fine_step,
                     fine_windows, every))
        cols: dict[str, dict[str, np.ndarray]] = {}
        for (instance,), values in busy.items():
            cols.setdefault(instance, {})["busy"] = values
        for (instance, state), values in idle.items():
            if state in c.NETWORK_STATES:
                cols.setdefault(instance, {})[f"idle_{state}"] = values
        node_fine = fine_table(cols, fine_windows)
    return workloads, node_fine


def _median(counts: dict[tuple, np.ndarray], windows: int) -> np.ndarray:
    """Per window, the median of the values counted ({(value,) -> how many per window}),
    interpolated as PromQL's quantile(0.5) does."""
    values = np.array([float(v) for (v,) in counts])
    table = np.nan_to_num(np.vstack(list(counts.values()))).astype(int) if counts else np.zeros((0, windows), int)
    median = np.full(windows, np.nan)
    for w in range(windows):
        if table[:, w].sum():
            median[w] = float(np.quantile(np.repeat(values, table[:, w]), 0.5))
    return median


def _peak(values: np.ndarray | None) -> float:
    """The largest known value; 0 where none is known."""
    if values is None or not np.isfinite(values).any():
        return 0.0
    return float(np.nanmax(values))


def _suspects(node_cols: dict[str, dict[str, np.ndarray]], step: float) -> list[str]:
    """Nodes whose NICs deserve a look: pauses sent, loss, flaps, a link down, less
    capacity than their peers. Ranked by how far they stand out; at most MAX_SUSPECTS."""
    capacity = {i: c["capacity"] for i, c in node_cols.items() if "capacity" in c}
    # A window without data (a server that has just started) is NaN for every node: no median,
    # no peak, and no numpy warning on the user's terminal either.
    with np.errstate(all="ignore"), warnings.catch_warnings(action="ignore", category=RuntimeWarning):
        median_capacity = np.nanmedian(np.vstack(list(capacity.values())), axis=0) if capacity else None
    scores = {}
    for instance, cols in node_cols.items():
        score = 0.0
        score += _peak(cols.get("pfc_tx")) / step / 100.0
        score += _peak(cols.get("rdma_loss")) / step
        score += 10.0 * _peak(cols.get("carrier_changes"))
        score += 10.0 * _peak(cols.get("nics_down"))
        if instance in capacity and np.any(capacity[instance] < 0.9 * median_capacity):
            score += 10.0  # some window with less link capacity than its peers: a slower or lost link
        if np.isfinite(score) and score >= 1.0:
            scores[instance] = score
    return sorted(scores, key=lambda i: -scores[i])[:MAX_SUSPECTS]
