"""The physical model: synchronous data-parallel training, step by step, and what an
exporter ticking every 0.2 s would count on each node.

Step model (one global timeline, because every rank waits for every other):

    step start t
    | input gap g_i (GPU idle, node reads its batch)
    |    | forward+backward c_i,g (GPU busy; longest GPU of a node decides that node)
    |    |                     D = max_i (g_i + c_i): the last rank is done
    |    |        comm start = D - overlap x min(T_comm, backward of that last rank)
    |    |        ring all-reduce on each rail at the rail's ring rate (slowest link)
    |                          t_opt = max(D, last rail done): every rank has the gradient
    |                                optimizer step (GPU busy)       next step
A rank that finishes early idles until the all-reduce finishes: waiting for the straggler
(fabric quiet, or a trickle of early buckets when `trickle`), then for the network.
Volume per rank per step: 2(N-1)/N x gradient bytes, split evenly over the K rails; every
rank sends that on each rail to its ring successor and receives it from its predecessor,
so all ranks of a rail carry the same bytes at the same time.

The fast tick: cumulative bytes, active time and GPU busy time are piecewise linear in
time (constant rates between step phase boundaries), so their value at each 0.2 s tick
edge is an exact np.interp over the breakpoints; per-tick differences then give exactly
what the exporter's tick sees (bytes in the tick / tick / link speed, busy seconds in the
tick), and network_state per tick follows docs/metrics.md. Nothing loops per tick.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpunet.simulate.conditions import Timeline, volume_per_rail
from gpunet.simulate.params import SimSpec

GPU_JITTER = 0.003  # GPUs of one node differ by a fraction of a percent per step
BACKWARD_SHARE = 2 / 3  # backward is ~2x forward
PAUSED, SATURATED, ACTIVE, QUIET = 0, 1, 2, 3  # contract order: first match wins


@dataclass
class Schedule:
    t0: np.ndarray  # (S,) step starts, seconds from trace start
    gap: np.ndarray  # (S, N) input gap per node
    comp: np.ndarray  # (S, N, G) forward+backward per GPU; 0 for GPUs the job does not use
    t_opt: np.ndarray  # (S,) all-reduce done (optimizer starts)
    t_end: np.ndarray  # (S,) step end
    pieces: list[np.ndarray]  # per rail: (P, 3) rows (start, end, wire bytes/s) of ring traffic
    stalls: np.ndarray  # (B, 2) checkpoint stalls actually taken: training stopped
    optimizer: float
    used: np.ndarray  # (N, G) bool

    def idle_fraction(self, t_from: float | None = None) -> float:
        """Mean GPU idle fraction of the used GPUs over the scheduled steps (for calibration)."""
        sel = slice(None) if t_from is None else self.t0 >= t_from
        comp = self.comp[sel]
        if not len(comp):
            return 0.0
        n_used = self.used.sum()
        busy = comp.sum() + self.optimizer * n_used * len(comp)
        wall = (self.t_end[sel][-1] - self.t0[sel][0]) * n_used
        return 1.0 - busy / wall


def _advance(tl: Timeline, k: int, t: float, rem: float, out: list) -> float:
    """Send `rem` payload bytes on rail k from time t, through segments whose ring rate
    may change (a link down stalls the ring); append the wire pieces; return the end."""
    s = int(tl.seg_at(t))
    while rem > 1e-6:
        g = tl.goodput[s, k]
        b = tl.breaks[s + 1]
        if g > 0:
            need = rem / g
            if t + need <= b:
                out.append((t, t + need, tl.wire[s, k]))
                return t + need
            out.append((t, b, tl.wire[s, k]))
            rem -= g * (b - t)
        elif not np.isfinite(b):
            raise ValueError(f"rail {k} can never finish its all-reduce (link down for good)")
        t = b
        s += 1
    return t


def run_steps(spec: SimSpec, tl: Timeline, used: np.ndarray, blocks: list[tuple[float, float]],
              rng: np.random.Generator, t_from: float, t_to: float) -> Schedule:
    """Schedule every training step from t_from until t_to (vectorised over nodes and GPUs;
    one Python iteration per step)."""
    job = spec.job
    n, g = used.shape
    k_rails = spec.cluster.nics
    c0, cj, gj = job.step_compute, job.compute_jitter, job.gap_jitter
    v0 = volume_per_rail(spec)
    node_used = used.any(axis=1)
    trickle_wire = job.trickle_ratio * spec.cluster.nic_speed
    blocks = sorted(blocks)
    t, bi = t_from, 0
    t0s, gaps, comps, topts, tends = [], [], [], [], []
    pieces: list[list] = [[] for _ in range(k_rails)]
    stalls = []
    chunk, i = 256, 256
    while t < t_to:
        # A checkpoint that fell due during the last step is taken at this step boundary.
        while bi < len(blocks) and blocks[bi][0] <= t:
            stalls.append((t, t + blocks[bi][1]))
            t += blocks[bi][1]
            bi += 1
        if t >= t_to:
            break
        if i == chunk:
            zc = rng.standard_normal((chunk, n))
            zg = rng.standard_normal((chunk, n))
            zgpu = rng.standard_normal((chunk, n, g))
            i = 0
        s = int(tl.seg_at(t))
        c = tl.conds[s]
        gap = (job.input_gap + c.gap_add) * np.exp(gj * zg[i] - gj * gj / 2)
        comp = (c0 * np.exp(cj * zc[i] - cj * cj / 2))[:, None] * (1 + GPU_JITTER * zgpu[i]) * c.compute_factor
        comp *= used
        i += 1
        node_end = np.where(node_used, gap + comp.max(axis=1), -np.inf)
        j = int(node_end.argmax())
        d = node_end[j]
        bwd = BACKWARD_SHARE * comp[j].max()
        v = v0 * c.grad_factor
        good, wire = tl.goodput[s], tl.wire[s]
        with np.errstate(divide="ignore"):
            t_nom = np.where(good > 0, v / np.where(good > 0, good, 1), np.inf)
        finite = t_nom[np.isfinite(t_nom)]
        t_comm = finite.max() if finite.size else 0.0
        cs = t + d - job.overlap * min(t_comm, bwd)
        rem = np.full(k_rails, v)
        if c.trickle and v > 0:
            # Ranks waiting for the straggler all-reduce the buckets it has produced so far:
            # a trickle at a fraction of line rate, the rest at full rate once it is done.
            e_med = t + float(np.median(node_end[node_used]))
            if cs > e_med:
                for k in range(k_rails):
                    if wire[k] > 0:
                        w_tr = min(trickle_wire, wire[k])
                        g_tr = good[k] * w_tr / wire[k]
                        vt = min(g_tr * (cs - e_med), 0.5 * v)
                        pieces[k].append((e_med, e_med + vt / g_tr, w_tr))
                        rem[k] -= vt
        ends = [_advance(tl, k, cs, rem[k], pieces[k]) for k in range(k_rails)]
        t_opt = max(t + d, max(ends))
        t_end = t_opt + job.optimizer
        t0s.append(t)
        gaps.append(gap)
        comps.append(comp)
        topts.append(t_opt)
        tends.append(t_end)
        t = t_end
    return Schedule(np.array(t0s), np.array(gaps).reshape(-1, n), np.array(comps).reshape(-1, n, g),
                    np.array(topts), np.array(tends),
                    [np.array(p, dtype=float).reshape(-1, 3) for p in pieces],
                    np.array(stalls, dtype=float).reshape(-1, 2), job.optimizer, used)


def piecewise_cumulative(starts: np.ndarray, ends: np.ndarray, rates: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Integral from -inf to `at` of a function that is `rates` on [starts, ends) and 0
    elsewhere (intervals sorted and disjoint): exact, by interpolating its breakpoints."""
    if not len(starts):
        return np.zeros_like(at, dtype=float)
    x = np.empty(2 * len(starts))
    x[0::2], x[1::2] = starts, ends
    y = np.zeros(2 * len(starts))
    y[1::2] = rates * (ends - starts)
    return np.interp(at, x, np.cumsum(y), left=0.0)


