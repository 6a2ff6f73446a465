"""The tidy frame: what every source yields and every later stage reads.

Time is cut into windows of `step` seconds. For each window:
  node  (instance, window)          sums over the node's GPUs and fabric NICs
  nic   (instance, device, window)  per NIC port, for localising culprits
Counters become increases within the window (resets and gaps handled), gauges become
their mean (and the minimum, for `up`). A source that cannot give a column leaves it
NaN, and the later stages say "unknown" rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagnoser.model.columns import (
    BY_METRIC,
    GPU_COLUMNS,
    INCREASE,
    NCCL_BUS_BANDWIDTH,
    NCCL_COLUMNS,
    NIC_COLUMNS,
    NIC_SUMMED,
    NODE_COLUMNS,
    RUNTIME_METRICS,
    WORKLOAD_COLUMNS,
    binned,
    counter_deltas,
    counter_increase,
    gauge_stats,
    nccl_key,
    reduce,
)
from diagnoser.model.netconfig import METRICS as CONFIG_METRICS
from diagnoser.model.netconfig import ConfigCollector, ConfigSnapshot, empty_snapshot
from gpunet import contract as c
from gpunet.trace import format_labels
from gpunet.window import rfc3339
from gpunet.words import plural

# Everything the diagnoser reads: the runtime columns and the configuration facts (the audit).
WANTED = RUNTIME_METRICS | CONFIG_METRICS


@dataclass
class Frame:
    source: str
    start: float
    end: float
    step: float
    windows: np.ndarray  # start time of each window
    node: pd.DataFrame  # index (instance, window)
    nic: pd.DataFrame  # index (instance, device, window)
    gpu: pd.DataFrame  # index (instance, gpu, window): per GPU, where the source gives it
    scrape_interval: float
    has_gpus: bool
    # Cluster GPU time at a finer grain (FINE sub-windows per window): tells a sustained
    # rise of idle from a brief stall (a checkpoint) inside the same window.
    fine: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Median link speed of all fabric NICs per window: the peers a NIC is compared with,
    # even when `nic` holds only the suspect nodes (drill-down from Prometheus).
    fabric_speed_median: np.ndarray | None = None
    warnings: list[str] = field(default_factory=list)
    # No whole window of the grid fits the range: the one window is partial, nothing is judged.
    partial: bool = False
    # The window asked for, where the data covers less of it (start, end are then the part covered).
    asked: tuple[float, float] | None = None
    # Series left out because they lack an `instance` label (they cannot be put on a node).
    without_instance: int = 0
    # GPU (busy, idle) seconds over the whole range asked for, partial windows at its ends
    # included: what the summary and the cost count (the rules judge whole windows only).
    gpu_seconds: tuple[float, float] | None = None
    # Configuration facts, the latest in the window, per node and device (diagnoser/audit.py).
    config: ConfigSnapshot = field(default_factory=empty_snapshot)
    # Which workload held which GPU in which window (gpunet_gpu_workload_info): one row per
    # (instance, gpu, workload, window) held; empty where the source has none.
    workloads: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=WORKLOAD_COLUMNS))
    # Per node at the fine grain: index (instance, window), busy and idle_<state> seconds.
    # Tells which nodes' GPU activity rises and falls together (diagnoser/jobs.py).
    node_fine: pd.DataFrame = field(default_factory=pd.DataFrame)
    # NCCL inspector samples found in the source (NCCL_COLUMNS); empty where there are none.
    nccl: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=NCCL_COLUMNS))

    @property
    def instances(self) -> list[str]:
        return sorted(self.node.index.get_level_values("instance").unique())


def _sum_known(rows: np.ndarray) -> np.ndarray:
    """Column sums over rows, NaN where no row knows the value (not 0: unknown is not none)."""
    known = np.isfinite(rows).any(axis=0)
    return np.where(known, np.nansum(rows, axis=0), np.nan)


# Window lengths the diagnoser uses. Every query cuts its windows on the same grid, fixed
# in absolute time (multiples of the step since the epoch), so that the same minutes of data
# fall in the same windows whatever second the query starts or ends at.
STEPS = (20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)
MAX_WINDOWS = 720  # a longer range takes a longer step (the per-window work bounds the run time)


def choose_step(start: float, end: float, scrape_interval: float) -> float:
    """The shortest step of STEPS that holds at least 4 scrapes (rates need several samples)
    and gives at most MAX_WINDOWS windows over the range: the same step for every window
    length up to MAX_WINDOWS steps, so that --since 15m and 3h judge the same windows."""
    scrape_interval = round(scrape_interval)  # jitter and the estimate's method must not move windows
    need = max(STEPS[0], 4 * scrape_interval)
    for step in STEPS:
        if step >= need and (end - start) / step <= MAX_WINDOWS:
            return step
    return max(STEPS[-1], float(np.ceil(need / STEPS[-1]) * STEPS[-1]))


def grid(start: float, end: float, step: float) -> np.ndarray:
    """Edges of the whole windows of the grid that lie in [start, end]; empty where none fits.
    The partial windows at either end are not judged: their rates would rest on fewer
    scrapes than the others', and which of their minutes they hold moves with the query."""
    first = np.ceil(start / step - 1e-9) * step
    last = np.floor(end / step + 1e-9) * step
    if last - first < step - 1e-6:
        return np.array([])
    return np.arange(first, last + step * 0.5, step)


