"""The tidy frame from any engine serving the Prometheus HTTP API, aggregated by the server.

The server does the work: one `increase()`/`avg_over_time()` range query per column,
summed by instance (and joined with the fabric NICs) in PromQL, evaluated once per window.
Queries are split by node group and by time and run concurrently. Only the NICs of
suspect nodes (pauses, loss, flaps, a slow or down link) are then read per device. Never
is every raw series of the cluster pulled.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

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
from diagnoser.model.frame import FINE, Frame, assemble, choose_step, fine_table, window_edges
from diagnoser.sources.promconfig import config_from_prometheus
from gpunet import contract as c
from gpunet.promapi import PromError, PrometheusClient, where_data_is
from gpunet.window import rfc3339

NODE_GROUP = 200  # instances per query: keeps each answer a few MB on a 1000-node cluster
WINDOWS_PER_QUERY = 120  # time split: windows per range query
MAX_SUSPECTS = 64
# The NIC columns read per device for suspect nodes: what localises a culprit NIC.
NIC_DRILL_DOWN = ("speed", "up", "pfc_", "rdma_loss", "carrier_changes", "tx_bytes", "rx_bytes")


# Every increase() is kept only where its series existed a window earlier: at a series'
# first window MetricsQL engines count the whole counter value as increase, Prometheus
# extrapolates; neither is a rate. (`x and x offset w` works in both.)


def _regex_escape(value: str) -> str:
    """A literal inside a PromQL regex inside a PromQL string: the regex escape's backslash
    is itself escaped for the string (`dgx001\\.cluster`)."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\\\1", value)


def _increase(metric: str, selector: str = "$M") -> str:
    """A counter's increase over the window, kept only where the series existed a window
    earlier (see above)."""
    return f"(increase({metric}{{{selector}}}[$S]) and {metric}{{{selector}}} offset $S)"


def _nic_expr(col: Column, labels: tuple[str, ...]) -> str:
    """One NIC column per device: the increase of a counter, the mean or minimum of a gauge."""
    if col.how == INCREASE:
        return f"sum by ({', '.join(labels)}) ({_increase(col.metric)})"
    return f"{'avg' if col.how == 'mean' else 'min'}_over_time({col.metric}{{$M}}[$S])"


class _Queries:
    def __init__(self, client: PrometheusClient, start: float, end: float, step: float, windows: np.ndarray,
                 instances: list[str], progress: Callable[[str], None]):
        self.client, self.start, self.end, self.step = client, start, end, step
        self.windows, self.instances, self.progress = windows, instances, progress
        self.index = {w: i for i, w in enumerate(np.round(windows + step, 3))}

    async def by(self, template: str, labels: tuple[str, ...], instances: list[str] | None = None,
                 step: float | None = None, windows: np.ndarray | None = None) -> dict[tuple, np.ndarray]:
        """Run `template` (with $M: the instance matcher, $S: the window in seconds) over
        every window; {labels -> one value per window}."""
        step = step or self.step
        windows = self.windows if windows is None else windows
        index = {round(w + step, 3): i for i, w in enumerate(windows)}
        groups = [None] if instances is None and len(self.instances) <= NODE_GROUP else [
            (instances or self.instances)[i:i + NODE_GROUP]
            for i in range(0, len(instances or self.instances), NODE_GROUP)]
        jobs = []
        for group in groups:
            matcher = "" if group is None else 'instance=~"' + "|".join(_regex_escape(i) for i in group) + '"'
            expr = template.replace("$M", matcher).replace("$S", f"{int(round(step))}s")
            for k in range(0, len(windows), WINDOWS_PER_QUERY):
                chunk = windows[k:k + WINDOWS_PER_QUERY]
                jobs.append(self.client.query_range(expr, float(chunk[0] + step), float(chunk[-1] + step), step))
        out: dict[tuple, np.ndarray] = {}
        for result in await asyncio.gather(*jobs):
            for series in result.get("result", []):
                key = tuple(series["metric"].get(label, "") for label in labels)
                row = out.setdefault(key, np.full(len(windows), np.nan))
                for t, value in series.get("values", []):
                    i = index.get(round(float(t), 3))
                    if i is not None:
                        row[i] = float(value)
        return out