@dataclass
class Ticks:
    """Global fast-tick arrays, shared by every node of the job."""
    dt: float
    edges: np.ndarray  # (T+1,) tick edges, seconds from trace start
    seg: np.ndarray  # (T,) segment of each tick
    seg_first: np.ndarray  # (S,) first tick of each segment
    seg_last: np.ndarray  # (S,) one past its last tick
    rail_bytes: np.ndarray  # (T, K) wire bytes each rail's links carried in each tick (each direction)
    rail_active: np.ndarray  # (T, K) seconds of each tick during which the rail carried traffic
    cum_bytes: np.ndarray  # (T+1, K) cumulative of rail_bytes from the trace start
    cum_active: np.ndarray  # (T+1, K)
    cum_time: np.ndarray  # (T+1, 1) = edges
    cum_bursts: np.ndarray  # (T+1, K) all-reduce bursts each rail started before each edge

    def seg_cumulative(self, coef: np.ndarray, cum: np.ndarray, kidx: np.ndarray) -> np.ndarray:
        """sum over ticks < kidx of coef[segment of tick] * x[tick], with x's cumulative `cum`
        (T+1, K) and per-segment coefficients coef (S, K): exact and O(scrapes x segments)."""
        kb = np.minimum(kidx[:, None], self.seg_first[None, :])  # (n, S)
        ke = np.minimum(kidx[:, None], self.seg_last[None, :])
        return ((cum[ke] - cum[kb]) * coef[None, :, :]).sum(axis=1)  # (n, K)


