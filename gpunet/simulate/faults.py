"""Fault classes (docs/classes.md) and the conditions they change, with why each counter
signature looks as it does.

Each fault is an Effect: a window [start, end), the culprit nodes and NICs, and `apply`,
which edits the Conditions of a segment inside the window. Magnitudes are one number per
class, `strength` (see STRENGTH); `subtle` faults get theirs from calibrate.py.

Signatures (what the physics makes of the conditions):

- network_bandwidth: the gradient outgrows the links. The ring runs at line rate (no loss,
  no marks), the all-reduce lasts longer than the backward pass can hide, and GPUs wait
  while every RDMA NIC is >= 90% busy: GPU idle in `saturated`, no congestion counters.
- network_congestion: something else shares the fabric (another job, an oversubscribed
  spine, incast). Switch queues build: they CE-mark RoCE packets (ECN marks at every
  receiver, CNPs sent back and handled by the senders' rate limiters), and when queues pass
  Xoff the switch pauses the senders (received PFC pauses, moderate). DCQCN cuts the rates:
  throughput well below line rate, GPU idle in `active`/`paused`. Variant `no_ecn`: the
  fabric has no ECN (whole trace), so PFC alone brakes: more received pauses, no marks.
  On InfiniBand (--link-layer infiniband) the switches withhold credits instead: every
  port's port_xmit_wait climbs to a large share of its time.
- pfc_storm: one host's NIC cannot drain its receive buffer (stuck host, firmware) and sends
  PFC XOFF continuously, traffic or not (~12k frames/s at 200G: one refresh per half pause
  quantum). The switch stops sending to it, its buffers fill, and it pauses every sender
  on that priority: all other nodes receive pauses, the whole ring crawls, GPUs idle in
  `paused`. The culprit is the one whose *transmitted* pauses dwarf everyone's.
- packet_loss: a bad cable/optic on one port (or a bad switch: variant `fabric`). RoCE
  recovers with go-back-N: the receiver after the lost packet sees out-of-sequence packets
  and NAKs (`out_of_sequence` on it, `sequence_error` on the sender), a lost tail packet
  costs a local ACK timeout (`ack_timeout` on the sender). The culprit's link is lossy both
  ways, so it shows all three kinds (plus CRC receive errors) and its ring neighbours one
  kind each. Throughput collapses (timeouts idle the QP). Over a TCP transport the same
  link shows as TCP retransmits on the node whose sends cross it, and no RDMA loss counter.
- link_degraded: variant `downshift`: the link renegotiates at a lower speed (its speed
  gauge drops, carrier changes +2); the ring runs at that speed, so the culprit's NIC is
  saturated while its peers' are only active. Variant `flap`: carrier drops for seconds,
  repeatedly; nic_up reads 0 when a scrape lands in it, carrier_changes climbs, the ring
  stalls while the link is down and the live QPs time out (`ack_timeout`).
- gpu_throttle: throttle reasons active (thermal, power brake, hw slowdown) on the
  culprit's GPUs, lower SM clock, so its compute lasts longer; the others wait (quiet).
- straggler: the culprit computes slower with nothing visible (a noisy CPU neighbour, a
  slow PCIe path); the others wait, seeing a quiet network or a trickle (`variant`).
- host_bound: the input pipeline makes every GPU wait longer at each step start; the fabric
  is quiet meanwhile and no node stands out.
"""

from __future__ import annotations

import numpy as np

from gpunet.contract import THROTTLE_REASONS
from gpunet.simulate.conditions import Conditions, solve_loss
from gpunet.simulate.params import FaultSpec, SimSpec

LOCALISED = {"pfc_storm", "link_degraded", "gpu_throttle", "straggler", "packet_loss"}
FROM_OUTSIDE = "from_outside"  # a fault whose source is another job on a shared fabric: no incident of this job
R = {r: i for i, r in enumerate(THROTTLE_REASONS)}

# class -> (default strength, strength at calibration position lam in [0, 1], meaning)
STRENGTH = {
    "network_bandwidth": (3.0, lambda lam: 1.0 + 4.0 * lam, "gradient volume multiplier"),
    "network_congestion": (0.35, lambda lam: 1.0 - 0.85 * lam, "fraction of line rate the fabric still gives"),
    "pfc_storm": (0.04, lambda lam: 1.0 - 0.97 * lam, "fraction of throughput left"),
    "packet_loss": (0.25, lambda lam: 1.0 - 0.85 * lam, "goodput fraction of the lossy link"),
    "link_degraded": (0.5, lambda lam: 0.5 * lam, "downshift: new/old speed; flap: fraction of time down"),
    "gpu_throttle": (0.62, lambda lam: 1.0 - 0.6 * lam, "SM clock / nominal"),
    "straggler": (1.4, lambda lam: 1.0 + 1.0 * lam, "compute time multiplier of the culprit"),
    "host_bound": (0.5, lambda lam: 1.5 * lam, "input gap added, in units of step compute"),
}
FLAP_DEFAULT = 0.12  # link_degraded/flap default fraction of the window the link is down
THROTTLE_VARIANTS = {  # reason -> fraction of time active
    "thermal": {"sw_thermal": 0.96, "hw_thermal": 0.35},
    "power": {"sw_power_cap": 0.98, "hw_power_brake": 0.4},
    "hw_slowdown": {"hw_slowdown": 0.97},
}


