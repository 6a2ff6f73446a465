"""What the cluster is like at a given moment, and how that changes over the trace.

A Conditions object holds every knob the physics reads (per node, per rail, per GPU). Faults
change them during their windows; between two consecutive fault boundaries nothing changes,
so the trace is cut into segments with one Conditions each (Timeline). The step model reads
the segment a step starts in; the fast-tick model indexes the per-segment arrays by tick.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from gpunet.contract import THROTTLE_REASONS
from gpunet.simulate.params import SimSpec

# Go-back-N costs (RoCE, mlx5 defaults): a lost packet makes the sender resend what it had in
# flight (~64 packets at 200G and a few microseconds RTT), and a lost tail packet is only
# noticed at the local ACK timeout (4.096 us x 2^12 = 16.7 ms), during which the QP sends nothing.
GBN_WINDOW = 64
GBN_TAIL = 0.02  # fraction of losses that end in an ACK timeout
ACK_TIMEOUT = 0.0167
# TCP: fast retransmit resends one segment but halves cwnd; a tail loss waits for RTO (200 ms).
TCP_CWND_COST = 12
TCP_TAIL = 0.01
TCP_RTO = 0.2


def loss_costs(p: np.ndarray | float, pps: np.ndarray | float, tcp: bool) -> tuple[np.ndarray, np.ndarray]:
    """(stall, resend) of a link losing a fraction p of its packets at pps packets/s:
    stall = fraction of time the sender can transmit (the rest it waits for timeouts),
    resend = wire bytes resent per payload byte."""
    p = np.asarray(p, dtype=float)
    if tcp:
        return 1.0 / (1.0 + p * pps * TCP_TAIL * TCP_RTO), p * TCP_CWND_COST
    return 1.0 / (1.0 + p * pps * GBN_TAIL * ACK_TIMEOUT), p * GBN_WINDOW


def loss_efficiency(p: np.ndarray | float, pps: np.ndarray | float, tcp: bool) -> np.ndarray:
    """Goodput / loss-free goodput."""
    stall, resend = loss_costs(p, pps, tcp)
    return stall / (1.0 + resend)


def solve_loss(target: float, pps: float, tcp: bool) -> float:
    """The packet loss probability that leaves `target` of the link's goodput (bisection in log p)."""
    lo, hi = -9.0, -0.5
    for _ in range(60):
        mid = (lo + hi) / 2
        if float(loss_efficiency(10 ** mid, pps, tcp)) > target:
            lo = mid
        else:
            hi = mid
    return 10 ** ((lo + hi) / 2)


def healthy_goodput(spec: SimSpec) -> float:
    f, c = spec.fabric, spec.cluster
    if spec.job.transport == "tcp":
        return c.nic_speed * f.tcp_efficiency / (1 + 52 / f.tcp_mss)
    return c.nic_speed * f.efficiency / (1 + f.header_overhead)


def gradient_bytes(spec: SimSpec) -> float:
    """The model's gradient size: explicit, or such that a healthy all-reduce takes
    comm_ratio x compute (so the job's balance holds whatever the cluster size)."""
    if spec.job.gradient_bytes:
        return spec.job.gradient_bytes
    n, k = spec.cluster.nodes, spec.cluster.nics
    per_rail = spec.job.comm_ratio * spec.job.step_compute * healthy_goodput(spec)
    return per_rail * k * n / max(2 * (n - 1), 1)


def volume_per_rail(spec: SimSpec) -> float:
    n = spec.cluster.nodes
    return 2 * (n - 1) / n * gradient_bytes(spec) / spec.cluster.nics



@dataclass
class Conditions:
    compute_factor: np.ndarray  # (N, G) multiplies a GPU's forward+backward time
    gap_add: float  # s added to every node's input gap
    grad_factor: float  # multiplies the gradient volume
    speed: np.ndarray  # (N, K) negotiated link speed, bytes/s; 0 while the link is down
    cap: np.ndarray  # (N, K) fraction of line rate the link can carry (congestion, PFC freeze)
    loss: np.ndarray  # (N, K) RDMA packet loss probability on the node's own link, each direction
    loss_fabric: float  # ... on every link (a bad switch or spine)
    tcp_loss: np.ndarray  # (N, K) TCP loss of what the node sends on that NIC
    tcp_loss_fabric: float
    ecn_frac: np.ndarray  # (N, K) fraction of received RoCE packets that carry a CE mark (congestion)
    ecn_burst: np.ndarray  # (N, K) CE marks per all-reduce burst: a healthy fabric's incast at burst starts
    pause_rx: np.ndarray  # (N, K) pause frames received per second of link activity
    pause_tx: np.ndarray  # (N, K) pause frames sent per second of link activity
    pause_tx_const: np.ndarray  # (N, K) pause frames sent per second, traffic or not (a storm)
    xmit_wait: np.ndarray  # (N, K) share of active time the port waits for credit (InfiniBand)
    discards: np.ndarray  # (N, K) receive discards per second
    ack_timeout_const: np.ndarray  # (N, K) ACK timeouts per second (link down under live QPs)
    throttle: np.ndarray  # (N, G, R) fraction of time each throttle reason is active
    clock: np.ndarray  # (N, G) SM clock / nominal
    trickle: bool  # ranks waiting for a straggler send a trickle (else nothing)

    def copy(self) -> Conditions:
        return copy.deepcopy(self)