def fast_ticks(spec: SimSpec, tl: Timeline, sched: Schedule) -> Ticks:
    dt = spec.scrape.tick
    n_ticks = int(np.ceil(spec.duration / dt))
    edges = np.arange(n_ticks + 1) * dt
    seg = tl.seg_at(edges[:-1] + dt / 2)
    segs = np.arange(len(tl.conds))
    cum_b = np.empty((n_ticks + 1, spec.cluster.nics))
    cum_a = np.empty_like(cum_b)
    for k, p in enumerate(sched.pieces):
        cum_b[:, k] = piecewise_cumulative(p[:, 0], p[:, 1], p[:, 2], edges)
        cum_a[:, k] = piecewise_cumulative(p[:, 0], p[:, 1], np.ones(len(p)), edges)
    cum_b -= cum_b[0]
    cum_a -= cum_a[0]
    # a burst starts where a piece starts right after a gap (not where a ring resumes after a stall)
    cum_n = np.empty_like(cum_b)
    for k, p in enumerate(sched.pieces):
        starts = p[np.concatenate([[True], p[1:, 0] > p[:-1, 1] + 1e-9]), 0] if len(p) else p[:, 0]
        cum_n[:, k] = np.searchsorted(starts, edges, "left")
    cum_n -= cum_n[0]
    return Ticks(dt, edges, seg, np.searchsorted(seg, segs, "left"), np.searchsorted(seg, segs, "right"),
                 np.diff(cum_b, axis=0), np.diff(cum_a, axis=0), cum_b, cum_a, edges[:, None], cum_n)


def gpu_busy_cumulative(sched: Schedule, node: int, edges: np.ndarray) -> np.ndarray:
    """(G, T+1) busy seconds of each GPU of `node` from the trace start to each tick edge."""
    n_gpus = sched.comp.shape[2]
    out = np.zeros((n_gpus, len(edges)))
    if not len(sched.t0):
        return out
    start = sched.t0 + sched.gap[:, node]
    x = np.empty((len(start), 4))
    x[:, 0] = start
    x[:, 2] = sched.t_opt
    x[:, 3] = sched.t_end
    inc = np.zeros((len(start), 4))
    for g in range(n_gpus):
        if not sched.used[node, g]:
            continue
        c = sched.comp[:, node, g]
        x[:, 1] = start + c
        inc[:, 1] = c
        inc[:, 3] = sched.optimizer
        cum = np.interp(edges, x.ravel(), np.cumsum(inc.ravel()), left=0.0)
        out[g] = cum - cum[0]
    return out


def network_state(paused: np.ndarray, saturated: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Per tick, docs/metrics.md: paused > saturated > active > quiet."""
    return np.where(paused, PAUSED, np.where(saturated, SATURATED, np.where(active, ACTIVE, QUIET))).astype(np.int8)