async def _fabric_selector(client: PrometheusClient, start: float, end: float) -> tuple[str, str]:
    """PromQL for the fabric NICs (labels instance, device), and how it was chosen."""
    names = set(await client.label_values("__name__", ['{__name__=~"gpunet_nic_(fabric|info)"}'], start, end))
    if c.NIC_FABRIC.name in names:
        return f"max by (instance, device) (last_over_time({c.NIC_FABRIC.name}{{$M}}[$S]) == 1)", "gpunet_nic_fabric"
    rdma = await client.series([f'{c.NIC_INFO.name}{{rdma_device!=""}}'], start, end)
    if rdma:
        return f'max by (instance, device) (last_over_time({c.NIC_INFO.name}{{rdma_device!="",$M}}[$S]))', \
            "NICs with an RDMA device"
    # Neither: a TCP job. Its data NIC is the one that moved the most bytes (the management
    # NIC carries scrapes); the same rule as for a trace.
    moved = await client.query(
        f"topk by (instance) (1, increase({c.NIC_TRANSMIT_BYTES.name}[{int(end - start)}s]) + ignoring() "
        f"increase({c.NIC_RECEIVE_BYTES.name}[{int(end - start)}s]))", end)
    devices = sorted({r["metric"].get("device", "") for r in moved.get("result", [])} - {""})
    if not devices:
        return "", "all NICs (no RDMA device, no gpunet_nic_fabric)"
    pattern = "|".join(_regex_escape(d) for d in devices)
    return (f'count by (instance, device) (last_over_time({c.NIC_TRANSMIT_BYTES.name}{{device=~"{pattern}",$M}}[$S]))',
            f"the busiest NIC of each node ({', '.join(devices[:4])})")


async def frame_from_prometheus(client: PrometheusClient, start: float, end: float,
                                progress: Callable[[str], None] = lambda m: None) -> Frame:
    instances = sorted(await client.label_values("instance", ['{__name__=~"gpunet_.*"}'], start, end))
    if not instances:
        raise PromError(f"{client.url}: no gpunet series between {rfc3339(start)} and {rfc3339(end)}; "
                        f"{await where_data_is(client, time.time())}")
    # The scrape interval: samples of one counter over the window, per instance.
    counts = await client.query(f"count_over_time({c.TCP_SENT.name}[{int(end - start)}s])", end)
    per = [float(r["value"][1]) for r in counts.get("result", []) if float(r["value"][1]) > 1]
    scrape = (end - start) / float(np.median(per)) if per else 15.0
    step = choose_step(start, end, scrape)
    edges, partial = window_edges(start, end, step)
    windows = edges[:-1]
    step = float(edges[1] - edges[0]) if partial else step
    q = _Queries(client, start, end, step, windows, instances, progress)
    fabric, fabric_how = await _fabric_selector(client, start, end)
    progress(f"{len(instances)} nodes, {len(windows)} windows of {step:.0f}s, fabric: {fabric_how}")

    def on_fabric(inner: str, keep: bool = True) -> str:
        if not fabric:
            return inner if keep else f"({inner}) unless on() vector(1)"
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
        counters[col.metric] = (col, labels)
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
        "other_bytes": ("sum by (instance) (" + on_fabric(_increase(c.NIC_TRANSMIT_BYTES.name), keep=False) + ")",
                        ("instance",)),
        "other_capacity": ("sum by (instance) (" + on_fabric(
            f"avg_over_time({c.NIC_LINK_SPEED.name}{{$M}}[$S])", keep=False) + ")", ("instance",)),
    }
    names = list(queries)
    results = await asyncio.gather(*(q.by(*queries[n]) for n in names))
    progress(f"{client.requests} queries for the node frame")
    answers = dict(zip(names, results))
    nan = np.full(len(windows), np.nan)
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

    # Peers' link speed, per window, over every fabric NIC of the cluster.
    median = await q.by("quantile(0.5, " + on_fabric(f"avg_over_time({c.NIC_LINK_SPEED.name}{{$M}}[$S])") + ")",
                        ())
    speed_median = next(iter(median.values()), nan.copy())

    # Finer grain for the cluster's GPU time (sustained vs brief stalls).
    fine_step = step / FINE
    fine_windows = np.arange(start, start + len(windows) * step - fine_step * 0.001, fine_step)
    fine_busy, fine_idle = await asyncio.gather(
        q.by(f"sum({_increase(c.GPU_BUSY_SECONDS.name)})", (), step=fine_step, windows=fine_windows),
        q.by(f"sum by (network_state) ({_increase(c.GPU_IDLE_SECONDS.name)})", ("network_state",),
             step=fine_step, windows=fine_windows))
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
    throttled = [i for i, cols in node_cols.items() if np.nanmax(cols.get("throttled", [0])) > 0][:MAX_SUSPECTS]
    gpu_rows: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    if throttled:
        per_gpu = await asyncio.gather(*(q.by(expr, ("instance", "gpu"), throttled) for expr in (
            f"max by (instance, gpu) ({_increase(c.GPU_THROTTLED_SECONDS.name)})",
            f"avg by (instance, gpu) (avg_over_time({c.GPU_SM_CLOCK.name}{{$M}}[$S]))")))
        for column, series in zip(("throttled", "sm_clock"), per_gpu):
            for key, values in series.items():
                gpu_rows.setdefault(key, {})[column] = values
    workloads, node_fine = await _jobs_inputs(q, has_gpus, fine_step, fine_windows)
    nccl = await _nccl(client, start, end)
    config = await config_from_prometheus(client, start, end)
    progress(f"{client.requests} queries in all")
    frame = assemble(f"prometheus:{client.url}", start, end, step, scrape, windows, node_cols, nic_rows, has_gpus,
                     fine, speed_median, [], gpu_rows)
    frame.workloads, frame.node_fine, frame.nccl = workloads, node_fine, nccl
    frame.config, frame.partial = config, partial
    # Series that no node can be given (recording rules or remote writes that dropped it).
    frame.without_instance = len(await client.series(['{__name__=~"gpunet_.+",instance=""}'], start, end))
    if has_gpus:
        frame.gpu_seconds = await _gpu_seconds(client, start, end)
    return frame


