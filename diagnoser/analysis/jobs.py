"""The cluster cut into jobs: peer comparison only means something inside one job.

A job is the set of nodes where one workload holds GPUs (gpunet_gpu_workload_info, from
Kubernetes, Slurm or the process table); a node shared by two workloads belongs to the one
holding most of its GPU time, and that is noted. Nodes without attribution are grouped by
behaviour: the ranks of one synchronous job wait for the same collectives, so whatever
slows the job (a fault, a checkpoint, an input stall, a straggler) moves every node's GPU
busy fraction at the same time, up or down. Nodes of another job do not follow.

A steady healthy job gives no such structure: at 15-60 s scrapes its nodes' busy fractions
differ by independent noise. Weak correlation is therefore never a reason to split; only
a group of nodes that move together far beyond chance (|r| well above the 3/sqrt(n) of
independent series), against other nodes that do not follow it at all, is. Groups stay
apart only if their profiles are nearly independent and neither's nodes change level at
the other's events. Where there is no clear structure, all unattributed nodes are one group.

Each job's Frame (`subset`) is the cluster frame cut to its nodes and time, so features,
classify and incidents run on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from diagnoser.analysis.phases import Change
from diagnoser.model.frame import FINE, Frame
from gpunet import contract as c
from gpunet.words import plural

UNATTRIBUTED = "unattributed"
# Behaviour grouping. Independent series of n points correlate by chance with |r| of about
# 1/sqrt(n): a node follows a group's profile when |r| exceeds NOISE_SIGMAS of that.
NOISE_SIGMAS = 3.0
# Nodes move together (one job's events) when |r| is at least this, and twice chance.
STRONG_R = 0.75
MIN_POINTS = 12  # fewer fine windows than this: too short to tell behaviour apart
MIN_GROUP = 2  # a group found by behaviour has at least this many nodes
MIN_CORE = 3  # ... and its core of nodes moving together at least this many (two may agree by chance)
# Two sets of nodes are two jobs only when their profiles are nearly independent: the
# correlation of the profiles, corrected for each set's own noise (cross |r| /
# sqrt(within_a x within_b)), below this. Inside one job the culprit's neighbours and the
# rest of the ring, or rank 0 that writes the checkpoint, move somewhat differently (0.5-0.8
# measured), but never independently. Two jobs whose slowdowns coincide in time are
# therefore one group by behaviour: only workload information tells them apart.
INDEPENDENT = 0.35
# ... or strongly opposed (a set of stragglers against the rest of their job). Two jobs slow
# at different times are opposed too, but less: -0.5 for two slow thirds of the window.
OPPOSED = -0.8
# A node responds to a group's events when its level inside them differs from outside by
# RESPONSE_SE standard errors (of a median: 1.25 sigma / sqrt(n)); groups merge when
# RESPONDING_SHARE of one's nodes respond to the other's events.
RESPONSE_SE = 3.0
RESPONDING_SHARE = 1 / 3


@dataclass
class Job:
    name: str
    instances: list[str]
    start: float
    end: float
    how: str  # the workload source (kubernetes, slurm, process), or "behaviour"
    notes: list[str] = field(default_factory=list)
    # Where the job started, or a node joined or left it, inside the range (its workload
    # series tell): the phases that follow are judged apart (analysis/phases.py).
    changes: list[Change] = field(default_factory=list)


def split(frame: Frame) -> list[Job]:
    """The jobs of the frame: attributed ones first (by name), then behaviour groups."""
    jobs, owned, notes = _attributed(frame)
    rest = [i for i in frame.instances if i not in owned]
    if rest and jobs:
        rest = _attach(frame, jobs, rest)
    if rest:
        groups = by_behaviour(frame, rest)
        for k, group in enumerate(groups, 1):
            name = UNATTRIBUTED if len(groups) == 1 else f"{UNATTRIBUTED}-{k}"
            why = [] if not jobs and len(groups) == 1 else [
                f"{plural(len(group), 'node')} without workload information, grouped by how their GPU activity moves"]
            jobs.append(Job(name, group, frame.start, frame.end, "behaviour", why))
    if jobs and notes:
        jobs[0].notes.extend(notes)
    return jobs


def _attributed(frame: Frame) -> tuple[list[Job], set[str], list[str]]:
    wl = frame.workloads
    if wl is None or not len(wl):
        return [], set(), []
    wl = wl[wl["instance"].isin(frame.instances) & names_a_job(wl)]
    if not len(wl):
        return [], set(), []
    # The same workload name in two namespaces is two jobs.
    key = wl["namespace"].fillna("") + "/" + wl["workload"].fillna("")
    names = {k: k.split("/", 1)[1] or k for k in key.unique()}
    clash = pd.Series(list(names.values())).duplicated(keep=False)
    for k, dup in zip(list(names), clash):
        if dup or not names[k]:
            names[k] = k.strip("/") or "(no name)"
    wl = wl.assign(job=key.map(names))
    held = wl.groupby(["instance", "job"])["window"].agg(["size", "min", "max"])  # GPU-windows, first, last
    owner: dict[str, list[str]] = {}
    notes = []
    for instance, per_job in held.groupby(level="instance"):
        per_job = per_job.droplevel("instance").sort_values("size", ascending=False, kind="stable")
        owner[instance] = [str(per_job.index[0])]
        for name, row in per_job.iloc[1:].iterrows():
            # One job after another on the node (a job ended, the next started): the node
            # belongs to each in its own time. Two at once: to the one holding most of it.
            apart = all(row["min"] > other["max"] + frame.step / 2 or row["max"] < other["min"] - frame.step / 2
                        for other_name, other in per_job.iterrows() if other_name in owner[instance])
            if apart:
                owner[instance].append(str(name))
            else:
                notes.append(f"{instance} is shared: {per_job.index[0]} holds most of its GPU time "
                             f"({per_job['size'].iloc[0]} GPU-windows) and the node is diagnosed with it; also "
                             f"{name} ({row['size']})")
    source = wl.groupby("job")["source"].agg(lambda s: ",".join(sorted(set(s) - {""})) or "workload")
    jobs = []
    for name in sorted({j for names in owner.values() for j in names}):
        nodes = sorted(i for i, names in owner.items() if name in names)
        w = wl.loc[(wl["job"] == name) & wl["instance"].isin(nodes), ["instance", "window"]]
        start, end = max(frame.start, float(w["window"].min())), min(frame.end, float(w["window"].max()) + frame.step)
        jobs.append(Job(name, nodes, start, end, source[name], changes=_changes(frame, w)))
    return jobs, set(owner), notes


def _changes(frame: Frame, held: pd.DataFrame) -> list[Change]:
    """The job's start and end inside the range (its workload absent from the range's first
    or last window), and the nodes that joined after it started or left before it ended
    (`held`: the job's (instance, window) rows)."""
    span = held.groupby("instance")["window"].agg(["min", "max"])
    first, last = float(span["min"].min()), float(span["max"].max())
    out = [Change(first, "the job started")] if len(frame.windows) and first > float(frame.windows[0]) else []
    out += [Change(float(t), f"{i} joined") for i, t in span["min"].items() if t > first + frame.step]
    out += [Change(float(t) + frame.step, f"{i} left") for i, t in span["max"].items() if t < last - frame.step]
    if len(frame.windows) and last < float(frame.windows[-1]):
        out.append(Change(last + frame.step, "the job ended", before=True))
    return sorted(out, key=lambda c: c.at)


def _attach(frame: Frame, jobs: list[Job], rest: list[str]) -> list[str]:
    """Nodes without attribution that move with an attributed job join it: a node whose
    kubelet socket or Slurm folder failed is still in its job, and it is often the faulty
    one. A node follows a job when its busy profile correlates (|r|: a straggler moves
    against its peers) with the job's first principal component about as well as the job's
    own nodes do (half their mean |r|, the midpoint between a member and an outsider) and
    far beyond chance. Returns the nodes that follow no job."""
    prof = busy_profile(frame, frame.instances)
    if not len(prof):
        return rest
    x = prof[(prof.notna().sum(axis=1) >= MIN_POINTS) & (prof.std(axis=1) > 1e-6)]
    z = x.sub(x.mean(axis=1), axis=0).div(x.std(axis=1), axis=0)
    profiles = []
    for job in jobs:
        members = [i for i in job.instances if i in z.index]
        if len(members) < MIN_CORE:
            continue
        mz = z.loc[members].to_numpy()
        _, _, vt = np.linalg.svd(np.nan_to_num(mz), full_matrices=False)
        pc = vt[0] / max(float(np.std(vt[0])), 1e-12)
        own = np.abs(np.nan_to_num(mz) @ pc) / np.maximum(np.isfinite(mz).sum(axis=1), 1)
        profiles.append((job, pc, float(own.mean())))
    left = []
    for node in rest:
        if node not in z.index or not profiles:
            left.append(node)
            continue
        row = z.loc[node].to_numpy()
        n = int(np.isfinite(row).sum())
        follow = [abs(float(np.nan_to_num(row) @ pc)) / max(n, 1) for _, pc, _ in profiles]
        best = int(np.argmax(follow))
        job, _, signal = profiles[best]
        if follow[best] >= max(0.5 * signal, NOISE_SIGMAS / np.sqrt(max(n, 1))):
            job.instances = sorted(job.instances + [node])
            job.notes.append(f"{node} has no workload information; it moves with {job.name}'s nodes "
                             f"(|r| {follow[best]:.2f} with their common profile) and is diagnosed with them")
        else:
            left.append(node)
    return left


def names_a_job(wl: pd.DataFrame) -> pd.Series:
    """Which workload rows name a job (gpunet.contract.workload_names_a_job); nodes known
    only by the exporter's last resorts are grouped by behaviour."""
    return pd.Series([c.workload_names_a_job(s, n) for s, n in zip(wl["source"].fillna(""), wl["namespace"].fillna(""))],
                     index=wl.index, dtype=bool)


def busy_profile(frame: Frame, instances: list[str]) -> pd.DataFrame:
    """Busy fraction of each node's GPU time (rows: instances, columns: windows), at the
    finest grain the source gives."""
    src = frame.node_fine if len(frame.node_fine) else frame.node
    if not len(src) or "busy" not in src:
        return pd.DataFrame()
    src = src[src.index.get_level_values("instance").isin(instances)]
    idle = src[[c for c in src.columns if c.startswith("idle_") and c[5:] in ("paused", "saturated", "active",
                                                                               "quiet")]].sum(axis=1, min_count=1)
    total = src["busy"] + idle
    with np.errstate(all="ignore"):
        frac = (src["busy"] / total).where(total > 0)
    return frac.unstack("window")


def by_behaviour(frame: Frame, instances: list[str]) -> list[list[str]]:
    """Groups of nodes whose GPU activity rises and falls together; one group when there
    is no clear structure."""
    instances = sorted(instances)
    prof = busy_profile(frame, instances)
    if len(prof) < 2 * MIN_CORE:
        return [instances]
    x = prof[prof.notna().sum(axis=1) >= MIN_POINTS]
    sd = x.std(axis=1)
    x = x[sd > 1e-6]
    if len(x) < 2 * MIN_CORE:
        return [instances]
    names = list(x.index)
    m = x.sub(x.mean(axis=1), axis=0).div(x.std(axis=1), axis=0).to_numpy()
    seen = np.isfinite(m).astype(float)
    m = np.nan_to_num(m)
    both = np.maximum(seen @ seen.T, 1.0)  # windows two nodes both report (nodes join and leave)
    # Pearson r over the windows both report. Cores are nodes that move in the same sense; a
    # straggler, which moves against its peers, still follows their profile (|r|, below).
    r = np.clip(m @ m.T / both, -1.0, 1.0)
    r[both < MIN_POINTS] = 0.0
    strong = np.maximum(STRONG_R, NOISE_SIGMAS / np.sqrt(both))
    cores = _join(r, _cores(r, strong))
    if not cores:
        return [instances]
    # Each core's profile: the first principal component of its members (which may move in
    # opposite senses), and how much of a member's variance it explains (mean |r| inside).
    profiles, signal = [], []
    for core in cores:
        _, _, vt = np.linalg.svd(m[core], full_matrices=False)
        profiles.append(vt[0] / max(np.std(vt[0]), 1e-12))
        block = r[np.ix_(core, core)]
        signal.append(float(block[~np.eye(len(core), dtype=bool)].mean()))
    n_own = seen.sum(axis=1)
    follow = np.abs(m @ np.vstack(profiles).T) / n_own[:, None]  # |r| with each core's profile
    assigned = {k: i for i, core in enumerate(cores) for k in core}
    residual = []
    for k in range(len(names)):
        if k in assigned:
            continue
        best = int(np.argmax(follow[k]))
        # A node of that job follows its profile with |r| near sqrt(signal), a node of another
        # job near 0: the midpoint tells them apart (noise of 1/sqrt(n) is far smaller).
        if follow[k, best] < 0.5 * np.sqrt(signal[best]):
            residual.append(k)
        else:
            assigned[k] = best
    groups = [[k for k, g in assigned.items() if g == i] for i in range(len(cores))]
    if len(residual) >= MIN_GROUP:
        groups.append(residual)
    else:
        for k in residual:  # a lone node is no job to name: it stays with the group it follows most
            groups[int(np.argmax(follow[k]))].append(k)
    groups = [[names[k] for k in g] for g in _merge_responding(np.where(seen > 0, m, np.nan), groups)]
    if len(groups) == 1:
        return [instances]
    # Nodes too short-lived or too flat to place join the group they share the most windows with.
    placed = {i for g in groups for i in g}
    for i in instances:
        if i not in placed:
            groups[_closest(prof, i, groups)].append(i)
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])


