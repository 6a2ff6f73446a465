#!/usr/bin/env python3
"""Clean-room labelled trace generator: traces for testing ``diagnose`` on data it was not made from.

Written from the public docs only (docs/metrics.md, docs/trace-format.md, docs/classes.md) and
general knowledge of RDMA (RoCE, InfiniBand) training clusters, by someone who never read how
gpunet's diagnoser or its simulator work. It imports only the standard library and numpy.

Models, all of them this file's own:

- Step model of synchronous data-parallel training. Each step: an optional input wait (host),
  compute (GPUs busy), and a gradient all-reduce over the fabric NICs (one ring per rail). The
  all-reduce starts when the slowest node's first gradient bucket is ready (overlap with the
  backward pass), moves its bytes no faster than the slowest link of each rail allows, and ends
  no earlier than a tail after the slowest node's compute. Faults change the step: slower compute
  on some nodes (straggler, throttle), longer input waits (host bound), lower rail rates
  (congestion, loss, downshift), more bytes (bandwidth), or the fabric frozen (PFC storm, flaps).
  It is integrated at a 0.2 s tick, the "fast tick" at which the GPU idle seconds are split by
  what the node's fabric NICs did (paused, saturated, active, quiet: the first that holds).
- Noise: event counters (ECN marks, CNPs, pauses, loss events, CRC and symbol errors, TCP
  retransmits) are Poisson counts from rates that differ per node (lognormal multipliers) and
  drift over time; TCP carries management traffic only (plus storage), except in traces where
  NCCL runs over TCP sockets.
- Scrapes: 15 s or 60 s, a per-node phase and jitter (within +-1 s), millisecond timestamps,
  about 1% of scrapes missing, an exporter restart that resets the exporter-computed counters.

Several jobs on one fabric (``--set multijob``, ``--set multijob-guard``), same models plus:

- Topology: spine-leaf (every NIC of a node on the node's leaf) or rail-optimised (NIC k of every
  node of a pod on the pod's rail switch k), the uplinks of each leaf / rail switch oversubscribed
  by a ratio (downlink capacity / uplink capacity); storage nodes on a leaf of their own. A flow
  whose two NICs sit on different switches crosses the sender switch's uplinks and the spine's
  links down to the receiver's switch.
- Jobs: each has its own nodes, GPUs per node (a job on part of a node uses the NICs of its GPUs'
  NUMA node), step time and pattern: a ring all-reduce per lane (node i sends to node i+1 on its
  NIC k) or an all-to-all (every node to every other). Each job runs the step model above.
- Contention: per 0.2 s tick, the offered load of every job's flows on every uplink; a flow gets
  the share its most loaded link allows (fair share, less a waste that grows with the overload),
  and a job's lane runs at its slowest flow's share (two fixed-point rounds between load and
  rates). Over ~0.85x capacity the receivers of crossing flows get ECN marks and send CNPs, the
  senders get CNPs and, over capacity, PFC pauses (RoCE); on InfiniBand the senders accumulate
  port_xmit_wait for the time they have data and no credit. Jobs whose flows stay inside a
  switch, or cross only unloaded links, see nothing.
- PFC storm: the stuck NIC's switch port cannot send; its frames fill that switch's shared
  buffer, so the switch says XOFF on every ingress that carries traffic (its NICs that send, the
  spine's links down to it); an egress queue that cannot drain then pauses, hop by hop, the
  queue upstream of it on every flow through it (head-of-line: one queue per port and priority).
  NICs whose queue is paused receive pauses; a job with any stopped flow freezes (GPUs idle:
  "paused" where the node's NIC is paused, "quiet" on its other nodes).
- Life cycle: a job starting inside the trace warms up (loading, compiling: GPUs 50-80% idle,
  little traffic); jobs end and others start on the same nodes; an elastic job loses a node (pod
  evicted, node stays up) and restarts on a replacement after a minute or two; a node's GPUs
  split between two jobs; allocated but idle nodes; nodes in no job. gpunet_gpu_workload_info
  exists only while the pod (Slurm job) holds the GPU. GPU health counters (ECC, row remaps,
  NVLink) rise on some traces' healthy nodes with no effect.
- Labels: each incident's ``job`` (the job on the source NIC or node; for network_congestion the
  job whose all-to-all loads the uplinks), ``jobs`` (nodes ever allocated, gpus_per_node, start
  and end where the job's workload series do not span the trace) and ``waited_on``, computed from
  the model: jobs a storm froze, and jobs whose lanes lost over 5% of their rate on average over
  the congestion's window. Incidents under way at the trace's edges are clipped to it.
- Timestamps: 85% of scrapes exactly on the node's grid (Prometheus snaps a timestamp within
  2 ms), the rest jittered by a few ms, 1% late. gzip level 9. The 512-node trace keeps only the
  contract families, the network state and the workload series.

Usage::

    python bench/cleanroom.py OUTDIR [--seed N] [--set full|guard|multijob|multijob-guard] [--only NAME ...]
                                     [--check]

It writes NAME.om.gz (gzipped OpenMetrics) and NAME.labels.json per trace and manifest.json.
Output is deterministic for a given seed. ``--check`` reads the files back and verifies them
(TYPE lines, families and series together, timestamps increasing, counters monotone except
resets, label times inside the trace; for multi-job traces also that the jobs' nodes exist, their
and ``waited_on``'s times lie inside the trace and the workload series match ``jobs``) and prints
each incident's effect on GPU idle (per job for multi-job traces).

Choices where the docs leave room (see also the notes in each NAME.labels.json):

- Counter families are named without ``_total`` on their ``# TYPE`` line and with it on samples
  (OpenMetrics, as the example in trace-format.md); ``# HELP`` lines are written too.
- ``network_state``: "paused" when a fabric port was paused (received PFC pause time, or on
  InfiniBand port_xmit_wait time) for >= 1% of the 0.2 s tick; "saturated" at >= 90% of link
  speed in either direction; "active" at >= 5%; otherwise "quiet". Any one fabric NIC decides.
- Exposed communication counts as GPU idle (the NCCL kernels are not counted as busy).
- Label values: loss ``kind`` is out_of_sequence, nak_sequence_error or local_ack_timeout;
  throttle ``reason`` is sw_power_cap, sw_thermal_slowdown or hw_slowdown; PFC ``priority`` is
  "3" (the RoCE priority); ``direction`` is receive or transmit.
- An exporter restart resets only the counters the exporter integrates itself (GPU busy, idle and
  throttled seconds, saturated seconds, network-state seconds, bursts); kernel and driver
  counters (bytes, pauses, TCP, errors) keep counting. A link that is down reports speed 0.
- RoCE-only series (ECN, CNP, PFC) are absent on InfiniBand; RDMA series are absent on the
  plain Ethernet NICs of the NCCL-over-TCP trace (those are fabric NICs by --fabric-devices).
- Optional families (FEC, pause duration, netdev bytes, power, temperature, workload info ...) are
  left out of a trace, in two tiers, where they would take it past about 3 MB (about 10 MB for a
  multi-job trace).
- Multi-job: an incident whose source runs no job (a storage node) has no ``job`` key, and its
  ``waited_on`` entries have ``cause_job`` null; a network_congestion incident names no nodes
  (the class names none) and its ``job`` is the job that congests. Slurm attribution: workload =
  the Slurm job id, source slurm, namespace, pod and container empty. Kubernetes: workload
  ``namespace/name``, pod ``name-worker-RANK`` (a replacement node's pod keeps the rank), container
  pytorch. Without workload series the job names are ground truth only. A storage node exports
  NIC, TCP and network-state series, no GPU series. NVLink error counters restart from 0 at an
  exporter restart ("since the exporter started"); ECC counters and row remaps do not.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

EPOCH = 1767225600.0  # 2026-01-01T00:00:00Z
DT = 0.2  # internal tick, also the exporter's fast tick in this model
JOB = "gpunet"
STATES = ("paused", "saturated", "active", "quiet")
REASONS = ("sw_power_cap", "sw_thermal_slowdown", "hw_slowdown")
LOSS_KINDS = ("out_of_sequence", "nak_sequence_error", "local_ack_timeout")
LOCALISED = {"gpu_throttle", "link_degraded", "packet_loss", "pfc_storm", "straggler"}
CLASSES = ("gpu_throttle", "host_bound", "link_degraded", "network_bandwidth", "network_congestion",
           "packet_loss", "pfc_storm", "straggler")
ROCE_PRIO = "3"
ROCE_PKT = 4096 + 58  # IB MTU 4096 payload + Eth/IPv4/UDP/BTH/ICRC/FCS
IB_PKT = 4096 + 30
TCP_MSS = 8948  # 9000 MTU
IB_WAIT_TICK = 4e-9  # port_xmit_wait tick assumed 4 ns
PAUSED_FRACTION = 0.01  # a tick is "paused" when a fabric port was paused >= 1% of it
SIZE_BUDGET_SAMPLES = 470_000  # samples: keeps a trace under about 3 MB gzip
ArrFn = Callable[[np.ndarray], np.ndarray]
DerivedFn = Callable[[np.ndarray, np.ndarray, int, float], np.ndarray]


# --------------------------------------------------------------------------------------------
# Trace specifications
# --------------------------------------------------------------------------------------------


@dataclass
class Fault:
    """One incident. ``strength`` is class specific (see ``_mods`` and ``_fault_events``)."""

    cls: str
    start_min: float
    dur_min: float
    strength: float
    nodes: tuple[int, ...] = ()
    kind: str = ""
    rail: int = 0
    gpus: int = 0  # gpu_throttle: GPUs per culprit node affected (0 = all)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Spec:
    name: str
    desc: str
    nodes: int
    gpus: int
    nics: int
    gbps: int
    fabric: str  # "roce", "ib" or "tcp" (NCCL over TCP sockets on plain Ethernet NICs)
    scrape: float = 15.0
    minutes: float = 70.0
    faults: list[Fault] = field(default_factory=list)
    step_s: float = 1.2  # mean compute time per step
    comm_ratio: float = 0.3  # all-reduce time at the achievable rate / compute time
    overlap: float = 0.6  # fraction of compute that overlaps the all-reduce (backward)
    tail: float = 0.12  # fraction of the bytes that can only move after the last compute
    eff: float = 0.94  # achievable wire rate / line rate
    host_style: str = "hgx"
    port: int = 9845
    tcp_noise: float = 1.0  # multiplier on the management-traffic retransmit ratio
    noisy_tcp_node: float = 0.0  # > 0: one node's management retransmit ratio rises to this for 6-14 min
    ecn_bg: float = 2e-4  # healthy DCQCN mark fraction (RoCE)
    blips: tuple[tuple[float, float], ...] = ()  # (minute, seconds) of a link going down once
    ckpt_every_min: float = 0.0
    ckpt_s: float = 90.0
    unused_gpus: int = 0  # GPUs left unused, spread over a few nodes
    restarts: int = 1
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    mgmt_gbps: int = 25
    workload_source: str = "kubernetes"


def _f(cls: str, start: float, dur: float, strength: float, nodes: tuple[int, ...] = (), *, kind: str = "",
       rail: int = 0, gpus: int = 0, extra: dict[str, float] | None = None) -> Fault:
    return Fault(cls, start, dur, strength, nodes, kind, rail, gpus, dict(extra or {}))


def full_set() -> list[Spec]:
    """The labelled traces of ``--set full``."""
    s: list[Spec] = []
    # ---- healthy, with confounders
    s.append(Spec("healthy_roce_confounders", "healthy RoCE job: one 3 s link blip, checkpoints, DCQCN marks, "
                  "TCP noise, 2 unused GPUs", 8, 8, 4, 400, "roce", minutes=64, blips=((23.0, 3.2),), ckpt_every_min=24,
                  ckpt_s=100, ecn_bg=4e-4, unused_gpus=2, tcp_noise=1.5, host_style="rack"))
    s.append(Spec("healthy_ib_checkpoints_60s", "healthy InfiniBand job, 60 s scrapes, 2-minute checkpoints, "
                  "noisy management TCP on one node, unused GPUs", 16, 8, 4, 200, "ib", scrape=60, minutes=75,
                  ckpt_every_min=30, ckpt_s=140, unused_gpus=3, noisy_tcp_node=2e-3, step_s=2.4,
                  gpu_model="NVIDIA A100-SXM4-80GB", host_style="dgx"))
    s.append(Spec("healthy_blip_60s", "healthy RoCE job, 60 s scrapes, a single 4 s link drop, TCP and ECN "
                  "background", 24, 4, 2, 200, "roce", scrape=60, minutes=72, blips=((41.0, 4.1),), ecn_bg=6e-4,
                  tcp_noise=2.0, step_s=0.8, host_style="slurm", workload_source="slurm"))
    s.append(Spec("healthy_tcp_ecn_noise", "healthy RoCE job with heavy management-TCP retransmits on one node "
                  "and a high steady DCQCN mark level", 8, 4, 2, 100, "roce", minutes=64, ecn_bg=1.5e-3,
                  noisy_tcp_node=4e-3, tcp_noise=3.0, step_s=0.6, comm_ratio=0.35, host_style="cloud", port=9400,
                  ckpt_every_min=20, ckpt_s=70))
    # ---- network_congestion
    s.append(Spec("congestion_roce_moderate", "RoCE fabric congestion for 12 min: ECN ~0.8%, CNPs, some pauses, "
                  "NICs ~50% of line; TCP noise", 8, 8, 4, 400, "roce", minutes=64, comm_ratio=0.4,
                  faults=[_f("network_congestion", 27, 12, 0.5, extra={"ecn": 0.008, "pause": 120})],
                  tcp_noise=2.0, host_style="hgx"))
    s.append(Spec("congestion_roce_strong_60s", "strong RoCE congestion for 18 min at 60 s scrapes: ECN ~3%, "
                  "NICs ~33% of line", 24, 8, 4, 200, "roce", scrape=60, minutes=78, step_s=1.6,
                  faults=[_f("network_congestion", 35, 18, 0.33, extra={"ecn": 0.03, "pause": 400})],
                  tcp_noise=1.5, host_style="rack"))
    s.append(Spec("congestion_ib", "InfiniBand congestion for 10 min: credits withheld (xmit_wait), NICs ~45% "
                  "of line", 16, 4, 4, 200, "ib", scrape=60, minutes=66, comm_ratio=0.38,
                  faults=[_f("network_congestion", 22, 10, 0.45, extra={"wait": 0.15})], host_style="dgx",
                  gpu_model="NVIDIA A100-SXM4-80GB", workload_source="slurm"))
    # ---- network_bandwidth
    s.append(Spec("bandwidth_roce_100g", "job phase needing 2.2x the all-reduce bytes on 2x100G per node: links "
                  "at line rate, GPUs wait (moderate)", 8, 8, 2, 100, "roce", minutes=68, comm_ratio=0.33,
                  eff=0.95, faults=[_f("network_bandwidth", 30, 15, 2.2)], host_style="hgx"))
    s.append(Spec("bandwidth_ib_60s", "InfiniBand job phase with 3.4x the all-reduce bytes for 20 min: links "
                  "saturated, GPUs wait (strong)", 16, 8, 4, 200, "ib", scrape=60, minutes=75, step_s=2.0,
                  eff=0.96, faults=[_f("network_bandwidth", 28, 20, 3.4)], host_style="slurm",
                  workload_source="slurm"))
    # ---- pfc_storm
    s.append(Spec("pfc_storm_full", "one host's NIC sends PFC pauses without end for 5 min: the job freezes",
                  8, 8, 4, 400, "roce", minutes=62,
                  faults=[_f("pfc_storm", 33, 5, 1.0, (5,), rail=2)], host_style="rack"))
    s.append(Spec("pfc_storm_intermittent_60s", "intermittent PFC storm (~25% duty) from one host for 12 min, "
                  "60 s scrapes", 16, 4, 2, 200, "roce", scrape=60, minutes=74,
                  faults=[_f("pfc_storm", 30, 12, 0.25, (11,), rail=1, extra={"episode": 12})],
                  host_style="hgx", gpu_model="NVIDIA H200", tcp_noise=1.5))
    # ---- packet_loss
    s.append(Spec("loss_roce_bad_cable", "bad cable on one node's RoCE port for 15 min: CRC/symbol errors, "
                  "go-back-N loss events, collectives slowed", 8, 8, 4, 200, "roce", minutes=64,
                  comm_ratio=0.38, faults=[_f("packet_loss", 25, 15, 0.45, (3,), kind="rdma", rail=1)],
                  tcp_noise=2.0, host_style="hgx"))
    s.append(Spec("loss_nccl_tcp", "NCCL over TCP sockets: one node retransmits ~1.5% of its segments for "
                  "10 min and the ring slows", 8, 8, 2, 100, "tcp", minutes=65, eff=0.72, comm_ratio=0.35,
                  faults=[_f("packet_loss", 28, 10, 0.45, (6,), kind="tcp", extra={"p": 0.015})],
                  host_style="cloud", port=9400, step_s=1.8, gpu_model="NVIDIA A100-SXM4-80GB"))
    s.append(Spec("loss_ib_symbol_60s", "InfiniBand port with symbol errors and loss for 16 min (moderate), 60 s "
                  "scrapes", 16, 8, 4, 400, "ib", scrape=60, minutes=72, comm_ratio=0.4,
                  faults=[_f("packet_loss", 30, 16, 0.55, (9,), kind="rdma", rail=3)], host_style="dgx"))
    # ---- link_degraded
    s.append(Spec("link_downshift_roce", "one RoCE NIC renegotiates 400G -> 200G for 20 min; TCP and ECN "
                  "background noise", 8, 8, 4, 400, "roce", minutes=64, comm_ratio=0.38, ecn_bg=8e-4,
                  faults=[_f("link_degraded", 26, 20, 2.0, (2,), kind="downshift", rail=0)], tcp_noise=2.5,
                  host_style="rack"))
    s.append(Spec("link_flap_ib_60s", "an InfiniBand link flaps every ~40 s for 10 min, 60 s scrapes", 16, 4, 2,
                  400, "ib", scrape=60, minutes=70, step_s=1.0,
                  faults=[_f("link_degraded", 31, 10, 40.0, (4,), kind="flap", rail=1, extra={"down": 3.0})],
                  host_style="slurm", workload_source="slurm"))
    # ---- straggler
    s.append(Spec("straggler_roce_noise", "one node computes 11% slower for 15 min; TCP and ECN background", 8,
                  8, 4, 400, "roce", minutes=64, ecn_bg=6e-4, tcp_noise=2.5,
                  faults=[_f("straggler", 29, 15, 0.11, (6,))], host_style="hgx"))
    s.append(Spec("straggler_two_nodes_60s", "two nodes compute 40% slower for 10 min, 60 s scrapes", 32, 4, 2,
                  200, "roce", scrape=60, minutes=70, step_s=0.9,
                  faults=[_f("straggler", 33, 10, 0.4, (7, 21))], host_style="cloud", port=9400))
    # ---- gpu_throttle
    s.append(Spec("throttle_thermal_noise", "3 GPUs of one node thermally throttled for 12 min (moderate); TCP "
                  "noise", 8, 8, 4, 400, "ib", minutes=66, tcp_noise=2.5,
                  faults=[_f("gpu_throttle", 24, 12, 0.1, (1,), kind="thermal", gpus=3)], host_style="dgx"))
    s.append(Spec("throttle_powerbrake_60s", "power brake on two nodes' GPUs for 8 min (strong), 60 s scrapes",
                  24, 8, 4, 200, "roce", scrape=60, minutes=70, step_s=1.4,
                  faults=[_f("gpu_throttle", 36, 8, 0.55, (3, 17), kind="brake")], host_style="rack",
                  tcp_noise=1.5))
    # ---- host_bound
    s.append(Spec("host_bound_3min_60s", "3-minute input stall at 60 s scrapes (all nodes wait on the data "
                  "loader); TCP noise", 16, 8, 4, 200, "ib", scrape=60, minutes=66, step_s=1.5,
                  faults=[_f("host_bound", 38, 3, 0.5, kind="cpu")], host_style="hgx", tcp_noise=2.0))
    s.append(Spec("host_bound_storage", "slow shared storage for 15 min: data loader waits, storage reads on the "
                  "management NIC, fabric quiet", 8, 4, 2, 200, "roce", minutes=70, step_s=0.9,
                  faults=[_f("host_bound", 26, 15, 0.14, kind="storage")], host_style="cloud", port=9400,
                  ecn_bg=5e-4, tcp_noise=1.5))
    # ---- two-incident traces
    s.append(Spec("multi_congestion_then_straggler", "RoCE congestion (12 min), later one straggler node "
                  "(10 min), 60 s scrapes", 12, 8, 4, 400, "roce", scrape=60, minutes=80, comm_ratio=0.4,
                  faults=[_f("network_congestion", 14, 12, 0.4, extra={"ecn": 0.015, "pause": 200}),
                          _f("straggler", 52, 10, 0.25, (8,))], host_style="rack", tcp_noise=1.5))
    s.append(Spec("multi_throttle_then_loss", "GPU throttle on one node (10 min), later a lossy RoCE cable on "
                  "another (12 min)", 8, 8, 2, 200, "roce", minutes=75, comm_ratio=0.36,
                  faults=[_f("gpu_throttle", 12, 10, 0.3, (0,), kind="thermal"),
                          _f("packet_loss", 45, 12, 0.5, (5,), kind="rdma", rail=0)], host_style="hgx",
                  tcp_noise=2.0, gpu_model="NVIDIA H200"))
    s.append(Spec("multi_pfc_then_hostbound", "PFC storm (6 min, ~50% duty), later host-bound input (15 min), "
                  "60 s scrapes", 16, 4, 2, 200, "roce", scrape=60, minutes=78, step_s=1.1,
                  faults=[_f("pfc_storm", 15, 6, 0.5, (2,), rail=0, extra={"episode": 20}),
                          _f("host_bound", 48, 15, 0.25, kind="storage")], host_style="slurm",
                  workload_source="slurm", ckpt_every_min=35, ckpt_s=80))
    s.append(Spec("multi_downshift_bandwidth_ib", "InfiniBand link downshift 200G -> 100G (14 min), later a "
                  "bandwidth-bound phase (10 min), 60 s scrapes", 12, 8, 4, 200, "ib", scrape=60, minutes=80,
                  comm_ratio=0.36, eff=0.95,
                  faults=[_f("link_degraded", 10, 14, 2.0, (10,), kind="downshift", rail=2),
                          _f("network_bandwidth", 50, 10, 2.6)], host_style="dgx"))
    return s


def guard_set() -> list[Spec]:
    """Four short, small traces for a regression test (a few seconds in all)."""
    return [
        Spec("guard_congestion_tcpnoise", "RoCE congestion (8 min) with TCP retransmit noise", 8, 4, 2, 200, "roce",
             minutes=25, comm_ratio=0.4, tcp_noise=3.0, restarts=0,
             faults=[_f("network_congestion", 9, 8, 0.38, extra={"ecn": 0.02, "pause": 250})]),
        Spec("guard_straggler_tcpnoise", "one straggler node (8 min) with TCP retransmit noise", 8, 4, 2, 200,
             "roce", minutes=25, tcp_noise=3.0, restarts=0, host_style="rack",
             faults=[_f("straggler", 10, 8, 0.3, (4,))]),
        Spec("guard_healthy_60s", "healthy job, 60 s scrapes: link blip, checkpoint, TCP/ECN noise, unused GPU",
             8, 4, 2, 200, "roce", scrape=60, minutes=25, blips=((11.0, 3.0),), ckpt_every_min=15, ckpt_s=80,
             unused_gpus=1, ecn_bg=6e-4, tcp_noise=2.0, noisy_tcp_node=2e-3, restarts=1, host_style="slurm"),
        Spec("guard_loss_roce", "bad cable on one RoCE port (8 min): CRC errors and loss events", 8, 4, 2, 200,
             "roce", minutes=25, comm_ratio=0.38, restarts=0, host_style="cloud", port=9400,
             faults=[_f("packet_loss", 9, 8, 0.55, (2,), kind="rdma", rail=1)]),
    ]


# --------------------------------------------------------------------------------------------
# Cluster description
# --------------------------------------------------------------------------------------------

GPU_MODELS: dict[str, tuple[float, float, float, float]] = {
    # model: (max SM clock Hz, idle clock Hz, TDP W, idle W)
    "NVIDIA H100 80GB HBM3": (1.98e9, 345e6, 700.0, 72.0),
    "NVIDIA H200": (1.98e9, 345e6, 700.0, 78.0),
    "NVIDIA A100-SXM4-80GB": (1.41e9, 210e6, 400.0, 58.0),
}
NIC_BUSES = (0x1A, 0x40, 0x53, 0x66, 0x9C, 0xC0, 0xCE, 0xDC)
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass
class Cluster:
    instances: list[str]
    nic_dev: list[str]
    nic_rdma: list[str]
    nic_pci: list[str]
    nic_numa: list[int]
    fabric_driver: str
    link_layer: str
    mgmt_dev: str
    mgmt_driver: str
    speed: float  # bytes/s of one fabric NIC
    mgmt_speed: float
    gpu_uuid: list[list[str]]
    clock: float
    idle_clock: float
    tdp: float
    idle_w: float


def _hostnames(style: str, n: int, rng: np.random.Generator) -> list[str]:
    if style == "rack":
        row = "abcdefgh"[int(rng.integers(0, 8))]
        r0 = int(rng.integers(1, 20))
        return [f"gpu-{row}{r0 + i // 4:02d}-r{i % 4 + 1}" for i in range(n)]
    if style == "dgx":
        site = ("sjc2", "ams1", "fra3")[int(rng.integers(0, 3))]
        b = int(rng.integers(1, 60))
        return [f"dgx{b + i:03d}.{site}.gpu.internal" for i in range(n)]
    if style == "slurm":
        c0 = int(rng.integers(1, 9))
        return [f"c{c0 + i // 16}-n{i % 16 + 1:02d}" for i in range(n)]
    if style == "cloud":
        a, b = int(rng.integers(0, 64)), int(rng.integers(0, 200))
        lows = sorted(rng.choice(np.arange(10, 250), size=n, replace=False).tolist())
        return [f"ip-10-{a}-{b}-{c}" for c in lows]
    b = int(rng.integers(1, 400))
    return [f"hgx-{b + i:04d}" for i in range(n)]


def build_cluster(spec: Spec, rng: np.random.Generator) -> Cluster:
    names = _hostnames(spec.host_style, spec.nodes, rng)
    inst = [f"{h}:{spec.port}" for h in names]
    buses = NIC_BUSES[:: max(1, 8 // spec.nics)][: spec.nics]
    if spec.fabric == "ib":
        dev = [f"ibp{b}s0" for b in buses]
        rdma = [f"mlx5_{i}" for i in range(spec.nics)]
        drv, ll = "mlx5_core", "infiniband"
    elif spec.fabric == "roce":
        dev = [f"enp{b}s0np0" for b in buses]
        rdma = [f"mlx5_{i}" for i in range(spec.nics)]
        drv, ll = "mlx5_core", "ethernet"
    else:
        dev = [f"ens{5 + i}f0" for i in range(spec.nics)]
        rdma = ["" for _ in range(spec.nics)]
        drv, ll = "ice", "ethernet"
    pci = [f"0000:{b:02x}:00.0" for b in buses]
    numa = [0 if i < max(1, spec.nics // 2) else 1 for i in range(spec.nics)]
    mgmt = ("eno1np0", "bnxt_en") if spec.host_style in ("hgx", "rack", "dgx") else ("enp3s0f0", "ice")
    uuids = []
    for _ in range(spec.nodes):
        row = []
        for _g in range(spec.gpus):
            h = "".join(f"{int(x):02x}" for x in rng.integers(0, 256, 16))
            row.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}")
        uuids.append(row)
    clock, idle_clock, tdp, idle_w = GPU_MODELS[spec.gpu_model]
    return Cluster(inst, dev, rdma, pci, numa, drv, ll, mgmt[0], mgmt[1], spec.gbps * 1e9 / 8,
                   spec.mgmt_gbps * 1e9 / 8, uuids, clock, idle_clock, tdp, idle_w)


# --------------------------------------------------------------------------------------------
# Time helpers
# --------------------------------------------------------------------------------------------


class Blocked:
    """Wall-time intervals in which the fabric moves nothing; U(t) is the unblocked time."""

    def __init__(self, intervals: list[tuple[float, float]]) -> None:
        merged: list[list[float]] = []
        for a, b in sorted(intervals):
            if b <= a:
                continue
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.s = np.array([m[0] for m in merged], dtype=float)
        self.e = np.array([m[1] for m in merged], dtype=float)
        lens = self.e - self.s
        self.before = np.concatenate([[0.0], np.cumsum(lens)])  # blocked time before interval i
        self.us = self.s - self.before[:-1]  # U at each interval's start
        self._s = self.s.tolist()
        self._us = self.us.tolist()

    def u(self, t: float) -> float:
        i = bisect.bisect_right(self._s, t) - 1
        if i < 0:
            return t
        return t - self.before[i] - min(t - self._s[i], self.e[i] - self._s[i])

    def u_vec(self, t: np.ndarray) -> np.ndarray:
        if len(self.s) == 0:
            return t.copy()
        i = np.searchsorted(self.s, t, side="right") - 1
        ic = np.clip(i, 0, None)
        inside = np.minimum(t - self.s[ic], self.e[ic] - self.s[ic])
        return np.where(i < 0, t, t - self.before[ic] - inside)

    def t_of(self, u: float) -> float:
        """Earliest wall time with U = u (a transfer ending at u ends before the next block)."""
        i = bisect.bisect_left(self._us, u)
        return u + float(self.before[i])

    def covered(self, a: float, b: float) -> float:
        return (b - a) - (self.u(b) - self.u(a))


def cum_piecewise(u0: np.ndarray, u1: np.ndarray, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sum_i w_i * clip((x - u0_i) / (u1_i - u0_i), 0, 1) for sorted, non-overlapping intervals."""
    if len(u0) == 0:
        return np.zeros_like(x)
    pre = np.concatenate([[0.0], np.cumsum(w)])
    i = np.searchsorted(u0, x, side="right") - 1
    ic = np.clip(i, 0, None)
    frac = np.clip((x - u0[ic]) / np.maximum(u1[ic] - u0[ic], 1e-12), 0.0, 1.0)
    v = pre[ic] + w[ic] * frac
    return np.where(i < 0, 0.0, v)


