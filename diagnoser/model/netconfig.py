"""The configuration snapshot: the latest value, in the window, of each configuration fact
of each node's NICs, GPUs and bonds. What diagnoser/analysis/audit.py checks.

Both sources fill it the same way: a source hands over records (metric name, labels,
value) that are already "the latest in the window" (the trace reader takes the last
sample, Prometheus answers last_over_time), and `snapshot()` turns them into small typed
tables. Info series (NIC_INFO, trust, bond mode) are label sets: where one device shows
two label sets in the window (it was reconfigured), the fact is unknown, not guessed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagnoser.model.columns import counter_increase
from gpunet import contract as c

# name -> (table, column): one value per (instance, device|gpu) in the table.
GAUGES = {
    c.NIC_LINK_SPEED.name: ("nic", "speed"), c.NIC_MTU.name: ("nic", "mtu"), c.NIC_FABRIC.name: ("nic", "fabric"),
    c.NIC_PCIE_CURRENT_SPEED.name: ("nic", "pcie_speed"), c.NIC_PCIE_MAX_SPEED.name: ("nic", "pcie_max_speed"),
    c.NIC_PCIE_CURRENT_WIDTH.name: ("nic", "pcie_width"), c.NIC_PCIE_MAX_WIDTH.name: ("nic", "pcie_max_width"),
    c.GPU_PCIE_CURRENT_SPEED.name: ("gpu", "pcie_speed"), c.GPU_PCIE_MAX_SPEED.name: ("gpu", "pcie_max_speed"),
    c.GPU_PCIE_CURRENT_WIDTH.name: ("gpu", "pcie_width"), c.GPU_PCIE_MAX_WIDTH.name: ("gpu", "pcie_max_width"),
}
# Per (device, extra labels): PFC per priority, ECN per priority and point, 802.3x pause per direction.
FLAGS = {c.NIC_PFC_ENABLED.name: ("pfc", ("priority",)), c.NIC_ECN_ENABLED.name: ("ecn", ("priority", "point")),
         c.NIC_LINK_PAUSE_ENABLED.name: ("link_pause", ("direction",))}
# Info series: (table, key label, {column: label}).
INFOS = {
    c.NIC_INFO.name: ("nic", "device", {"rdma_device": "rdma_device", "link_layer": "link_layer",
                                        "numa_node": "numa_node"}),
    c.NIC_QOS_TRUST_INFO.name: ("nic", "device", {"trust": "trust"}),
    c.GPU_INFO.name: ("gpu", "gpu", {"numa_node": "numa_node"}),
    c.BOND_INFO.name: ("bond", "bond", {"mode": "mode", "xmit_hash_policy": "xmit_hash_policy"}),
}
# GPU busy fraction over the window (GPUs lower their PCIe speed when idle), and the
# current GPU PCIe speed as its maximum over the window, for the same reason.
BUSY = c.GPU_BUSY_SECONDS.name
MAX_OVER_WINDOW = {c.GPU_PCIE_CURRENT_SPEED.name}
# Which job each node serves: fleet comparisons (speeds, MTU, PFC, trust) are made among a
# job's nodes, since another job may run on other hardware by design.
WORKLOAD = c.GPU_WORKLOAD_INFO.name
METRICS = frozenset({*GAUGES, *FLAGS, *INFOS, c.BOND_MEMBER_UP.name, BUSY, WORKLOAD})
# Read by the audit only, and constant for long stretches: the trace reader keeps only their
# value changes (and last sample), see replay.read_trace.
SPARSE = METRICS - {BUSY, c.NIC_INFO.name, c.GPU_INFO.name, c.NIC_LINK_SPEED.name, c.NIC_FABRIC.name, WORKLOAD}

NIC_COLUMNS = ("rdma_device", "link_layer", "numa_node", "trust", "fabric", "speed", "mtu", "pcie_speed",
               "pcie_max_speed", "pcie_width", "pcie_max_width")
GPU_COLUMNS = ("numa_node", "busy", "pcie_speed", "pcie_max_speed", "pcie_width", "pcie_max_width")
TEXT = {"rdma_device", "link_layer", "numa_node", "trust", "mode", "xmit_hash_policy"}


@dataclass
class ConfigSnapshot:
    """Tables indexed by instance and device (or gpu, bond); NaN / None where unknown."""
    nic: pd.DataFrame  # (instance, device): NIC_COLUMNS; fabric 1/0
    gpu: pd.DataFrame  # (instance, gpu): GPU_COLUMNS; busy = fraction of the window
    pfc: pd.DataFrame  # (instance, device, priority): enabled
    ecn: pd.DataFrame  # (instance, device, priority, point): enabled
    link_pause: pd.DataFrame  # (instance, device, direction): enabled
    bond: pd.DataFrame  # (instance, bond): mode, xmit_hash_policy
    bond_member: pd.DataFrame  # (instance, bond, device): up
    notes: list[str] = field(default_factory=list)
    job_of: dict[str, str] = field(default_factory=dict)  # instance -> the job holding most of its GPUs

    @property
    def empty(self) -> bool:
        return self.nic.empty and self.gpu.empty and self.bond.empty


def _index(keys: list[tuple], names: tuple[str, ...]) -> pd.MultiIndex:
    return pd.MultiIndex.from_tuples(keys, names=names) if keys else \
        pd.MultiIndex.from_arrays([[] for _ in names], names=names)


def _frame(rows: dict[tuple, dict], keys: tuple[str, ...], columns: tuple[str, ...]) -> pd.DataFrame:
    order = sorted(rows)
    data = {col: [rows[k].get(col, None if col in TEXT else np.nan) for k in order] for col in columns}
    df = pd.DataFrame(data, index=_index(order, keys), columns=list(columns))
    for col in columns:
        if col not in TEXT:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df


def _values(rows: dict[tuple, float], keys: tuple[str, ...], column: str) -> pd.DataFrame:
    """A table of one numeric column (the flags: some 400,000 rows at 2,048 nodes), kept as
    {key: value} rather than {key: {column: value}}: a dict per row was most of the memory."""
    order = sorted(rows)
    return pd.DataFrame({column: np.fromiter((rows[k] for k in order), float, len(order))},
                        index=_index(order, keys))


# The labels each metric's records are read by (the rest of a series' labels are not used).
_KEY_LABELS = {name: ("gpu" if table == "gpu" else "device",) for name, (table, _) in GAUGES.items()} | {
    name: ("device", *extra) for name, (_, extra) in FLAGS.items()} | {
    name: (key, *columns.values()) for name, (_, key, columns) in INFOS.items()} | {
    BUSY: ("gpu",), c.BOND_MEMBER_UP.name: ("bond", "device"), WORKLOAD: ("source", "namespace", "workload")}


def labels_read(name: str) -> tuple[str, ...]:
    """The labels of a series of `name` that the snapshot reads: a source may hand over only these."""
    return ("instance", *_KEY_LABELS.get(name, ()))


class SnapshotBuilder:
    """The snapshot built record by record, as a source reads them (an answer at a time, each
    dropped once added): only the tables are held, not every series' labels. Label values
    are interned: the same instance and device names repeat in tens of thousands of keys."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple, dict]] = {"nic": {}, "gpu": {}, "bond": {}}
        self.flags: dict[str, dict[tuple, float]] = {table: {} for table, _ in FLAGS.values()}
        self.members: dict[tuple, float] = {}
        self.infos: dict[tuple[str, str, str], set[tuple]] = {}
        self.held: dict[str, Counter] = {}
        self._strings: dict[str, str] = {}

    def _name(self, text: str) -> str:
        return self._strings.setdefault(text, text)

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        instance = labels.get("instance")
        if instance is None:
            return
        instance = self._name(instance)
        if name == WORKLOAD:
            if value > 0 and c.workload_names_a_job(labels.get("source", ""), labels.get("namespace", "")):
                self.held.setdefault(instance, Counter())[
                    f"{labels.get('namespace', '')}/{labels.get('workload', '')}"] += 1
        elif name in GAUGES:
            table, column = GAUGES[name]
            key = (instance, self._name(labels.get("gpu" if table == "gpu" else "device", "")))
            self.tables[table].setdefault(key, {})[column] = value
        elif name == BUSY:
            self.tables["gpu"].setdefault((instance, self._name(labels.get("gpu", ""))), {})["busy"] = value
        elif name in FLAGS:
            table, extra = FLAGS[name]
            self.flags[table][(instance, self._name(labels.get("device", "")),
                               *(self._name(labels.get(x, "")) for x in extra))] = value
        elif name == c.BOND_MEMBER_UP.name:
            self.members[(instance, self._name(labels.get("bond", "")), self._name(labels.get("device", "")))] = value
        elif name in INFOS:
            key_label, columns = INFOS[name][1:]
            facts = tuple((col, labels.get(label, "")) for col, label in columns.items())
            self.infos.setdefault((name, instance, self._name(labels.get(key_label, ""))), set()).add(facts)

    def build(self) -> ConfigSnapshot:
        tables = self.tables
        changed = []
        for (name, instance, device), variants in self.infos.items():
            row = tables[INFOS[name][0]].setdefault((instance, device), {})
            if len(variants) > 1:  # reconfigured within the window: unknown, not guessed
                changed.append(f"{name} of {instance} {device}")
                continue
            for col, value in next(iter(variants)):
                row[col] = None if value == "" or (col == "numa_node" and value == "-1") else value
        notes = []
        if changed:
            notes.append(f"configuration changed within the window, taken as unknown: {', '.join(sorted(changed)[:3])}"
                         + (f" and {len(changed) - 3} more" if len(changed) > 3 else ""))
        return ConfigSnapshot(
            nic=_frame(tables["nic"], ("instance", "device"), NIC_COLUMNS),
            gpu=_frame(tables["gpu"], ("instance", "gpu"), GPU_COLUMNS),
            pfc=_values(self.flags["pfc"], ("instance", "device", "priority"), "enabled"),
            ecn=_values(self.flags["ecn"], ("instance", "device", "priority", "point"), "enabled"),
            link_pause=_values(self.flags["link_pause"], ("instance", "device", "direction"), "enabled"),
            bond=_frame(tables["bond"], ("instance", "bond"), ("mode", "xmit_hash_policy")),
            bond_member=_values(self.members, ("instance", "bond", "device"), "up"),
            notes=notes, job_of={i: jobs.most_common(1)[0][0] for i, jobs in self.held.items()})