def window_edges(start: float, end: float, step: float) -> tuple[np.ndarray, bool]:
    """(edges, partial): the grid's whole windows, or where none fits the one partial window
    [start, end] (then nothing is judged: see pipeline's verdict)."""
    edges = grid(start, end, step)
    return (edges, False) if len(edges) >= 2 else (np.array([start, end]), True)


def data_window(start: float, end: float, first: float, last: float, scrape_interval: float,
                what: str) -> tuple[float, float, list[str]]:
    """The window asked for, cut to the part the data covers: (start, end, notes). Every source
    cuts alike, so that a trace and the server it was loaded into judge the same span. Data
    within one scrape interval of an end covers it (the next scrape was yet to come); `what`
    names the data in the error where none of it lies in the window."""
    cut_start = first if first > start + scrape_interval else start
    cut_end = last if last < end - scrape_interval else end
    if last < start or first > end or cut_end <= cut_start:
        raise ValueError(f"the window holds no samples: {what} covers {rfc3339(first)} .. {rfc3339(last)}")
    notes = []
    if cut_start > start:
        notes.append(f"the data begins at {rfc3339(cut_start)}, after the window asked for begins "
                     f"({rfc3339(start)}): judged from there")
    if cut_end < end:
        notes.append(f"the window asked for ends at {rfc3339(end)}, after {what}'s last sample: cut to "
                     f"{rfc3339(cut_start)} .. {rfc3339(cut_end)}, the part {what} covers")
    return cut_start, cut_end, notes


FINE = 4  # sub-windows per window