def _responds(z: np.ndarray, profile: np.ndarray) -> np.ndarray:
    """Which nodes (rows of z, standardised, NaN where unseen) change level when the profile
    has its events (windows where it departs from its median by a standard deviation): the
    difference of the node's medians inside those windows and outside them (leaving out the
    node's own events, which belong to its own job's timeline), against 3 standard errors.
    A node of another job does not move then, unless its own events coincide."""
    event = np.abs(profile - np.median(profile)) >= 1.0
    out = np.zeros(len(z), dtype=bool)
    if event.sum() < 3 or (~event).sum() < 3:
        return out
    for k, row in enumerate(z):
        seen = np.isfinite(row)
        own = np.abs(row - np.nanmedian(row)) >= 1.0
        a, b = row[event & seen], row[~event & ~own & seen]
        if len(a) >= 3 and len(b) >= 3:
            out[k] = abs(np.median(a) - np.median(b)) >= RESPONSE_SE * 1.25 * np.sqrt(1 / len(a) + 1 / len(b))
    return out


def _merge_responding(z: np.ndarray, groups: list[list[int]]) -> list[list[int]]:
    """Groups are one job when a third of one's nodes change level at the other's events (the
    culprit's ring neighbours and the rest of its job stall at different moments, together)."""
    groups = [g for g in groups if g]
    merged = True
    while merged and len(groups) > 1:
        merged = False
        responds = []
        for g in groups:
            _, _, vt = np.linalg.svd(np.nan_to_num(z[g]), full_matrices=False)
            responds.append(_responds(z, vt[0] / max(float(np.std(vt[0])), 1e-12)))
        for i in range(len(groups)):
            for j in range(len(groups)):
                if i != j and responds[j][groups[i]].mean() >= RESPONDING_SHARE:
                    groups[min(i, j)] = groups[i] + groups[j]
                    groups.pop(max(i, j))
                    merged = True
                    break
            if merged:
                break
    return groups