async def _gpu_seconds(client: PrometheusClient, start: float, end: float) -> tuple[float, float]:
    """GPU busy and idle seconds over the whole range (partial windows at its ends included)."""
    span = f"{int(round(end - start))}s"
    busy, idle = await asyncio.gather(*(client.query(f"sum(increase({m}[{span}]))", end)
                                        for m in (c.GPU_BUSY_SECONDS.name, c.GPU_IDLE_SECONDS.name)))
    values = [float(a["result"][0]["value"][1]) if a.get("result") else 0.0 for a in (busy, idle)]
    return values[0], values[1]


async def _nccl(client: PrometheusClient, start: float, end: float) -> pd.DataFrame:
    """NCCL inspector bus bandwidth per rank over the window, where its dump is scraped (one
    series per collective: averaged on the server)."""
    labels = ("hostname", "instance", "rank", "comm_id", "collective", "message_size")
    answer = await client.query(f"avg by ({', '.join(labels)}) "
                                f"(avg_over_time({NCCL_BUS_BANDWIDTH}[{int(round(end - start))}s]))", end)
    rows = [(*nccl_key(r["metric"]), float(r["value"][1]), float("nan")) for r in answer.get("result", [])]
    return pd.DataFrame(rows, columns=NCCL_COLUMNS)


async def _jobs_inputs(q: _Queries, has_gpus: bool, fine_step: float, fine_windows: np.ndarray):
    """What splits the cluster into jobs (diagnoser/jobs.py): which workload held which GPU
    in which window (aggregated on the server), and each node's GPU time at the fine grain."""
    info = await q.by(f"max by (instance, gpu, workload, source, namespace) "
                      f"(max_over_time({c.GPU_WORKLOAD_INFO.name}{{$M}}[$S]))",
                      ("instance", "gpu", "workload", "source", "namespace"))
    rows = [(*key, float(w)) for key, values in info.items() for w in q.windows[np.nan_to_num(values) > 0]]
    workloads = pd.DataFrame(rows, columns=WORKLOAD_COLUMNS)
    node_fine = pd.DataFrame()
    if has_gpus and len(q.instances) > 1:
        # The counters themselves at every fine edge, differenced here: an increase() over a
        # range of one scrape interval holds one sample or none.
        edges = np.concatenate(([fine_windows[0] - fine_step], fine_windows))
        busy, idle = await asyncio.gather(
            q.by(f"sum by (instance) ({c.GPU_BUSY_SECONDS.name}{{$M}})", ("instance",), step=fine_step,
                 windows=edges),
            q.by(f"sum by (instance, network_state) ({c.GPU_IDLE_SECONDS.name}{{$M}})", ("instance", "network_state"),
                 step=fine_step, windows=edges))

        def increase(values: np.ndarray) -> np.ndarray:
            delta = np.diff(values)
            delta[delta < 0] = np.nan  # a reset (or a GPU gone): unknown, not negative
            return delta

        cols: dict[str, dict[str, np.ndarray]] = {}
        for (instance,), values in busy.items():
            cols.setdefault(instance, {})["busy"] = increase(values)
        for (instance, state), values in idle.items():
            if state in c.NETWORK_STATES:
                cols.setdefault(instance, {})[f"idle_{state}"] = increase(values)
        node_fine = fine_table(cols, fine_windows)
    return workloads, node_fine


def _suspects(node_cols: dict[str, dict[str, np.ndarray]], step: float) -> list[str]:
    """Nodes whose NICs deserve a look: pauses sent, loss, flaps, a link down, less
    capacity than their peers. Ranked by how far they stand out; at most MAX_SUSPECTS."""
    capacity = {i: c["capacity"] for i, c in node_cols.items() if "capacity" in c}
    with np.errstate(all="ignore"):
        median_capacity = np.nanmedian(np.vstack(list(capacity.values())), axis=0) if capacity else None
    scores = {}
    for instance, cols in node_cols.items():
        score = 0.0
        score += np.nanmax(cols.get("pfc_tx", [0])) / step / 100.0
        score += np.nanmax(cols.get("rdma_loss", [0])) / step
        score += 10.0 * np.nanmax(cols.get("carrier_changes", [0]))
        score += 10.0 * np.nanmax(cols.get("nics_down", [0]))
        if instance in capacity and np.any(capacity[instance] < 0.9 * median_capacity):
            score += 10.0  # some window with less link capacity than its peers: a slower or lost link
        if np.isfinite(score) and score >= 1.0:
            scores[instance] = score
    return sorted(scores, key=lambda i: -scores[i])[:MAX_SUSPECTS]
