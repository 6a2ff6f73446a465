"""What every bottleneck rule is made of: the record of one class (docs/classes.md),
the window it is checked on, and what a check returns.

A rule file (one per class, beside this one) holds the class's thresholds with their
reasons, its `check`, and one `BottleneckClass` record named `RULE` with everything else
the project knows about the class. Report, incidents, HTML and NCCL read that record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagnoser.model.findings import Incident
from gpunet.promql import regex_literal

# GPU idle above the job's own baseline (its quieter windows) that is worth a finding:
# the subtle faults on-call must catch add 5 to 8 points of idle.
EXCESS_IDLE = 0.03
# The smallest segment TCP commonly sends on a data-centre link (1500-byte MTU): segments
# times this is the least their bytes can be, so a share of bytes computed with it is a
# lower bound.
SMALLEST_MSS = 1448


def tcp_share(tcp_sent: pd.Series, bytes_sent: pd.Series) -> pd.Series:
    """The share of the bytes sent that TCP's segments carried, at least (SMALLEST_MSS)."""
    with np.errstate(all="ignore"):
        return tcp_sent * SMALLEST_MSS / bytes_sent.where(bytes_sent > 0)


@dataclass(frozen=True)
class Baseline:
    """The job's own normal: its quieter windows (20th percentile of each cluster feature)."""
    idle_frac: float
    idle_saturated_frac: float
    idle_quiet_frac: float
    ecn_per_gb: float
    retrans_ratio: float
    other_util: float
    xmit_wait_per_gb: float
    # The share of the median node's bytes sent, over the whole range, that its TCP segments
    # carry (at least: counted at the smallest common segment size). Near 0 where the training
    # traffic is RDMA and TCP only manages; a large share where the collectives run over
    # sockets. NaN where unknown.
    tcp_byte_share: float = float("nan")
    loss_per_gb: float = float("nan")  # RDMA loss events per GB moved in the usual windows
    # The median node's fabric load at its best (the 90th percentile of the windows): loss
    # that costs the job time costs it throughput too, so a lossy window must fall below it.
    util_top: float = float("nan")
    # The rest of the fabric's usual congestion signal (ECN marks, and InfiniBand's credit
    # wait, per GB moved) where other jobs share it (classify.fabric_level): a job congested
    # all its life has its congestion for a baseline, and only the fabric's shows it. NaN
    # where the job is alone.
    fabric_ecn_per_gb: float = float("nan")
    fabric_xmit_wait_per_gb: float = float("nan")


@dataclass(frozen=True)
class Detection:
    """A rule held in a window: on which nodes and devices, how sure, and the figures."""
    nodes: list[str]
    devices: list[str]
    confidence: float
    evidence: dict[str, object]
    # The rule's signal held but another class's finding in the same window (or normal
    # operation, such as "checkpoint") explains it: no finding, only a marker that keeps an
    # incident of this class from being cut in two, and tells the verdict the idle is explained.
    suppressed_by: str | None = None
    # How much of the effect each culprit carries, in the rule's own figure (pauses sent,
    # loss events, throttled share...): an incident ranks its culprits by it. None: equal.
    effect: dict[str, float] | None = None
    # Where the condition held against no baseline of the job's own (it lasted the job's
    # whole life): the network states whose GPU idle the finding costs at least (the
    # record's `waits_in` otherwise).
    waits_in: tuple[str, ...] = ()


@dataclass
class WindowContext:
    """One window of one job, as a rule sees it.

    `cluster` is the window's row of cluster features, `node` the nodes' features (index:
    instance), `nic` the fabric NICs' (index: instance, device; `in_use`: the NIC carried
    traffic or was up at some time in the whole range). `found` holds the detections of the rules that
    ran before this one in the same window (the `after` of its record)."""
    window: float
    cluster: pd.Series
    node: pd.DataFrame
    nic: pd.DataFrame
    baseline: Baseline
    fabric_speed_median: float = float("nan")  # all fabric NICs' median speed, bytes/s
    gpu: pd.DataFrame = field(default_factory=pd.DataFrame)  # per GPU (index: instance, gpu, window) where known
    step: float = 20.0
    found: dict[str, Detection] = field(default_factory=dict)
    # For each class, the classes it produces as symptoms (the records' `explains`), and the
    # network state it makes every GPU wait in (the records' `waits_in`).
    explains: dict[str, frozenset[str]] = field(default_factory=dict)
    waits_in: dict[str, str | None] = field(default_factory=dict)

    @property
    def has_gpu(self) -> bool:
        gpu_time = self.cluster.get("gpu_time", np.nan)
        return bool(gpu_time > 0) if np.isfinite(gpu_time) else False

    @property
    def excess(self) -> float:
        """GPU idle above the job's baseline, as a fraction of GPU time (NaN without GPUs)."""
        return float(self.cluster["idle_frac"] - self.baseline.idle_frac) if self.has_gpu else float("nan")

    @property
    def impact(self) -> bool:
        """Whether GPUs wait measurably more than usual (always true without GPU series: the
        network condition is then reported with its impact unknown)."""
        return (not self.has_gpu) or self.excess >= EXCESS_IDLE

    def cause_found(self, cls: str) -> str | None:
        """A class found in this window that produces `cls` as its symptom, if any."""
        return next((c for c in sorted(self.found) if cls in self.explains.get(c, ())), None)

    def devices(self, nodes: list[str], column: str) -> list[str]:
        """The NICs of `nodes` that carry most of `column` in this window."""
        if not len(self.nic) or not nodes or column not in self.nic:
            return []
        sub = self.nic[self.nic.index.get_level_values("instance").isin(nodes)][column].fillna(0)
        if not len(sub) or sub.max() <= 0:
            return []
        return sorted({d for (_, d), v in sub.items() if v >= 0.3 * sub.max()})