class FrameBuilder:
    """Accumulates raw series (from a trace) into the frame, one series at a time."""

    def __init__(self, source: str, start: float, end: float, step: float, scrape_interval: float):
        self.source, self.start, self.end, self.step = source, start, end, step
        self.scrape_interval = scrape_interval
        self.edges, self.partial = window_edges(start, end, step)
        self.n = len(self.edges) - 1
        self.fine_edges = np.linspace(self.edges[0], self.edges[-1], self.n * FINE + 1)
        self.fine: dict[str, dict[str, np.ndarray]] = {}  # "busy" | "idle" -> column -> values
        self.node: dict[str, dict[str, np.ndarray]] = {}
        self.nic: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self.gpu: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self.nic_info: dict[tuple[str, str], dict[str, str]] = {}
        self.fabric_flag: dict[tuple[str, str], bool] = {}  # the exporter's own word, where exported
        self.gpu_seen: dict[str, set[str]] = {}
        self.sm_clock: dict[str, list[np.ndarray]] = {}
        self.throttled: dict[tuple[str, str], np.ndarray] = {}
        self.warnings: list[str] = []
        self._glitches: dict[str, list[tuple[dict[str, str], float, int]]] = {}  # metric -> bad samples left out
        self.config = ConfigCollector(start, end)
        self.node_fine: dict[str, dict[str, np.ndarray]] = {}
        self.workloads: list[tuple] = []
        self.nccl: list[tuple] = []
        self.without_instance = 0
        self.totals: dict[str, dict[str, np.ndarray]] = {}  # "busy" | "idle" -> seconds over [start, end]
        self.range_edges = np.array([start, end])

    def _acc(self, table: dict, key: object, column: str, values: np.ndarray) -> None:
        row = table.setdefault(key, {})
        if column in row:
            row[column] = row[column] + values
        else:
            row[column] = values.copy()

    def add(self, name: str, labels: dict[str, str], t: np.ndarray, v: np.ndarray) -> None:
        instance = labels.get("instance")
        if instance is None:
            self.without_instance += 1
            return
        if name in CONFIG_METRICS:
            self.config.add(name, labels, t, v)
        e = self.edges
        column = BY_METRIC.get(name)
        if column is not None:
            target = column.name_for(labels)
            if target is None:
                return
            first = int(np.searchsorted(t, e[0]))  # the sources give samples in time order
            if first == len(t) or t[first] >= e[-1]:
                # No sample in the windows judged (the series stopped before them, or starts after):
                # absent from them, not zero in them (a counter's increase over no samples is 0).
                return
            if column.how == INCREASE:  # its deltas serve the fine and whole-range grids below too
                glitches: list[float] = []
                later, grown = counter_deltas(t, v, glitches)
                if glitches:
                    self._glitches.setdefault(name, []).append((labels, glitches[0], len(glitches)))
                values = binned(later, grown, e)
            else:
                values = reduce(column, t, v, e)
            if column.table == "nic":
                key = (instance, labels.get("device", ""))
                if column.how == INCREASE:
                    self._acc(self.nic, key, target, values)
                else:
                    self.nic.setdefault(key, {})[target] = values
            elif column.table == "node":
                self._acc(self.node, instance, target, values)
            else:  # per GPU: summed per node, kept per GPU, and at the fine grain (sustained vs brief idle)
                assert column.how == INCREASE  # every GPU column counts seconds (columns.py): its deltas are above
                self._acc(self.node, instance, target, values)
                self._acc(self.gpu, (instance, labels.get("gpu", "")), "busy" if target == "busy" else "idle", values)
                fine = binned(later, grown, self.fine_edges)
                self._acc(self.totals, "busy" if target == "busy" else "idle", "seconds",
                          binned(later, grown, self.range_edges))
                self._acc(self.fine, "busy" if target == "busy" else "idle", target, fine)
                self._acc(self.node_fine, instance, target, fine)
                if target == "busy":
                    self.gpu_seen.setdefault(instance, set()).add(labels.get("gpu", ""))
        elif name == c.NIC_INFO.name:
            self.nic_info[(instance, labels.get("device", ""))] = labels
        elif name == c.NIC_FABRIC.name:
            self.fabric_flag[(instance, labels.get("device", ""))] = bool(np.nanmax(v) > 0) if len(v) else False
        elif name == c.GPU_THROTTLED_SECONDS.name:
            # Reasons overlap in time: a GPU's throttled time is its busiest reason's.
            key = (instance, labels.get("gpu", ""))
            inc = counter_increase(t, v, e)
            self.throttled[key] = np.maximum(self.throttled.get(key, inc), inc)
        elif name == c.GPU_SM_CLOCK.name:
            clock = gauge_stats(t, v, e)[0]
            self.sm_clock.setdefault(instance, []).append(clock)
            self.gpu.setdefault((instance, labels.get("gpu", "")), {})["sm_clock"] = clock
        elif name == NCCL_BUS_BANDWIDTH:
            self.nccl.extend((*nccl_key(labels), float(value), float(when)) for when, value in zip(t, v))
        elif name == c.GPU_WORKLOAD_INFO.name:
            mean, _ = gauge_stats(t, v, e)
            for w in self.edges[:-1][np.nan_to_num(mean) > 0]:
                self.workloads.append((instance, labels.get("gpu", ""), labels.get("workload", ""),
                                       labels.get("source", ""), labels.get("namespace", ""), float(w)))

    def build(self) -> Frame:
        nan = np.full(self.n, np.nan)
        windows = self.edges[:-1]
        # Fabric NICs: as the exporter says (gpunet_nic_fabric); else those with an RDMA
        # device; on a node with neither, the NIC that carried the most bytes (a TCP job's
        # data NIC outweighs the management NIC that carries scrapes).
        rdma_nodes = {inst for (inst, _), info in self.nic_info.items() if info.get("rdma_device")}
        busiest: dict[str, tuple[float, str]] = {}
        for (instance, device), cols in self.nic.items():
            moved = float(np.nansum(cols.get("tx_bytes", 0)) + np.nansum(cols.get("rx_bytes", 0)))
            if moved > busiest.get(instance, (-1.0, ""))[0]:
                busiest[instance] = (moved, device)
        nic_rows = {}
        for (instance, device), cols in self.nic.items():
            info = self.nic_info.get((instance, device), {})
            if (instance, device) in self.fabric_flag:
                fabric = self.fabric_flag[(instance, device)]
            elif instance in rdma_nodes:
                fabric = bool(info.get("rdma_device"))
            else:
                fabric = busiest.get(instance, (0, ""))[1] == device
            row = {"fabric": np.full(self.n, fabric)}
            for col in NIC_COLUMNS[1:]:
                row[col] = cols.get(col, nan)
            nic_rows[(instance, device)] = row
        for (instance, gpu), inc in self.throttled.items():
            self._acc(self.node, instance, "throttled", inc)
            self.gpu.setdefault((instance, gpu), {})["throttled"] = inc
        for instance, clocks in self.sm_clock.items():
            stacked = np.vstack(clocks)
            known = np.isfinite(stacked).sum(axis=0)
            self.node.setdefault(instance, {})["sm_clock"] = np.where(
                known > 0, np.nansum(stacked, axis=0) / np.maximum(known, 1), np.nan)

        node_cols: dict[str, dict[str, np.ndarray]] = {}
        for instance in sorted(set(self.node) | {inst for inst, _ in nic_rows}):
            cols = node_cols[instance] = dict(self.node.get(instance, {}))
            cols["gpus"] = np.full(self.n, float(len(self.gpu_seen.get(instance, ()))))
            on_fabric = [r for (inst, _), r in nic_rows.items() if inst == instance and r["fabric"][0]]
            if on_fabric:
                for col in NIC_SUMMED:
                    cols[col] = _sum_known(np.vstack([r[col] for r in on_fabric]))
                cols["capacity"] = _sum_known(np.vstack([r["speed"] for r in on_fabric])) * self.step
                cols["nics_down"] = np.nansum(np.vstack([r["up"] for r in on_fabric]) == 0, axis=0).astype(float)
                cols["fabric_nics"] = np.full(self.n, float(len(on_fabric)))
            other = [r for (inst, _), r in nic_rows.items() if inst == instance and not r["fabric"][0]]
            if other:
                cols["other_bytes"] = _sum_known(np.vstack([np.fmax(r["tx_bytes"], r["rx_bytes"]) for r in other]))
                cols["other_capacity"] = _sum_known(np.vstack([r["speed"] for r in other])) * self.step
        fabric_speeds = [r["speed"] for r in nic_rows.values() if r["fabric"][0]]
        speed_median = np.full(self.n, np.nan)
        if fabric_speeds:
            stacked = np.vstack(fabric_speeds)
            known = np.isfinite(stacked).any(axis=0)
            speed_median[known] = np.nanmedian(stacked[:, known], axis=0)
        fine_cols = {**self.fine.get("busy", {}), **self.fine.get("idle", {})}
        fine = pd.DataFrame(fine_cols, index=pd.Index(self.fine_edges[:-1], name="window")) if fine_cols \
            else pd.DataFrame()
        for name, bad in sorted(self._glitches.items()):  # one line per metric, its first series as the example
            labels, at, _ = bad[0]
            series = name + format_labels(labels)
            self.warnings.append(f"{plural(sum(n for *_, n in bad), 'sample')} of {name} in {len(bad)} series lay outside "
                                 f"their neighbours' range (a counter only grows: a bad reading) and were left out, "
                                 f"e.g. {series} at {rfc3339(at)}")
        frame = assemble(self.source, self.start, self.end, self.step, self.scrape_interval, windows, node_cols,
                         nic_rows, bool(self.gpu_seen), fine, speed_median, self.warnings, self.gpu)
        frame.workloads = pd.DataFrame(self.workloads, columns=WORKLOAD_COLUMNS)
        frame.nccl = pd.DataFrame(self.nccl, columns=NCCL_COLUMNS)
        frame.node_fine = fine_table(self.node_fine, self.fine_edges[:-1])
        frame.config = self.config.build()
        frame.partial, frame.without_instance = self.partial, self.without_instance
        if self.totals:
            frame.gpu_seconds = (float(self.totals.get("busy", {}).get("seconds", [0.0])[0]),
                                 float(self.totals.get("idle", {}).get("seconds", [0.0])[0]))
        return frame