def window_cum(edges: np.ndarray, a: float, b: float) -> np.ndarray:
    """Cumulative time inside [a, b) at each edge."""
    return np.clip(edges - a, 0.0, max(0.0, b - a))


def drift(rng: np.random.Generator, n_t: int, shape: tuple[int, ...], sigma: float, corr_s: float) -> np.ndarray:
    """A mean-one lognormal multiplier drifting as an AR(1) process, on a coarse grid held per tick."""
    hold = max(1, int(round(corr_s / DT / 6)))
    n_c = n_t // hold + 2
    a = math.exp(-hold * DT / corr_s)
    eps = rng.standard_normal((n_c, *shape)) * math.sqrt(1 - a * a)
    z = np.empty((n_c, *shape))
    z[0] = rng.standard_normal(shape)
    for i in range(1, n_c):
        z[i] = a * z[i - 1] + eps[i]
    return np.repeat(np.exp(sigma * z - sigma * sigma / 2), hold, axis=0)[:n_t]


# --------------------------------------------------------------------------------------------
# The simulation
# --------------------------------------------------------------------------------------------


@dataclass
class Win:
    f: Fault
    s: float
    e: float


@dataclass
class Sim:
    spec: Spec
    cl: Cluster
    rng: np.random.Generator
    t0: float
    t_end: float
    sim0: float
    n_t: int
    edges: np.ndarray
    wins: list[Win]
    blocked: Blocked
    flaps: list[tuple[int, int, float, float]]  # (node, rail, down at, up at)
    storm: list[tuple[int, int, float, float]]  # (node, rail, on at, off at)
    ckpts: list[tuple[float, float]] = field(default_factory=list)
    timeouts: list[tuple[float, int, str]] = field(default_factory=list)  # (time, node, "rdma"|"tcp")


def _episodes(rng: np.random.Generator, s: float, e: float, duty: float, mean_on: float) -> list[tuple[float, float]]:
    if duty >= 0.999:
        return [(s, e)]
    out = []
    t = s
    mean_off = mean_on * (1 - duty) / duty
    while t < e:
        on = float(rng.exponential(mean_on)) + 1.0
        out.append((t, min(e, t + on)))
        t += on + float(rng.exponential(mean_off)) + 1.0
    return out


def make_sim(spec: Spec, seed: int) -> Sim:
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    cl = build_cluster(spec, rng)
    day = zlib.crc32(spec.name.encode()) % 120
    t0 = EPOCH + day * 86400 + float(rng.integers(0, 20)) * 3600 + float(rng.integers(0, 3600))
    t_end = t0 + spec.minutes * 60
    sim0 = t0 - 120.0
    n_t = int(math.ceil((t_end + 8.0 - sim0) / DT))
    edges = sim0 + DT * np.arange(n_t + 1)
    wins = [Win(f, t0 + f.start_min * 60, t0 + (f.start_min + f.dur_min) * 60) for f in spec.faults]
    blocks: list[tuple[float, float]] = []
    flaps: list[tuple[int, int, float, float]] = []
    storm: list[tuple[int, int, float, float]] = []
    for w in wins:
        f = w.f
        if f.cls == "pfc_storm":
            eps = _episodes(rng, w.s, w.e, f.strength, f.extra.get("episode", 15.0))
            eps[0] = (w.s, eps[0][1])
            storm += [(f.nodes[0], f.rail, a, b) for a, b in eps]
            blocks += eps
        if f.cls == "link_degraded" and f.kind == "flap":
            t = w.s
            while True:
                down = float(np.clip(rng.gamma(4.0, f.extra.get("down", 3.0) / 4.0), 0.8, 12.0))
                if t + down > w.e:
                    break
                flaps.append((f.nodes[0], f.rail, t, t + down))
                blocks.append((t, t + down + float(rng.uniform(0.8, 3.0))))  # NCCL/QP retry after link-up
                t += down + float(rng.exponential(f.strength)) + 5.0
            if flaps:
                w.e = flaps[-1][3]
    for minute, secs in spec.blips:
        n = int(rng.integers(0, spec.nodes))
        r = int(rng.integers(0, spec.nics))
        flaps.append((n, r, t0 + minute * 60, t0 + minute * 60 + secs))
    return Sim(spec, cl, rng, t0, t_end, sim0, n_t, edges, wins, Blocked(blocks), flaps, storm)


@dataclass
class Steps:
    busy: list[tuple[np.ndarray, np.ndarray]]  # per node: (starts, ends) of compute
    extra: list[tuple[np.ndarray, np.ndarray]]  # per node: throttled GPUs' extra compute
    segs: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # per rail: U-time segments and their bytes


def _mods(sim: Sim, t: float) -> tuple[np.ndarray, np.ndarray, float, float, np.ndarray, np.ndarray, list[Win]]:
    """Step modifiers at time t: compute factor, throttle factor, host wait, byte multiplier, rail rate factor,
    link speeds (node x rail) and the active windows."""
    n, r = sim.spec.nodes, sim.spec.nics
    comp = np.ones(n)
    thr = np.ones(n)
    host = 0.0
    bmult = 1.0
    rfac = np.ones(r)
    speed = np.full((n, r), sim.cl.speed)
    act = [w for w in sim.wins if w.s <= t < w.e]
    for w in act:
        f = w.f
        nodes = list(f.nodes)
        if f.cls == "straggler":
            comp[nodes] *= 1 + f.strength
        elif f.cls == "gpu_throttle":
            thr[nodes] *= 1 + f.strength
        elif f.cls == "host_bound":
            host += f.strength * sim.spec.step_s
        elif f.cls == "network_bandwidth":
            bmult *= f.strength
        elif f.cls == "network_congestion":
            rfac *= f.strength / sim.spec.eff
        elif f.cls == "packet_loss":
            if f.kind == "tcp":
                rfac *= f.strength
            else:
                rfac[f.rail] *= f.strength
        elif f.cls == "link_degraded" and f.kind == "downshift":
            speed[f.nodes[0], f.rail] = sim.cl.speed / f.strength
    return comp, thr, host, bmult, rfac, speed, act


def run_steps(sim: Sim) -> Steps:
    sp, rng = sim.spec, sim.rng
    n, r = sp.nodes, sp.nics
    node_speed = np.exp(rng.normal(0, 0.006, n))  # silicon and thermals: tiny static spread
    b0 = sp.comm_ratio * sp.step_s * sp.eff * sim.cl.speed  # bytes per rail per step
    h0 = 0.008 * sp.step_s
    gap = 0.01 * sp.step_s
    hs_l: list[np.ndarray] = []
    ce_l: list[np.ndarray] = []
    xe_l: list[np.ndarray] = []
    seg_u0: list[list[float]] = [[] for _ in range(r)]
    seg_u1: list[list[float]] = [[] for _ in range(r)]
    seg_b: list[list[float]] = [[] for _ in range(r)]
    next_ck = math.inf
    if sp.ckpt_every_min > 0:
        next_ck = sim.t0 + float(rng.uniform(0.35, 0.8)) * sp.ckpt_every_min * 60
    t = sim.sim0
    t_stop = sim.edges[-1]
    while t < t_stop:
        if t >= next_ck:
            if any(w.s - 90 <= t <= w.e + 30 for w in sim.wins):
                next_ck = t + 120.0
            else:
                dc = sp.ckpt_s * float(rng.uniform(0.85, 1.15))
                sim.ckpts.append((t, t + dc))
                t += dc
                next_ck = t + sp.ckpt_every_min * 60 * float(rng.uniform(0.9, 1.1))
                continue
        comp, thr, host, bmult, rfac, speed, act = _mods(sim, t)
        c = sp.step_s * comp * node_speed * math.exp(rng.normal(0, 0.03)) * np.exp(rng.normal(0, 0.012, n))
        h = rng.exponential(h0, n)
        if host > 0:  # a shared cause (storage, preprocessing): every node waits about as long
            h = h + rng.gamma(3.0, host / 3.0) * np.exp(rng.normal(0, 0.12, n))
        hs = t + h
        ce = hs + c * thr
        cs = float(np.max(hs + c * thr * (1 - sp.overlap)))
        last = float(np.max(ce))
        uc, ul = sim.blocked.u(cs), sim.blocked.u(last)
        rate = sp.eff * speed.min(axis=0) * rfac
        b = b0 * bmult * np.ones(r)
        x = np.minimum(b * (1 - sp.tail), rate * (ul - uc))
        ue = ul + (b - x) / rate
        stall = 0.0
        for w in act:
            if w.f.cls == "packet_loss":
                lam = w.f.extra.get("timeouts", 0.35 if w.f.kind == "tcp" else 0.15)
                k = int(rng.poisson(lam * float(ue.max() - uc)))
                for _ in range(k):
                    d = float(rng.uniform(0.2, 0.6)) if w.f.kind == "tcp" else float(rng.uniform(0.05, 0.25))
                    stall += d
                    sim.timeouts.append((sim.blocked.t_of(float(rng.uniform(uc, ue.max()))), w.f.nodes[0], w.f.kind))
        for i in range(r):
            if x[i] > 0 and ul > uc:
                seg_u0[i].append(uc)
                seg_u1[i].append(ul)
                seg_b[i].append(float(x[i]))
            if b[i] - x[i] > 0:
                seg_u0[i].append(ul)
                seg_u1[i].append(float(ue[i]))
                seg_b[i].append(float(b[i] - x[i]))
        end = sim.blocked.t_of(float(ue.max()) + stall)
        hs_l.append(hs)
        ce_l.append(hs + c)
        xe_l.append(ce)
        t = max(end, last) + gap * float(rng.uniform(0.5, 1.5))
    hs_a, ce_a, xe_a = np.array(hs_l), np.array(ce_l), np.array(xe_l)
    busy = [(hs_a[:, i], ce_a[:, i]) for i in range(n)]
    extra = [(ce_a[:, i], xe_a[:, i]) for i in range(n)]
    segs = [(np.array(seg_u0[i]), np.array(seg_u1[i]), np.array(seg_b[i])) for i in range(r)]
    return Steps(busy, extra, segs)


# --------------------------------------------------------------------------------------------
# Series and families
# --------------------------------------------------------------------------------------------

FAMILY_ORDER: list[tuple[str, str, str, bool]] = [
    # (name, type, help, exporter-computed: reset when the exporter restarts)
    ("gpunet_nic_info", "gauge", "One per NIC port; empty string where unknown.", False),
    ("gpunet_nic_link_speed_bytes_per_second", "gauge", "Negotiated link speed.", False),
    ("gpunet_nic_up", "gauge", "1 when operstate is up and carrier present, else 0.", False),
    ("gpunet_nic_carrier_changes", "counter", "Link flaps (carrier changes).", False),
    ("gpunet_nic_receive_bytes", "counter", "Bytes received on the wire, RDMA included.", False),
    ("gpunet_nic_transmit_bytes", "counter", "Bytes sent on the wire, RDMA included.", False),
    ("gpunet_nic_pfc_pause_frames", "counter", "PFC pause frames per priority and direction.", False),
    ("gpunet_nic_ecn_marked_packets", "counter", "RoCE packets received with an ECN CE mark.", False),
    ("gpunet_nic_cnp_sent", "counter", "Congestion notification packets sent.", False),
    ("gpunet_nic_cnp_received", "counter", "CNPs handled by the rate limiter.", False),
    ("gpunet_nic_rdma_loss_events", "counter", "RDMA go-back-N triggers.", False),
    ("gpunet_nic_receive_discards", "counter", "Packets the NIC dropped for lack of buffer or by policy.", False),
    ("gpunet_nic_saturated_seconds", "counter", "Time at the fast tick at >= 90% of link speed.", True),
    ("gpunet_node_network_state_seconds", "counter", "Time the node's fabric NICs spent in each state.", True),
    ("gpunet_node_network_bursts", "counter", "Quiet-to-busier transitions of the node's fabric.", True),
    ("gpunet_nic_pfc_pause_duration_seconds", "counter", "Time the port was paused or asked its peer to pause.",
     False),
    ("gpunet_nic_transmit_discards", "counter", "Packets the NIC dropped on transmit.", False),
    ("gpunet_nic_receive_errors", "counter", "Frames received with errors on the wire.", False),
    ("gpunet_nic_link_downed", "counter", "Times the link went down.", False),
    ("gpunet_nic_symbol_errors", "counter", "Physical-layer symbol errors.", False),
    ("gpunet_nic_fec_corrected_blocks", "counter", "FEC codewords corrected.", False),
    ("gpunet_nic_fec_uncorrectable_blocks", "counter", "FEC codewords not correctable.", False),
    ("gpunet_nic_transmit_wait_ticks", "counter", "InfiniBand port_xmit_wait ticks.", False),
    ("gpunet_nic_rdma_out_of_buffer", "counter", "RDMA packets dropped for want of a receive WQE.", False),
    ("gpunet_nic_fabric", "gauge", "1 when the NIC belongs to the training fabric.", False),
    ("gpunet_nic_mtu_bytes", "gauge", "MTU of the netdev.", False),
    ("gpunet_nic_netdev_receive_bytes", "counter", "Bytes the kernel's network stack received.", False),
    ("gpunet_nic_netdev_transmit_bytes", "counter", "Bytes the kernel's network stack sent.", False),
    ("gpunet_tcp_retransmitted_segments", "counter", "TCP RetransSegs of the node.", False),
    ("gpunet_tcp_sent_segments", "counter", "TCP OutSegs of the node.", False),
    ("gpunet_tcp_received_segments", "counter", "TCP InSegs of the node.", False),
    ("gpunet_tcp_timeouts", "counter", "TCP retransmission timeouts.", False),
    ("gpunet_gpu_info", "gauge", "One per GPU.", False),
    ("gpunet_gpu_utilization_ratio", "gauge", "Latest NVML utilization.", False),
    ("gpunet_gpu_busy_seconds", "counter", "Seconds in which a kernel ran.", True),
    ("gpunet_gpu_idle_seconds", "counter", "Idle seconds split by the node's network state.", True),
    ("gpunet_gpu_throttled_seconds", "counter", "Time an NVML clock-event reason slowing the GPU was active.", True),
    ("gpunet_gpu_sm_clock_hertz", "gauge", "SM clock.", False),
    ("gpunet_gpu_up", "gauge", "1 while NVML answers for the GPU.", False),
    ("gpunet_gpu_driver_info", "gauge", "NVIDIA driver version of the node.", False),
    ("gpunet_gpu_power_watts", "gauge", "Power draw.", False),
    ("gpunet_gpu_temperature_celsius", "gauge", "GPU core temperature.", False),
    ("gpunet_gpu_ecc_errors", "counter", "Memory ECC errors since the driver loaded, by type.", False),
    ("gpunet_gpu_remapped_rows", "gauge", "Memory rows remapped to spares, by the errors that caused it.", False),
    ("gpunet_gpu_row_remap_pending", "gauge", "1 when a row remapping waits for a GPU reset.", False),
    ("gpunet_gpu_row_remap_failed", "gauge", "1 when a row remapping failed.", False),
    ("gpunet_gpu_nvlink_errors", "counter", "NVLink errors summed over the GPU's links since the exporter started.",
     True),
    ("gpunet_gpu_workload_info", "gauge", "One per (GPU, workload using it).", False),
]
RESET_OK = {name for name, _, _, exporter_computed in FAMILY_ORDER if exporter_computed}

# Families left out when a trace would grow past SIZE_BUDGET_SAMPLES: tier 2 first, then tier 1.
TIER1 = {"gpunet_nic_pfc_pause_duration_seconds", "gpunet_nic_transmit_discards", "gpunet_nic_fec_corrected_blocks",
         "gpunet_nic_fec_uncorrectable_blocks", "gpunet_nic_rdma_out_of_buffer", "gpunet_nic_fabric",
         "gpunet_nic_mtu_bytes", "gpunet_nic_netdev_receive_bytes", "gpunet_nic_netdev_transmit_bytes",
         "gpunet_tcp_received_segments", "gpunet_tcp_timeouts", "gpunet_gpu_driver_info", "gpunet_gpu_workload_info"}
TIER2 = {"gpunet_gpu_up", "gpunet_gpu_power_watts", "gpunet_gpu_temperature_celsius", "gpunet_gpu_ecc_errors",
         "gpunet_gpu_remapped_rows", "gpunet_gpu_row_remap_pending", "gpunet_gpu_row_remap_failed",
         "gpunet_gpu_nvlink_errors"}  # GPU health: only the multi-job traces have these


@dataclass
class Series:
    labels: dict[str, str]
    node: int
    group: str  # "gpu", "nic" or "node": what an exporter collector error takes away
    values: np.ndarray  # one per scrape
    fmt: str  # "i" integer, "fN" N decimals
    alive: np.ndarray | None = None  # scrapes at which the series exists (None: all of them)


class Store:
    def __init__(self) -> None:
        self.fams: dict[str, list[Series]] = {name: [] for name, _, _, _ in FAMILY_ORDER}
        self.tier = 2  # the highest tier of families written
        self.budget = SIZE_BUDGET_SAMPLES
        self.only: set[str] | None = None  # when set, only these families are written

    def add(self, fam: str, node: int, group: str, labels: dict[str, str], values: np.ndarray, fmt: str,
            alive: np.ndarray | None = None) -> None:
        self.fams[fam].append(Series(labels, node, group, values, fmt, alive))

    def fit(self, present: np.ndarray) -> None:
        """Leave out the optional tiers that would take the trace past the size budget."""
        per_node = present.sum(axis=0)
        count = [0, 0, 0]
        for fam, series in self.fams.items():
            t = 2 if fam in TIER2 else 1 if fam in TIER1 else 0
            count[t] += sum(int(per_node[x.node]) for x in series)
        self.tier = 2 if sum(count) <= self.budget else 1 if count[0] + count[1] <= self.budget else 0

    def written(self, fam: str) -> list[Series]:
        t = 2 if fam in TIER2 else 1 if fam in TIER1 else 0
        if self.only is not None and fam not in self.only:
            return []
        return self.fams[fam] if t <= self.tier else []