def baseline(spec: SimSpec, ecn: bool) -> Conditions:
    c, f = spec.cluster, spec.fabric
    n, k, g = c.nodes, c.nics, c.gpus
    nk = (n, k)
    tcp = spec.job.transport == "tcp"
    # A TCP job's traffic is on a lossy class: no PFC, no ECN marks on RoCE, no CNPs. Nor
    # has InfiniBand, whose back-pressure is credits (port_xmit_wait).
    roce = 0.0 if tcp or f.infiniband else 1.0
    burst_packets = volume_per_rail(spec) * (1 + f.header_overhead) / f.packet_bytes
    return Conditions(
        compute_factor=np.ones((n, g)), gap_add=0.0, grad_factor=1.0,
        speed=np.full(nk, c.nic_speed), cap=np.full(nk, f.tcp_efficiency if tcp else f.efficiency),
        loss=np.zeros(nk), loss_fabric=0.0, tcp_loss=np.zeros(nk), tcp_loss_fabric=0.0,
        ecn_frac=np.zeros(nk),
        # A healthy DCQCN fabric marks a little at each burst's start (incast as every rank starts
        # sending at once), not in proportion to bytes: the background stays steady when bursts
        # grow longer (links too slow), which is no congestion.
        ecn_burst=np.full(nk, f.ecn_background * roce * burst_packets if ecn else 0.0),
        pause_rx=np.full(nk, f.pause_rx_background * roce), pause_tx=np.full(nk, f.pause_tx_background * roce),
        pause_tx_const=np.zeros(nk), xmit_wait=np.full(nk, f.xmit_wait_background if f.infiniband else 0.0),
        discards=np.zeros(nk), ack_timeout_const=np.zeros(nk),
        throttle=np.zeros((n, g, len(THROTTLE_REASONS))), clock=np.ones((n, g)),
        trickle=spec.job.wait_traffic == "trickle")


class Timeline:
    """Segments [breaks[i], breaks[i+1]) of constant Conditions; the first starts at -inf
    (the job ran before the trace) and the last ends at +inf."""

    def __init__(self, breaks: np.ndarray, conds: list[Conditions], spec: SimSpec):
        self.breaks = breaks  # len(conds) + 1
        self.conds = conds
        self.spec = spec
        self._stacks: dict[str, np.ndarray] = {}
        self._rails = [rail_rates(c, spec) for c in conds]
        self.goodput = np.array([r[0] for r in self._rails])  # (S, K) payload bytes/s of each rail's ring
        self.wire = np.array([r[1] for r in self._rails])  # (S, K) wire bytes/s while it runs

    @classmethod
    def build(cls, spec: SimSpec, base: Conditions, effects: list) -> Timeline:
        points = {0.0, spec.duration}
        for e in effects:
            points.update(t for t in e.breakpoints() if 0.0 < t < spec.duration)
        inner = np.array(sorted(points))
        breaks = np.concatenate([[-np.inf], inner, [np.inf]])
        conds = []
        for a, b in zip(breaks[:-1], breaks[1:]):
            mid = (a + b) / 2 if np.isfinite(a) and np.isfinite(b) else (b - 1.0 if np.isfinite(b) else a + 1.0)
            cond = base.copy()
            for e in effects:
                e.apply(cond, mid)
            conds.append(cond)
        return cls(breaks, conds, spec)

    def seg_at(self, t: float | np.ndarray):
        return np.searchsorted(self.breaks, t, side="right") - 1

    def stack(self, name: str) -> np.ndarray:
        """A field of every segment stacked: shape (segments, ...)."""
        if name not in self._stacks:
            self._stacks[name] = np.stack([np.asarray(getattr(c, name), dtype=float) for c in self.conds])
        return self._stacks[name]


def rail_rates(c: Conditions, spec: SimSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per rail: the ring's payload goodput and the wire rate on each link while it runs.

    A ring all-reduce moves at the pace of its slowest link: every rank sends to the next at
    the same rate, so each rail runs at min over nodes of what that node's link can carry
    (speed x cap, less what loss recovery costs). The wire carries the payload plus headers
    plus go-back-N resends."""
    f = spec.fabric
    tcp = spec.job.transport == "tcp"
    link = c.speed * c.cap  # (N, K) wire bytes/s each link could carry
    if tcp:
        pps = np.maximum(link, 1.0) / (f.tcp_mss + 52)
        p = c.tcp_loss + c.tcp_loss_fabric
        overhead = 1.0 + 52 / f.tcp_mss
    else:
        pps = np.maximum(link, 1.0) / f.packet_bytes
        # A packet into node i crosses node i-1's uplink and node i's downlink: both can drop it.
        p = c.loss + np.roll(c.loss, 1, axis=0) + c.loss_fabric
        overhead = 1.0 + f.header_overhead
    stall, resend = loss_costs(p, pps, tcp)
    goodput = (link * stall / (1.0 + resend)).min(axis=0) / overhead  # (K,)
    wire = goodput * overhead * (1.0 + resend.max(axis=0))
    return goodput, wire
