"""Perturb a labelled trace: the same incidents under other noise, timing and damage.

    python bench/perturb.py IN.om.gz OUT.om.gz --perturbation NAME [--seed N]
    python bench/perturb.py --list

Reads any trace (docs/trace-format.md: committed, simulated, recorded), applies one
perturbation and writes the result through gpunet/trace.py's writer (each family once with
its `# TYPE` line, each series' samples together and oldest first, `# EOF`; gzip for .gz).
`IN.labels.json` is copied beside OUT as `OUT.labels.json` (evaluate.labels_of's stem rule)
with a line appended to its `notes` naming the perturbation and seed; the incidents are
unchanged. Same input, name and seed: same output bytes. Importable: `perturb(in_path,
out_path, name, seed)` and `PERTURBATIONS` (name -> one-line description).

Counters are the families whose `# TYPE` is counter (samples ending in `_total`); gauges are
only ever moved in time or dropped with their scrape. A counter's increment between two
consecutive samples is the difference, or, where the value falls (a reset), the value after
the fall (what accumulated since the restart); rebuilding a counter from new increments keeps
its first value and keeps every reset a reset (a redrawn post-reset value is capped below the
value before it). Every random draw comes from a stream of its own, named by the seed, the
perturbation and the series (or node) it draws for, so one series' draws do not depend on
what else the trace holds.

The rules, perturbation by perturbation:

poisson
    Every increment of every event counter (EVENT_FAMILIES: TCP retransmitted and sent
    segments; ECN marks; CNPs sent and received; PFC pause frames; RDMA loss events; receive,
    netdev receive and symbol errors; receive, transmit and netdev drops/discards) is redrawn
    as Poisson(increment), then the counter is re-accumulated. Carrier changes, link-downs,
    bytes, seconds, FEC and every other counter are not redrawn.

bg_x0.1, bg_x3, bg_x10
    The background of the background families (BACKGROUND_FAMILIES) is scaled: an
    increment becomes Poisson(factor x increment), except for increments whose interval
    (previous sample, sample] overlaps a labelled incident widened by 2 scrape intervals on
    either side, on the incident's culprit nodes (every node when it names none): those are
    left as they are. The factor is applied only where the scaled background can neither
    cause GPU idle by itself nor be a fault by itself:
      - TCP: retransmitted segments only, on nodes where TCP carries management traffic
        (its segments, at 1,448 bytes, under 5% of the bytes the node sent on its NICs);
        sent segments are left, so the retransmit ratio changes with the factor. Where the
        collectives run over TCP (NCCL's sockets), more retransmits would cost the job time:
        not a background, left as they are.
      - ECN marked packets, CNPs sent and received: everywhere outside the incidents.
      - CRC/symbol/receive errors (nic receive errors, netdev receive errors, symbol errors):
        everywhere outside the incidents.
      - PFC pause frames: only in the scrape intervals where the NIC's expected scaled rate
        (factor x its pause frames over all directions and priorities / interval) stays under
        PFC_CAP = 1 frame/s; in the others that NIC's pauses are left as they are.
      - RDMA loss events: only in the scrape intervals where the node's expected scaled rate
        (all its NICs and kinds) stays under LOSS_CAP = 0.05 events/s; elsewhere left.
    Nothing else is scaled (carrier changes, discards, bytes, GPU seconds...).

node_lognormal
    The same backgrounds, same incident exclusion and same caps, with a factor per (node,
    family) drawn lognormal (median 1, sigma 0.5) instead of one factor for all.

jitter
    Each (node, scrape) timestamp moves by uniform(-1, +1) s: one shift for every series of
    that node at that scrape, as one scrape of one exporter (a scrape is the node's samples
    within a quarter scrape interval of each other). The shift is clipped to 0.45 of the gap
    to the node's neighbouring scrapes, so every series stays strictly increasing in time
    (only matters under 5 s scrapes). Times are written to the millisecond.

missing
    2% of the (node, scrape) pairs are dropped, every series of that node at that scrape:
    per node floor(0.02 n + u) scrapes (u uniform in [0, 1)), never its first or last one and
    never two in a row (nor next to a scrape another perturbation dropped).

resets
    An exporter restart on a third of the nodes (rounded, at least one): at one scrape drawn
    between 20% and 80% of the node's scrapes, every counter of the node restarts from 0 (its
    later values minus its value at that scrape, until a reset it already had), and that
    scrape is missing (every series of the node).

all
    poisson, node_lognormal, resets, missing and jitter, in that order (each with its own
    streams of the same seed).

Labels are needed by bg_* and node_lognormal (and all), to leave incidents alone; the
others also take a trace without labels (and write none).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from diagnoser.sources.exposition import parse_series
from gpunet.contract import BY_NAME
from gpunet.trace import TraceWriter, format_value

# Event counters whose increments `poisson` redraws (family names: the sample name less _total).
EVENT_FAMILIES = frozenset({
    "gpunet_tcp_retransmitted_segments", "gpunet_tcp_sent_segments",
    "gpunet_nic_ecn_marked_packets", "gpunet_nic_cnp_sent", "gpunet_nic_cnp_received",
    "gpunet_nic_pfc_pause_frames", "gpunet_nic_rdma_loss_events",
    "gpunet_nic_receive_errors", "gpunet_nic_netdev_receive_errors", "gpunet_nic_symbol_errors",
    "gpunet_nic_receive_discards", "gpunet_nic_transmit_discards",
    "gpunet_nic_netdev_receive_drops", "gpunet_nic_netdev_transmit_drops",
})
PFC = "gpunet_nic_pfc_pause_frames"
LOSS = "gpunet_nic_rdma_loss_events"
PFC_CAP = 1.0  # pause frames per second per NIC: scaled background stays under it
LOSS_CAP = 0.05  # RDMA loss events per second per node
# Families whose background bg_* and node_lognormal scale, and what caps them: None (no
# cap), or (rate cap, the labels that with the node make the group the cap is summed over).
BACKGROUND_FAMILIES: dict[str, tuple[float, tuple[str, ...]] | None] = {
    "gpunet_tcp_retransmitted_segments": None,
    "gpunet_nic_ecn_marked_packets": None,
    "gpunet_nic_cnp_sent": None,
    "gpunet_nic_cnp_received": None,
    "gpunet_nic_receive_errors": None,
    "gpunet_nic_netdev_receive_errors": None,
    "gpunet_nic_symbol_errors": None,
    PFC: (PFC_CAP, ("device",)),
    LOSS: (LOSS_CAP, ()),
}
INCIDENT_MARGIN = 2  # scrape intervals either side of a labelled incident left alone
LOGNORMAL_SIGMA = 0.5
JITTER = 1.0  # seconds either way
MISSING = 0.02
RESET_SHARE = 1 / 3

PERTURBATIONS: dict[str, str] = {
    "poisson": "event counters' increments redrawn as Poisson(increment)",
    "bg_x0.1": "background of ECN/CNP/TCP-retransmit/error/PFC/RDMA-loss counters x0.1 outside incidents",
    "bg_x3": "background of ECN/CNP/TCP-retransmit/error/PFC/RDMA-loss counters x3 outside incidents (capped)",
    "bg_x10": "background of ECN/CNP/TCP-retransmit/error/PFC/RDMA-loss counters x10 outside incidents (capped)",
    "node_lognormal": "those backgrounds x a lognormal (sigma 0.5) factor per (node, family) outside incidents",
    "jitter": "each (node, scrape) timestamp moved by uniform +-1 s",
    "missing": "2% of (node, scrape) pairs dropped, never two in a row",
    "resets": "exporter restart on a third of the nodes: counters from 0, one scrape missing",
    "all": "poisson + node_lognormal + resets + missing + jitter",
}
BACKGROUND_FACTORS = {"bg_x0.1": 0.1, "bg_x3": 3.0, "bg_x10": 10.0}
NEEDS_LABELS = frozenset({*BACKGROUND_FACTORS, "node_lognormal", "all"})


# --- the trace in memory ------------------------------------------------------------------------

@dataclass
class _Series:
    name: str
    labels: dict[str, str]
    node: str
    counter: bool
    t: np.ndarray
    v: np.ndarray
    vtext: np.ndarray | None  # the values as read (bytes), None once they changed
    ttext: np.ndarray  # the timestamps as read
    idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # scrape of each sample on its node


@dataclass
class _Family:
    name: str
    type: str
    help: str | None
    series: list[_Series] = field(default_factory=list)


@dataclass
class _Node:
    scrapes: np.ndarray  # representative time of each scrape
    dropped: np.ndarray  # bool per scrape
    shift: np.ndarray | None = None  # seconds per scrape, once jittered


@dataclass
class _Trace:
    families: list[_Family]
    nodes: dict[str, _Node]
    interval: float
    incidents: list[dict]
    skipped: int = 0  # lines that were no sample


def _family_of(name: str, families: dict[str, _Family]) -> _Family:
    """The family a sample name belongs to (one declared by a `# TYPE` line, else the contract's)."""
    for fam in (name, name.removesuffix("_total")):
        if fam in families:
            return families[fam]
    spec = BY_NAME.get(name)
    type_ = spec.type if spec else "gauge"
    fam = name.removesuffix("_total") if type_ == "counter" else name
    return families.setdefault(fam, _Family(fam, type_, None))


def _load(path: Path) -> _Trace:
    """Read a trace whole: every family and series, values and times kept as their text too."""
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    families: dict[str, _Family] = {}
    current: _Family | None = None
    # (family, series key) -> (family, value chunks, time chunks): a series' samples stand together,
    # so each run of them is made a compact array when the next series starts.
    raw: dict[tuple[str, bytes], tuple[_Family, list[np.ndarray], list[np.ndarray]]] = {}
    entry: tuple[_Family, list[np.ndarray], list[np.ndarray]] | None = None
    key_b, values, stamps = b"", [], []
    skipped = 0
    helps: dict[str, str] = {}
    with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
        for line in f:
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            if line[0] == 35:  # '#'
                if line.startswith((b"# TYPE ", b"# HELP ")):
                    parts = line.decode("utf-8", "replace").split(" ", 3)
                    if len(parts) < 3:
                        continue
                    if line.startswith(b"# TYPE "):
                        fam = families.get(parts[2])
                        if fam is None:
                            type_ = parts[3].strip() if len(parts) > 3 else "gauge"
                            fam = families[parts[2]] = _Family(parts[2], type_, None)
                        current, key_b = fam, b""
                    else:
                        helps[parts[2]] = parts[3] if len(parts) > 3 else ""
                elif line.startswith(b"# EOF"):
                    break
                continue
            fields = line.rsplit(b" ", 2)
            if len(fields) != 3:
                skipped += 1
                continue
            if fields[0] != key_b:
                if entry is not None and values:
                    entry[1].append(np.array(values))
                    entry[2].append(np.array(stamps))
                values, stamps = [], []
                key_b = fields[0]
                name = key_b.split(b"{", 1)[0].decode("utf-8", "replace")
                fam = current if current is not None and name in (current.name, current.name + "_total") \
                    else _family_of(name, families)
                entry = raw.get((fam.name, key_b))
                if entry is None:
                    entry = raw[(fam.name, key_b)] = (fam, [], [])
            values.append(fields[1])
            stamps.append(fields[2])
    if entry is not None and values:
        entry[1].append(np.array(values))
        entry[2].append(np.array(stamps))
    for fam in families.values():
        fam.help = helps.get(fam.name)
    for (_, key), (fam, vchunks, tchunks) in raw.items():
        vtext, ttext = np.concatenate(vchunks), np.concatenate(tchunks)
        try:
            name, labels = parse_series(key.decode("utf-8", "replace"))
        except ValueError:
            skipped += len(vtext)
            continue
        try:
            v, t = vtext.astype(np.float64), ttext.astype(np.float64)
        except ValueError:  # a damaged number: parse one by one, dropping what is none
            v, t = (np.array([_number(x) for x in a.tolist()]) for a in (vtext, ttext))
        n = len(t)
        ok = np.isfinite(t)
        order = np.argsort(t[ok], kind="stable")
        v, t, vtext, ttext = v[ok][order], t[ok][order], vtext[ok][order], ttext[ok][order]
        if len(t) > 1:  # duplicate times: the first kept
            keep = np.concatenate(([True], np.diff(t) > 0))
            v, t, vtext, ttext = v[keep], t[keep], vtext[keep], ttext[keep]
        skipped += n - len(t)
        if len(t):
            counter = fam.type == "counter" and name.endswith("_total")
            fam.series.append(_Series(name, labels, labels.get("instance", ""), counter, t, v, vtext, ttext))
    trace = _Trace([f for f in families.values() if f.series], {}, 15.0, [], skipped)
    _scrapes(trace)
    return trace


def _number(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _scrapes(trace: _Trace) -> None:
    """Each node's scrapes: its sample times, those within a quarter scrape interval of each
    other taken as one scrape; each sample's scrape index."""
    gaps = [float(np.median(np.diff(s.t))) for f in trace.families for s in f.series if len(s.t) > 2]
    trace.interval = float(np.median(gaps)) if gaps else 15.0
    tol = 0.25 * trace.interval
    by_node: dict[str, list[_Series]] = {}
    for f in trace.families:
        for s in f.series:
            by_node.setdefault(s.node, []).append(s)
    for node, series in by_node.items():
        times = np.unique(np.concatenate([s.t for s in series]))
        new = np.concatenate(([True], np.diff(times) > tol))
        cluster = np.cumsum(new) - 1
        trace.nodes[node] = _Node(times[new], np.zeros(int(cluster[-1]) + 1, bool))
        for s in series:
            s.idx = cluster[np.searchsorted(times, s.t)]


# --- counters ------------------------------------------------------------------------------------

def _increments(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(increment before each sample from the second on, whether it is a reset)."""
    d = np.diff(v)
    reset = d < 0
    d[reset] = v[1:][reset]
    return d, reset


def _rebuild(first: float, inc: np.ndarray, reset: np.ndarray) -> np.ndarray:
    """A counter from its first value and increments; every reset stays a fall."""
    inc = inc.astype(np.float64)
    while True:
        full = np.concatenate(([0.0], inc))
        cs = np.cumsum(full)
        seg = np.concatenate(([0], np.cumsum(reset)))
        starts = np.concatenate(([0], np.flatnonzero(reset) + 1))
        offset = np.concatenate(([first], -cs[starts[1:] - 1]))
        v = cs + offset[seg]
        bad = np.flatnonzero(reset & (v[1:] >= v[:-1]) & (v[:-1] > 0))
        if not len(bad):
            return v
        k = int(bad[0])
        inc[k] = max(math.floor(v[k]) - 1.0, 0.0) if v[k] >= 1 else 0.0


def _set_values(s: _Series, v: np.ndarray) -> None:
    s.v, s.vtext = v, None


def _rng(seed: int, *names: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


def _key(s: _Series) -> str:
    return s.name + json.dumps(s.labels, sort_keys=True)


def _event_series(trace: _Trace, families) -> list[tuple[_Family, _Series]]:
    return [(f, s) for f in trace.families if f.name in families for s in f.series
            if s.counter and len(s.v) > 1 and np.isfinite(s.v).all()]


def _poisson(trace: _Trace, seed: int) -> None:
    for _, s in _event_series(trace, EVENT_FAMILIES):
        inc, reset = _increments(s.v)
        new = _rng(seed, "poisson", _key(s)).poisson(inc).astype(np.float64)
        _set_values(s, _rebuild(float(s.v[0]), new, reset))


def _protected(trace: _Trace, s: _Series) -> np.ndarray:
    """Per increment of s: whether its interval touches a labelled incident on its node."""
    out = np.zeros(len(s.t) - 1, bool)
    margin = INCIDENT_MARGIN * trace.interval
    for inc in trace.incidents:
        nodes = inc.get("nodes") or []
        if nodes and s.node not in nodes:
            continue
        out |= (s.t[:-1] < inc["end"] + margin) & (s.t[1:] > inc["start"] - margin)
    return out


TCP_RETRANS = "gpunet_tcp_retransmitted_segments"
SEGMENT_BYTES = 1448  # the least a TCP segment carries on a 1500-byte MTU
TCP_TRAINING_SHARE = 0.05


def _tcp_training_nodes(trace: _Trace) -> set[str]:
    """Nodes whose TCP segments carry a material share of the bytes they sent: their
    retransmits are the training traffic's, not a background."""
    sent: dict[str, float] = {}
    moved: dict[str, float] = {}
    for f in trace.families:
        totals = sent if f.name == "gpunet_tcp_sent_segments" else \
            moved if f.name == "gpunet_nic_transmit_bytes" else None
        if totals is None:
            continue
        for s in f.series:
            if s.counter and len(s.v) > 1 and np.isfinite(s.v).all():
                totals[s.node] = totals.get(s.node, 0.0) + float(_increments(s.v)[0].sum())
    return {n for n, segments in sent.items() if segments * SEGMENT_BYTES >= TCP_TRAINING_SHARE * moved.get(n, 0.0)}


def _background(trace: _Trace, seed: int, op: str, factor_of) -> None:
    """Scale the background families' increments outside incidents by factor_of(node, family)."""
    tcp_training = _tcp_training_nodes(trace)
    for f in trace.families:
        if f.name not in BACKGROUND_FAMILIES:
            continue
        cap = BACKGROUND_FAMILIES[f.name]
        series = [s for _, s in _event_series(trace, {f.name})]
        parts = []
        rates: dict[tuple, np.ndarray] = {}  # cap group (a node's NIC, or node) -> expected scaled rate per scrape
        for s in series:
            inc, reset = _increments(s.v)
            factor = factor_of(s.node, f.name)
            parts.append((s, inc, reset, factor))
            if cap is not None:
                group = (s.node, *(s.labels.get(k, "") for k in cap[1]))
                rate = rates.setdefault(group, np.zeros(len(trace.nodes[s.node].scrapes)))
                np.add.at(rate, s.idx[1:], factor * inc / np.diff(s.t))
        for s, inc, reset, factor in parts:
            if f.name == TCP_RETRANS and s.node in tcp_training:
                continue
            scale = ~_protected(trace, s)
            if cap is not None:
                scale &= rates[(s.node, *(s.labels.get(k, "") for k in cap[1]))][s.idx[1:]] < cap[0]
            if not scale.any():
                continue
            new = inc.astype(np.float64)
            new[scale] = _rng(seed, op, _key(s)).poisson(factor * inc[scale])
            _set_values(s, _rebuild(float(s.v[0]), new, reset))


def _lognormal_factors(seed: int):
    def factor(node: str, family: str) -> float:
        return float(np.exp(_rng(seed, "node_lognormal", node, family).normal(0.0, LOGNORMAL_SIGMA)))
    return factor


# --- scrapes -------------------------------------------------------------------------------------

def _nodes_of(trace: _Trace) -> list[str]:
    return sorted(n for n in trace.nodes if n)


def _resets(trace: _Trace, seed: int) -> None:
    nodes = [n for n in _nodes_of(trace) if len(trace.nodes[n].scrapes) >= 5]
    if not nodes:
        return
    rng = _rng(seed, "resets")
    chosen = rng.choice(len(nodes), size=max(1, round(len(nodes) * RESET_SHARE)), replace=False)
    at: dict[str, int] = {}
    for k in sorted(chosen.tolist()):
        node = nodes[k]
        n = len(trace.nodes[node].scrapes)
        at[node] = int(_rng(seed, "resets", node).integers(math.ceil(0.2 * n), math.floor(0.8 * n) + 1))
        trace.nodes[node].dropped[at[node]] = True
    for f in trace.families:
        for s in f.series:
            r = at.get(s.node)
            if r is None or not s.counter or not np.isfinite(s.v).all():
                continue
            before = np.flatnonzero(s.idx <= r)
            after = np.flatnonzero(s.idx > r)
            if not len(before) or not len(after):
                continue  # the series starts after the restart (or ends before it): nothing to restart
            base = s.v[before[-1]]
            first = int(after[0])
            falls = np.flatnonzero(s.v[first:] < s.v[first - 1:-1]) if first > 0 else np.zeros(0, np.int64)
            stop = first + int(falls[0]) if len(falls) else len(s.v)  # a reset of its own: from there as it was
            v = s.v.copy()
            v[first:stop] = np.maximum(v[first:stop] - base, 0.0)
            _set_values(s, v)


def _missing(trace: _Trace, seed: int) -> None:
    for node in _nodes_of(trace):
        nd = trace.nodes[node]
        n = len(nd.scrapes)
        rng = _rng(seed, "missing", node)
        want = math.floor(MISSING * n + rng.uniform())
        for j in rng.permutation(np.arange(1, n - 1)).tolist() if n > 2 else []:
            if want <= 0:
                break
            if nd.dropped[j - 1] or nd.dropped[j] or nd.dropped[j + 1]:
                continue
            nd.dropped[j] = True
            want -= 1


def _jitter(trace: _Trace, seed: int) -> None:
    for node in _nodes_of(trace):
        nd = trace.nodes[node]
        shift = _rng(seed, "jitter", node).uniform(-JITTER, JITTER, len(nd.scrapes))
        if len(nd.scrapes) > 1:
            gaps = np.diff(nd.scrapes)
            room = np.minimum(np.concatenate(([np.inf], gaps)), np.concatenate((gaps, [np.inf])))
            limit = np.minimum(JITTER, 0.45 * room)
            shift = np.clip(shift, -limit, limit)
        nd.shift = shift


# --- writing -------------------------------------------------------------------------------------

class _Writer(TraceWriter):
    """gpunet's writer, taking the families a trace holds as they are (a type outside the
    contract's gauge and counter too)."""

    def _check(self, sample_name: str) -> None:
        if self._current is None:
            raise ValueError(f"{sample_name}: call family() first")


def _formatted(v: np.ndarray) -> list[str]:
    if np.isfinite(v).all() and (v == np.round(v)).all() and (np.abs(v) < 1e15).all():
        return list(map(str, v.astype(np.int64).tolist()))
    return [format_value(x) for x in np.round(v, 6).tolist()]


def _write(trace: _Trace, path: Path) -> tuple[int, int]:
    """Write the trace; returns (samples written, samples dropped as out of order after shifts)."""
    disorder = 0
    with _Writer(path) as w:
        for f in trace.families:
            w.family(f.name, f.type, f.help if f.help is not None else "")
            for s in f.series:
                nd = trace.nodes[s.node]
                keep = ~nd.dropped[s.idx]
                if not keep.any():
                    continue
                values = (s.vtext[keep].astype(str).tolist() if s.vtext is not None else _formatted(s.v[keep]))
                if nd.shift is None:
                    suffixes = [f" {x}\n" for x in s.ttext[keep].astype(str).tolist()]
                else:
                    t = np.round(s.t[keep] + nd.shift[s.idx[keep]], 3)
                    ok = np.concatenate(([True], np.diff(t) > 0))
                    while not ok.all():  # cannot happen with scrapes over 5 ms apart: a guard
                        disorder += int((~ok).sum())
                        values = [x for x, o in zip(values, ok.tolist()) if o]
                        t = t[ok]
                        ok = np.concatenate(([True], np.diff(t) > 0))
                    suffixes = [f" {x:.3f}\n" for x in t.tolist()]
                w.series_formatted(s.name, s.labels, values, suffixes)
        return w.samples, disorder


# --- the entry points -------------------------------------------------------------------------------

def labels_path(trace: str | Path) -> Path:
    """NAME.labels.json beside NAME.om.gz (diagnoser.evaluate.labels_of's rule)."""
    return Path(str(trace).removesuffix(".om.gz").removesuffix(".om") + ".labels.json")


def perturb(in_path: str | Path, out_path: str | Path, name: str, seed: int = 0) -> dict:
    """Apply perturbation `name` to the trace at in_path, write out_path (and its labels
    beside it where in_path has labels). Returns a few facts about what was done."""
    if name not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {name!r}: one of {', '.join(PERTURBATIONS)}")
    if seed < 0:
        raise ValueError("the seed must be >= 0")
    in_path, out_path = Path(in_path), Path(out_path)
    labels_in = labels_path(in_path)
    labels = json.loads(labels_in.read_text()) if labels_in.exists() else None
    if labels is None and name in NEEDS_LABELS:
        raise FileNotFoundError(f"{labels_in}: {name} leaves labelled incidents alone, and needs their labels")
    trace = _load(in_path)
    trace.incidents = (labels or {}).get("incidents", [])
    steps = ["poisson", "node_lognormal", "resets", "missing", "jitter"] if name == "all" else [name]
    for step in steps:
        if step == "poisson":
            _poisson(trace, seed)
        elif step in BACKGROUND_FACTORS:
            factor = BACKGROUND_FACTORS[step]
            _background(trace, seed, step, lambda node, family: factor)
        elif step == "node_lognormal":
            _background(trace, seed, step, _lognormal_factors(seed))
        elif step == "resets":
            _resets(trace, seed)
        elif step == "missing":
            _missing(trace, seed)
        elif step == "jitter":
            _jitter(trace, seed)
    samples, disorder = _write(trace, out_path)
    if labels is not None:
        note = f"perturbed by bench/perturb.py: {name} (seed {seed}): {PERTURBATIONS[name]}"
        labels["notes"] = (labels.get("notes") or "").rstrip() + ("\n" if labels.get("notes") else "") + note
        labels_path(out_path).write_text(json.dumps(labels, indent=1) + "\n")
    return {"samples": samples, "series": sum(len(f.series) for f in trace.families),
            "dropped_scrapes": int(sum(nd.dropped.sum() for nd in trace.nodes.values())),
            "skipped_lines": trace.skipped, "out_of_order": disorder, "interval": trace.interval}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", nargs="?", help="a trace (.om or .om.gz), labels beside it")
    p.add_argument("output", nargs="?", help="where to write the perturbed trace (.gz: compressed)")
    p.add_argument("--perturbation", "-p", choices=list(PERTURBATIONS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="name and describe every perturbation")
    args = p.parse_args(argv)
    if args.list:
        for name, what in PERTURBATIONS.items():
            print(f"{name:15} {what}")
        return 0
    if not (args.input and args.output and args.perturbation):
        p.error("give IN OUT --perturbation NAME (or --list)")
    started = time.perf_counter()
    facts = perturb(args.input, args.output, args.perturbation, args.seed)
    print(f"{args.output}: {args.perturbation} (seed {args.seed}), {facts['series']} series, "
          f"{facts['samples']} samples, {facts['dropped_scrapes']} (node, scrape) pairs dropped, "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    if facts["skipped_lines"]:
        print(f"warning: {facts['skipped_lines']} lines of the input were no readable sample: left out",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