def _poisson_cum(rng: np.random.Generator, expected: np.ndarray) -> np.ndarray:
    """Cumulative Poisson counts at scrapes from cumulative expectations [S, ...] (first row from 0)."""
    inc = np.diff(expected, axis=0, prepend=np.zeros((1, *expected.shape[1:])))
    return np.cumsum(rng.poisson(np.clip(inc, 0.0, None)), axis=0).astype(float)


def _events_cum(times: list[float], ts: np.ndarray) -> np.ndarray:
    """Number of events at or before each scrape time."""
    if not times:
        return np.zeros_like(ts)
    return np.searchsorted(np.sort(np.array(times)), ts, side="right").astype(float)


@dataclass
class Built:
    store: Store
    ts: np.ndarray  # [S, N]
    present: np.ndarray  # [S, N]
    present_grp: dict[str, np.ndarray]
    incidents: list[dict[str, object]]
    notes: str
    instances: list[str]


def simulate(spec: Spec, seed: int) -> Built:
    sim = make_sim(spec, seed)
    st = run_steps(sim)
    sp, cl, rng = sim.spec, sim.cl, sim.rng
    n, r, g = sp.nodes, sp.nics, sp.gpus
    n_t, edges = sim.n_t, sim.edges

    # ---- scrapes
    n_s = int(sp.minutes * 60 // sp.scrape) + 1
    phase = rng.uniform(-0.75, 0.75, n)  # with the jitter below, within +-1 s
    jit = np.clip(rng.normal(0, 0.004, (n_s, n)), -0.05, 0.05)
    late = rng.random((n_s, n)) < 0.01
    jit = jit + late * rng.uniform(0.03, 0.18, (n_s, n))
    ts = np.round(sim.t0 + np.arange(n_s)[:, None] * sp.scrape + phase[None, :] + jit, 3)
    pos = (ts - sim.sim0) / DT
    ii = np.clip(np.floor(pos).astype(int), 0, n_t - 1)
    ff = pos - ii
    cols = np.arange(n)[None, :]

    def samp(cum: np.ndarray) -> np.ndarray:
        """Cumulative values at the tick edges [T+1, N] -> at each node's scrape times [S, N]."""
        return cum[ii, cols] * (1 - ff) + cum[ii + 1, cols] * ff

    def cum0(x: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros((1, *x.shape[1:])), np.cumsum(x, axis=0)], axis=0)

    # ---- compute (GPU busy) per tick
    busy_cum = np.stack([cum_piecewise(a, b, b - a, edges) for a, b in st.busy], axis=1)
    extra_cum = np.stack([cum_piecewise(a, b, b - a, edges) for a, b in st.extra], axis=1)
    busy_t = np.diff(busy_cum, axis=0)
    extra_t = np.diff(extra_cum, axis=0)

    # ---- fabric traffic per tick, node and rail
    ue = sim.blocked.u_vec(edges)
    rail = np.stack([np.diff(cum_piecewise(a, b, w, ue)) for a, b, w in st.segs], axis=1)  # [T, R]
    tx = (rail[:, None, :] * np.exp(rng.normal(0, 0.004, (1, n, r)))).astype(np.float64)
    rx = (rail[:, None, :] * np.exp(rng.normal(0, 0.004, (1, n, r)))).astype(np.float64)
    speed_t = np.full((n_t, n, r), cl.speed)
    down = np.zeros((n_t, n, r))  # fraction of each tick the link was down
    for node, rl, a, b in sim.flaps:
        frac = np.diff(window_cum(edges, a, b)) / DT
        down[:, node, rl] = np.maximum(down[:, node, rl], frac)
    tx *= 1 - down
    rx *= 1 - down
    wire = ROCE_PKT if sp.fabric != "ib" else IB_PKT
    loss_p = np.zeros((n_t, n, r))  # per-packet corruption probability on a port's receive side
    tcp_p = np.zeros((n_t, n))
    for w in sim.wins:
        f = w.f
        on = np.diff(window_cum(edges, w.s, w.e)) / DT
        if f.cls == "link_degraded" and f.kind == "downshift":
            speed_t[on > 0.5, f.nodes[0], f.rail] = cl.speed / f.strength
        if f.cls == "packet_loss" and f.kind == "rdma":
            s_, rl = f.nodes[0], f.rail
            gbn = 300.0  # packets resent or waited for per loss (go-back-N window and NAK round trip)
            p = (1 / f.strength - 1) / gbn
            loss_p[:, s_, rl] += p * on
            over = rail[:, rl] * on * 0.5 * (1 / f.strength - 1)  # go-back-N retransmitted bytes
            rx[:, s_, rl] += over
            tx[:, (s_ - 1) % n, rl] += 0.7 * over
            tx[:, (s_ + n // 2) % n, rl] += 0.3 * over
        if f.cls == "packet_loss" and f.kind == "tcp":
            tcp_p[:, f.nodes[0]] += f.extra.get("p", 0.01) * on
            tx[:, f.nodes[0], :] *= (1 + f.extra.get("p", 0.01) * on)[:, None]
    ctrl = 900.0 * DT  # LLDP, ARP, management of the port
    tx += ctrl
    rx += ctrl
    act = np.clip(np.maximum(tx, rx) / (DT * speed_t), 0.0, 1.0)

    # ---- pauses (RoCE) / credit waits (InfiniBand)
    cong = np.zeros(n_t)
    cong_ecn = np.zeros(n_t)
    cong_pause = np.zeros(n_t)
    cong_wait = np.zeros(n_t)
    for w in sim.wins:
        if w.f.cls == "network_congestion":
            on = np.diff(window_cum(edges, w.s, w.e)) / DT
            cong = np.maximum(cong, on)
            cong_ecn += on * w.f.extra.get("ecn", 0.01)
            cong_pause += on * w.f.extra.get("pause", 150.0)
            cong_wait += on * w.f.extra.get("wait", 0.15)
    node_cong = np.exp(rng.normal(0, 0.35, n))  # congestion is uneven across the leaves
    pause_rx_dur = np.zeros((n_t, n, r))
    pause_rx_frames = np.zeros((n_t, n, r))
    pause_tx_dur = np.zeros((n_t, n, r))
    pause_tx_frames = np.zeros((n_t, n, r))
    wait_ticks = np.zeros((n_t, n, r))
    discards = np.zeros((n_t, n, r))
    if sp.fabric == "roce":
        bg_pause = np.exp(rng.normal(math.log(1.0), 1.0, (n, r)))  # frames/s at full load
        frame_dur = 12e-6 * np.exp(rng.normal(0, 0.3, (n, r)))
        lam = act * (bg_pause[None] + cong_pause[:, None, None] * node_cong[None, :, None])
        pause_rx_frames = rng.poisson(lam * DT).astype(float)
        pause_rx_dur = pause_rx_frames * frame_dur[None] * np.exp(rng.normal(0, 0.3, pause_rx_frames.shape))
        pause_tx_frames = rng.poisson(act * 0.03 * DT).astype(float)
        pause_tx_dur = pause_tx_frames * 4e-6
        quanta = 65535 * 512 / (cl.speed * 8)  # seconds one maximal pause lasts
        for node, rl, a, b in sim.storm:
            ov = np.diff(window_cum(edges, a, b))
            spread = rng.uniform(0.6, 0.95, n)
            spread[node] = 0.35
            for m in range(n):
                d = ov * spread[m]
                pause_rx_dur[:, m, rl] += d
                pause_rx_frames[:, m, rl] += rng.poisson(d / (quanta / 2))
            pause_tx_dur[:, node, rl] += ov
            pause_tx_frames[:, node, rl] += rng.poisson(ov / (quanta / 2))
            discards[:, node, rl] += ov * 3.0e4
    elif sp.fabric == "ib":
        bg_wait = 0.0015 * np.exp(rng.normal(0, 0.5, (n, r)))
        wfrac = act * (bg_wait[None] + cong_wait[:, None, None] * node_cong[None, :, None])
        wfrac *= np.exp(rng.normal(0, 0.25, wfrac.shape))
        pause_rx_dur = np.clip(wfrac, 0, 1) * DT  # credit starvation plays the part of being paused
        wait_ticks = pause_rx_dur / IB_WAIT_TICK

    # ---- network state per tick and node
    maxfrac = np.max(np.maximum(tx, rx) / (DT * speed_t), axis=2)
    paused = np.any(pause_rx_dur >= PAUSED_FRACTION * DT, axis=2)
    state = np.where(paused, 0, np.where(maxfrac >= 0.9, 1, np.where(maxfrac >= 0.05, 2, 3)))
    masks = [(state == k).astype(float) for k in range(4)]
    quiet = state == 3
    bursts = np.zeros((n_t, n))
    bursts[1:] = (quiet[:-1] & ~quiet[1:]).astype(float)

    # ---- exporter restarts and missing scrapes
    present = rng.random((n_s, n)) >= 0.007
    present_grp = {k: rng.random((n_s, n)) >= 0.003 for k in ("gpu", "nic", "node")}
    restart_at: dict[int, float] = {}
    for _ in range(sp.restarts):
        node = int(rng.integers(0, n))
        tr = sim.t0 + float(rng.uniform(0.2, 0.85)) * sp.minutes * 60
        dwn = float(rng.uniform(8, 45))
        present[(ts[:, node] >= tr) & (ts[:, node] < tr + dwn), node] = False
        restart_at[node] = tr + dwn
    present[0, :] = True
    present[-1, :] = True
    uptime = rng.uniform(4 * 3600, 20 * 86400, n)  # exporter uptime before the trace

    def derived(vals: np.ndarray, cum_edges: np.ndarray, node: int, offset: float) -> np.ndarray:
        """Exporter-computed counter: an offset for the time before the trace; back to 0 at a restart."""
        out = vals + offset
        if node in restart_at:
            tr = restart_at[node]
            k = min(int((tr - sim.sim0) / DT), n_t)
            base = cum_edges[k] + offset
            out = np.where(ts[:, node] >= tr, out - base, out)
        return np.maximum(out, 0.0)

    store = Store()
    inst = cl.instances

    # ---- NIC series
    fec_bg = np.exp(rng.normal(math.log(300.0), 1.2, (n, r)))  # corrected FEC blocks/s: a healthy link's margin
    sym_bg = np.where(rng.random((n, r)) < 0.15, np.exp(rng.normal(math.log(2e-3), 1.0, (n, r))), 0.0)
    ecn_node = np.exp(rng.normal(0, 0.5, (n, r)))
    ecn_drift = drift(rng, n_t, (n,), 0.4, 300.0)
    flap_events: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for node, rl, a, b in sim.flaps:
        flap_events.setdefault((node, rl), []).append((a, b))
    for w in sim.wins:  # a downshift is a renegotiation: the link goes down and up at each end
        if w.f.cls == "link_degraded" and w.f.kind == "downshift":
            flap_events.setdefault((w.f.nodes[0], w.f.rail), []).extend([(w.s - 1.5, w.s), (w.e - 1.8, w.e)])
    is_flap_fault = {(w.f.nodes[0], w.f.rail) for w in sim.wins if w.f.cls == "link_degraded" and w.f.kind == "flap"}
    for rl in range(r):
        pk_rx = rx[:, :, rl] / wire
        ecn_rate = (sp.ecn_bg * ecn_drift * ecn_node[None, :, rl] * act[:, :, rl]
                    + cong_ecn[:, None] * node_cong[None, :])
        ecn_e = pk_rx * ecn_rate
        cnp_ratio = np.where(cong[:, None] > 0, 0.3, 0.8)
        cnp_s_e = ecn_e * cnp_ratio
        cnp_r_e = np.roll(cnp_s_e, -1, axis=1)
        oos_e = pk_rx * (loss_p[:, :, rl] * 12.0 + 3e-12)
        lost = pk_rx * loss_p[:, :, rl]
        nak_e = np.zeros_like(lost)
        nak_e += 0.7 * np.roll(lost, -1, axis=1)
        nak_e += 0.3 * np.roll(lost, -(n - n // 2), axis=1)
        sym_e = np.repeat(sym_bg[None, :, rl], n_t, axis=0) * DT + (loss_p[:, :, rl] > 0) * 2500.0 * DT
        crc_e = lost + 1e-6 * DT
        fec_e = np.repeat(fec_bg[None, :, rl], n_t, axis=0) * DT * (1 + (loss_p[:, :, rl] > 0) * 150.0)
        sat_tx = (tx[:, :, rl] / (DT * speed_t[:, :, rl]) >= 0.9) * DT
        sat_rx = (rx[:, :, rl] / (DT * speed_t[:, :, rl]) >= 0.9) * DT
        c_tx, c_rx = cum0(tx[:, :, rl]), cum0(rx[:, :, rl])
        v_tx, v_rx = samp(c_tx), samp(c_rx)
        c_sat_tx, c_sat_rx = cum0(sat_tx), cum0(sat_rx)
        v_sat_tx, v_sat_rx = samp(c_sat_tx), samp(c_sat_rx)
        v_ecn = _poisson_cum(rng, samp(cum0(ecn_e)))
        v_cnps = _poisson_cum(rng, samp(cum0(cnp_s_e)))
        v_cnpr = _poisson_cum(rng, samp(cum0(cnp_r_e)))
        v_oos = _poisson_cum(rng, samp(cum0(oos_e)))
        v_nak = _poisson_cum(rng, samp(cum0(nak_e)))
        v_sym = _poisson_cum(rng, samp(cum0(sym_e)))
        v_crc = _poisson_cum(rng, samp(cum0(crc_e)))
        v_fec = _poisson_cum(rng, samp(cum0(fec_e)))
        v_disc = _poisson_cum(rng, samp(cum0(discards[:, :, rl])))
        v_prf = samp(cum0(pause_rx_frames[:, :, rl]))
        v_ptf = samp(cum0(pause_tx_frames[:, :, rl]))
        v_prd = samp(cum0(pause_rx_dur[:, :, rl]))
        v_ptd = samp(cum0(pause_tx_dur[:, :, rl]))
        v_wait = samp(cum0(wait_ticks[:, :, rl]))
        for m in range(n):
            lab = {"device": cl.nic_dev[rl]}
            tsm = ts[:, m]
            store.add("gpunet_nic_info", m, "nic", {
                "device": cl.nic_dev[rl], "rdma_device": cl.nic_rdma[rl], "port": "1", "driver": cl.fabric_driver,
                "link_layer": cl.link_layer, "numa_node": str(cl.nic_numa[rl]), "pci_address": cl.nic_pci[rl]},
                np.ones(n_s), "i")
            evs = flap_events.get((m, rl), [])
            up = np.ones(n_s)
            spd = speed_t[ii[:, m], m, rl].copy()
            for a, b in evs:
                dn = (tsm >= a) & (tsm < b)
                up[dn] = 0
                spd[dn] = 0
            store.add("gpunet_nic_link_speed_bytes_per_second", m, "nic", lab, spd, "i")
            store.add("gpunet_nic_up", m, "nic", lab, up, "i")
            base_cc = float(rng.integers(1, 5)) * 2
            downs = [a for a, _ in evs]
            ups = [b for _, b in evs]
            store.add("gpunet_nic_carrier_changes", m, "nic", lab,
                      base_cc + _events_cum(downs, tsm) + _events_cum(ups, tsm), "i")
            o_rx, o_tx = rng.uniform(1e12, 8e14, 2)
            store.add("gpunet_nic_receive_bytes", m, "nic", lab, o_rx + v_rx[:, m], "i")
            store.add("gpunet_nic_transmit_bytes", m, "nic", lab, o_tx + v_tx[:, m], "i")
            if sp.fabric in ("roce", "tcp"):
                o = rng.integers(0, 5000, 2).astype(float) * (sp.fabric == "roce")
                store.add("gpunet_nic_pfc_pause_frames", m, "nic",
                          {"device": cl.nic_dev[rl], "direction": "receive", "priority": ROCE_PRIO}, o[0] + v_prf[:, m],
                          "i")
                store.add("gpunet_nic_pfc_pause_frames", m, "nic",
                          {"device": cl.nic_dev[rl], "direction": "transmit", "priority": ROCE_PRIO},
                          o[1] + v_ptf[:, m], "i")
            if sp.fabric == "roce":
                o = rng.integers(0, 200000, 1)[0]
                store.add("gpunet_nic_ecn_marked_packets", m, "nic", lab, o + v_ecn[:, m], "i")
                store.add("gpunet_nic_cnp_sent", m, "nic", lab, o * 0.8 // 1 + v_cnps[:, m], "i")
                store.add("gpunet_nic_cnp_received", m, "nic", lab, o * 0.75 // 1 + v_cnpr[:, m], "i")
            if sp.fabric != "tcp":
                lat = _events_cum([t for t, node, k in sim.timeouts if k == "rdma" and (node - 1) % n == m and
                                   rl == _loss_rail(sim)], tsm)
                flap_to = [a + 1.0 for (fn, fr), lst in flap_events.items() if (fn, fr) in is_flap_fault and fr == rl
                           and fn != m and (fn - m) % n in (1, n // 2) for a, _ in lst]
                lat = lat + 6.0 * _events_cum(flap_to, tsm)
                o = rng.integers(0, 40, 3).astype(float)
                store.add("gpunet_nic_rdma_loss_events", m, "nic", {"device": cl.nic_dev[rl], "kind": LOSS_KINDS[0]},
                          o[0] + v_oos[:, m], "i")
                store.add("gpunet_nic_rdma_loss_events", m, "nic", {"device": cl.nic_dev[rl], "kind": LOSS_KINDS[1]},
                          o[1] + v_nak[:, m], "i")
                store.add("gpunet_nic_rdma_loss_events", m, "nic", {"device": cl.nic_dev[rl], "kind": LOSS_KINDS[2]},
                          o[2] + lat, "i")
            store.add("gpunet_nic_receive_discards", m, "nic", lab, v_disc[:, m], "i")
            for d, v, c in (("receive", v_sat_rx, c_sat_rx), ("transmit", v_sat_tx, c_sat_tx)):
                store.add("gpunet_nic_saturated_seconds", m, "nic", {"device": cl.nic_dev[rl], "direction": d},
                          derived(v[:, m], c[:, m], m, uptime[m] * 0.01), "f3")
            if sp.fabric == "roce":
                store.add("gpunet_nic_pfc_pause_duration_seconds", m, "nic",
                          {"device": cl.nic_dev[rl], "direction": "receive", "priority": ROCE_PRIO}, v_prd[:, m], "f6")
                store.add("gpunet_nic_pfc_pause_duration_seconds", m, "nic",
                          {"device": cl.nic_dev[rl], "direction": "transmit", "priority": ROCE_PRIO}, v_ptd[:, m],
                          "f6")
            store.add("gpunet_nic_transmit_discards", m, "nic", lab, np.zeros(n_s), "i")
            store.add("gpunet_nic_receive_errors", m, "nic", lab, v_crc[:, m], "i")
            store.add("gpunet_nic_link_downed", m, "nic", lab, _events_cum(downs, tsm), "i")
            flap_sym = sum(float(rng.integers(40, 900)) * _events_cum([a], tsm) for a in downs) if downs else 0.0
            store.add("gpunet_nic_symbol_errors", m, "nic", lab, v_sym[:, m] + flap_sym, "i")
            if sp.fabric != "ib":
                store.add("gpunet_nic_fec_corrected_blocks", m, "nic", lab, v_fec[:, m], "i")
                store.add("gpunet_nic_fec_uncorrectable_blocks", m, "nic", lab, np.floor(v_crc[:, m] * 0.9), "i")
            if sp.fabric == "ib":
                store.add("gpunet_nic_transmit_wait_ticks", m, "nic", lab, v_wait[:, m], "i")
            if sp.fabric != "tcp":
                store.add("gpunet_nic_rdma_out_of_buffer", m, "nic", lab, np.floor(v_disc[:, m] * 0.2), "i")
            store.add("gpunet_nic_fabric", m, "nic", lab, np.ones(n_s), "i")
            store.add("gpunet_nic_mtu_bytes", m, "nic", lab, np.full(n_s, 4092 if sp.fabric == "ib" else 9000), "i")
            if sp.fabric == "tcp":
                store.add("gpunet_nic_netdev_receive_bytes", m, "nic", lab, o_rx + v_rx[:, m], "i")
                store.add("gpunet_nic_netdev_transmit_bytes", m, "nic", lab, o_tx + v_tx[:, m], "i")

    # ---- node: network state, bursts; management NIC; TCP
    st_cum = [cum0(mk * DT) for mk in masks]
    for k, name in enumerate(STATES):
        v = samp(st_cum[k])
        for m in range(n):
            store.add("gpunet_node_network_state_seconds", m, "node", {"network_state": name},
                      derived(v[:, m], st_cum[k][:, m], m, uptime[m] * (0.01, 0.03, 0.3, 0.66)[k]), "f3")
    b_cum = cum0(bursts)
    vb = samp(b_cum)
    for m in range(n):
        store.add("gpunet_node_network_bursts", m, "node", {}, derived(vb[:, m], b_cum[:, m], m,
                                                                     np.floor(uptime[m] / sp.step_s)), "i")

    ck = np.zeros(n_t)
    for a, b in sim.ckpts:
        ck += np.diff(window_cum(edges, a, b))
    ck_rate = rng.uniform(0.4e9, 1.2e9, n)
    stor_tx = ck[:, None] * ck_rate[None, :]  # checkpoint writes: bytes per tick
    load_rate = rng.uniform(10e6, 60e6, n)
    stor_rx = np.repeat(load_rate[None, :] * DT, n_t, axis=0)  # the data loader's reads
    for w in sim.wins:
        if w.f.cls == "host_bound" and w.f.kind == "storage":
            on = np.diff(window_cum(edges, w.s, w.e))
            stor_rx += on[:, None] * rng.uniform(0.15e9, 0.5e9, n)[None, :]
    mgmt_seg = rng.lognormal(math.log(700.0), 0.7, n).clip(150, 5000)[None, :] * drift(rng, n_t, (n,), 0.35, 90.0)
    mgmt_out = mgmt_seg * DT
    mgmt_in = mgmt_out * rng.uniform(0.85, 1.15, n)[None, :]
    seg_out = mgmt_out + stor_tx / TCP_MSS + stor_rx / TCP_MSS / 2
    seg_in = mgmt_in + stor_rx / TCP_MSS + stor_tx / TCP_MSS / 2
    if sp.fabric == "tcp":
        seg_out = seg_out + tx.sum(axis=2) / TCP_MSS + rx.sum(axis=2) / TCP_MSS / 8
        seg_in = seg_in + rx.sum(axis=2) / TCP_MSS + tx.sum(axis=2) / TCP_MSS / 8
    ratio_base = np.exp(rng.uniform(math.log(1e-5), math.log(3e-4), n)) * sp.tcp_noise
    ratio = ratio_base[None, :] * drift(rng, n_t, (n,), 0.7, 400.0)
    if sp.noisy_tcp_node > 0:
        busy_w = [(w.s, w.e) for w in sim.wins]
        node = int(rng.integers(0, n))
        for _ in range(50):
            a = sim.t0 + float(rng.uniform(0.1, 0.7)) * sp.minutes * 60
            if not any(a - 60 < e and a + 900 > s for s, e in busy_w):
                break
        ln = float(rng.uniform(6, 14)) * 60
        on = np.diff(window_cum(edges, a, a + ln)) / DT
        ratio[:, node] = ratio[:, node] * (1 - on) + sp.noisy_tcp_node * on
    retr_e = ratio * seg_out
    if sp.fabric == "tcp":
        retr_e += tcp_p * tx.sum(axis=2) / TCP_MSS
    to_e = retr_e * 0.03
    v_out = _poisson_cum(rng, samp(cum0(seg_out)))
    v_in = _poisson_cum(rng, samp(cum0(seg_in)))
    v_re = _poisson_cum(rng, samp(cum0(retr_e)))
    v_to = _poisson_cum(rng, samp(cum0(to_e)))
    m_tx = samp(cum0(mgmt_out * 420.0 + stor_tx * 1.02 + stor_rx / TCP_MSS / 2 * 66))
    m_rx = samp(cum0(mgmt_in * 640.0 + stor_rx * 1.02 + stor_tx / TCP_MSS / 2 * 66))
    for m in range(n):
        tsm = ts[:, m]
        lab = {"device": cl.mgmt_dev}
        store.add("gpunet_nic_info", m, "nic", {
            "device": cl.mgmt_dev, "rdma_device": "", "port": "1", "driver": cl.mgmt_driver, "link_layer": "ethernet",
            "numa_node": "0", "pci_address": "0000:03:00.0"}, np.ones(n_s), "i")
        evs = flap_events.get((m, -1), [])
        store.add("gpunet_nic_link_speed_bytes_per_second", m, "nic", lab, np.full(n_s, cl.mgmt_speed), "i")
        store.add("gpunet_nic_up", m, "nic", lab, np.ones(n_s), "i")
        store.add("gpunet_nic_carrier_changes", m, "nic", lab, np.full(n_s, 2.0 + 2 * len(evs)), "i")
        o_rx, o_tx = rng.uniform(1e11, 5e13, 2)
        store.add("gpunet_nic_receive_bytes", m, "nic", lab, o_rx + m_rx[:, m], "i")
        store.add("gpunet_nic_transmit_bytes", m, "nic", lab, o_tx + m_tx[:, m], "i")
        store.add("gpunet_nic_fabric", m, "nic", lab, np.zeros(n_s), "i")
        store.add("gpunet_nic_mtu_bytes", m, "nic", lab, np.full(n_s, 9000), "i")
        store.add("gpunet_nic_netdev_receive_bytes", m, "nic", lab, o_rx + m_rx[:, m], "i")
        store.add("gpunet_nic_netdev_transmit_bytes", m, "nic", lab, o_tx + m_tx[:, m], "i")
        o_seg = rng.uniform(1e8, 4e9)
        store.add("gpunet_tcp_retransmitted_segments", m, "node", {}, np.floor(o_seg * 2e-4) + v_re[:, m], "i")
        store.add("gpunet_tcp_sent_segments", m, "node", {}, np.floor(o_seg) + v_out[:, m], "i")
        store.add("gpunet_tcp_received_segments", m, "node", {}, np.floor(o_seg * 1.02) + v_in[:, m], "i")
        tcp_to = _events_cum([t for t, node, k in sim.timeouts if k == "tcp" and node == m], tsm)
        store.add("gpunet_tcp_timeouts", m, "node", {}, np.floor(o_seg * 5e-6) + v_to[:, m] + tcp_to, "i")

    # ---- GPUs
    _gpus(sim, store, samp, cum0, derived, busy_cum, extra_cum, busy_t, extra_t, masks, ts, ii, uptime)

    incidents: list[dict[str, object]] = []
    for w in sim.wins:
        nodes = [inst[k] for k in w.f.nodes] if w.f.cls in LOCALISED else []
        incidents.append({"class": w.f.cls, "start": round(w.s, 3), "end": round(w.e, 3), "nodes": nodes})
    notes = (f"bench/cleanroom.py (clean-room generator, written from docs only), seed {seed}: {spec.desc}. "
             f"{n} nodes x {g} GPUs ({spec.gpu_model}), {r} x {spec.gbps}G {spec.fabric} fabric NICs, "
             f"{spec.scrape:g} s scrapes, step ~{spec.step_s:g} s; checkpoints {len(sim.ckpts)}; "
             f"link blips {len(spec.blips)}; exporter restarts {sp.restarts}.")
    store.fit(present)
    return Built(store, ts, present, present_grp, incidents, notes, inst)


def _loss_rail(sim: Sim) -> int:
    for w in sim.wins:
        if w.f.cls == "packet_loss" and w.f.kind == "rdma":
            return w.f.rail
    return -1


def _gpus(sim: Sim, store: Store, samp: ArrFn, cum0: ArrFn, derived: DerivedFn, busy_cum: np.ndarray,
          extra_cum: np.ndarray, busy_t: np.ndarray, extra_t: np.ndarray, masks: list[np.ndarray], ts: np.ndarray,
          ii: np.ndarray, uptime: np.ndarray) -> None:
    sp, cl, rng = sim.spec, sim.cl, sim.rng
    n, g = sp.nodes, sp.gpus
    n_s = ts.shape[0]
    edges = sim.edges
    sm, c0, dv = samp, cum0, derived
    unused = np.zeros((n, g), dtype=bool)
    if sp.unused_gpus:
        holders = rng.choice(n, size=min(n, max(1, (sp.unused_gpus + 1) // 2)), replace=False)
        for k in range(sp.unused_gpus):
            unused[holders[k % len(holders)], g - 1 - k // len(holders)] = True
    aff = np.zeros((n, g))
    throttle_w: list[tuple[Win, np.ndarray]] = []
    for w in sim.wins:
        if w.f.cls == "gpu_throttle":
            a = np.zeros((n, g))
            for node in w.f.nodes:
                k = w.f.gpus or g
                a[node, rng.choice(g, size=k, replace=False)] = 1.0
            aff = np.maximum(aff, a)
            throttle_w.append((w, a))
    u = rng.uniform(0.955, 0.99, (n, g))
    cols = np.arange(n)[None, :]
    b_now, x_now = sm(busy_cum), sm(extra_cum)
    prev = np.clip(ii - int(round(1.0 / DT)), 0, None)
    b_prev, x_prev = busy_cum[prev, cols], extra_cum[prev, cols]
    cm = [c0(mk * DT) for mk in masks]
    cb = [c0(mk * busy_t) for mk in masks]
    cx = [c0(mk * extra_t) for mk in masks]
    vm = [sm(x) for x in cm]
    vb = [sm(x) for x in cb]
    vx = [sm(x) for x in cx]
    pc = np.clip(rng.lognormal(math.log(0.012), 0.9, (n, g)), 0, 0.08)
    driver = ("550.90.07", "535.183.06", "560.35.03")[int(rng.integers(0, 3))]
    job = ("llm-pretrain-13b", "moe-sft-v4", "vit-h-14", "dlrm-train")[int(rng.integers(0, 4))]
    jobid = str(int(rng.integers(100000, 999999)))
    clocks = np.full((n_s, n, g), cl.clock)
    in_thr = np.zeros((n_s, n, g), dtype=bool)
    cr_all = np.ones((n_s, n, g))
    for w, a in throttle_w:
        cr = (1 + w.f.strength) ** (-1 / 0.85)
        hit = ((ts >= w.s) & (ts < w.e))[:, :, None] & (a[None] > 0)
        in_thr |= hit
        cr_all = np.where(hit, cr, cr_all)
    clocks = clocks * cr_all * np.exp(rng.normal(0, 0.012, clocks.shape)) * (1 - 0.03 * rng.random(clocks.shape))
    clocks = np.minimum(clocks, cl.clock)
    for m in range(n):
        store.add("gpunet_gpu_driver_info", m, "gpu", {"driver_version": driver}, np.ones(n_s), "i")
        ambient = float(rng.uniform(26, 34))
        for k in range(g):
            lab = {"gpu": str(k)}
            used = not unused[m, k]
            store.add("gpunet_gpu_info", m, "gpu", {
                "gpu": str(k), "uuid": cl.gpu_uuid[m][k], "model": sp.gpu_model,
                "pci_address": f"00000000:{GPU_BUSES[k * (8 // g)]:02X}:00.0",
                "numa_node": str(0 if k < g // 2 else 1)},
                np.ones(n_s), "i")
            uu, aa = u[m, k] * used, aff[m, k]
            util = np.clip(np.round(uu * ((b_now[:, m] - b_prev[:, m]) + aa * (x_now[:, m] - x_prev[:, m])) /
                                    1.0 * 100) / 100, 0, 1)
            store.add("gpunet_gpu_utilization_ratio", m, "gpu", lab, util, "f2")
            busy_e = uu * (busy_cum[:, m] + aa * extra_cum[:, m])
            busy_v = uu * (b_now[:, m] + aa * x_now[:, m])
            store.add("gpunet_gpu_busy_seconds", m, "gpu", lab, dv(busy_v, busy_e, m, uptime[m] * 0.85 * used), "f3")
            for j, name in enumerate(STATES):
                idle_e = cm[j][:, m] - uu * (cb[j][:, m] + aa * cx[j][:, m])
                idle_v = vm[j][:, m] - uu * (vb[j][:, m] + aa * vx[j][:, m])
                off = uptime[m] * ((0.004, 0.01, 0.07, 0.066)[j] if used else (0.01, 0.03, 0.3, 0.66)[j])
                store.add("gpunet_gpu_idle_seconds", m, "gpu", {"gpu": str(k), "network_state": name},
                          dv(np.maximum(idle_v, 0), np.maximum(idle_e, 0), m, off), "f3")
            thr_e = {"sw_power_cap": pc[m, k] * busy_e, "sw_thermal_slowdown": np.zeros_like(busy_e),
                     "hw_slowdown": np.zeros_like(busy_e)}
            for w, a in throttle_w:
                if a[m, k] <= 0:
                    continue
                win = window_cum(edges, w.s, w.e)
                if w.f.kind == "brake":
                    thr_e["hw_slowdown"] = thr_e["hw_slowdown"] + float(rng.uniform(0.9, 1.0)) * win
                    thr_e["sw_power_cap"] = thr_e["sw_power_cap"] + float(rng.uniform(0.1, 0.4)) * win
                else:
                    thr_e["sw_thermal_slowdown"] = thr_e["sw_thermal_slowdown"] + float(rng.uniform(0.88, 1.0)) * win
                    thr_e["hw_slowdown"] = thr_e["hw_slowdown"] + float(rng.uniform(0.03, 0.2)) * win
            for reason in REASONS:
                e_ = thr_e[reason]
                v_ = sm(np.repeat(e_[:, None], n, axis=1))[:, m]
                off = uptime[m] * (pc[m, k] * 0.8 if reason == "sw_power_cap" else 0.0)
                store.add("gpunet_gpu_throttled_seconds", m, "gpu", {"gpu": str(k), "reason": reason},
                          dv(v_, e_, m, off), "f3")
            ck = np.where(used, np.round(clocks[:, m, k] / 1e6) * 1e6, cl.idle_clock)
            store.add("gpunet_gpu_sm_clock_hertz", m, "gpu", lab, ck, "i")
            store.add("gpunet_gpu_up", m, "gpu", lab, np.ones(n_s), "i")
            crk = cr_all[:, m, k]
            power = cl.idle_w + (cl.tdp - cl.idle_w) * 0.9 * util * crk ** 1.6 + rng.normal(0, 6, n_s)
            power = np.clip(power, cl.idle_w * 0.9, cl.tdp * 1.02)
            store.add("gpunet_gpu_power_watts", m, "gpu", lab, power, "f1")
            temp = ambient + (power - cl.idle_w) / cl.tdp * 48 + rng.normal(0, 0.7, n_s)
            hot = in_thr[:, m, k] & any(w.f.kind == "thermal" for w, _ in throttle_w)
            temp = np.where(hot, rng.uniform(87, 91, n_s), temp)
            store.add("gpunet_gpu_temperature_celsius", m, "gpu", lab, np.round(temp), "i")
            if used:
                if sp.workload_source == "slurm":
                    wl = {"gpu": str(k), "workload": jobid, "source": "slurm", "namespace": "", "pod": "",
                          "container": ""}
                else:
                    wl = {"gpu": str(k), "workload": job, "source": "kubernetes", "namespace": "training",
                          "pod": f"{job}-worker-{m}", "container": "trainer"}
                store.add("gpunet_gpu_workload_info", m, "gpu", wl, np.ones(n_s), "i")

# --------------------------------------------------------------------------------------------
# Several jobs on one shared fabric (--set multijob)
# --------------------------------------------------------------------------------------------

MJ_BUDGET = 1_500_000  # samples: keeps a multi-job trace under about 10 MB gzip
LEAN_FAMILIES = {  # a very large trace: contract families (docs/metrics.md), network state, xmit_wait, workloads
    "gpunet_nic_info", "gpunet_nic_link_speed_bytes_per_second", "gpunet_nic_up", "gpunet_nic_carrier_changes",
    "gpunet_nic_receive_bytes", "gpunet_nic_transmit_bytes", "gpunet_nic_pfc_pause_frames",
    "gpunet_nic_ecn_marked_packets", "gpunet_nic_cnp_sent", "gpunet_nic_cnp_received", "gpunet_nic_rdma_loss_events",
    "gpunet_nic_receive_discards", "gpunet_nic_saturated_seconds", "gpunet_tcp_retransmitted_segments",
    "gpunet_tcp_sent_segments", "gpunet_gpu_info", "gpunet_gpu_utilization_ratio", "gpunet_gpu_busy_seconds",
    "gpunet_gpu_idle_seconds", "gpunet_gpu_throttled_seconds", "gpunet_gpu_sm_clock_hertz",
    "gpunet_node_network_state_seconds", "gpunet_nic_transmit_wait_ticks", "gpunet_gpu_workload_info"}
WARM_RATE = 0.004  # fabric traffic during a warm-up (NCCL set-up, small collectives), share of line rate


@dataclass
class Job:
    """One training job of a multi-job trace. Node numbers index the cluster's GPU nodes."""

    name: str  # the workload as gpunet_gpu_workload_info carries it (namespace/name, or the Slurm job id)
    nodes: tuple[int, ...]  # the nodes it computes on, in ring order
    gpus: int  # GPUs per node
    pattern: str = "ring"  # "ring" (data-parallel all-reduce) or "a2a" (all-to-all: expert parallel)
    step_s: float = 1.2
    comm_ratio: float = 0.3
    overlap: float = 0.6
    tail: float = 0.12
    eff: float = 0.94
    start_min: float | None = None  # None: it started before the trace
    end_min: float | None = None  # None: still running when the trace ends
    warmup_min: float = 4.0  # loading data, compiling: after a start inside the trace
    gpu_first: dict[int, int] = field(default_factory=dict)  # node -> first GPU it holds (default 0)
    rails: tuple[int, ...] = ()  # fabric NICs it uses, when forced (a job pinned to one rail)
    idle_nodes: tuple[int, ...] = ()  # allocated to it, but it runs nothing there
    replace: tuple[int, int, float, float] | None = None  # elastic: (node lost, replacement, minute, restart s)
    storage: bool = False  # reads its data from (and writes to) the storage nodes over the fabric


@dataclass
class MFault:
    """One incident of a multi-job trace. network_congestion: ``job`` (an index) is the job whose
    all-to-all loads the uplinks; its window is that job's running span, not start/dur."""

    cls: str
    start_min: float  # < 0: under way before the trace starts
    dur_min: float  # may run past the trace's end
    strength: float = 1.0
    node: int = -1  # source node (storage nodes are numbered after the GPU nodes)
    nic: int = 0
    kind: str = ""
    job: int = -1
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class MSpec:
    name: str
    desc: str
    nodes: int  # GPU nodes
    gpus: int
    nics: int
    gbps: int
    fabric: str  # "roce" or "ib"
    jobs: list[Job]
    faults: list[MFault] = field(default_factory=list)
    topo: str = "leaf"  # "leaf": spine-leaf, a node's NICs all on its leaf; "rail": NIC k of a pod's nodes on switch k
    per_switch: int = 8  # nodes under a leaf, or in a pod of rail switches
    ratio: float = 2.0  # oversubscription of a leaf's (rail switch's) uplinks: downlink capacity / uplink capacity
    storage: int = 0  # storage nodes (no GPUs, NIC series only) on a leaf of their own
    scrape: float = 15.0
    minutes: float = 60.0
    source: str = "kubernetes"  # how GPUs are attributed: kubernetes, slurm or none (no workload series)
    host_style: str = "hgx"
    port: int = 9845
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    mgmt_gbps: int = 25
    ecn_bg: float = 3e-4
    tcp_noise: float = 1.0
    restarts: int = 1
    health: tuple[tuple[int, int, str], ...] = ()  # (node, gpu, "ecc" | "nvlink"): counters that rise, no effect
    budget: int = MJ_BUDGET
    lean: bool = False  # write LEAN_FAMILIES only (very large traces)


def multijob_set() -> list[MSpec]:
    """The labelled traces of ``--set multijob``."""
    s: list[MSpec] = []
    s.append(MSpec(
        "mj_storm_spine_leaf", "PFC storm from a NIC of job A (6 min): the pauses climb to the spine and freeze job B, "
        "whose ring crosses the uplinks of a leaf that sends toward the storm's leaf; job C, inside one leaf, runs on",
        24, 8, 4, 400, "roce", scrape=30, minutes=62, ratio=2.0, host_style="rack", jobs=[
            Job("training/llm-pretrain-a", tuple(range(10)), 8, step_s=1.3, comm_ratio=0.35),
            Job("training/vision-b", tuple(range(10, 18)), 8, step_s=0.9, comm_ratio=0.3),
            Job("research/rl-policy-c", tuple(range(18, 24)), 8, step_s=1.1, comm_ratio=0.25)],
        faults=[MFault("pfc_storm", 29, 6, 1.0, node=3, nic=1)]))
    s.append(MSpec(
        "mj_storage_storm", "PFC storm from a storage node's NIC (no job, no GPUs), ~60% duty for 7 min: jobs A and B "
        "read from it over the fabric and freeze; job C (data on local disks, inside one leaf) runs on",
        24, 4, 2, 200, "roce", storage=2, scrape=15, minutes=56, ratio=2.0, host_style="cloud", port=9400, jobs=[
            Job("training/llm-7b", tuple(range(10)), 4, step_s=1.0, comm_ratio=0.32, storage=True),
            Job("speech/asr-conformer", tuple(range(10, 20)), 4, step_s=0.8, comm_ratio=0.28, storage=True),
            Job("research/diffusion-c", tuple(range(20, 24)), 4, step_s=1.2, comm_ratio=0.25)],
        faults=[MFault("pfc_storm", 24, 7, 0.6, node=24, nic=0, extra={"episode": 20.0})]))
    s.append(MSpec(
        "mj_a2a_uplink_congestion", "MoE job A (all-to-all, 14 nodes on leaves 0-1) starts at min 16 and loads the "
        "3:1 uplinks past capacity once warmed up; job B's ring crosses those uplinks: ECN marks, CNPs, slower "
        "collectives on B; job C inside leaf 3 untouched; 4 idle nodes", 32, 8, 4, 400, "roce", scrape=30,
        minutes=66, ratio=3.0, host_style="hgx", jobs=[
            Job("moe/mixtral-ft-a", (*range(7), *range(8, 15)), 8, pattern="a2a", step_s=1.0, comm_ratio=1.8,
                overlap=0.15, tail=0.6, start_min=16, end_min=45, warmup_min=4),
            Job("training/llm-dense-b", (7, 15, *range(16, 22)), 8, step_s=1.1, comm_ratio=0.45, overlap=0.5,
                tail=0.15),
            Job("research/vit-c", tuple(range(24, 30)), 8, step_s=1.0, comm_ratio=0.3)],
        faults=[MFault("network_congestion", 0, 0, job=0)]))
    s.append(MSpec(
        "mj_rail_one_congestion", "rail-optimised fabric (3 pods x 4 rails, 3:1 uplinks): job A, pinned to rail 0 "
        "(NCCL_IB_HCA=mlx5_0), runs an all-to-all across pods 0-1 from min 14: rail-0 uplinks congest; job B's "
        "rail-0 ring hops that cross pods get ECN marks and slow down, its rails 1-3 stay clean; job C (pod 2) "
        "untouched", 24, 8, 4, 400, "roce", topo="rail", scrape=30, minutes=60, ratio=3.0, host_style="dgx", jobs=[
            Job("moe/expert-sweep-a", (*range(6), *range(8, 14)), 8, pattern="a2a", step_s=1.0, comm_ratio=0.6,
                overlap=0.15, tail=0.6, start_min=14, end_min=41, warmup_min=3, rails=(0,)),
            Job("training/llm-b", (6, 7, 14, 15, 16, 17, 18, 19), 8, step_s=1.0, comm_ratio=0.45, overlap=0.5,
                tail=0.15),
            Job("training/rec-c", tuple(range(20, 24)), 8, step_s=0.9, comm_ratio=0.3)],
        faults=[MFault("network_congestion", 0, 0, job=0)]))
    s.append(MSpec(
        "mj_ib_xmitwait_congestion", "InfiniBand, Slurm: all-to-all job A (min 22-47) congests the 3:1 uplinks of "
        "leaves 0-1; job B's ring crosses them and its HCAs wait for credits (port_xmit_wait), no ECN/PFC on IB; "
        "job C inside leaf 2 untouched", 24, 8, 4, 200, "ib", scrape=60, minutes=68, ratio=3.0, source="slurm",
        host_style="slurm", gpu_model="NVIDIA A100-SXM4-80GB", jobs=[
            Job("5104233", (*range(6), *range(8, 14)), 8, pattern="a2a", step_s=1.2, comm_ratio=1.6,
                overlap=0.15, tail=0.6, start_min=22, end_min=47, warmup_min=4),
            Job("5103871", (6, 7, 14, 15, 16, 17, 18, 19), 8, step_s=1.3, comm_ratio=0.45, overlap=0.5, tail=0.15),
            Job("5103990", tuple(range(20, 24)), 8, step_s=1.0, comm_ratio=0.3)],
        faults=[MFault("network_congestion", 0, 0, job=0)]))
    s.append(MSpec(
        "mj_cut_incidents", "incidents cut by the trace's edges: all-to-all job A has congested the uplinks job B "
        "crosses since before the trace starts (A ends at min 13); a node of job C turns straggler at min 41 and "
        "still is when the trace ends", 24, 4, 2, 400, "roce", scrape=15, minutes=50, ratio=3.0, host_style="rack",
        jobs=[
            Job("moe/router-a", (*range(7), *range(8, 15)), 4, pattern="a2a", step_s=0.9, comm_ratio=1.6,
                overlap=0.15, tail=0.6, end_min=13),
            Job("training/llm-b", (7, 15, 16, 17, 18, 19), 4, step_s=1.0, comm_ratio=0.45, overlap=0.5, tail=0.15),
            Job("training/ranker-c", (20, 21, 22, 23), 4, step_s=0.8, comm_ratio=0.3)],
        faults=[MFault("network_congestion", 0, 0, job=0), MFault("straggler", 41, 20, 0.35, node=21)]))
    s.append(MSpec(
        "mj_straggler_one_job", "one node of job A computes 30% slower for 14 min; job B, on the same leaves, is "
        "healthy", 16, 8, 4, 200, "roce", scrape=15, minutes=60, ratio=2.0, host_style="hgx", tcp_noise=2.0, jobs=[
            Job("training/llm-a", tuple(range(10)), 8, step_s=1.2, comm_ratio=0.3),
            Job("training/seg-b", tuple(range(10, 16)), 8, step_s=0.9, comm_ratio=0.3)],
        faults=[MFault("straggler", 25, 14, 0.3, node=4)]))
    s.append(MSpec(
        "mj_churn_healthy", "healthy: job A ends at min 24, job B starts on the same 8 nodes at min 28 (5 min of "
        "loading and compiling: GPUs mostly idle, little traffic); job C runs throughout", 16, 8, 4, 400, "roce",
        scrape=30, minutes=64, host_style="dgx", jobs=[
            Job("training/llm-a", tuple(range(8)), 8, step_s=1.2, comm_ratio=0.3, end_min=24),
            Job("training/llm-sft-b", tuple(range(8)), 8, step_s=1.0, comm_ratio=0.32, start_min=28,
                warmup_min=5),
            Job("research/vlm-c", tuple(range(8, 16)), 8, step_s=1.4, comm_ratio=0.28)]))
    s.append(MSpec(
        "mj_elastic_healthy", "healthy: elastic job A loses a node (its pod evicted) at min 27, restarts for ~100 s "
        "and continues on a replacement node that was idle; job B throughout; idle nodes without a job", 16, 4, 2,
        200, "roce", scrape=15, minutes=58, host_style="cloud", port=9400, jobs=[
            Job("training/elastic-llm-a", tuple(range(8)), 4, step_s=1.0, comm_ratio=0.3,
                replace=(5, 12, 27.0, 100.0)),
            Job("training/det-b", tuple(range(8, 12)), 4, step_s=0.8, comm_ratio=0.25)]))
    s.append(MSpec(
        "mj_shared_node_healthy", "healthy: node 8's GPUs are split between jobs B (GPUs 0-3) and C (GPUs 4-7); "
        "node 11 is allocated to C but idle; nodes 12-13 belong to no job; jobs B and C use 4 GPUs per node and "
        "the NICs on those GPUs' NUMA node", 14, 8, 4, 400, "roce", scrape=30, minutes=60, host_style="rack", jobs=[
            Job("training/llm-a", tuple(range(5)), 8, step_s=1.2, comm_ratio=0.3),
            Job("team-vision/vit-b", (5, 6, 7, 8), 4, step_s=0.9, comm_ratio=0.3),
            Job("team-speech/tts-c", (8, 9, 10), 4, step_s=1.0, comm_ratio=0.28, gpu_first={8: 4},
                idle_nodes=(11,))]))
    s.append(MSpec(
        "mj_gpu_health_healthy", "healthy: corrected ECC errors and a row remap (pending) on one GPU of job A, "
        "NVLink CRC/replay errors rising on one GPU of job B; no effect on either job", 16, 8, 4, 400, "roce",
        scrape=30, minutes=60, host_style="hgx", gpu_model="NVIDIA H200", jobs=[
            Job("training/llm-a", tuple(range(10)), 8, step_s=1.2, comm_ratio=0.3),
            Job("training/vision-b", tuple(range(10, 16)), 8, step_s=0.9, comm_ratio=0.3)],
        health=((3, 5, "ecc"), (12, 2, "nvlink"))))
    s.append(MSpec(
        "mj_slurm_loss_cable", "Slurm: a bad cable on one RoCE port of job A (14 min): CRC/symbol errors, go-back-N "
        "loss events, A's collectives slowed; job B healthy", 16, 8, 4, 200, "roce", scrape=15, minutes=62,
        source="slurm", host_style="slurm", tcp_noise=2.0, jobs=[
            Job("4817223", tuple(range(10)), 8, step_s=1.2, comm_ratio=0.38),
            Job("4817301", tuple(range(10, 16)), 8, step_s=1.0, comm_ratio=0.3)],
        faults=[MFault("packet_loss", 24, 14, 0.5, node=6, nic=2, kind="rdma")]))
    s.append(MSpec(
        "mj_unattributed_storm", "no workload series at all (no Kubernetes, no Slurm): PFC storm from a NIC of job A "
        "(5 min) freezes A and, over the spine, job B", 18, 4, 2, 200, "roce", per_switch=6, scrape=15,
        minutes=55, source="none", host_style="hgx", jobs=[
            Job("job-a (unattributed)", tuple(range(8)), 4, step_s=1.0, comm_ratio=0.3),
            Job("job-b (unattributed)", tuple(range(8, 16)), 4, step_s=1.1, comm_ratio=0.3)],
        faults=[MFault("pfc_storm", 27, 5, 1.0, node=2, nic=0)]))
    s.append(MSpec(
        "mj_storm_rail", "rail-optimised fabric (3 pods x 4 rails): PFC storm from job A's NIC on rail 2 (6 min) "
        "fills pod 0's rail-2 switch and, through the spine, pod 1's rail-2 uplinks: A freezes, job B (pods 1-2) "
        "freezes through its rail-2 hop out of pod 1, job C (pod 2, no hop out) runs on", 24, 8, 4, 400, "roce",
        topo="rail", scrape=30, minutes=60, host_style="dgx", jobs=[
            Job("training/llm-a", tuple(range(12)), 8, step_s=1.2, comm_ratio=0.3),
            Job("training/llm-b", tuple(range(12, 20)), 8, step_s=1.0, comm_ratio=0.3),
            Job("research/rl-c", tuple(range(20, 24)), 8, step_s=1.1, comm_ratio=0.25)],
        faults=[MFault("pfc_storm", 31, 6, 1.0, node=5, nic=2)]))
    big = [Job("training/foundation-405b", tuple(range(256)), 4, step_s=2.0, comm_ratio=0.35),
           Job("training/llm-70b-sft", tuple(range(256, 384)), 4, step_s=1.5, comm_ratio=0.45, overlap=0.5),
           Job("research/moe-16x", tuple(range(384, 448)), 4, step_s=1.2, comm_ratio=0.3),
           Job("team-vision/video-gen", tuple(range(448, 480)), 4, step_s=1.0, comm_ratio=0.3),
           Job("team-speech/asr-xl", tuple(range(480, 496)), 4, step_s=0.9, comm_ratio=0.28, start_min=21,
               warmup_min=4)]
    s.append(MSpec(
        "mj_512_downshift", "512 nodes (4 GPUs, 2 x 400G each, rail-optimised pods of 32), 5 jobs, 16 idle nodes: "
        "one NIC of job B renegotiates 400G -> 200G for 20 min; the rest healthy", 512, 4, 2, 400, "roce",
        topo="rail", per_switch=32, ratio=1.0, scrape=15, minutes=60, host_style="hgx", lean=True, jobs=big,
        faults=[MFault("link_degraded", 24, 20, 2.0, node=301, nic=1, kind="downshift")]))
    return s


def multijob_guard_set() -> list[MSpec]:
    """Four short, small multi-job traces for a regression test."""
    return [
        MSpec("mjg_churn_healthy", "healthy: job A ends at min 9, job B starts on the same nodes at min 12; job C "
              "throughout", 12, 4, 2, 200, "roce", per_switch=6, scrape=15, minutes=25, restarts=0, jobs=[
                  Job("training/llm-a", tuple(range(6)), 4, end_min=9),
                  Job("training/sft-b", tuple(range(6)), 4, start_min=12, warmup_min=3, step_s=1.0),
                  Job("research/rl-c", tuple(range(6, 12)), 4, step_s=0.9)]),
        MSpec("mjg_elastic_healthy", "healthy: elastic job A loses node 3 at min 11 and continues on node 12 after "
              "90 s; job B throughout", 14, 4, 2, 200, "roce", per_switch=7, scrape=15, minutes=25, restarts=0,
              host_style="rack", jobs=[
                  Job("training/elastic-a", tuple(range(8)), 4, replace=(3, 12, 11.0, 90.0)),
                  Job("training/vision-b", tuple(range(8, 12)), 4, step_s=0.9)]),
        MSpec("mjg_storm_xjob", "PFC storm from a NIC of job A (5 min); job B waits through the spine", 12, 4, 2,
              200, "roce", per_switch=4, scrape=15, minutes=25, restarts=0, host_style="cloud", port=9400, jobs=[
                  Job("training/llm-a", tuple(range(6)), 4),
                  Job("training/vision-b", tuple(range(6, 12)), 4, step_s=0.9)],
              faults=[MFault("pfc_storm", 10, 5, 1.0, node=1, nic=0)]),
        MSpec("mjg_a2a_congestion", "all-to-all job A (min 5-20) loads the 3:1 uplinks of leaves 0-1; job B's "
              "ring crosses them; job C inside leaf 2 untouched", 16, 4, 2, 200, "roce", per_switch=6, scrape=15,
              minutes=25, ratio=3.0, restarts=0, host_style="rack", jobs=[
                  Job("moe/a2a-a", (0, 1, 2, 3, 6, 7, 8, 9), 4, pattern="a2a", step_s=1.0, comm_ratio=1.8,
                      overlap=0.15, tail=0.6, start_min=5, end_min=20, warmup_min=2),
                  Job("training/ring-b", (4, 5, 10, 11), 4, step_s=1.1, comm_ratio=0.45, overlap=0.5, tail=0.15),
                  Job("research/c", (12, 13, 14, 15), 4, step_s=1.0, comm_ratio=0.3)],
              faults=[MFault("network_congestion", 0, 0, job=0)]),
    ]


@dataclass
class Run:
    """A stretch of a job on a fixed set of nodes: a warm-up, then steps from ``a + warm`` until ``b``."""

    a: float
    b: float
    members: tuple[int, ...]
    warm: float
    warm_busy: tuple[float, float]  # range of the GPUs' busy share during the warm-up


@dataclass
class MSim:
    ms: MSpec
    rng: np.random.Generator
    seed: int
    t0: float
    t_end: float
    sim0: float
    n_t: int
    edges: np.ndarray
    n_all: int  # GPU nodes and storage nodes
    sw: np.ndarray  # [node, nic] -> switch (leaf, or rail switch of a pod)
    n_sw: int
    cap: np.ndarray  # bytes/s of each switch's uplinks [0, n_sw) and of the spine's links down to it [n_sw, 2 n_sw)
    speed: float
    runs: list[list[Run]]
    alloc: list[dict[int, tuple[float, float]]]  # job -> node -> span of its workload series (pod or Slurm step)
    nic_of: list[dict[int, tuple[int, ...]]]  # job -> node -> NICs, one per lane
    gpu_of: list[dict[int, tuple[int, ...]]]  # job -> node -> GPUs
    wins: list[tuple[MFault, float, float]]


Flow = tuple[int, int, int, int, float, int]  # (src node, src nic, dst node, dst nic, share of the lane's bytes, lane)


def make_msim(ms: MSpec, seed: int) -> MSim:
    rng = np.random.default_rng([seed, zlib.crc32(ms.name.encode())])
    day = zlib.crc32(ms.name.encode()) % 120
    t0 = EPOCH + day * 86400 + float(rng.integers(0, 20)) * 3600 + float(rng.integers(0, 3600))
    t_end = t0 + ms.minutes * 60
    sim0 = t0 - 120.0
    n_t = int(math.ceil((t_end + 8.0 - sim0) / DT))
    edges = sim0 + DT * np.arange(n_t + 1)
    n, r, g = ms.nodes, ms.nics, ms.gpus
    groups = -(-n // ms.per_switch)
    if ms.topo == "rail":
        sw = np.array([[(m // ms.per_switch) * r + k for k in range(r)] for m in range(n)], dtype=int).reshape(n, r)
        stor_sw = groups * r
    else:
        sw = np.repeat((np.arange(n) // ms.per_switch)[:, None], r, axis=1)
        stor_sw = groups
    if ms.storage:
        sw = np.concatenate([sw, np.full((ms.storage, r), stor_sw)], axis=0)
    n_sw = int(sw.max()) + 1
    speed = ms.gbps * 1e9 / 8
    ports = np.bincount(sw.ravel(), minlength=n_sw).astype(float)
    ratio = np.full(n_sw, ms.ratio)
    if ms.storage:
        ratio[stor_sw] = 1.0
    cap_up = ports * speed / ratio
    cap = np.concatenate([cap_up, cap_up])
    runs: list[list[Run]] = []
    alloc: list[dict[int, tuple[float, float]]] = []
    nic_of: list[dict[int, tuple[int, ...]]] = []
    gpu_of: list[dict[int, tuple[int, ...]]] = []
    for jb in ms.jobs:
        ta = t0 + jb.start_min * 60 if jb.start_min is not None else sim0 - 3600.0
        tb = t0 + jb.end_min * 60 if jb.end_min is not None else float(edges[-1]) + 60.0
        warm = jb.warmup_min * 60 if jb.start_min is not None else 0.0
        al = dict.fromkeys((*jb.nodes, *jb.idle_nodes), (ta, tb + 15.0))
        if jb.replace is not None:
            out, inn, minute, restart = jb.replace
            t_r = t0 + minute * 60
            new = tuple(inn if m == out else m for m in jb.nodes)
            rl = [Run(ta, t_r, jb.nodes, warm, (0.2, 0.5)), Run(t_r, tb, new, restart, (0.05, 0.3))]
            al[out] = (ta, t_r + 8.0)
            al[inn] = (t_r + 25.0, tb + 15.0)
        else:
            rl = [Run(ta, tb, jb.nodes, warm, (0.2, 0.5))]
        gp: dict[int, tuple[int, ...]] = {}
        nc: dict[int, tuple[int, ...]] = {}
        for m in al:
            f0 = jb.gpu_first.get(m, 0)
            gp[m] = tuple(range(f0, f0 + jb.gpus))
            lo = f0 * r // g
            hi = max(lo + 1, (f0 + jb.gpus) * r // g)
            nc[m] = jb.rails or tuple(range(lo, hi))
        runs.append(rl)
        alloc.append(al)
        gpu_of.append(gp)
        nic_of.append(nc)
    wins: list[tuple[MFault, float, float]] = []
    for f in ms.faults:
        if f.cls == "network_congestion":
            rl = runs[f.job]
            wins.append((f, max(rl[0].a + rl[0].warm, sim0), min(rl[-1].b, float(edges[-1]))))
        else:
            wins.append((f, t0 + f.start_min * 60, t0 + (f.start_min + f.dur_min) * 60))
    return MSim(ms, rng, seed, t0, t_end, sim0, n_t, edges, n + ms.storage, sw, n_sw, cap, speed, runs, alloc,
                nic_of, gpu_of, wins)


def _job_flows(sim: MSim, ji: int, members: tuple[int, ...]) -> list[Flow]:
    """The job's flows on the fabric: a ring per lane (node i sends its bytes to node i+1), or all-to-all."""
    jb, nic = sim.ms.jobs[ji], sim.nic_of[ji]
    n = len(members)
    if n < 2:
        return []
    out: list[Flow] = []
    for lane in range(len(nic[members[0]])):
        if jb.pattern == "a2a":
            out += [(a, nic[a][lane], b, nic[b][lane], 1.0 / (n - 1), lane) for a in members for b in members if a != b]
        else:
            out += [(a, nic[a][lane], members[(i + 1) % n], nic[members[(i + 1) % n]][lane], 1.0, lane)
                    for i, a in enumerate(members)]
    return out


def _storage_peer(sim: MSim, m: int) -> tuple[int, int]:
    s = sim.ms.storage
    return sim.ms.nodes + m % s, (m // s) % sim.ms.nics


def _storage_flows(sim: MSim, ji: int, members: tuple[int, ...]) -> list[Flow]:
    """Reads (storage -> node) and requests and checkpoint writes (node -> storage), on the node's first NIC."""
    if not (sim.ms.storage and sim.ms.jobs[ji].storage):
        return []
    out: list[Flow] = []
    for m in members:
        s, ks = _storage_peer(sim, m)
        k = sim.nic_of[ji][m][0]
        out += [(s, ks, m, k, 0.0, -1), (m, k, s, ks, 0.0, -1)]
    return out


def _path(sim: MSim, f: Flow) -> list[tuple[int, ...]]:
    """Egress queues a flow passes: the sending NIC (0), its switch's uplinks (1), the spine's link down to the far
    switch (2), the far switch's port to the receiving NIC (3)."""
    a, ka, b, kb = f[0], f[1], f[2], f[3]
    sa, sb = int(sim.sw[a, ka]), int(sim.sw[b, kb])
    mid = [(1, sa), (2, sb)] if sa != sb else []
    return [(0, a, ka), *mid, (3, sb, b, kb)]


def _storm_spread(sim: MSim, node: int, nic: int, flows: list[Flow]) -> tuple[set[tuple[int, int]], list[int]]:
    """Which NICs a PFC storm pauses and which flows it stops, from the flows and the topology.

    The stormed switch port cannot send; its frames fill the switch's shared buffer, so the switch says XOFF on
    every ingress that carries traffic (its NICs that send, and the spine's links down to it). From there pauses
    climb hop by hop: an egress queue that cannot drain pauses the egress queues upstream of it on every flow
    through it (head-of-line blocking: one queue per port and priority)."""
    x = int(sim.sw[node, nic])
    paths = [_path(sim, f) for f in flows]
    blocked: set[tuple[int, ...]] = {(3, x, node, nic)}
    for p in paths:
        for i in range(1, len(p)):
            if p[i][0] in (1, 3) and p[i][1] == x:
                blocked.add(p[i - 1])
    changed = True
    while changed:
        changed = False
        for p in paths:
            for i in range(len(p) - 1, 0, -1):
                if p[i] in blocked and p[i - 1] not in blocked:
                    blocked.add(p[i - 1])
                    changed = True
    victims = {(q[1], q[2]) for q in blocked if q[0] == 0}
    hit = [k for k, p in enumerate(paths) if any(q in blocked for q in p)]
    return victims, hit


def _bursts(rng: np.random.Generator, a: float, b: float, frac: float) -> tuple[np.ndarray, np.ndarray]:
    """Random kernel bursts filling about ``frac`` of [a, b): compiling, loading, a few warm-up steps."""
    if b <= a + 1.0:
        return np.zeros(0), np.zeros(0)
    on_m = 0.7
    off_m = on_m * (1 - frac) / frac
    k = int((b - a) / (on_m + off_m) * 1.6) + 8
    on = rng.exponential(on_m, k) + 0.05
    off = rng.exponential(off_m, k) + 0.05
    st = a + np.cumsum(off) + np.concatenate([[0.0], np.cumsum(on)[:-1]])
    en = np.minimum(st + on, b)
    keep = st < b - 0.05
    return st[keep], en[keep]


@dataclass
class JobRun:
    busy: dict[int, tuple[np.ndarray, np.ndarray]]  # node -> compute intervals
    tr: np.ndarray  # [T, lanes]: bytes each member NIC moves per tick and lane (sent, and as much received)
    timeouts: list[tuple[float, int, int]]  # (time, node, nic): local ACK timeouts at the senders to a lossy port
    warm: list[tuple[int, float, float]]  # (node, from, to): warm-ups


def _lane_mods(sim: MSim, ji: int) -> list[tuple[float, float, int, int, str, float]]:
    """Faults on the job's NICs: (from, to, node, lane, kind, value)."""
    out = []
    for f, ws, we in sim.wins:
        if f.cls in ("link_degraded", "packet_loss") and f.node < sim.ms.nodes and f.node in sim.nic_of[ji]:
            lanes = sim.nic_of[ji][f.node]
            if f.nic in lanes and any(f.node in r.members for r in sim.runs[ji]):
                out.append((ws, we, f.node, lanes.index(f.nic), f.kind, f.strength))
    return out


def _run_job(sim: MSim, ji: int, rf: np.ndarray, blocked: Blocked) -> JobRun:
    """The step model of one job (as ``run_steps``), its lanes slowed by ``rf`` (the fabric's share per tick)."""
    ms, jb = sim.ms, sim.ms.jobs[ji]
    rng = np.random.default_rng([sim.seed, zlib.crc32(ms.name.encode()), 7, ji])
    nic = sim.nic_of[ji]
    lanes = rf.shape[1]
    natural = max(1, round(ms.nics * jb.gpus / ms.gpus))
    b0 = jb.comm_ratio * jb.step_s * jb.eff * sim.speed * natural / lanes  # bytes per lane per step
    est = b0 / (jb.eff * sim.speed)
    h0, gap = 0.008 * jb.step_s, 0.01 * jb.step_s
    nodes_all = sorted({m for r in sim.runs[ji] for m in r.members})
    nspeed = dict(zip(nodes_all, np.exp(rng.normal(0, 0.006, len(nodes_all))).tolist()))
    rf_cum = np.concatenate([np.zeros((1, lanes)), np.cumsum(rf, axis=0)], axis=0)
    mods = _lane_mods(sim, ji)
    strag = [(ws, we, f.node, f.strength) for f, ws, we in sim.wins if f.cls == "straggler"]
    busy_l: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {m: [] for m in nodes_all}
    last_end = dict.fromkeys(nodes_all, -math.inf)
    seg: list[list[tuple[float, float, float]]] = [[] for _ in range(lanes)]
    timeouts: list[tuple[float, int, int]] = []
    warm_w: list[tuple[int, float, float]] = []
    t_stop = float(sim.edges[-1])

    def rf_mean(a: float, b: float) -> np.ndarray:
        i0 = int(np.clip((a - sim.sim0) / DT, 0, sim.n_t - 1))
        i1 = int(np.clip((b - sim.sim0) / DT, i0 + 1, sim.n_t))
        return (rf_cum[i1] - rf_cum[i0]) / (i1 - i0)

    for run in sim.runs[ji]:
        mem = run.members
        n = len(mem)
        for m in mem:
            wa = max(run.a, sim.alloc[ji][m][0], last_end[m], sim.sim0)
            wb = run.a + run.warm
            if wb > wa:
                st, en = _bursts(rng, wa, wb, float(rng.uniform(*run.warm_busy)))
                busy_l[m].append((st, en))
                warm_w.append((m, wa, wb))
        ns = np.array([nspeed[m] for m in mem])
        t = max(run.a + run.warm, sim.sim0)
        hs = ce = np.zeros(n)
        while t < min(run.b, t_stop):
            comp = np.ones(n)
            for ws, we, node, val in strag:
                if ws <= t < we and node in mem:
                    comp[mem.index(node)] *= 1 + val
            spd = np.full(lanes, sim.speed)
            fac = np.ones(lanes)
            lossy: list[tuple[int, int]] = []
            for ws, we, node, lane, kind, val in mods:
                if ws <= t < we and node in mem:
                    if kind == "downshift":
                        spd[lane] = min(spd[lane], sim.speed / val)
                    else:
                        fac[lane] *= val
                        lossy.append((node, lane))
            c = jb.step_s * comp * ns * math.exp(rng.normal(0, 0.03)) * np.exp(rng.normal(0, 0.012, n))
            hs = t + rng.exponential(h0, n)
            ce = hs + c
            cs = float(np.max(hs + c * (1 - jb.overlap)))
            last = float(np.max(ce))
            uc, ul = blocked.u(cs), blocked.u(last)
            rate = jb.eff * spd * fac * np.maximum(rf_mean(cs, cs + 1.3 * est + 0.2), 0.05)
            b = np.full(lanes, b0)
            x = np.minimum(b * (1 - jb.tail), rate * (ul - uc))
            ue = ul + (b - x) / rate
            stall = 0.0
            for node, lane in lossy:
                k = int(rng.poisson(0.15 * float(ue.max() - uc)))
                pred = mem[(mem.index(node) - 1) % n]
                for _ in range(k):
                    stall += float(rng.uniform(0.05, 0.25))
                    timeouts.append((blocked.t_of(float(rng.uniform(uc, ue.max()))), pred, nic[pred][lane]))
            for i in range(lanes):
                if x[i] > 0 and ul > uc:
                    seg[i].append((uc, ul, float(x[i])))
                if b[i] - x[i] > 0:
                    seg[i].append((ul, float(ue[i]), float(b[i] - x[i])))
            end = blocked.t_of(float(ue.max()) + stall)
            for j, m in enumerate(mem):
                busy_l[m].append((hs[j:j + 1], ce[j:j + 1]))
            t = max(end, last) + gap * float(rng.uniform(0.5, 1.5))
        for j, m in enumerate(mem):
            last_end[m] = max(last_end[m], float(ce[j]) if len(ce) else -math.inf)
    busy: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for m, parts in busy_l.items():
        st = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0)
        en = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
        o = np.argsort(st, kind="stable")
        busy[m] = (st[o], en[o])
    ue_edges = blocked.u_vec(sim.edges)
    tr = np.zeros((sim.n_t, lanes))
    for i in range(lanes):
        if seg[i]:
            a = np.array(seg[i])
            tr[:, i] = np.diff(cum_piecewise(a[:, 0], a[:, 1], a[:, 2], ue_edges))
    return JobRun(busy, tr, timeouts, warm_w)


def _run_masks(sim: MSim, ji: int) -> list[np.ndarray]:
    """Per run: the share of each tick inside it (a run lasts until the next begins; the last one a step longer)."""
    rl = sim.runs[ji]
    out = []
    for i, r in enumerate(rl):
        end = rl[i + 1].a if i + 1 < len(rl) else r.b + 3 * sim.ms.jobs[ji].step_s
        out.append(np.diff(window_cum(sim.edges, r.a, end)) / DT)
    return out


def _share(c: np.ndarray) -> np.ndarray:
    """The rate a flow gets, as a share of its own, on a path whose busiest link is offered ``c`` times its
    capacity: a fair share of the link, less what congestion control's oscillation and the pauses waste."""
    over = np.maximum(c, 1.0)
    return 1.0 / over / (1.0 + 0.25 * np.clip(over - 1.0, 0.0, 1.0))


def _p_mark(c: np.ndarray) -> np.ndarray:
    """Share of packets ECN-marked on a path whose busiest link is offered ``c`` times its capacity."""
    return 0.025 * np.clip((c - 0.85) / 0.6, 0.0, 1.5)


@dataclass
class MultiOut:
    built: Built
    jobs: list[dict[str, object]]
    waited_on: list[dict[str, object]]


@dataclass
class Storm:
    f: MFault
    eps: list[tuple[float, float]]
    victims: list[tuple[int, int]]  # (node, nic) that receive pauses
    jobs: list[int]  # jobs whose collectives stop


def _mhostnames(ms: MSpec, rng: np.random.Generator) -> list[str]:
    return _hostnames(ms.host_style, ms.nodes, rng) + [f"stor-{i + 1:02d}" for i in range(ms.storage)]


def simulate_multi(ms: MSpec, seed: int) -> MultiOut:
    sim = make_msim(ms, seed)
    rng = sim.rng
    n_gpu_nodes, n, r = ms.nodes, sim.n_all, ms.nics
    n_t, edges, speed = sim.n_t, sim.edges, sim.speed
    n_jobs = len(ms.jobs)
    nq = 2 * sim.n_sw
    wire = ROCE_PKT if ms.fabric == "roce" else IB_PKT
    names = _mhostnames(ms, rng)
    inst = [f"{h}:{ms.port}" for h in names]
    masks = [_run_masks(sim, ji) for ji in range(n_jobs)]
    lanes_of = [len(next(iter(sim.nic_of[ji].values()))) for ji in range(n_jobs)]
    run_flows = [[_job_flows(sim, ji, rn.members) for rn in sim.runs[ji]] for ji in range(n_jobs)]
    stor_flows = [[_storage_flows(sim, ji, rn.members) for rn in sim.runs[ji]] for ji in range(n_jobs)]

    def run_at(ji: int, t: float) -> int:
        for ri, rn in enumerate(sim.runs[ji]):
            nxt = sim.runs[ji][ri + 1].a if ri + 1 < len(sim.runs[ji]) else rn.b
            if rn.a <= t < nxt:
                return ri
        return -1

    # ---- PFC storms: who is paused, whose collectives stop (from the flows running when the storm begins)
    job_blocks: list[list[tuple[float, float]]] = [[] for _ in range(n_jobs)]
    storms: list[Storm] = []
    stor_stop = np.zeros((n_t, n))  # share of each tick a node's storage traffic is stopped
    for f, ws, we in sim.wins:
        if f.cls != "pfc_storm":
            continue
        eps = _episodes(rng, ws, we, f.strength, f.extra.get("episode", 15.0))
        eps[0] = (ws, eps[0][1])
        flows: list[Flow] = []
        owner: list[tuple[int, bool]] = []
        for ji in range(n_jobs):
            ri = run_at(ji, max(ws, sim.sim0))
            if ri < 0:
                continue
            flows += run_flows[ji][ri] + stor_flows[ji][ri]
            owner += [(ji, False)] * len(run_flows[ji][ri]) + [(ji, True)] * len(stor_flows[ji][ri])
        victims, hit = _storm_spread(sim, f.node, f.nic, flows)
        jobs_hit = sorted({owner[k][0] for k in hit if not owner[k][1]})  # a collective with a stopped hop stops
        on = np.zeros(n_t)
        for a, b in eps:
            on += np.diff(window_cum(edges, a, b)) / DT
        for k in hit:
            if owner[k][1]:
                m = flows[k][2] if flows[k][0] >= n_gpu_nodes else flows[k][0]
                stor_stop[:, m] = np.maximum(stor_stop[:, m], on)
        for ji in jobs_hit:
            job_blocks[ji] += eps
        storms.append(Storm(f, eps, sorted(victims), jobs_hit))
    blocked = [Blocked(job_blocks[ji]) for ji in range(n_jobs)]

    # ---- storage traffic (bytes per tick): reads toward the nodes, requests and checkpoint writes back
    stor_read = np.zeros((n_t, n))
    for ji in range(n_jobs):
        if not (ms.storage and ms.jobs[ji].storage):
            continue
        for ri, rn in enumerate(sim.runs[ji]):
            for m in rn.members:
                rate = float(rng.uniform(40e6, 160e6)) * drift(rng, n_t, (), 0.4, 120.0)
                stor_read[:, m] += rate * DT * masks[ji][ri]
    stor_read *= 1 - stor_stop
    stor_write = stor_read * 0.04

    # ---- the fabric: load on each switch's uplinks and the spine's links down to it; each job's share
    def coefs(flows: list[Flow]) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for a, ka, b, kb, w, lane in flows:
            sa, sb = int(sim.sw[a, ka]), int(sim.sw[b, kb])
            if sa != sb:
                v = out.setdefault(lane, np.zeros(nq))
                v[sa] += w
                v[sim.n_sw + sb] += w
        return out

    run_coef = [[coefs(fl) for fl in run_flows[ji]] for ji in range(n_jobs)]
    stor_load = np.zeros((n_t, nq))
    if ms.storage:
        for m in range(n_gpu_nodes):
            if not stor_read[:, m].any():
                continue
            s, ks = _storage_peer(sim, m)
            k = next(sim.nic_of[ji][m][0] for ji in range(n_jobs) if m in sim.nic_of[ji])
            sm_, ss = int(sim.sw[m, k]), int(sim.sw[s, ks])
            if sm_ != ss:
                stor_load[:, ss] += stor_read[:, m]
                stor_load[:, sim.n_sw + sm_] += stor_read[:, m]
                stor_load[:, sm_] += stor_write[:, m]
                stor_load[:, sim.n_sw + ss] += stor_write[:, m]

    def load_of(runs_: list[JobRun], rf_: list[np.ndarray]) -> np.ndarray:
        off = stor_load.copy()
        for ji in range(n_jobs):
            for ri, cf in enumerate(run_coef[ji]):
                for lane, v in cf.items():
                    src = runs_[ji].tr[:, lane] * masks[ji][ri] / np.maximum(rf_[ji][:, lane], 0.05)
                    off += np.outer(src, v)
        return off / (sim.cap[None, :] * DT)

    def shares(c: np.ndarray) -> list[np.ndarray]:
        share = _share(c)
        out = []
        for ji in range(n_jobs):
            rfj = np.ones((n_t, lanes_of[ji]))
            for ri, cf in enumerate(run_coef[ji]):
                inside = masks[ji][ri] > 0
                for lane, v in cf.items():
                    qs = np.flatnonzero(v)
                    sl = share[:, qs].min(axis=1)
                    rfj[:, lane] = np.where(inside, np.minimum(rfj[:, lane], sl), rfj[:, lane])
            out.append(rfj)
        return out

    rf = [np.ones((n_t, lanes_of[ji])) for ji in range(n_jobs)]
    jruns = [_run_job(sim, ji, rf[ji], blocked[ji]) for ji in range(n_jobs)]
    cong = load_of(jruns, rf)
    passes = 0
    if cong.max() >= 0.85:  # the fabric is loaded past where queues build: let the jobs feel it (two rounds)
        for _ in range(2):
            rf = shares(cong)
            jruns = [_run_job(sim, ji, rf[ji], blocked[ji]) for ji in range(n_jobs)]
            cong = load_of(jruns, rf)
            passes += 1

    # ---- traffic per tick, node and NIC
    tx = np.zeros((n_t, n, r))
    rx = np.zeros((n_t, n, r))
    for ji in range(n_jobs):
        for ri, rn in enumerate(sim.runs[ji]):
            mk = masks[ji][ri]
            for m in rn.members:
                for lane, k in enumerate(sim.nic_of[ji][m]):
                    v = jruns[ji].tr[:, lane] * mk
                    tx[:, m, k] += v * math.exp(rng.normal(0, 0.004))
                    rx[:, m, k] += v * math.exp(rng.normal(0, 0.004))
        for m, a, b in jruns[ji].warm:
            on = np.diff(window_cum(edges, a, b))
            for k in sim.nic_of[ji][m]:
                tx[:, m, k] += on * WARM_RATE * speed * float(rng.lognormal(0, 0.4))
                rx[:, m, k] += on * WARM_RATE * speed * float(rng.lognormal(0, 0.4))
    if ms.storage:
        for m in range(n_gpu_nodes):
            if not stor_read[:, m].any():
                continue
            s, ks = _storage_peer(sim, m)
            k = next(sim.nic_of[ji][m][0] for ji in range(n_jobs) if m in sim.nic_of[ji])
            rx[:, m, k] += stor_read[:, m]
            tx[:, m, k] += stor_write[:, m]
            tx[:, s, ks] += stor_read[:, m]
            rx[:, s, ks] += stor_write[:, m]
    speed_t = np.full((n_t, n, r), speed)
    loss_p = np.zeros((n_t, n, r))
    nak_e = np.zeros((n_t, n, r))  # NAK-sequence errors at the senders to a lossy port
    for f, ws, we in sim.wins:
        on = np.diff(window_cum(edges, ws, we)) / DT
        if f.cls == "link_degraded" and f.kind == "downshift":
            speed_t[on > 0.5, f.node, f.nic] = speed / f.strength
        if f.cls == "packet_loss":
            ji = next(j for j in range(n_jobs) if f.node in sim.nic_of[j] and f.nic in sim.nic_of[j][f.node])
            lane = sim.nic_of[ji][f.node].index(f.nic)
            mem = next(rn.members for rn in sim.runs[ji] if f.node in rn.members)
            p_ = (1 / f.strength - 1) / 300.0 * on  # 300 packets resent or waited for per loss (go-back-N)
            loss_p[:, f.node, f.nic] += p_
            over = jruns[ji].tr[:, lane] * on * 0.5 * (1 / f.strength - 1)  # go-back-N: bytes sent again
            lost = jruns[ji].tr[:, lane] / wire * p_
            rx[:, f.node, f.nic] += over
            at = mem.index(f.node)
            for peer, share in ((mem[(at - 1) % len(mem)], 0.7), (mem[(at + len(mem) // 2) % len(mem)], 0.3)):
                tx[:, peer, sim.nic_of[ji][peer][lane]] += share * over
                nak_e[:, peer, sim.nic_of[ji][peer][lane]] += share * lost
    tx += 900.0 * DT
    rx += 900.0 * DT
    act = np.clip(np.maximum(tx, rx) / (DT * speed_t), 0.0, 1.0)

    # ---- congestion where a flow's path crosses an overloaded link: marks and CNPs (RoCE) or credit waits (IB)
    mark_cong = np.zeros((n_t, n, r))  # marked packets received
    cnp_cong = np.zeros((n_t, n, r))  # CNPs received by the senders
    pfr_cong = np.zeros((n_t, n, r))  # pause frames received by the senders (ingress buffer past XOFF)
    wait_cong = np.zeros((n_t, n, r))  # seconds with data to send and no credit (IB)
    cache: dict[tuple[int, int], np.ndarray] = {}
    for ji in range(n_jobs):
        eff = ms.jobs[ji].eff
        for ri, fl in enumerate(run_flows[ji]):
            mk = masks[ji][ri]
            for a, ka, b, kb, w, lane in fl:
                sa, sb = int(sim.sw[a, ka]), int(sim.sw[b, kb])
                if sa == sb:
                    continue
                key = (sa, sim.n_sw + sb)
                if key not in cache:
                    cache[key] = np.maximum(cong[:, key[0]], cong[:, key[1]])
                cc = cache[key]
                if cc.max() < 0.85:
                    continue
                byt = jruns[ji].tr[:, lane] * mk * w
                fshare = _share(cc)
                busy_s = np.minimum(byt / (eff * speed * fshare), DT)
                if ms.fabric == "roce":
                    mk_ = byt / wire * _p_mark(cc)
                    mark_cong[:, b, kb] += mk_
                    cnp_cong[:, a, ka] += mk_ * 0.3
                    pfr_cong[:, a, ka] += 500.0 * np.clip(cc - 1.0, 0.0, 1.5) * busy_s
                else:
                    wait_cong[:, a, ka] += busy_s * (1 - fshare)
    del cache

    # ---- pauses (RoCE) and credit waits (InfiniBand), storms
    pause_rx_dur = np.zeros((n_t, n, r))
    pause_rx_frames = np.zeros((n_t, n, r))
    pause_tx_dur = np.zeros((n_t, n, r))
    pause_tx_frames = np.zeros((n_t, n, r))
    wait_ticks = np.zeros((n_t, n, r))
    discards = np.zeros((n_t, n, r))
    if ms.fabric == "roce":
        bg_pause = np.exp(rng.normal(0.0, 1.0, (n, r)))
        frame_dur = 12e-6 * np.exp(rng.normal(0, 0.3, (n, r)))
        lam = act * bg_pause[None] + pfr_cong * np.exp(rng.normal(0, 0.3, (1, n, r)))
        pause_rx_frames = rng.poisson(lam * DT).astype(float)
        pause_rx_dur = pause_rx_frames * frame_dur[None] * np.exp(rng.normal(0, 0.3, pause_rx_frames.shape))
        pause_tx_frames = rng.poisson(act * 0.03 * DT).astype(float)
        pause_tx_dur = pause_tx_frames * 4e-6
        quanta = 65535 * 512 / (speed * 8)
        for st in storms:
            f = st.f
            ov = np.zeros(n_t)
            for a, b in st.eps:
                ov += np.diff(window_cum(edges, a, b))
            for m, k in st.victims:
                d = ov * float(rng.uniform(0.55, 0.95))
                pause_rx_dur[:, m, k] += d
                pause_rx_frames[:, m, k] += rng.poisson(d / (quanta / 2))
            pause_tx_dur[:, f.node, f.nic] += ov
            pause_tx_frames[:, f.node, f.nic] += rng.poisson(ov / (quanta / 2))
            discards[:, f.node, f.nic] += ov * 3.0e4
    else:
        bg_wait = 0.0015 * np.exp(rng.normal(0, 0.5, (n, r)))
        wfrac = act * bg_wait[None] * np.exp(rng.normal(0, 0.25, (n_t, n, r)))
        wfrac = wfrac + wait_cong / DT * np.exp(rng.normal(0, 0.15, (1, n, r)))
        pause_rx_dur = np.clip(wfrac, 0, 1) * DT
        wait_ticks = pause_rx_dur / IB_WAIT_TICK

    # ---- network state per tick and node
    maxfrac = np.max(np.maximum(tx, rx) / (DT * speed_t), axis=2)
    paused = np.any(pause_rx_dur >= PAUSED_FRACTION * DT, axis=2)
    state = np.where(paused, 0, np.where(maxfrac >= 0.9, 1, np.where(maxfrac >= 0.05, 2, 3)))
    st_masks = [(state == k).astype(float) for k in range(4)]
    quiet = state == 3
    bursts = np.zeros((n_t, n))
    bursts[1:] = (quiet[:-1] & ~quiet[1:]).astype(float)
    del state, paused, maxfrac

    # ---- scrapes, missing scrapes, exporter restarts
    n_s = int(ms.minutes * 60 // ms.scrape) + 1
    phase = rng.uniform(-0.75, 0.75, n)
    jit = np.clip(rng.normal(0, 0.006, (n_s, n)), -0.05, 0.05)
    jit = np.where(rng.random((n_s, n)) < 0.85, 0.0, jit)  # Prometheus snaps a timestamp within 2 ms to its grid
    late = rng.random((n_s, n)) < 0.01
    jit = jit + late * rng.uniform(0.03, 0.18, (n_s, n))
    ts = np.round(sim.t0 + np.arange(n_s)[:, None] * ms.scrape + phase[None, :] + jit, 3)
    pos = (ts - sim.sim0) / DT
    ii = np.clip(np.floor(pos).astype(int), 0, n_t - 1)
    ff = pos - ii
    cols = np.arange(n)[None, :]

    def samp(cum: np.ndarray) -> np.ndarray:
        return cum[ii, cols] * (1 - ff) + cum[ii + 1, cols] * ff

    def samp_on(cum: np.ndarray, node_of: np.ndarray) -> np.ndarray:
        """Like samp, for columns that belong to the nodes ``node_of``."""
        gi, gf = ii[:, node_of], ff[:, node_of]
        c = np.arange(len(node_of))[None, :]
        return cum[gi, c] * (1 - gf) + cum[gi + 1, c] * gf

    def cum0(x: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros((1, *x.shape[1:])), np.cumsum(x, axis=0)], axis=0)

    present = rng.random((n_s, n)) >= 0.007
    present_grp = {k: rng.random((n_s, n)) >= 0.003 for k in ("gpu", "nic", "node")}
    restart_at: dict[int, float] = {}
    for _ in range(ms.restarts):
        node = int(rng.integers(0, n))
        t_r = sim.t0 + float(rng.uniform(0.2, 0.85)) * ms.minutes * 60
        dwn = float(rng.uniform(8, 45))
        present[(ts[:, node] >= t_r) & (ts[:, node] < t_r + dwn), node] = False
        restart_at[node] = t_r + dwn
    present[0, :] = True
    present[-1, :] = True
    uptime = rng.uniform(4 * 3600, 20 * 86400, n)

    def derived(vals: np.ndarray, cum_edges: np.ndarray, node: int, offset: float) -> np.ndarray:
        out = vals + offset
        if node in restart_at:
            t_r = restart_at[node]
            k = min(int((t_r - sim.sim0) / DT), n_t)
            out = np.where(ts[:, node] >= t_r, out - (cum_edges[k] + offset), out)
        return np.maximum(out, 0.0)

    store = Store()
    store.budget = ms.budget
    nic_arrays = {"tx": tx, "rx": rx, "speed": speed_t, "act": act, "loss_p": loss_p, "nak": nak_e, "mark": mark_cong,
                  "cnp": cnp_cong, "prd": pause_rx_dur, "prf": pause_rx_frames, "ptd": pause_tx_dur,
                  "ptf": pause_tx_frames, "wait": wait_ticks, "disc": discards}
    del tx, rx, act, loss_p, nak_e, mark_cong, cnp_cong, pause_rx_frames, pause_tx_dur, pause_tx_frames, wait_ticks
    del discards, pfr_cong, wait_cong
    _mnics(sim, store, rng, inst, nic_arrays, jruns, samp, cum0, derived, ts, uptime)
    nic_arrays.clear()
    loader = np.zeros((n_t, n))  # data-loader reads on the management NIC (jobs without fabric storage)
    for ji in range(n_jobs):
        if ms.jobs[ji].storage and ms.storage:
            continue
        for ri, rn in enumerate(sim.runs[ji]):
            for m in rn.members:
                loader[:, m] += masks[ji][ri]
    _mnode(sim, store, rng, st_masks, bursts, np.minimum(loader, 1.0), samp, cum0, derived, ts, uptime)
    _mgpus(sim, store, rng, jruns, st_masks, samp_on, cum0, derived, ts, ii, uptime)

    # ---- labels
    span = (float(ts[0].max()), float(ts[-1].min()))  # inside every node's first and last scrape

    def clip_t(t: float) -> float:
        return round(min(max(t, span[0]), span[1]), 3)

    def job_at(node: int, nic: int, t: float) -> int:
        if node >= n_gpu_nodes:
            return -1
        for ji in range(n_jobs):
            a, b = sim.alloc[ji].get(node, (math.inf, -math.inf))
            if a <= t < b and (nic < 0 or nic in sim.nic_of[ji][node]):
                return ji
        return -1

    def running(ji: int) -> tuple[float, float]:
        rl = sim.runs[ji]
        return rl[0].a + rl[0].warm, rl[-1].b

    incidents: list[dict[str, object]] = []
    waited: list[dict[str, object]] = []
    cut: list[str] = []
    for f, ws, we in sim.wins:
        s_, e_ = clip_t(ws), clip_t(we)
        if ws < span[0] or we > span[1]:
            cut.append(f"{f.cls} [{'cut at the start' if ws < span[0] else ''}"
                       f"{', ' if ws < span[0] and we > span[1] else ''}{'cut at the end' if we > span[1] else ''}]")
        nodes = [inst[f.node]] if f.cls in LOCALISED else []
        src = f.job if f.cls == "network_congestion" else job_at(f.node, f.nic if f.cls != "straggler" else -1,
                                                                    max(ws, sim.t0))
        inc: dict[str, object] = {"class": f.cls, "start": s_, "end": e_, "nodes": nodes}
        if src >= 0:
            inc["job"] = ms.jobs[src].name
        incidents.append(inc)
        hurt: list[int] = []
        if f.cls == "pfc_storm":
            hurt = next(st.jobs for st in storms if st.f is f)
        elif f.cls == "network_congestion":
            i0, i1 = int((max(ws, span[0]) - sim.sim0) / DT), int((min(we, span[1]) - sim.sim0) / DT)
            for ji in range(n_jobs):
                lost = 1.0 - rf[ji][i0:i1].min(axis=1)
                if ji != src and lost.size and float(lost.mean()) > 0.05:
                    hurt.append(ji)
        for ji in hurt:
            if ji == src:
                continue
            a, b = running(ji)
            a, b = max(a, ws), min(b, we)
            if b - a < 30:
                continue
            waited.append({"job": ms.jobs[ji].name, "cause_job": ms.jobs[src].name if src >= 0 else None,
                           "class": f.cls, "start": clip_t(a), "end": clip_t(b), "nodes": nodes})
    jobs_out: list[dict[str, object]] = []
    for ji, jb in enumerate(ms.jobs):
        al = sim.alloc[ji]
        ent: dict[str, object] = {"name": jb.name, "nodes": [inst[m] for m in sorted(al)], "gpus_per_node": jb.gpus}
        a, b = min(v[0] for v in al.values()), max(v[1] for v in al.values())
        if a > span[0]:
            ent["start"] = round(a, 3)
        if b < span[1]:
            ent["end"] = round(b, 3)
        jobs_out.append(ent)
    notes = _mnotes(sim, inst, storms, cut, passes, seed)
    store.fit(present)
    if ms.lean:
        store.tier = 2
        store.only = LEAN_FAMILIES
    built = Built(store, ts, present, present_grp, incidents, notes, inst)
    return MultiOut(built, jobs_out, waited)


def _mnics(sim: MSim, store: Store, rng: np.random.Generator, inst: list[str], arr: dict[str, np.ndarray],
           jruns: list[JobRun], samp: ArrFn, cum0: ArrFn, derived: DerivedFn, ts: np.ndarray,
           uptime: np.ndarray) -> None:
    """The fabric NICs' series of every node (GPU and storage nodes)."""
    ms = sim.ms
    n, r, n_t = sim.n_all, ms.nics, sim.n_t
    n_s = ts.shape[0]
    ib = ms.fabric == "ib"
    wire = IB_PKT if ib else ROCE_PKT
    buses = NIC_BUSES[:: max(1, 8 // r)][:r]
    dev = [f"ibp{b}s0" if ib else f"enp{b}s0np0" for b in buses]
    numa = [0 if i < max(1, r // 2) else 1 for i in range(r)]
    fec_bg = np.exp(rng.normal(math.log(300.0), 1.2, (n, r)))
    sym_bg = np.where(rng.random((n, r)) < 0.15, np.exp(rng.normal(math.log(2e-3), 1.0, (n, r))), 0.0)
    ecn_node = np.exp(rng.normal(0, 0.5, (n, r)))
    cnp_node = np.exp(rng.normal(0, 0.3, (n, r)))
    ecn_drift = drift(rng, n_t, (n,), 0.4, 300.0)
    flaps: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for f, ws, we in sim.wins:  # a downshift is a renegotiation: the link goes down and up at each end
        if f.cls == "link_degraded" and f.kind == "downshift":
            flaps.setdefault((f.node, f.nic), []).extend([(ws - 1.5, ws), (we - 1.8, we)])
    lat_ev: dict[tuple[int, int], list[float]] = {}
    for jr in jruns:
        for t, m, k in jr.timeouts:
            lat_ev.setdefault((m, k), []).append(t)
    for rl in range(r):
        tx, rx, spd, act = arr["tx"][:, :, rl], arr["rx"][:, :, rl], arr["speed"][:, :, rl], arr["act"][:, :, rl]
        lp = arr["loss_p"][:, :, rl]
        pk_rx = rx / wire
        ecn_bg = ms.ecn_bg * ecn_drift * ecn_node[None, :, rl] * act * pk_rx
        ecn_e = ecn_bg + arr["mark"][:, :, rl]
        cnps_e = ecn_bg * 0.8 + arr["mark"][:, :, rl] * 0.3
        cnpr_e = ecn_bg * 0.8 * cnp_node[None, :, rl] + arr["cnp"][:, :, rl]
        lost = pk_rx * lp
        oos_e = pk_rx * (lp * 12.0 + 3e-12)
        sym_e = np.repeat(sym_bg[None, :, rl], n_t, axis=0) * DT + (lp > 0) * 2500.0 * DT
        crc_e = lost + 1e-6 * DT
        fec_e = np.repeat(fec_bg[None, :, rl], n_t, axis=0) * DT * (1 + (lp > 0) * 150.0)
        c_tx, c_rx = cum0(tx), cum0(rx)
        v_tx, v_rx = samp(c_tx), samp(c_rx)
        c_sat_tx, c_sat_rx = cum0((tx / (DT * spd) >= 0.9) * DT), cum0((rx / (DT * spd) >= 0.9) * DT)
        v_sat_tx, v_sat_rx = samp(c_sat_tx), samp(c_sat_rx)
        v_ecn = _poisson_cum(rng, samp(cum0(ecn_e)))
        v_cnps = _poisson_cum(rng, samp(cum0(cnps_e)))
        v_cnpr = _poisson_cum(rng, samp(cum0(cnpr_e)))
        v_oos = _poisson_cum(rng, samp(cum0(oos_e)))
        v_nak = _poisson_cum(rng, samp(cum0(arr["nak"][:, :, rl])))
        v_sym = _poisson_cum(rng, samp(cum0(sym_e)))
        v_crc = _poisson_cum(rng, samp(cum0(crc_e)))
        v_fec = _poisson_cum(rng, samp(cum0(fec_e))) if not ib else None
        v_disc = _poisson_cum(rng, samp(cum0(arr["disc"][:, :, rl])))
        v_prf = samp(cum0(arr["prf"][:, :, rl]))
        v_ptf = samp(cum0(arr["ptf"][:, :, rl]))
        v_prd = samp(cum0(arr["prd"][:, :, rl]))
        v_ptd = samp(cum0(arr["ptd"][:, :, rl]))
        v_wait = samp(cum0(arr["wait"][:, :, rl])) if ib else None
        for m in range(n):
            d = dev[rl]
            lab = {"device": d}
            tsm = ts[:, m]
            store.add("gpunet_nic_info", m, "nic", {
                "device": d, "rdma_device": f"mlx5_{rl}", "port": "1", "driver": "mlx5_core",
                "link_layer": "infiniband" if ib else "ethernet", "numa_node": str(numa[rl]),
                "pci_address": f"0000:{buses[rl]:02x}:00.0"}, np.ones(n_s), "i")
            evs = flaps.get((m, rl), [])
            up = np.ones(n_s)
            sp_ = spd[np.clip(((tsm - sim.sim0) / DT).astype(int), 0, n_t - 1), m].copy()
            for a, b in evs:
                dn = (tsm >= a) & (tsm < b)
                up[dn] = 0
                sp_[dn] = 0
            store.add("gpunet_nic_link_speed_bytes_per_second", m, "nic", lab, sp_, "i")
            store.add("gpunet_nic_up", m, "nic", lab, up, "i")
            downs = [a for a, _ in evs]
            store.add("gpunet_nic_carrier_changes", m, "nic", lab, float(rng.integers(1, 5)) * 2
                      + _events_cum(downs, tsm) + _events_cum([b for _, b in evs], tsm), "i")
            o_rx, o_tx = rng.uniform(1e12, 8e14, 2)
            store.add("gpunet_nic_receive_bytes", m, "nic", lab, o_rx + v_rx[:, m], "i")
            store.add("gpunet_nic_transmit_bytes", m, "nic", lab, o_tx + v_tx[:, m], "i")
            if not ib:
                o = rng.integers(0, 5000, 2).astype(float)
                store.add("gpunet_nic_pfc_pause_frames", m, "nic",
                          {"device": d, "direction": "receive", "priority": ROCE_PRIO}, o[0] + v_prf[:, m], "i")
                store.add("gpunet_nic_pfc_pause_frames", m, "nic",
                          {"device": d, "direction": "transmit", "priority": ROCE_PRIO}, o[1] + v_ptf[:, m], "i")
                o_e = float(rng.integers(0, 200000))
                store.add("gpunet_nic_ecn_marked_packets", m, "nic", lab, o_e + v_ecn[:, m], "i")
                store.add("gpunet_nic_cnp_sent", m, "nic", lab, o_e * 0.8 // 1 + v_cnps[:, m], "i")
                store.add("gpunet_nic_cnp_received", m, "nic", lab, o_e * 0.75 // 1 + v_cnpr[:, m], "i")
            lat = _events_cum(lat_ev.get((m, rl), []), tsm)
            o = rng.integers(0, 40, 3).astype(float)
            for kind, v in zip(LOSS_KINDS, (v_oos[:, m], v_nak[:, m], lat)):
                store.add("gpunet_nic_rdma_loss_events", m, "nic", {"device": d, "kind": kind},
                          o[LOSS_KINDS.index(kind)] + v, "i")
            store.add("gpunet_nic_receive_discards", m, "nic", lab, v_disc[:, m], "i")
            for direc, v, c in (("receive", v_sat_rx, c_sat_rx), ("transmit", v_sat_tx, c_sat_tx)):
                store.add("gpunet_nic_saturated_seconds", m, "nic", {"device": d, "direction": direc},
                          derived(v[:, m], c[:, m], m, uptime[m] * 0.01), "f3")
            if not ib:
                for direc, v in (("receive", v_prd), ("transmit", v_ptd)):
                    store.add("gpunet_nic_pfc_pause_duration_seconds", m, "nic",
                              {"device": d, "direction": direc, "priority": ROCE_PRIO}, v[:, m], "f6")
            store.add("gpunet_nic_transmit_discards", m, "nic", lab, np.zeros(n_s), "i")
            store.add("gpunet_nic_receive_errors", m, "nic", lab, v_crc[:, m], "i")
            store.add("gpunet_nic_link_downed", m, "nic", lab, _events_cum(downs, tsm), "i")
            flap_sym = sum(float(rng.integers(40, 900)) * _events_cum([a], tsm) for a in downs) if downs else 0.0
            store.add("gpunet_nic_symbol_errors", m, "nic", lab, v_sym[:, m] + flap_sym, "i")
            if v_fec is not None:
                store.add("gpunet_nic_fec_corrected_blocks", m, "nic", lab, v_fec[:, m], "i")
                store.add("gpunet_nic_fec_uncorrectable_blocks", m, "nic", lab, np.floor(v_crc[:, m] * 0.9), "i")
            if v_wait is not None:
                store.add("gpunet_nic_transmit_wait_ticks", m, "nic", lab, v_wait[:, m], "i")
            store.add("gpunet_nic_rdma_out_of_buffer", m, "nic", lab, np.floor(v_disc[:, m] * 0.2), "i")
            store.add("gpunet_nic_fabric", m, "nic", lab, np.ones(n_s), "i")
            store.add("gpunet_nic_mtu_bytes", m, "nic", lab, np.full(n_s, 4092 if ib else 9000), "i")


def _mnode(sim: MSim, store: Store, rng: np.random.Generator, st_masks: list[np.ndarray], bursts: np.ndarray,
           loader: np.ndarray, samp: ArrFn, cum0: ArrFn, derived: DerivedFn, ts: np.ndarray,
           uptime: np.ndarray) -> None:
    """Network state and bursts, the management NIC, TCP: every node."""
    ms = sim.ms
    n, n_t = sim.n_all, sim.n_t
    n_s = ts.shape[0]
    for k, name in enumerate(STATES):
        c = cum0(st_masks[k] * DT)
        v = samp(c)
        for m in range(n):
            store.add("gpunet_node_network_state_seconds", m, "node", {"network_state": name},
                      derived(v[:, m], c[:, m], m, uptime[m] * (0.01, 0.03, 0.3, 0.66)[k]), "f3")
    b_cum = cum0(bursts)
    vb = samp(b_cum)
    for m in range(n):
        store.add("gpunet_node_network_bursts", m, "node", {},
                  derived(vb[:, m], b_cum[:, m], m, np.floor(uptime[m] / 1.2)), "i")
    stor_rx = loader * rng.uniform(10e6, 60e6, n)[None, :] * DT
    stor_rx[:, ms.nodes:] = rng.uniform(20e6, 80e6, ms.storage)[None, :] * DT  # storage nodes: NFS, metadata
    mgmt_seg = rng.lognormal(math.log(700.0), 0.7, n).clip(150, 5000)[None, :] * drift(rng, n_t, (n,), 0.35, 90.0)
    mgmt_out = mgmt_seg * DT
    mgmt_in = mgmt_out * rng.uniform(0.85, 1.15, n)[None, :]
    seg_out = mgmt_out + stor_rx / TCP_MSS / 2
    seg_in = mgmt_in + stor_rx / TCP_MSS
    ratio = (np.exp(rng.uniform(math.log(1e-5), math.log(3e-4), n)) * ms.tcp_noise)[None, :] \
        * drift(rng, n_t, (n,), 0.7, 400.0)
    retr_e = ratio * seg_out
    v_out = _poisson_cum(rng, samp(cum0(seg_out)))
    v_in = _poisson_cum(rng, samp(cum0(seg_in)))
    v_re = _poisson_cum(rng, samp(cum0(retr_e)))
    v_to = _poisson_cum(rng, samp(cum0(retr_e * 0.03)))
    m_tx = samp(cum0(mgmt_out * 420.0 + stor_rx / TCP_MSS / 2 * 66))
    m_rx = samp(cum0(mgmt_in * 640.0 + stor_rx * 1.02))
    mgmt_dev, mgmt_drv = ("eno1np0", "bnxt_en") if ms.host_style in ("hgx", "rack", "dgx") else ("enp3s0f0", "ice")
    for m in range(n):
        lab = {"device": mgmt_dev}
        store.add("gpunet_nic_info", m, "nic", {
            "device": mgmt_dev, "rdma_device": "", "port": "1", "driver": mgmt_drv, "link_layer": "ethernet",
            "numa_node": "0", "pci_address": "0000:03:00.0"}, np.ones(n_s), "i")
        store.add("gpunet_nic_link_speed_bytes_per_second", m, "nic", lab, np.full(n_s, ms.mgmt_gbps * 1e9 / 8), "i")
        store.add("gpunet_nic_up", m, "nic", lab, np.ones(n_s), "i")
        store.add("gpunet_nic_carrier_changes", m, "nic", lab, np.full(n_s, 2.0), "i")
        o_rx, o_tx = rng.uniform(1e11, 5e13, 2)
        store.add("gpunet_nic_receive_bytes", m, "nic", lab, o_rx + m_rx[:, m], "i")
        store.add("gpunet_nic_transmit_bytes", m, "nic", lab, o_tx + m_tx[:, m], "i")
        store.add("gpunet_nic_fabric", m, "nic", lab, np.zeros(n_s), "i")
        store.add("gpunet_nic_mtu_bytes", m, "nic", lab, np.full(n_s, 9000), "i")
        store.add("gpunet_nic_netdev_receive_bytes", m, "nic", lab, o_rx + m_rx[:, m], "i")
        store.add("gpunet_nic_netdev_transmit_bytes", m, "nic", lab, o_tx + m_tx[:, m], "i")
        o_seg = rng.uniform(1e8, 4e9)
        store.add("gpunet_tcp_retransmitted_segments", m, "node", {}, np.floor(o_seg * 2e-4) + v_re[:, m], "i")
        store.add("gpunet_tcp_sent_segments", m, "node", {}, np.floor(o_seg) + v_out[:, m], "i")
        store.add("gpunet_tcp_received_segments", m, "node", {}, np.floor(o_seg * 1.02) + v_in[:, m], "i")
        store.add("gpunet_tcp_timeouts", m, "node", {}, np.floor(o_seg * 5e-6) + v_to[:, m], "i")


def _pod_rank(jb: Job, m: int) -> int:
    """The rank in the pod's name: a replacement node's pod takes the lost node's name (rescheduled)."""
    if jb.replace is not None and m == jb.replace[1]:
        m = jb.replace[0]
    return jb.nodes.index(m) if m in jb.nodes else len(jb.nodes) + jb.idle_nodes.index(m)


def _workload_labels(ms: MSpec, jb: Job, gpu: int, rank: int) -> dict[str, str]:
    if ms.source == "slurm":
        return {"gpu": str(gpu), "workload": jb.name, "source": "slurm", "namespace": "", "pod": "", "container": ""}
    ns, _, short = jb.name.partition("/")
    return {"gpu": str(gpu), "workload": jb.name, "source": "kubernetes", "namespace": ns,
            "pod": f"{short}-worker-{rank}", "container": "pytorch"}


def _mgpus(sim: MSim, store: Store, rng: np.random.Generator, jruns: list[JobRun], st_masks: list[np.ndarray],
           samp_on: Callable[[np.ndarray, np.ndarray], np.ndarray], cum0: ArrFn, derived: DerivedFn, ts: np.ndarray,
           ii: np.ndarray, uptime: np.ndarray) -> None:
    """GPU series of the GPU nodes: each GPU busy when a job that holds it computes on its node."""
    ms = sim.ms
    n, g, n_t = ms.nodes, ms.gpus, sim.n_t
    n_s = ts.shape[0]
    edges = sim.edges
    clock, idle_clock, tdp, idle_w = GPU_MODELS[ms.gpu_model]
    # GPU groups: the GPUs of a node held by the same jobs
    holders = [[tuple(ji for ji in range(len(ms.jobs)) if k in sim.gpu_of[ji].get(m, ())) for k in range(g)]
               for m in range(n)]
    keys = sorted({(m, holders[m][k]) for m in range(n) for k in range(g)})
    gidx = {key: i for i, key in enumerate(keys)}
    node_of = np.array([m for m, _ in keys], dtype=int)
    busy_cum = np.zeros((n_t + 1, len(keys)))
    for i, (m, js) in enumerate(keys):
        for ji in js:
            if m in jruns[ji].busy:
                st, en = jruns[ji].busy[m]
                busy_cum[:, i] += cum_piecewise(st, en, en - st, edges)
    busy_t = np.diff(busy_cum, axis=0)
    cm_e = [cum0(mk[:, node_of] * DT) for mk in st_masks]
    cm = [samp_on(c, node_of) for c in cm_e]
    cb_e = [cum0(mk[:, node_of] * busy_t) for mk in st_masks]
    cb = [samp_on(c, node_of) for c in cb_e]
    b_now = samp_on(busy_cum, node_of)
    gcols = np.arange(len(keys))[None, :]
    prev = np.clip(ii[:, node_of] - int(round(1.0 / DT)), 0, None)
    b_prev = busy_cum[prev, gcols]
    win = ts[:, node_of] - edges[prev]  # NVML's utilization: the last second or so before the scrape
    u = rng.uniform(0.955, 0.99, (n, g))
    pc = np.clip(rng.lognormal(math.log(0.012), 0.9, (n, g)), 0, 0.08)
    driver = ("550.90.07", "535.183.06", "560.35.03")[int(rng.integers(0, 3))]
    uuids = [["GPU-" + "-".join(h[a:b] for a, b in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)))
              for h in ("".join(f"{int(x):02x}" for x in rng.integers(0, 256, 16)) for _ in range(g))]
             for _ in range(n)]
    health = {(m, k): kind for m, k, kind in ms.health}
    for m in range(n):
        store.add("gpunet_gpu_driver_info", m, "gpu", {"driver_version": driver}, np.ones(n_s), "i")
        ambient = float(rng.uniform(26, 34))
        tsm = ts[:, m]
        for k in range(g):
            i = gidx[(m, holders[m][k])]
            lab = {"gpu": str(k)}
            uu = u[m, k]
            store.add("gpunet_gpu_info", m, "gpu", {
                "gpu": str(k), "uuid": uuids[m][k], "model": ms.gpu_model,
                "pci_address": f"00000000:{GPU_BUSES[k * (8 // g)]:02X}:00.0",
                "numa_node": str(0 if k < g // 2 else 1)}, np.ones(n_s), "i")
            util = np.clip(np.round(uu * (b_now[:, i] - b_prev[:, i]) / win[:, i] * 100) / 100, 0, 1)
            store.add("gpunet_gpu_utilization_ratio", m, "gpu", lab, util, "f2")
            used = bool(holders[m][k])
            busy_e = uu * busy_cum[:, i]
            store.add("gpunet_gpu_busy_seconds", m, "gpu", lab,
                      derived(uu * b_now[:, i], busy_e, m, uptime[m] * (0.85 if used else 0.1)), "f3")
            for j, name in enumerate(STATES):
                idle_e = cm_e[j][:, i] - uu * cb_e[j][:, i]
                idle_v = cm[j][:, i] - uu * cb[j][:, i]
                off = uptime[m] * ((0.004, 0.01, 0.07, 0.066)[j] if used else (0.01, 0.03, 0.3, 0.56)[j])
                store.add("gpunet_gpu_idle_seconds", m, "gpu", {"gpu": str(k), "network_state": name},
                          derived(np.maximum(idle_v, 0), np.maximum(idle_e, 0), m, off), "f3")
            pcap_e = pc[m, k] * busy_e
            for reason in REASONS:
                e_ = pcap_e if reason == "sw_power_cap" else np.zeros_like(busy_e)
                v_ = samp_on(e_[:, None], np.array([m]))[:, 0]
                off = uptime[m] * (pc[m, k] * 0.8 if reason == "sw_power_cap" else 0.0)
                store.add("gpunet_gpu_throttled_seconds", m, "gpu", {"gpu": str(k), "reason": reason},
                          derived(v_, e_, m, off), "f3")
            active = util > 0.02
            clk = np.where(active, np.round(clock * np.exp(rng.normal(0, 0.012, n_s))
                                            * (1 - 0.03 * rng.random(n_s)) / 1e6) * 1e6, idle_clock)
            store.add("gpunet_gpu_sm_clock_hertz", m, "gpu", lab, np.minimum(clk, clock), "i")
            store.add("gpunet_gpu_up", m, "gpu", lab, np.ones(n_s), "i")
            power = idle_w + (tdp - idle_w) * 0.9 * util + rng.normal(0, 6, n_s)
            power = np.clip(power, idle_w * 0.9, tdp * 1.02)
            store.add("gpunet_gpu_power_watts", m, "gpu", lab, power, "f1")
            temp = ambient + (power - idle_w) / tdp * 48 + rng.normal(0, 0.7, n_s)
            store.add("gpunet_gpu_temperature_celsius", m, "gpu", lab, np.round(temp), "i")
            _health(sim, store, rng, m, k, health.get((m, k), ""), tsm, derived)
            if ms.source == "none":
                continue
            for ji in holders[m][k]:
                a, b = sim.alloc[ji][m]
                alive = (tsm >= a) & (tsm < b)
                if alive.any():
                    store.add("gpunet_gpu_workload_info", m, "gpu",
                              _workload_labels(ms, ms.jobs[ji], k, _pod_rank(ms.jobs[ji], m)), np.ones(n_s), "i", alive)


def _health(sim: MSim, store: Store, rng: np.random.Generator, m: int, k: int, kind: str, tsm: np.ndarray,
            derived: DerivedFn) -> None:
    """GPU health counters: constant small values, or (``kind``) rising without effect on the job."""
    n_s = len(tsm)
    lab = {"gpu": str(k)}
    t_rel = tsm - sim.t0
    corr = np.full(n_s, float(rng.integers(0, 3)) if rng.random() < 0.1 else 0.0)
    remap = np.full(n_s, 1.0 if rng.random() < 0.03 else 0.0)
    pending = np.zeros(n_s)
    if kind == "ecc":
        rate = float(rng.uniform(0.02, 0.06))  # corrected errors per second: one weak memory row
        corr = corr + 40 + np.cumsum(rng.poisson(rate * np.diff(t_rel, prepend=t_rel[0])))
        t_remap = float(rng.uniform(0.35, 0.6)) * sim.ms.minutes * 60
        remap = remap + 1 + (t_rel >= t_remap)
        pending = (t_rel >= t_remap).astype(float)
    store.add("gpunet_gpu_ecc_errors", m, "gpu", {"gpu": str(k), "type": "corrected"}, corr, "i")
    store.add("gpunet_gpu_ecc_errors", m, "gpu", {"gpu": str(k), "type": "uncorrected"}, np.zeros(n_s), "i")
    store.add("gpunet_gpu_remapped_rows", m, "gpu", {"gpu": str(k), "cause": "correctable"}, remap, "i")
    store.add("gpunet_gpu_remapped_rows", m, "gpu", {"gpu": str(k), "cause": "uncorrectable"}, np.zeros(n_s), "i")
    store.add("gpunet_gpu_row_remap_pending", m, "gpu", lab, pending, "i")
    store.add("gpunet_gpu_row_remap_failed", m, "gpu", lab, np.zeros(n_s), "i")
    base = float(rng.integers(0, 4)) if rng.random() < 0.2 else 0.0
    dt_ = np.diff(t_rel, prepend=t_rel[0])
    for nk in ("replay", "recovery", "crc_flit", "crc_data", "ecc_data"):
        v = np.full(n_s, base if nk in ("replay", "crc_flit") else 0.0)
        if kind == "nvlink":
            rate = {"replay": 1.2, "recovery": 0.002, "crc_flit": 1.25, "crc_data": 0.01, "ecc_data": 0.0}[nk]
            v = v + np.cumsum(rng.poisson(rate * dt_))
        # summed since the exporter started: back to 0 at an exporter restart
        store.add("gpunet_gpu_nvlink_errors", m, "gpu", {"gpu": str(k), "kind": nk},
                  derived(v, np.interp(sim.edges, tsm, v), m, 0.0), "i")


def _mnotes(sim: MSim, inst: list[str], storms: list[Storm], cut: list[str], passes: int, seed: int) -> str:
    ms = sim.ms
    short = [h.split(":")[0] for h in inst]
    if ms.topo == "rail":
        topo = (f"rail-optimised fabric: pods of {ms.per_switch} nodes, NIC k of each node of a pod on the pod's "
                f"rail switch k, rail switches' uplinks to the spine {ms.ratio:g}:1 oversubscribed")
    else:
        topo = (f"spine-leaf fabric: {ms.per_switch} nodes under each leaf (all NICs of a node on its leaf), "
                f"leaf uplinks {ms.ratio:g}:1 oversubscribed")
    grp = "pods" if ms.topo == "rail" else "leaves"
    parts = [f"bench/cleanroom.py (clean-room generator, written from docs only), seed {seed}: {ms.desc}.",
             f"{ms.nodes} GPU nodes x {ms.gpus} GPUs ({ms.gpu_model}), {ms.nics} x {ms.gbps}G {ms.fabric} fabric "
             f"NICs, {ms.scrape:g} s scrapes, {ms.minutes:g} min; {topo}."]
    if ms.storage:
        parts.append(f"Storage nodes (no GPUs, so no GPU series; NIC, TCP and network-state series only) on a leaf "
                     f"of their own: {', '.join(short[ms.nodes:])}.")
    for ji, jb in enumerate(ms.jobs):
        grps = sorted({m // ms.per_switch for m in sim.alloc[ji]})
        t = [f"job {jb.name}: {jb.pattern}, {len(jb.nodes)} nodes x {jb.gpus} GPUs ({grp} {grps}), "
             f"step ~{jb.step_s:g} s"]
        if jb.start_min is not None:
            t.append(f"starts at min {jb.start_min:g} ({jb.warmup_min:g} min warm-up: loading, compiling, GPUs "
                     f"mostly idle, little traffic)")
        if jb.end_min is not None:
            t.append(f"ends at min {jb.end_min:g}")
        if jb.replace is not None:
            out, inn, minute, restart = jb.replace
            t.append(f"elastic: loses {short[out]} at min {minute:g} (pod evicted; the node stays up, idle), "
                     f"restarts for {restart:g} s and continues with {short[inn]} (both listed in its nodes)")
        if jb.idle_nodes:
            t.append(f"allocated but idle: {', '.join(short[m] for m in jb.idle_nodes)}")
        if jb.gpu_first:
            t.append("holds GPUs " + ", ".join(f"{a}-{a + jb.gpus - 1} of {short[m]}" for m, a in jb.gpu_first.items()))
        if jb.rails:
            t.append(f"pinned to fabric NIC(s) {list(jb.rails)}")
        if jb.storage and ms.storage:
            t.append("reads data from the storage nodes over the fabric")
        parts.append("; ".join(t) + ".")
    used = {m for al in sim.alloc for m in al}
    free = [short[m] for m in range(ms.nodes) if m not in used]
    if free:
        parts.append(f"Nodes in no job (idle GPUs, no workload series): {', '.join(free)}.")
    if ms.source == "none":
        parts.append("No gpunet_gpu_workload_info series at all: the job names here are ground truth only.")
    elif ms.source == "slurm":
        parts.append("Workloads attributed by Slurm: workload = the Slurm job id, source slurm, namespace/pod/"
                     "container empty.")
    for st in storms:
        parts.append(f"pfc_storm from {short[st.f.node]} NIC {st.f.nic}: the model's pause propagation pauses "
                     f"{len(st.victims)} NICs on {len({v[0] for v in st.victims})} nodes and stops the collectives of "
                     f"{', '.join(ms.jobs[j].name for j in st.jobs) or 'no job'}.")
    if passes:
        parts.append("Uplink contention: job rates follow the offered load on each uplink (two fixed-point rounds).")
    if cut:
        parts.append("Incidents clipped to the trace's span: " + "; ".join(cut) + ".")
    parts.append("Job start/end in `jobs` are the span of their workload series (pods), given only where the job "
                 f"does not span the whole trace. Exporter restarts: {ms.restarts}.")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _fmt(values: np.ndarray, fmt: str) -> list[str]:
    if fmt == "i":
        return [str(x) for x in np.floor(values).astype(np.int64).tolist()]
    spec = "{:." + fmt[1:] + "f}"
    return [spec.format(x) for x in values.tolist()]


def render_blocks(b: Built, instances: list[str]) -> Iterator[str]:
    """The trace's text in blocks (a family's header, one series' samples), each ending with a newline."""
    n = b.ts.shape[1]
    ts_str = [[f"{x:.3f}" for x in b.ts[:, m].tolist()] for m in range(n)]
    for fam, kind, hlp, _ in FAMILY_ORDER:
        series = b.store.written(fam)
        if not series:
            continue
        yield f"# HELP {fam} {hlp}\n# TYPE {fam} {kind}\n"
        sample = fam + "_total" if kind == "counter" else fam
        rows = []
        for s in series:
            labels = dict(s.labels, instance=instances[s.node], job=JOB)
            lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            rows.append((instances[s.node], lab, s))
        rows.sort(key=lambda x: (x[0], x[1]))
        for _, lab, s in rows:
            head = f"{sample}{{{lab}}} "
            keep = b.present[:, s.node] & b.present_grp[s.group][:, s.node]
            if s.alive is not None:
                keep = keep & s.alive
            vals = _fmt(s.values, s.fmt)
            tsn = ts_str[s.node]
            yield "".join(head + vals[i] + " " + tsn[i] + "\n" for i in np.flatnonzero(keep).tolist())
    yield "# EOF\n"


def render(b: Built, instances: list[str]) -> bytes:
    return "".join(render_blocks(b, instances)).encode()


def generate(specs: list[Spec], outdir: Path, seed: int, set_name: str) -> list[dict[str, object]]:
    outdir.mkdir(parents=True, exist_ok=True)
    manifest: list[dict[str, object]] = []
    for spec in specs:
        t_a = time.perf_counter()
        b = simulate(spec, seed)
        raw = render(b, b.instances)
        gz = gzip.compress(raw, compresslevel=6, mtime=0)
        (outdir / f"{spec.name}.om.gz").write_bytes(gz)
        labels = {"incidents": b.incidents, "notes": b.notes}
        (outdir / f"{spec.name}.labels.json").write_text(json.dumps(labels, indent=1) + "\n")
        manifest.append({"name": spec.name, "description": spec.desc,
                         "classes": sorted({str(i["class"]) for i in b.incidents}) or ["healthy"],
                         "nodes": spec.nodes, "gpus_per_node": spec.gpus, "fabric_nics": spec.nics,
                         "nic_gbps": spec.gbps, "fabric": spec.fabric, "scrape_s": spec.scrape,
                         "minutes": spec.minutes, "incidents": b.incidents, "bytes": len(gz),
                         "optional_families": ("none", "nic/tcp/workload", "all")[b.store.tier]})
        took = time.perf_counter() - t_a
        print(f"{spec.name:34s} {len(gz) / 1e6:5.2f} MB {took:5.1f} s  optional tier {b.store.tier}", flush=True)
    doc = {"generator": "bench/cleanroom.py", "seed": seed, "set": set_name, "traces": manifest}
    (outdir / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
    return manifest


def generate_multi(specs: list[MSpec], outdir: Path, seed: int, set_name: str) -> list[dict[str, object]]:
    outdir.mkdir(parents=True, exist_ok=True)
    manifest: list[dict[str, object]] = []
    for ms in specs:
        t_a = time.perf_counter()
        out = simulate_multi(ms, seed)
        b = out.built
        t_sim = time.perf_counter() - t_a
        path = outdir / f"{ms.name}.om.gz"
        with path.open("wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=9,
                                                  mtime=0) as gz:
            buf: list[str] = []
            size = 0
            for blk in render_blocks(b, b.instances):
                buf.append(blk)
                size += len(blk)
                if size > 1 << 22:
                    gz.write("".join(buf).encode())
                    buf, size = [], 0
            gz.write("".join(buf).encode())
        labels = {"incidents": b.incidents, "jobs": out.jobs, "waited_on": out.waited_on, "notes": b.notes}
        (outdir / f"{ms.name}.labels.json").write_text(json.dumps(labels, indent=1) + "\n")
        took = time.perf_counter() - t_a
        nbytes = path.stat().st_size
        manifest.append({"name": ms.name, "description": ms.desc,
                         "classes": sorted({str(i["class"]) for i in b.incidents}) or ["healthy"],
                         "nodes": ms.nodes, "storage_nodes": ms.storage, "gpus_per_node": ms.gpus,
                         "fabric_nics": ms.nics, "nic_gbps": ms.gbps, "fabric": ms.fabric, "topology": ms.topo,
                         "oversubscription": ms.ratio, "scrape_s": ms.scrape, "minutes": ms.minutes,
                         "attribution": ms.source, "jobs": [j["name"] for j in out.jobs],
                         "incidents": b.incidents, "waited_on": out.waited_on, "bytes": nbytes,
                         "optional_families": "none" if ms.lean else ("none", "nic/tcp/workload", "all")[b.store.tier]})
        print(f"{ms.name:34s} {nbytes / 1e6:6.2f} MB {took:6.1f} s (model {t_sim:5.1f} s)  optional tier "
              f"{'lean' if ms.lean else b.store.tier}", flush=True)
    doc = {"generator": "bench/cleanroom.py", "seed": seed, "set": set_name, "traces": manifest}
    (outdir / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
    return manifest


# --------------------------------------------------------------------------------------------
# Self-check: read the files back
# --------------------------------------------------------------------------------------------


def _labels_of(key: str) -> dict[str, str]:
    body = key[key.index("{") + 1: -1]
    out = {}
    for part in body.split('",'):
        k, _, v = part.partition('="')
        out[k] = v.rstrip('"')
    return out


def check_trace(om: Path, lab: Path) -> tuple[list[str], dict[str, object]]:
    """Parse a trace back; return (problems, summary with each incident's effect on GPU idle)."""
    problems: list[str] = []
    text = gzip.decompress(om.read_bytes()).decode()
    lines = text.split("\n")
    if lines[-1] != "" or lines[-2] != "# EOF":
        problems.append("does not end with # EOF")
    types: dict[str, str] = {}
    closed: set[str] = set()
    seen: set[str] = set()
    cur_fam = ""
    cur_key = ""
    last_t = -math.inf
    last_v = 0.0
    resets: dict[str, int] = {}
    n_samples = 0
    t_min, t_max = math.inf, -math.inf
    gpu: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    instances: set[str] = set()
    wl: dict[tuple[str, str], set[str]] = {}  # (instance, gpu) -> workloads
    for no, ln in enumerate(lines, 1):
        if not ln or ln == "# EOF":
            continue
        if ln.startswith("#"):
            parts = ln.split(" ", 3)
            if parts[1] == "TYPE":
                if parts[2] in types:
                    problems.append(f"line {no}: second TYPE for {parts[2]}")
                types[parts[2]] = parts[3]
            continue
        b = ln.rfind(" ")
        a = ln.rfind(" ", 0, b)
        key, v_s, t_s = ln[:a], ln[a + 1: b], ln[b + 1:]
        if "." not in t_s or len(t_s.split(".")[1]) != 3:
            problems.append(f"line {no}: timestamp {t_s} is not seconds with millisecond decimals")
        v, t = float(v_s), float(t_s)
        name = key[: key.index("{")] if "{" in key else key
        fam = name[:-6] if name.endswith("_total") and types.get(name[:-6]) == "counter" else name
        if fam not in types:
            problems.append(f"line {no}: no TYPE line for {name}")
        if fam != cur_fam:
            if fam in closed:
                problems.append(f"line {no}: family {fam} is not together")
            closed.add(cur_fam)
            cur_fam = fam
        if key != cur_key:
            if key in seen:
                problems.append(f"line {no}: series {key} is not together")
            seen.add(key)
            cur_key = key
            lbk = _labels_of(key) if "{" in key else {}
            instances.add(lbk.get("instance", ""))
            if fam == "gpunet_gpu_workload_info":
                wl.setdefault((lbk["instance"], lbk["gpu"]), set()).add(lbk["workload"])
        else:
            if t <= last_t:
                problems.append(f"line {no}: timestamp not increasing in {key}")
            if types.get(fam) == "counter" and v < last_v:
                resets[fam] = resets.get(fam, 0) + 1
                if fam not in RESET_OK:
                    problems.append(f"line {no}: {fam} decreased, but only exporter-computed counters reset here")
        if types.get(fam) == "counter" and v < 0:
            problems.append(f"line {no}: negative counter")
        last_t, last_v = t, v
        n_samples += 1
        t_min, t_max = min(t_min, t), max(t_max, t)
        if fam in ("gpunet_gpu_busy_seconds", "gpunet_gpu_idle_seconds"):
            lb = _labels_of(key)
            gpu.setdefault((lb["instance"], lb["gpu"], lb.get("network_state", "busy")), []).append((t, v))
    if len(problems) > 20:
        problems = problems[:20] + [f"... {len(problems) - 20} more"]
    labels = json.loads(lab.read_text())
    for inc in labels["incidents"]:
        if not (t_min <= inc["start"] < inc["end"] <= t_max):
            problems.append(f"incident {inc['class']} [{inc['start']}, {inc['end']}] outside [{t_min}, {t_max}]")
        if inc["class"] not in CLASSES:
            problems.append(f"unknown class {inc['class']}")
    if "jobs" in labels:
        problems += _check_jobs(labels, instances, wl, t_min, t_max)
        effects = _job_effects(gpu, labels, wl)
    else:
        effects = _effects(gpu, labels["incidents"])
    summary: dict[str, object] = {"series": len(seen), "samples": n_samples, "families": len(types),
                                  "resets": resets, "span_min": (t_max - t_min) / 60, "effects": effects}
    return problems, summary


def _effects(gpu: dict[tuple[str, str, str], list[tuple[float, float]]],
             incidents: list[dict[str, object]]) -> list[str]:
    """GPU idle share inside each incident against outside all of them, and where the extra idle went."""
    def incs(series: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
        a = np.array(series)
        d = np.diff(a[:, 1])
        mid = (a[1:, 0] + a[:-1, 0]) / 2
        ok = d >= 0
        return mid[ok], d[ok]

    wins = [(float(str(i["start"])), float(str(i["end"]))) for i in incidents]
    per: dict[str, list[float]] = {k: [0.0, 0.0] for k in ("base", *[str(j) for j in range(len(wins))])}
    per_state: dict[str, dict[str, float]] = {k: dict.fromkeys(STATES, 0.0) for k in per}
    keys = {(i, g) for i, g, _ in gpu}
    for inst, gg in keys:
        busy = gpu.get((inst, gg, "busy"))
        if not busy or len(busy) < 3:
            continue
        mids, db = incs(busy)
        tot_idle = sum(float(incs(gpu[(inst, gg, s)])[1].sum()) for s in STATES if (inst, gg, s) in gpu)
        if db.sum() < 0.3 * (db.sum() + tot_idle):
            continue  # an unused GPU
        regions = [(str(j), (mids >= a) & (mids < b)) for j, (a, b) in enumerate(wins)]
        base = np.ones_like(mids, dtype=bool)
        for a, b in wins:
            base &= (mids < a - 120) | (mids > b + 120)
        for key, sel in [("base", base), *regions]:
            per[key][0] += float(db[sel].sum())
        for s in STATES:
            if (inst, gg, s) not in gpu:
                continue
            mi, di = incs(gpu[(inst, gg, s)])
            rs = [(str(j), (mi >= a) & (mi < b)) for j, (a, b) in enumerate(wins)]
            bs = np.ones_like(mi, dtype=bool)
            for a, b in wins:
                bs &= (mi < a - 120) | (mi > b + 120)
            for key, sel in [("base", bs), *rs]:
                per[key][1] += float(di[sel].sum())
                per_state[key][s] += float(di[sel].sum())
    out = []

    def share(key: str) -> float:
        bsy, idl = per[key]
        return idl / max(bsy + idl, 1e-9)

    out.append(f"base idle {100 * share('base'):.1f}%")
    for j, inc in enumerate(incidents):
        key = str(j)
        tot = max(sum(per[key]), 1e-9)
        btot = max(sum(per["base"]), 1e-9)
        extra = {s: per_state[key][s] / tot - per_state["base"][s] / btot for s in STATES}
        pos = {s: v for s, v in extra.items() if v > 0}
        psum = sum(pos.values()) or 1.0
        where = ", ".join(f"{s} {100 * v / psum:.0f}%" for s, v in sorted(pos.items(), key=lambda x: -x[1]) if v > 0)
        out.append(f"{inc['class']}: idle {100 * share(key):.1f}% ({100 * (share(key) - share('base')):+.1f} pts; "
                   f"extra idle: {where})")
    return out


def _check_jobs(labels: dict[str, object], instances: set[str], wl: dict[tuple[str, str], set[str]], t_min: float,
                t_max: float) -> list[str]:
    """The multi-job labels against the trace: nodes exist, times inside it, names consistent."""
    out: list[str] = []
    jobs: list[dict[str, object]] = labels["jobs"]  # type: ignore[assignment]
    names = {str(j["name"]) for j in jobs}
    workloads = set().union(*wl.values()) if wl else set()
    for j in jobs:
        nodes = [str(x) for x in j["nodes"]]  # type: ignore[attr-defined]
        missing = [x for x in nodes if x not in instances]
        if missing:
            out.append(f"job {j['name']}: nodes not in the trace: {missing[:3]}")
        a, b = float(str(j.get("start", t_min))), float(str(j.get("end", t_max)))
        if not (t_min <= a < b <= t_max):
            out.append(f"job {j['name']}: [{a}, {b}] not inside the trace")
        if wl and str(j["name"]) not in workloads:
            out.append(f"job {j['name']}: no workload series carries its name")
        if wl:
            held = {i for (i, _), w in wl.items() if str(j["name"]) in w}
            if held != set(nodes):
                out.append(f"job {j['name']}: workload series on {len(held)} nodes, labels list {len(nodes)}")
    for inc in labels["incidents"]:  # type: ignore[attr-defined]
        if "job" in inc and inc["job"] not in names:
            out.append(f"incident {inc['class']}: job {inc['job']} not in jobs")
        out += [f"incident {inc['class']}: node {x} not in the trace" for x in inc["nodes"] if x not in instances]
    for w in labels.get("waited_on", []):  # type: ignore[attr-defined]
        if w["job"] not in names or (w["cause_job"] is not None and w["cause_job"] not in names):
            out.append(f"waited_on {w['job']} <- {w['cause_job']}: unknown job")
        if w["job"] == w["cause_job"]:
            out.append(f"waited_on {w['job']}: a job waiting on itself")
        if not (t_min <= w["start"] < w["end"] <= t_max):
            out.append(f"waited_on {w['job']}: [{w['start']}, {w['end']}] not inside the trace")
        if not any(i["class"] == w["class"] and i.get("job") == w["cause_job"] and i["start"] <= w["start"]
                   and w["end"] <= i["end"] for i in labels["incidents"]):  # type: ignore[attr-defined]
            out.append(f"waited_on {w['job']}: no incident of {w['cause_job']} covers it")
    return out


def _job_effects(gpu: dict[tuple[str, str, str], list[tuple[float, float]]], labels: dict[str, object],
                 wl: dict[tuple[str, str], set[str]]) -> list[str]:
    """Per incident, each job's GPU idle share inside its window against that job's own busy baseline."""
    jobs: list[dict[str, object]] = labels["jobs"]  # type: ignore[assignment]
    incidents: list[dict[str, object]] = labels["incidents"]  # type: ignore[assignment]
    span = {str(j["name"]): (float(str(j.get("start", -math.inf))), float(str(j.get("end", math.inf)))) for j in jobs}
    nodes = {str(j["name"]): set(j["nodes"]) for j in jobs}  # type: ignore[call-overload]
    per: dict[str, list[np.ndarray]] = {name: [] for name in span}
    for inst, gg in {(i, g_) for i, g_, _ in gpu}:
        busy = gpu.get((inst, gg, "busy"))
        if not busy or len(busy) < 3:
            continue
        t = np.array([x[0] for x in busy])
        bv = np.array([x[1] for x in busy])
        iv = np.zeros_like(bv)
        for st in STATES:
            d = dict(gpu.get((inst, gg, st), []))
            iv += np.array([d.get(x, np.nan) for x in t.tolist()])
        db, di = np.diff(bv), np.diff(iv)
        ok = (db >= 0) & (di >= 0) & np.isfinite(di)
        mid = (t[1:] + t[:-1]) / 2
        free = ok.copy()
        cands = [nm for nm in span if inst in nodes[nm] and (not wl.get((inst, gg)) or nm in wl[(inst, gg)])]
        for nm in cands:
            sel = free & (mid >= span[nm][0]) & (mid < span[nm][1])
            free &= ~sel
            per[nm].append(np.stack([mid[sel], db[sel], di[sel]]))
    wins = [(float(str(i["start"])), float(str(i["end"]))) for i in incidents]
    out = []
    arr = {nm: np.concatenate(v, axis=1) if v else np.zeros((3, 0)) for nm, v in per.items()}

    def idle(a: np.ndarray, sel: np.ndarray) -> float:
        return float(a[2, sel].sum() / max(a[1, sel].sum() + a[2, sel].sum(), 1e-9))

    base: dict[str, float] = {}
    for nm, a in arr.items():
        sel = (a[1] >= 0.3 * (a[1] + a[2]))
        for s_, e_ in wins:
            sel &= (a[0] < s_ - 120) | (a[0] > e_ + 120)
        base[nm] = idle(a, sel)
    out.append("baseline idle: " + ", ".join(f"{nm} {100 * v:.1f}%" for nm, v in base.items()))
    waited: list[dict[str, object]] = labels.get("waited_on", [])  # type: ignore[assignment]
    for j, inc in enumerate(incidents):
        s_, e_ = wins[j]
        hurt = {w["job"] for w in waited
                if w["class"] == inc["class"] and float(str(w["start"])) >= s_ and float(str(w["end"])) <= e_}
        row = []
        for nm, a in arr.items():
            sel = (a[0] >= s_) & (a[0] < e_)
            if not sel.any():
                continue
            tag = "*" if inc.get("job") == nm else "~" if nm in hurt else ""
            row.append(f"{tag}{nm} {100 * idle(a, sel):.0f}% ({100 * (idle(a, sel) - base[nm]):+.0f})")
        out.append(f"{inc['class']} ({(e_ - s_) / 60:.1f} min): " + ", ".join(row))
    out.append("  (* the incident's job, ~ a job labelled as waiting on it)")
    return out


def check_all(outdir: Path, names: list[str]) -> bool:
    ok = True
    for name in names:
        probs, summ = check_trace(outdir / f"{name}.om.gz", outdir / f"{name}.labels.json")
        status = "ok" if not probs else "PROBLEMS"
        print(f"[{status}] {name}: {summ['series']} series, {summ['samples']} samples, {summ['families']} families, "
              f"{float(str(summ['span_min'])):.1f} min, resets {summ['resets']}")
        for e in summ["effects"]:  # type: ignore[attr-defined]
            print(f"      {e}")
        for p in probs:
            print(f"      ! {p}")
        ok &= not probs
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Clean-room labelled trace generator for gpunet's diagnoser.")
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", choices=("full", "guard", "multijob", "multijob-guard"), default="full", dest="set_name")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="generate only these traces")
    ap.add_argument("--check", action="store_true", help="read the traces back and verify them")
    args = ap.parse_args(argv)
    sets: dict[str, Callable[[], list[Spec]] | Callable[[], list[MSpec]]] = {
        "full": full_set, "guard": guard_set, "multijob": multijob_set, "multijob-guard": multijob_guard_set}
    specs: list[Spec | MSpec] = list(sets[args.set_name]())
    if args.only:
        known = {s.name for s in specs}
        unknown = [x for x in args.only if x not in known]
        if unknown:
            print(f"unknown trace(s) in set {args.set_name}: {', '.join(unknown)}", file=sys.stderr)
            return 2
        specs = [s for s in specs if s.name in args.only]
    t_a = time.perf_counter()
    if args.set_name.startswith("multijob"):
        man = generate_multi([s for s in specs if isinstance(s, MSpec)], args.outdir, args.seed, args.set_name)
    else:
        man = generate([s for s in specs if isinstance(s, Spec)], args.outdir, args.seed, args.set_name)
    total = sum(int(str(m["bytes"])) for m in man)
    print(f"{len(man)} traces, {total / 1e6:.1f} MB, {time.perf_counter() - t_a:.1f} s -> {args.outdir}")
    if args.check:
        return 0 if check_all(args.outdir, [s.name for s in specs]) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