def _cores(r: np.ndarray, strong: np.ndarray) -> list[list[int]]:
    """Groups of at least MIN_GROUP nodes whose average pairwise |r| is at least `strong`
    (average linkage: one spurious pair cannot chain two jobs together)."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    # Distance 1 - |r|, scaled so that the pair's own threshold (stronger for pairs that share
    # few windows) sits at the common cut.
    d = np.clip((1.0 - np.maximum(r, 0.0)) * (1.0 - STRONG_R) / np.maximum(1.0 - strong, 1e-3), 0.0, 10.0)
    np.fill_diagonal(d, 0.0)
    labels = fcluster(linkage(squareform(d, checks=False), method="average"), t=1.0 - STRONG_R,
                      criterion="distance")
    cores = [list(np.flatnonzero(labels == k)) for k in np.unique(labels)]
    return [c for c in cores if len(c) >= MIN_CORE]


def _profile_r(r: np.ndarray, a: list[int], b: list[int]) -> float:
    """Correlation of two sets' common profiles: cross r / sqrt(within_a x within_b)."""
    def within(ix: list[int]) -> float:
        block = r[np.ix_(ix, ix)]
        return float(block[~np.eye(len(ix), dtype=bool)].mean())

    return float(r[np.ix_(a, b)].mean()) / np.sqrt(max(within(a) * within(b), 1e-12))


