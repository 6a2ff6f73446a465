"""Putting a simulation together: pick culprits and confounder nodes, calibrate subtle
faults, build the condition timeline, schedule the steps, integrate the fast tick, sample
the scrapes, and produce the ground truth."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace

import numpy as np

from gpunet.simulate.cluster import Cluster
from gpunet.simulate.conditions import Timeline, baseline
from gpunet.simulate.faults import (
    FROM_OUTSIDE,
    STRENGTH,
    DcqcnBackground,
    Effect,
    Fault,
    LinkDegraded,
    is_localised,
    make_fault,
)
from gpunet.simulate.node import NodeModel, NodeOut, NodeSetup
from gpunet.simulate.params import FaultSpec, SimSpec, parse_duration
from gpunet.simulate.physics import Schedule, fast_ticks, run_steps
from gpunet.simulate.scrape import plan_node

# Independent random streams, so that changing one part of a spec does not reshuffle the rest.
STREAM_CONFOUNDERS, STREAM_CULPRITS, STREAM_FAULTS, STREAM_STEPS, STREAM_SCRAPES, STREAM_NODES, STREAM_MGMT = range(7)
SUBTLE_POINTS = (5.5, 7.5)  # a subtle fault adds this many points of GPU idle


def rng_for(spec: SimSpec, stream: int, *more: int) -> np.random.Generator:
    return np.random.default_rng([spec.seed, stream, *more])


@dataclass
class Result:
    spec: SimSpec
    cluster: Cluster
    faults: list[Fault]
    nodes: list[NodeOut]
    schedule: Schedule
    setups: list[NodeSetup] = field(default_factory=list)  # per node: confounders, link downs
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def labels(self) -> dict:
        """Ground truth, docs/trace-format.md."""
        incidents = []
        for f in self.faults:
            if f.spec.variant == FROM_OUTSIDE:  # the source's job holds the incident (multijob --shared-fabric)
                continue
            nodes = [self.cluster.instances[i] for i in f.culprits] if is_localised(f.spec) else []
            incidents.append({"class": f.spec.cls, "start": round(self.spec.start_time + f.start, 3),
                              "end": round(self.spec.start_time + f.end, 3), "nodes": nodes})
        incidents.sort(key=lambda x: (x["start"], x["class"]))
        return {"incidents": incidents, "notes": "; ".join(self.notes)}


def _pick(value: str | int | None, n: int, rng: np.random.Generator, prefer_not: set[int],
          default: int = 1) -> list[int]:
    """Node indices from 'all', a count (picked at random, avoiding `prefer_not` if it can),
    or explicit 0-based indices '#3' / '#3+17'."""
    if value in (None, ""):
        value = default
    if value == "all":
        return list(range(n))
    if isinstance(value, str) and value.startswith("#"):
        return sorted({int(x) % n for x in value[1:].split("+")})
    count = min(int(value), n)
    pool = [i for i in range(n) if i not in prefer_not]
    if len(pool) < count:
        pool = list(range(n))
    return sorted(rng.choice(pool, count, replace=False).tolist())


@dataclass
class Confounded:
    setups: list[NodeSetup]
    effects: list[Effect]
    checkpoints: list[tuple[float, float]]  # (due at, seconds)
    checkpoint_write: bool
    touched: set[int]
    notes: list[str]


def apply_confounders(spec: SimSpec, cluster: Cluster) -> Confounded:
    n, g = spec.cluster.nodes, spec.cluster.gpus
    rng = rng_for(spec, STREAM_CONFOUNDERS)
    setups = [NodeSetup(used=np.ones(g, dtype=bool)) for _ in range(n)]
    effects: list[Effect] = []
    checkpoints: list[tuple[float, float]] = []
    write = True
    touched: set[int] = set()
    notes = []
    for c in spec.confounders:
        p = c.params
        if c.kind == "checkpoint":
            every = parse_duration(p.get("every", "20m"))
            write = p.get("variant", "sync") != "async"
            dur = parse_duration(p.get("dur", "90s" if write else "20s"))
            t = parse_duration(p.get("first", str(round(rng.uniform(0.3, 0.8) * every))))
            while t < spec.duration:
                checkpoints.append((t, dur))
                t += every
            what = f"checkpoint writes over {cluster.mgmt.device}" if write else "async checkpoint"
            notes.append(f"confounder: {what} every {every:g}s for {dur:g}s on every node (GPUs idle, fabric quiet)")
            continue
        if c.kind == "dcqcn_background":
            level = float(p.get("level", 8))
            effects.append(DcqcnBackground(level, spec.duration))
            notes.append(f"confounder: healthy DCQCN background x{level:g} (ECN marks, CNPs, some pauses)")
            continue
        nodes = _pick(p.get("nodes"), n, rng, touched, default=1)
        names = ", ".join(cluster.instances[i] for i in nodes[:6]) + (" ..." if len(nodes) > 6 else "")
        if c.kind == "spare_port":
            for i in nodes:
                setups[i].spare_port = True
            notes.append(f"confounder: spare RDMA port {cluster.spare_port().device} down all along on {names}")
        elif c.kind == "unused_gpus":
            k = max(1, min(int(p.get("gpus", 2)), g - 1))
            for i in nodes:
                setups[i].used[g - k:] = False
            notes.append(f"confounder: {k} GPU(s) per node not used by the job on {names}")
        elif c.kind == "missing_gpu_series":
            for i in nodes:
                setups[i].gpu_series = False
            touched.update(nodes)
            notes.append(f"confounder: no GPU series (NVML broken) on {names}")
        elif c.kind == "exporter_restart":
            for i in nodes:
                at = parse_duration(p["at"]) if "at" in p else rng.uniform(0.1, 0.9) * spec.duration
                down = parse_duration(p.get("down", str(round(rng.uniform(10, 40)))))
                setups[i].restarts.append((at, down))
            notes.append(f"confounder: exporter restart (derived counters reset) on {names}")
        elif c.kind in ("node_join", "node_leave"):
            for i in nodes:
                at = parse_duration(p["at"]) if "at" in p else rng.uniform(0.15, 0.85) * spec.duration
                setups[i].window = (at, np.inf) if c.kind == "node_join" else (0.0, at)
            touched.update(nodes)
            notes.append(f"confounder: {c.kind.replace('_', ' ')} of monitoring on {names}")
        elif c.kind == "backup":
            for i in nodes:
                a = rng.uniform(0, spec.duration * 0.8)
                rate = rng.uniform(0.5, 0.95) * spec.cluster.mgmt_speed
                setups[i].mgmt_tx.append((a, a + rng.uniform(300, 1200), rate))
            notes.append(f"confounder: backup traffic on {cluster.mgmt.device} of {names}")
    # Ordinary life: now and then a node runs a backup over its management NIC.
    mrng = rng_for(spec, STREAM_MGMT)
    for i in range(n):
        if mrng.random() < 0.15 * spec.duration / 3600:
            a = mrng.uniform(0, spec.duration)
            setups[i].mgmt_tx.append((a, a + mrng.uniform(120, 900), mrng.uniform(0.2, 0.7) * spec.cluster.mgmt_speed))
    for s in setups:
        s.mgmt_tx.sort()
    return Confounded(setups, effects, checkpoints, write, touched, notes)


def choose_culprits(spec: SimSpec, avoid: set[int]) -> list[list[int]]:
    n = spec.cluster.nodes
    rng = rng_for(spec, STREAM_CULPRITS)
    out, taken = [], set(avoid)
    for f in spec.faults:
        if f.culprits is not None:
            picks = [c % n for c in f.culprits]
        elif is_localised(f):
            picks = _pick(f.nodes, n, rng, taken)
        else:
            picks = list(range(n))
        if is_localised(f):
            taken.update(picks)
        out.append(picks)
    return out


def calibrate(spec: SimSpec, fspec: FaultSpec, culprits: list[int], target: float, used: np.ndarray) -> float:
    """The strength at which `fspec` adds `target` points of GPU idle (bisection on the
    step model over a short stretch with the fault on throughout)."""
    window = max(300 * spec.job.step_compute, 300.0)
    probe_spec = replace(spec, faults=[], duration=window)
    probe = replace(fspec, start=0.0, duration=window, subtle=False)
    base = baseline(probe_spec, probe_spec.fabric.ecn)

    def idle(strength: float | None) -> float:
        effects = []
        if strength is not None:
            effects.append(make_fault(replace(probe, strength=strength), probe_spec, culprits, rng_for(spec, 99, 1)))
        tl = Timeline.build(probe_spec, base, effects)
        sched = run_steps(probe_spec, tl, used, [], rng_for(spec, 99, 2), 0.0, window)
        return sched.idle_fraction()

    healthy = idle(None)
    at = STRENGTH[fspec.cls][1]
    lo, hi = 0.0, 1.0
    for _ in range(14):
        mid = (lo + hi) / 2
        if (idle(at(mid)) - healthy) * 100 < target:
            lo = mid
        else:
            hi = mid
    return at((lo + hi) / 2)


def simulate(spec: SimSpec, log=None) -> Result:
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    spec = copy.deepcopy(spec)
    if any(f.cls == "network_congestion" and f.variant == "no_ecn" for f in spec.faults):
        spec.fabric.ecn = False  # ECN is a fabric setting: off for the whole trace
    for f in spec.faults:
        if f.cls == "link_degraded" and f.subtle and f.variant is None:
            f.variant = "flap"  # speeds come in steps; a subtle degradation is a rare flap
    cluster = Cluster.build(spec.cluster)
    conf = apply_confounders(spec, cluster)
    used = np.array([s.used for s in conf.setups])
    culprits = choose_culprits(spec, conf.touched)
    notes = []
    frng = rng_for(spec, STREAM_FAULTS)
    faults = []
    for j, (fs, cul) in enumerate(zip(spec.faults, culprits)):
        if fs.subtle and fs.strength is None:
            target = float(rng_for(spec, STREAM_FAULTS, 50 + j).uniform(*SUBTLE_POINTS))
            fs.strength = calibrate(spec, fs, cul, target, used)
            notes.append(f"{fs.cls} subtle: strength {fs.strength:.3g} for +{target:.1f} points of GPU idle")
        fault = make_fault(fs, spec, cul, frng)
        faults.append(fault)
        desc = f"{fs.cls}" + (f"/{fs.variant}" if fs.variant else "") + f" strength {fault.strength:.3g}"
        if is_localised(fs):
            desc += " on " + ", ".join(cluster.instances[i] for i in cul)
            if fs.cls in ("pfc_storm", "packet_loss", "link_degraded"):
                desc += " devices " + ",".join(cluster.nics[k].device for k in fault.nics)
            if fs.cls == "gpu_throttle":
                desc += " gpus " + ",".join(map(str, fault.gpus))
        notes.append(desc)
    for fault in faults:
        if isinstance(fault, LinkDegraded):
            for i in fault.culprits:
                for k in fault.nics:
                    conf.setups[i].downs.setdefault(k, []).extend(fault.downs)
    timings["setup"] = time.perf_counter() - t_start

    t = time.perf_counter()
    tl = Timeline.build(spec, baseline(spec, spec.fabric.ecn), conf.effects + faults)
    srng = rng_for(spec, STREAM_STEPS)
    sched = run_steps(spec, tl, used, conf.checkpoints, srng, -srng.uniform(0, spec.job.step_compute),
                      spec.duration)
    if conf.checkpoint_write and len(sched.stalls):
        mrng = rng_for(spec, STREAM_MGMT, 1)
        for s in conf.setups:  # every rank writes its shard to storage over the management NIC
            s.mgmt_tx.extend((a, b, mrng.uniform(0.85, 0.97) * spec.cluster.mgmt_speed) for a, b in sched.stalls)
            s.mgmt_tx.sort()
            _merge_overlaps(s.mgmt_tx)
    timings["steps"] = time.perf_counter() - t
    t = time.perf_counter()
    ticks = fast_ticks(spec, tl, sched)
    model = NodeModel(spec, cluster, tl, ticks, sched, conf.setups)
    nodes = []
    for i in range(spec.cluster.nodes):
        scr = plan_node(spec, rng_for(spec, STREAM_SCRAPES, i), conf.setups[i].restarts, conf.setups[i].window)
        nodes.append(model.node(i, scr, rng_for(spec, STREAM_NODES, i)))
    timings["counters"] = time.perf_counter() - t
    steps = len(sched.t0)
    head = [f"simulated {spec.cluster.nodes} nodes x {spec.cluster.gpus} GPUs x {spec.cluster.nics} RDMA NICs, "
            f"{steps} steps, GPU idle {100 * sched.idle_fraction():.1f}%"]
    if spec.command:
        head.append(spec.command)
    return Result(spec, cluster, faults, nodes, sched, conf.setups, timings, head + notes + conf.notes)


def _merge_overlaps(pieces: list[tuple[float, float, float]]) -> None:
    """Management NIC transfers that overlap share the link: the later one waits for the
    earlier (keeping its duration and rate), so the pieces stay disjoint."""
    out: list[tuple[float, float, float]] = []
    for a, b, r in sorted(pieces):
        if out and a < out[-1][1]:
            a, b = out[-1][1], out[-1][1] + (b - a)
        out.append((a, b, r))
    pieces[:] = out