def fine_table(rows: dict[str, dict[str, np.ndarray]], windows: np.ndarray) -> pd.DataFrame:
    """Per-node fine columns -> one frame indexed by (instance, window)."""
    if not rows:
        return pd.DataFrame()
    columns = ("busy", *(f"idle_{s}" for s in c.NETWORK_STATES))
    return _table({(i,): cols for i, cols in rows.items()}, ("instance",), columns, windows)


def _table(rows: dict[tuple, dict[str, np.ndarray]], keys: tuple[str, ...], columns: tuple[str, ...],
           windows: np.ndarray) -> pd.DataFrame:
    """One frame indexed by (*keys, window) from per-key column arrays, built in one go
    (thousands of small frames concatenated cost more than the whole parse)."""
    n = len(windows)
    ordered = sorted(rows)
    if not ordered:
        return pd.DataFrame(columns=columns, index=pd.MultiIndex.from_arrays(
            [[] for _ in (*keys, "window")], names=[*keys, "window"]))
    data = {}
    for col in columns:
        data[col] = np.concatenate([np.asarray(rows[k].get(col, np.full(n, np.nan)), dtype=float)
                                    if col != "fabric" else np.asarray(rows[k].get(col, np.full(n, False)))
                                    for k in ordered])
    levels = [np.repeat([k[i] for k in ordered], n) for i in range(len(keys))]
    index = pd.MultiIndex.from_arrays([*levels, np.tile(windows, len(ordered))], names=[*keys, "window"])
    return pd.DataFrame(data, index=index)


def assemble(source: str, start: float, end: float, step: float, scrape_interval: float, windows: np.ndarray,
             node_cols: dict[str, dict[str, np.ndarray]], nic_rows: dict[tuple[str, str], dict[str, np.ndarray]],
             has_gpus: bool, fine: pd.DataFrame, speed_median: np.ndarray, warnings: list[str],
             gpu_rows: dict[tuple[str, str], dict[str, np.ndarray]] | None = None) -> Frame:
    """The Frame from per-window columns, whichever source computed them."""
    node = _table({(i,): cols for i, cols in node_cols.items()}, ("instance",), NODE_COLUMNS, windows)
    nic = _table(nic_rows, ("instance", "device"), NIC_COLUMNS, windows)
    gpu = _table(gpu_rows or {}, ("instance", "gpu"), GPU_COLUMNS, windows)
    return Frame(source, start, end, step, windows, node, nic, gpu, scrape_interval, has_gpus, fine, speed_median,
                 warnings)