def is_localised(fault: FaultSpec) -> bool:
    if fault.cls == "packet_loss":
        return fault.variant != "fabric"
    return fault.cls in LOCALISED


class Effect:
    """Base: a window and the segments it edits."""

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end

    def breakpoints(self) -> list[float]:
        return [self.start, self.end]

    def active(self, t: float) -> bool:
        return self.start <= t < self.end

    def apply(self, c: Conditions, t: float) -> None:
        if self.active(t):
            self._apply(c, t)

    def _apply(self, c: Conditions, t: float) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class Fault(Effect):
    def __init__(self, spec: FaultSpec, sim: SimSpec, culprits: list[int], nics: list[int], gpus: list[int],
                 rng: np.random.Generator):
        super().__init__(spec.start, spec.end)
        self.spec, self.sim = spec, sim
        self.culprits, self.nics, self.gpus = culprits, nics, gpus
        self.strength = spec.strength if spec.strength is not None else default_strength(spec)
        self.setup(rng)

    def setup(self, rng: np.random.Generator) -> None:
        pass

    @property
    def cidx(self):  # culprits x their affected NICs, for fancy indexing
        return np.ix_(self.culprits, self.nics)


def default_strength(spec: FaultSpec) -> float:
    if spec.cls == "link_degraded" and spec.variant == "flap":
        return FLAP_DEFAULT
    return STRENGTH[spec.cls][0]


class NetworkBandwidth(Fault):
    def _apply(self, c, t):
        c.grad_factor *= self.strength


class Congestion(Fault):
    def _apply(self, c, t):
        sev = min(1.0, max(0.0, 1.0 - self.strength))
        rails = self.nics
        c.cap[:, rails] *= self.strength
        if self.sim.job.transport == "tcp":
            return  # TCP on a lossy class: throughput only (switch drops are TCP's business)
        if self.sim.fabric.infiniband:
            # Full switch buffers hold back credits: ports wait for a share of their time
            # that grows with how much of the line rate the fabric takes away.
            c.xmit_wait[:, rails] = np.maximum(c.xmit_wait[:, rails], 0.4 * sev)
            return
        if self.spec.variant == "no_ecn" or not self.sim.fabric.ecn:
            c.pause_rx[:, rails] += 900.0 * sev  # PFC is the only brake
        else:
            c.ecn_frac[:, rails] = np.maximum(c.ecn_frac[:, rails], 0.08 * sev)
            c.pause_rx[:, rails] += 150.0 * sev  # queues still pass Xoff now and then


class PfcStorm(Fault):
    """Variant `from_outside`: the storming host belongs to another job on the same spine-leaf
    fabric (gpunet.simulate.multijob --shared-fabric): this job's links are paused and frozen
    as a victim's, and none of its own nodes sends the pauses."""

    def _apply(self, c, t):
        sev = min(1.0, max(0.0, (1.0 - self.strength) / 0.96))
        speed = self.sim.cluster.nic_speed
        rails = self.nics
        c.cap[:, rails] *= self.strength  # the rail's switch is frozen for everyone
        if self.spec.variant == FROM_OUTSIDE:
            c.pause_rx[:, rails] += 2500.0 * sev
            return
        c.pause_tx_const[self.cidx] += 12000.0 * (speed / 25e9) * sev
        others = np.setdiff1d(np.arange(c.cap.shape[0]), self.culprits)
        c.pause_rx[np.ix_(others, rails)] += 2500.0 * sev
        c.pause_rx[self.cidx] += 250.0 * sev
        c.discards[self.cidx] += 400.0 * sev


class PacketLoss(Fault):
    def setup(self, rng):
        tcp = self.sim.job.transport == "tcp"
        f = self.sim.fabric
        speed = self.sim.cluster.nic_speed
        pps = speed * (f.tcp_efficiency if tcp else f.efficiency) / ((f.tcp_mss + 52) if tcp else f.packet_bytes)
        self.p = solve_loss(self.strength, pps, tcp)
        self.tcp = tcp

    def _apply(self, c, t):
        fabric = self.spec.variant == "fabric"
        if self.tcp:
            if fabric:
                c.tcp_loss_fabric += self.p
            else:
                c.tcp_loss[self.cidx] += self.p
        elif fabric:
            c.loss_fabric += self.p
        else:
            c.loss[self.cidx] += self.p