def snapshot(records: Iterable[tuple[str, Mapping[str, str], float]]) -> ConfigSnapshot:
    """The snapshot from (metric name, labels, latest value) records of METRICS."""
    builder = SnapshotBuilder()
    for name, labels, value in records:
        builder.add(name, labels, value)
    return builder.build()


def empty_snapshot() -> ConfigSnapshot:
    return snapshot(())


class ConfigCollector:
    """For the trace reader: each series' value in force at the window's end (its latest
    sample up to then, if the series reaches into the window), or its maximum over the window
    (MAX_OVER_WINDOW). Works on every sample or on value changes only (sparse families)."""

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end
        self.records: list[tuple[str, dict[str, str], float]] = []

    def add(self, name: str, labels: dict[str, str], t: np.ndarray, v: np.ndarray) -> None:
        if name == BUSY:
            busy = counter_increase(t, v, np.array([self.start, self.end]))[0]
            self.records.append((name, labels, float(busy / max(self.end - self.start, 1e-9))))
            return
        ok = np.isfinite(t) & np.isfinite(v)
        t, v = t[ok], v[ok]
        if not len(t) or t[-1] < self.start or t[0] > self.end:
            return  # the series does not reach into the window
        last = int(np.searchsorted(t, self.end, side="right")) - 1
        first = max(int(np.searchsorted(t, self.start, side="right")) - 1, 0)  # in force at the start
        value = float(v[first:last + 1].max() if name in MAX_OVER_WINDOW else v[last])
        self.records.append((name, labels, value))

    def build(self) -> ConfigSnapshot:
        return snapshot(self.records)