Check = Callable[[WindowContext], Detection | None]
# Node features of every window (index: instance, window) -> per window, whether the class's
# own physical signal held there, whatever its impact.
Signature = Callable[[pd.DataFrame], pd.Series]
# (incidents, step) -> (incidents kept, a note on those left out or None)
IncidentFilter = Callable[[list[Incident], float], tuple[list[Incident], str | None]]


@dataclass(frozen=True)
class BottleneckClass:
    """Everything the project knows about one bottleneck class."""
    name: str  # the contract's class name
    title: str  # for people
    # The PromQL that shows on-call the class's signal, to confirm a finding on their own
    # Prometheus or Grafana: $NODES stands for the finding's nodes (an instance regex).
    confirm: str
    remediation: str  # what on-call should do
    check: Check
    localised: bool  # whether findings name culprit nodes (docs/classes.md)
    # The network_state in which the class makes GPUs wait: a finding costs at least the
    # GPU idle spent in it, even where the condition lasted the whole window (no baseline).
    waits_in: str | None = None
    # Classes whose findings this one produces as symptoms at its edges (a window half
    # inside a storm shows pauses without the storm's full rate): an incident of one of
    # them inside this class's incident is dropped.
    explains: frozenset[str] = frozenset()
    # Rules that must have run in the window before this one (it reads their detections).
    after: tuple[str, ...] = ()
    needs_gpu: bool = False  # checked only in windows with GPU series
    # The per-node feature that shows the class best, and its label: the report's chart of
    # the culprits against their peers.
    chart: tuple[str, str] | None = None
    # What NCCL's per-rank bus bandwidth says of a rank of this class, if it says anything:
    # "slow" (far below its communicator's median) or "late" (far above it).
    nccl_signal: str | None = None
    incident_filter: IncidentFilter | None = None  # incidents that are normal operation, not findings
    # Where its own physical signal holds (a storm's pause rate, loss events, a link down, a
    # throttle reason): those windows are left out of the job's baseline, so that a fault
    # covering most of a short window is still measured against the job's normal.
    signature: Signature | None = None
    # Whether its effect reaches other jobs on the same fabric (a storm's pauses climb the
    # spine to every job behind the same switches; a slow node slows only its own job).
    reaches_other_jobs: bool = False


def confirm_query(record: BottleneckClass, nodes: list[str]) -> str:
    """The record's confirming PromQL for these nodes (every node where it names none)."""
    pattern = "|".join(regex_literal(n) for n in nodes) or ".+"
    return record.confirm.replace("$NODES", pattern)


# Peers, for rules that compare a node with the others of its job: fewer than this many
# nodes and a median or spread of the others means little (a straggler needs peers; a storm
# or a slow link has a physical signature of its own and needs none).
MIN_PEERS = 4


def any_node(node: pd.DataFrame, column: str, at_least: float) -> pd.Series:
    """Per window, whether some node's `column` reached `at_least`: a record's signature."""
    return (node[column] >= at_least).groupby(level="window").any()


def against_peers(values: pd.Series, culprits: list[str]) -> dict[str, dict[str, float | None]]:
    """Each culprit's own figure, the median of its peers (the window's other nodes) and the
    ratio of the two: the evidence that names a node, in its own numbers."""
    peers = values.drop(index=[n for n in culprits if n in values.index]).dropna()
    median = float(peers.median()) if len(peers) else float("nan")
    out: dict[str, dict[str, float | None]] = {}
    for node in culprits:
        value = float(values.get(node, np.nan))
        ratio = value / median if np.isfinite(median) and median > 0 else None
        out[node] = {"value": value, "peers_median": median, "ratio": ratio}
    return out


def plain(value: object) -> object:
    """Evidence as JSON takes it: plain floats to 4 significant digits (no figure that is not
    zero prints as 0), NaN as None."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (np.floating, float)):
        return None if not np.isfinite(value) else float(f"{float(value):.4g}")
    if isinstance(value, (np.integer,)):
        return int(value)
    return value