class LinkDegraded(Fault):
    """Downshift (default) or flap; `downs` lists the (start, end) intervals the link is down
    on every affected NIC of every culprit (scrape.py turns them into nic_up/carrier)."""

    def setup(self, rng):
        self.flap = self.spec.variant == "flap"
        downs = []
        if self.flap:
            frac = max(self.strength, 1e-3)
            mean_down = 4.0
            t = self.start + rng.uniform(0.5, 8.0)
            while t < self.end:  # a down of 2-6 s, then up for a while: down `frac` of the time on average
                d = float(rng.uniform(2.0, 6.0))
                downs.append((t, min(t + d, self.end)))
                t += d + max(mean_down / frac - mean_down, 1.0) * rng.uniform(0.6, 1.4)
        else:
            # renegotiation at the lower speed, and again when the cable is fixed (if within the trace)
            downs = [(self.start, self.start + 2.0)] + ([(self.end, self.end + 2.0)]
                                                        if self.end < self.sim.duration else [])
            self.new_speed = self.spec.speed or self.sim.cluster.nic_speed * self.strength
        self.downs = downs

    def breakpoints(self):
        return [self.start, self.end] + [x for d in self.downs for x in d]

    def apply(self, c, t):
        down = any(a <= t < b for a, b in self.downs)
        if not self.flap and self.active(t):
            c.speed[self.cidx] = self.new_speed
        if down:
            c.speed[self.cidx] = 0.0
            # live QPs toward and from the dead link retry until it is back
            c.ack_timeout_const[self.cidx] += 3.0
            prev = [(i - 1) % c.speed.shape[0] for i in self.culprits]
            c.ack_timeout_const[np.ix_(prev, self.nics)] += 3.0


class GpuThrottle(Fault):
    MEMORY_BOUND = 0.2  # share of a step that does not scale with the SM clock

    def _apply(self, c, t):
        ix = np.ix_(self.culprits, self.gpus)
        c.clock[ix] = np.minimum(c.clock[ix], self.strength)
        c.compute_factor[ix] *= self.MEMORY_BOUND + (1 - self.MEMORY_BOUND) / self.strength
        for reason, duty in THROTTLE_VARIANTS[self.spec.variant or "thermal"].items():
            c.throttle[ix + (R[reason],)] = np.maximum(c.throttle[ix + (R[reason],)], duty)


class Straggler(Fault):
    def _apply(self, c, t):
        c.compute_factor[self.culprits, :] *= self.strength
        if self.spec.variant in ("quiet", "trickle"):
            c.trickle = self.spec.variant == "trickle"


class HostBound(Fault):
    def _apply(self, c, t):
        c.gap_add += self.strength * self.sim.job.step_compute


FAULTS = {"network_bandwidth": NetworkBandwidth, "network_congestion": Congestion, "pfc_storm": PfcStorm,
          "packet_loss": PacketLoss, "link_degraded": LinkDegraded, "gpu_throttle": GpuThrottle,
          "straggler": Straggler, "host_bound": HostBound}


class DcqcnBackground(Effect):
    """Confounder: a busier but healthy DCQCN fabric (steady marks, CNPs, a few pauses), whole trace."""

    def __init__(self, level: float, duration: float):
        super().__init__(0.0, duration)
        self.level = level

    def apply(self, c, t):
        c.ecn_burst *= self.level
        c.pause_rx *= self.level
        c.pause_tx *= self.level


def default_nics(spec: FaultSpec, k: int) -> int:
    if spec.nics is not None:
        return max(1, min(spec.nics, k))
    return {"packet_loss": 1, "link_degraded": 1}.get(spec.cls, k)


def make_fault(spec: FaultSpec, sim: SimSpec, culprits: list[int], rng: np.random.Generator) -> Fault:
    k, g = sim.cluster.nics, sim.cluster.gpus
    n_nics = default_nics(spec, k)
    nics = sorted(rng.choice(k, n_nics, replace=False).tolist()) if n_nics < k else list(range(k))
    n_gpus = g if spec.gpus is None else max(1, min(spec.gpus, g))
    gpus = sorted(rng.choice(g, n_gpus, replace=False).tolist()) if n_gpus < g else list(range(g))
    return FAULTS[spec.cls](spec, sim, culprits, nics, gpus, rng)