def _join(r: np.ndarray, cores: list[list[int]]) -> list[list[int]]:
    """Cores whose profiles are not independent are one job."""
    cores = [list(c) for c in cores]
    merged = True
    while merged and len(cores) > 1:
        merged = False
        for i in range(len(cores)):
            for j in range(i + 1, len(cores)):
                rho = _profile_r(r, cores[i], cores[j])
                if rho >= INDEPENDENT or rho <= OPPOSED:
                    cores[i] = cores[i] + cores.pop(j)
                    merged = True
                    break
            if merged:
                break
    return cores


def _closest(prof: pd.DataFrame, instance: str, groups: list[list[str]]) -> int:
    if instance not in prof.index:
        return int(np.argmax([len(g) for g in groups]))
    mine = prof.loc[instance].notna()
    overlap = [int((prof.loc[[i for i in g if i in prof.index]].notna() & mine).any(axis=0).sum()) for g in groups]
    return int(np.argmax(overlap))


def subset(frame: Frame, instances: list[str], start: float | None = None, end: float | None = None) -> Frame:
    """The frame of one job: its nodes, from start to end (windows that overlap), with the
    cluster-level columns (fine grain, peers' link speed) recomputed from those nodes only."""
    start = frame.start if start is None else start
    end = frame.end if end is None else end
    keep_w = (frame.windows + frame.step > start + 1e-6) & (frame.windows < end - 1e-6)
    if not keep_w.any():
        keep_w[:] = True
    windows = frame.windows[keep_w]
    w0, w1 = float(windows[0]), float(windows[-1]) + frame.step
    nodes = set(instances)

    def cut(df: pd.DataFrame) -> pd.DataFrame:
        if not len(df):
            return df
        idx = df.index
        return df[idx.get_level_values("instance").isin(nodes) & idx.get_level_values("window").isin(windows)]

    node, nic, gpu = cut(frame.node), cut(frame.nic), cut(frame.gpu)
    node_fine = pd.DataFrame()
    fine = pd.DataFrame()
    if len(frame.node_fine):
        nf = frame.node_fine
        t = nf.index.get_level_values("window")
        node_fine = nf[nf.index.get_level_values("instance").isin(nodes) & (t >= w0 - 1e-6) & (t < w1 - 1e-6)]
        if len(node_fine) and frame.has_gpus:
            fine = node_fine.groupby(level="window").sum(min_count=1)
            fine = fine.reindex(np.linspace(w0, w1, len(windows) * FINE + 1)[:-1], method="nearest")
            fine.index.name = "window"
    speed = _speed_median(frame, nic, node, windows, keep_w)
    wl = frame.workloads
    if wl is not None and len(wl):
        wl = wl[wl["instance"].isin(nodes) & wl["window"].isin(windows)]
    has_gpus = bool(len(node)) and bool(np.nansum(node["gpus"].to_numpy()) > 0)
    return replace(frame, start=max(start, frame.start), end=min(end, frame.end), windows=windows, node=node, nic=nic,
                   gpu=gpu, has_gpus=has_gpus, fine=fine, fabric_speed_median=speed, warnings=[], workloads=wl,
                   node_fine=node_fine, gpu_seconds=None, without_instance=0)  # those are the cluster's


def _speed_median(frame: Frame, nic: pd.DataFrame, node: pd.DataFrame, windows: np.ndarray,
                  keep_w: np.ndarray) -> np.ndarray | None:
    """Median fabric link speed of the job's own NICs per window (its peers): from the NIC
    table where it holds every NIC (a trace), else from each node's capacity per fabric NIC."""
    out = np.full(len(windows), np.nan)
    index = pd.Index(windows)
    fab = nic[nic["fabric"].astype(bool)] if len(nic) else nic
    per_node_nics = node["fabric_nics"].groupby(level="instance").max() if len(node) else pd.Series(dtype=float)
    full = len(fab) and fab.index.get_level_values("instance").nunique() >= (per_node_nics > 0).sum()
    if full:
        med = fab["speed"].groupby(level="window").median()
    elif len(node):
        with np.errstate(all="ignore"):
            per_nic = node["capacity"] / (node["fabric_nics"] * frame.step)
        med = per_nic.groupby(level="window").median()
    else:
        med = pd.Series(dtype=float)
    got = med.reindex(index).to_numpy(dtype=float)
    out[np.isfinite(got)] = got[np.isfinite(got)]
    if frame.fabric_speed_median is not None:
        fallback = np.asarray(frame.fabric_speed_median)[keep_w]
        out = np.where(np.isfinite(out), out, fallback)
    return out
