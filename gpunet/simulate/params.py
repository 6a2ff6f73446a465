"""What a simulated trace is made of: the cluster, the training job, the fabric, the scrape,
and the faults and confounders injected into it.

Everything is a plain dataclass so that a spec can be printed, compared and rebuilt; the
command-line syntax of faults (``pfc_storm:start=20m,dur=10m,nodes=1``) is parsed here too,
so that the CLI and the committed suite (suite.py) read specs the same way.

Units inside the simulator are SI: seconds, bytes, bytes per second. Only the parsers accept
the human forms (``20m``, ``200G``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from gpunet.contract import BOTTLENECK_CLASSES, DEFAULT_PORT

HOSTNAME_STYLES = ("node", "rack", "dgx", "ip")
CONFOUNDERS = ("checkpoint", "dcqcn_background", "spare_port", "unused_gpus", "missing_gpu_series",
               "exporter_restart", "node_join", "node_leave", "backup")
TRANSPORTS = ("rdma", "tcp")
LINK_LAYERS = ("ethernet", "infiniband")
ETHERNET_ONLY_CONFIG = ("ecn_off", "no_pfc_ecn", "pfc_extra", "trust", "link_pause", "bond")
WAIT_TRAFFIC = ("quiet", "trickle")


@dataclass
class ClusterParams:
    nodes: int = 16
    gpus: int = 8  # per node
    nics: int = 4  # RDMA NICs per node (the training fabric, one rail each)
    nic_speed: float = 200e9 / 8  # bytes/s of each RDMA NIC
    mgmt_speed: float = 25e9 / 8  # the management NIC (no RDMA): storage, backups, ssh
    hostname_style: str = "node"
    port: int = DEFAULT_PORT
    job: str = "gpunet"  # the `job` label value
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    gpu_clock_hz: float = 1.98e9  # SM clock of an unthrottled GPU under load

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 4096:
            raise ValueError("nodes must be 1..4096")
        if not 1 <= self.nics <= 8:
            raise ValueError("nics must be 1..8 (RDMA NICs per node)")
        if not 1 <= self.gpus <= 16:
            raise ValueError("gpus must be 1..16 (GPUs per node)")
        if not 1 <= self.port <= 65535:
            raise ValueError("port must be 1..65535")
        if not (self.nic_speed > 0 and self.mgmt_speed > 0):
            raise ValueError("link speeds must be above 0")
        if self.hostname_style not in HOSTNAME_STYLES:
            raise ValueError(f"hostname style must be one of {HOSTNAME_STYLES}")


@dataclass
class JobParams:
    """A synchronous data-parallel training step: input gap, forward+backward, ring all-reduce
    (partly overlapped with the backward pass), optimizer step."""
    step_compute: float = 0.9  # s of forward+backward on a healthy GPU
    compute_jitter: float = 0.015  # lognormal sigma of a node's compute time, per step
    input_gap: float = 0.02  # s the input pipeline makes the GPU wait at each step start
    gap_jitter: float = 0.25  # lognormal sigma of the gap
    optimizer: float = 0.03  # s of optimizer step after the all-reduce
    overlap: float = 0.7  # share of the all-reduce (and of the backward pass) that can overlap
    comm_ratio: float = 0.4  # healthy all-reduce time / compute time; sets the gradient size
    gradient_bytes: float | None = None  # explicit gradient size (overrides comm_ratio)
    transport: str = "rdma"  # "tcp": NCCL socket / gloo over the same NICs, no RoCE
    wait_traffic: str = "quiet"  # what ranks waiting for a straggler send: nothing, or a trickle
    trickle_ratio: float = 0.12  # fraction of line rate of that trickle
    data_read_rate: float = 40e6  # bytes/s each node reads from storage over the management NIC

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}")
        if self.wait_traffic not in WAIT_TRAFFIC:
            raise ValueError(f"wait traffic must be one of {WAIT_TRAFFIC}")
        # `not a <= x <= b` is also true for NaN.
        if not 0.01 <= self.step_compute <= 600:
            raise ValueError("step time must be 10ms..10m")
        if not 0 <= self.input_gap <= 600:
            raise ValueError("input gap must be 0..10m")
        if not 0 <= self.overlap <= 1:
            raise ValueError("overlap must be 0..1 (a share of the all-reduce)")
        if not 0 < self.comm_ratio <= 100:
            raise ValueError("comm ratio must be above 0 and at most 100")
        if self.gradient_bytes is not None and not 0 < self.gradient_bytes < 1e15:
            raise ValueError("gradient bytes must be above 0 (and below a petabyte)")


@dataclass
class FabricParams:
    """RoCE fabric with PFC on priority 3 and DCQCN. The healthy background: a steady trickle
    of ECN marks and CNPs during all-reduce bursts, and a rare received pause (micro-bursts).

    `link_layer="infiniband"`: credit-based flow control instead. No pause frames, no ECN marks
    or CNPs on the NIC; a port with data but no credit from its peer counts port_xmit_wait
    ticks: briefly in every burst when healthy, for a large share of its time when the
    switches are congested."""
    ecn: bool = True  # switches ECN-mark and NICs run DCQCN; False: PFC alone reacts to congestion
    link_layer: str = "ethernet"  # or "infiniband"
    # Share of a port's active time spent waiting for credit on a healthy fabric: the bursts'
    # incast fills a switch buffer for a moment.
    xmit_wait_background: float = 0.004
    # port_xmit_wait's tick. The HCA's own (vendor-specific); the diagnoser reads only rises
    # against the job's baseline, never the absolute count.
    xmit_wait_tick: float = 4e-9
    packet_bytes: int = 4096 + 58  # RoCE payload MTU + headers on the wire
    header_overhead: float = 58 / 4096  # wire bytes per payload byte, beyond the payload
    efficiency: float = 0.96  # fraction of line rate a healthy RDMA ring reaches
    tcp_efficiency: float = 0.8  # ... and a TCP (socket transport) ring
    tcp_mss: int = 8948  # MTU 9000 on the fabric
    mgmt_mss: int = 1448  # MTU 1500 on the management NIC
    ecn_background: float = 3e-5  # fraction of received packets CE-marked when healthy
    cnp_per_mark: float = 0.5  # CNPs the notification point sends per marked packet (coalescing)
    pause_rx_background: float = 0.02  # pause frames received per second of link activity, per NIC
    pause_tx_background: float = 0.002  # pause frames a healthy host sends, per second of activity
    retrans_background: float = 3e-5  # TCP RetransSegs / OutSegs of a healthy node
    pfc_priority: str = "3"

    def __post_init__(self) -> None:
        if self.link_layer not in LINK_LAYERS:
            raise ValueError(f"link layer must be one of {LINK_LAYERS}")

    @property
    def infiniband(self) -> bool:
        return self.link_layer == "infiniband"


@dataclass
class ScrapeParams:
    interval: float = 15.0
    jitter: float = 0.01  # s, stdev of a scrape's start around its slot
    missing: float = 0.002  # probability that one scrape of one target fails
    tick: float = 0.2  # the exporter's fast tick

    def __post_init__(self) -> None:
        if not 1 <= self.interval <= 600:
            raise ValueError("scrape interval must be 1s..10m")
        if not 0.01 <= self.tick <= self.interval / 2:
            raise ValueError("tick must be 10ms..half the scrape interval")
        if not 0 <= self.jitter <= self.interval / 4:
            raise ValueError("scrape jitter must be 0..a quarter of the scrape interval")
        if not 0 <= self.missing < 1:
            raise ValueError("missing scrapes must be a probability from 0 to below 1")


@dataclass
class FaultSpec:
    """One incident: a bottleneck class of docs/classes.md during [start, start+duration).

    nodes: how many culprits (localised classes); culprits: explicit node indices (0-based)
    instead; variant: class-specific flavour; strength: class-specific magnitude (None: the
    class default; see faults.py); subtle: choose the strength so that the fault adds only
    5-8 points of GPU idle."""
    cls: str
    start: float
    duration: float
    nodes: int = 1
    culprits: tuple[int, ...] | None = None
    variant: str | None = None
    strength: float | None = None
    subtle: bool = False
    nics: int | None = None  # NICs of a culprit affected (None: class default)
    gpus: int | None = None  # GPUs of a culprit affected (gpu_throttle)
    speed: float | None = None  # link_degraded downshift: the new speed, bytes/s

    def __post_init__(self) -> None:
        if self.cls not in BOTTLENECK_CLASSES:
            raise ValueError(f"unknown fault class {self.cls!r}; one of {BOTTLENECK_CLASSES}")
        if self.duration <= 0:
            raise ValueError("fault duration must be > 0")

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass
class ConfounderSpec:
    """Something that looks odd but is not an incident (never in labels.json)."""
    kind: str
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in CONFOUNDERS:
            raise ValueError(f"unknown confounder {self.kind!r}; one of {CONFOUNDERS}")


CONFIG_FAULTS = ("ecn_off", "no_pfc_ecn", "pfc_extra", "trust", "link_pause", "mtu", "nic_numa", "pcie_width",
                 "pcie_speed", "bond")
CONFIG_OPTIONS = {"culprits", "nics", "gpus", "point", "priority", "value", "direction", "mtu", "numa", "width",
                  "speed", "target", "mode", "hash", "down"}


@dataclass
class ConfigFaultSpec:
    """A deployment mistake on some nodes (configfacts.py): it changes what the exporter
    reports about the configuration, for the whole trace, and nothing else.
    culprits: node indices (0-based); params: the kind's options (nics=N: the first N rails,
    gpus=N: the first N GPUs, target=nic|gpu for PCIe, ...)."""
    kind: str
    culprits: tuple[int, ...]
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in CONFIG_FAULTS:
            raise ValueError(f"unknown config fault {self.kind!r}; one of {CONFIG_FAULTS}")
        unknown = set(self.params) - CONFIG_OPTIONS
        if unknown:
            raise ValueError(f"config fault {self.kind}: unknown option(s) {sorted(unknown)}; known: "
                             f"{sorted(CONFIG_OPTIONS)}")


@dataclass
class SimSpec:
    cluster: ClusterParams = field(default_factory=ClusterParams)
    job: JobParams = field(default_factory=JobParams)
    fabric: FabricParams = field(default_factory=FabricParams)
    scrape: ScrapeParams = field(default_factory=ScrapeParams)
    faults: list[FaultSpec] = field(default_factory=list)
    confounders: list[ConfounderSpec] = field(default_factory=list)
    config_faults: list[ConfigFaultSpec] = field(default_factory=list)
    duration: float = 3600.0
    start_time: float = 1767225600.0  # 2026-01-01T00:00:00Z
    seed: int = 1
    command: str = ""  # the command line that made it, for labels.json notes

    def __post_init__(self) -> None:
        for f in self.faults:
            if f.start < 0 or f.start >= self.duration:
                raise ValueError(f"fault {f.cls} starts outside the trace")
            if self.fabric.infiniband and (f.cls == "pfc_storm" or f.variant == "no_ecn"):
                raise ValueError(f"fault {f.cls}{':' + f.variant if f.variant else ''}: InfiniBand has no PFC or ECN")
        if self.fabric.infiniband and self.job.transport == "tcp":
            raise ValueError("an InfiniBand fabric carries the job over RDMA (IPoIB sockets are not modelled)")
        for x in self.config_faults:
            if self.fabric.infiniband and x.kind in ETHERNET_ONLY_CONFIG:
                raise ValueError(f"config fault {x.kind}: an Ethernet setting, InfiniBand has none")
            if any(not 0 <= i < self.cluster.nodes for i in x.culprits):
                raise ValueError(f"config fault {x.kind}: culprits {x.culprits} outside 0..{self.cluster.nodes - 1}")


# --- parsing the human forms --------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str | float) -> float:
    """'90s', '20m', '1h30m', '0.5h', '250ms', or a plain number of seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not 0 <= seconds < math.inf:  # also false for NaN
            raise ValueError(f"bad duration {text!r} (a finite number of seconds, 0 or more)")
        return seconds
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"bad duration {text!r} (e.g. 90s, 20m, 1h30m)")
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    return sum(float(n) * scale[u] for n, u in parts)


def parse_speed(text: str | float) -> float:
    """A link speed in bytes/s from '200G', '25Gb/s', '100Gbit', '400g', '10G', '1000M'."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([GgMmTt])(?:b|bit|bps|b/s|bit/s)?", text.strip())
    if not m:
        raise ValueError(f"bad link speed {text!r} (e.g. 200G)")
    bits = float(m.group(1)) * {"m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    if not 0 < bits < math.inf:
        raise ValueError(f"bad link speed {text!r} (above 0, e.g. 200G)")
    return bits / 8


def format_speed(bytes_per_second: float) -> str:
    gbit = bytes_per_second * 8 / 1e9
    return f"{gbit:g}G"


def _kv(text: str) -> tuple[str, dict[str, str]]:
    kind, _, rest = text.partition(":")
    out: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{text!r}: expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return kind.strip(), out


def _bool(v: str) -> bool:
    return v.lower() in ("1", "true", "yes", "on")


# --- numeric options of faults, confounders and config faults -------------------------------------
# Each is checked where it is parsed, before any work: a value out of its range would hang the
# simulator (checkpoint:every=0s) or make a trace of nonsense, found only hours later.
MAX_NODES = 4096  # ClusterParams' bound
MAX_MULTIPLIER = 100.0  # a strength that multiplies (gradient volume, compute time, input gap)
# Fault classes whose strength is a fraction of something left (see faults.py STRENGTH).
FRACTION_STRENGTH = ("network_congestion", "pfc_storm", "packet_loss", "link_degraded", "gpu_throttle")


def _within(option: str, text: str, value: float, low: float, high: float, shown: str) -> float:
    """`value` where low <= value <= high; else a ValueError naming option=text."""
    if not low <= value <= high:  # also true for NaN
        raise ValueError(f"{option}={text}: must be {shown}")
    return value


def _whole(option: str, text: str, low: int, high: int) -> int:
    """A whole number from low to high."""
    if not re.fullmatch(r"-?\d{1,9}", text):
        raise ValueError(f"{option}={text}: must be a whole number from {low} to {high}")
    return int(_within(option, text, int(text), low, high, f"{low} to {high}"))


def _real(option: str, text: str, low: float, high: float, shown: str, above: bool = False) -> float:
    """A finite number from low (excluded where `above`) to high."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{option}={text}: not a number") from None
    if above and value == low:
        raise ValueError(f"{option}={text}: must be {shown}")
    return _within(option, text, value, low, high, shown)


def _seconds(option: str, text: str, low: float, high: float, shown: str, above: bool = False) -> float:
    """A duration (90s, 20m, 1h) from low (excluded where `above`) to high seconds."""
    try:
        value = parse_duration(text)
    except ValueError as e:
        raise ValueError(f"{option}={text}: {e}") from None
    if above and value == low:
        raise ValueError(f"{option}={text}: must be {shown}")
    return _within(option, text, value, low, high, shown)


def _indices(option: str, text: str) -> tuple[int, ...]:
    """Node indices joined by + (3+17), each 0 to MAX_NODES - 1."""
    return tuple(_whole(option, part, 0, MAX_NODES - 1) for part in text.split("+"))


def _nodes(option: str, text: str) -> None:
    """A confounder's nodes: all, a count, or #I+J (indices)."""
    if text == "all":
        return
    if text.startswith("#"):
        _indices(option, text[1:])
        return
    _whole(option, text, 1, MAX_NODES)


def parse_fault(text: str, duration: float | None = None) -> FaultSpec:
    """``CLASS:start=20m,dur=10m,nodes=1[,culprits=3+17][,variant=V][,strength=X][,subtle=1]
    [,nics=N][,gpus=N][,speed=100G]``; dur=all (or omitted start/dur) covers the whole trace."""
    cls, kv = _kv(text)
    known = {"start", "dur", "end", "nodes", "culprits", "variant", "strength", "subtle", "nics", "gpus", "speed"}
    unknown = set(kv) - known
    if unknown:
        raise ValueError(f"{text!r}: unknown fault option(s) {sorted(unknown)}; known: {sorted(known)}")
    longest = duration if duration is not None else 30 * 86400.0  # the CLI's longest trace
    span = f"0 to {longest:g}s (the trace)"
    start = _seconds("start", kv.get("start", "0"), 0, longest, span)
    if kv.get("dur", "") == "all" or ("dur" not in kv and "end" not in kv):
        if duration is None:
            raise ValueError(f"{text!r}: dur=all needs the trace duration")
        dur = duration - start
    elif "end" in kv:
        dur = _seconds("end", kv["end"], start, longest, f"after start, up to {longest:g}s (the trace)") - start
    else:
        dur = _seconds("dur", kv["dur"], 0, 30 * 86400.0, "above 0, at most 30d", above=True)
    if duration is not None:
        dur = min(dur, duration - start)
    strength = None
    if "strength" in kv:
        fraction = cls in FRACTION_STRENGTH
        strength = _real("strength", kv["strength"], 0, 1 if fraction else MAX_MULTIPLIER,
                         "above 0, at most 1 (a fraction left)" if fraction else f"above 0, at most {MAX_MULTIPLIER:g}",
                         above=True)
    speed = None
    if "speed" in kv:
        try:
            speed = parse_speed(kv["speed"])
        except ValueError as e:
            raise ValueError(f"speed={kv['speed']}: {e}") from None
    return FaultSpec(
        cls=cls, start=start, duration=dur,
        nodes=_whole("nodes", kv["nodes"], 1, MAX_NODES) if "nodes" in kv else 1,
        culprits=_indices("culprits", kv["culprits"]) if "culprits" in kv else None,
        variant=kv.get("variant"),
        strength=strength,
        subtle=_bool(kv.get("subtle", "0")),
        nics=_whole("nics", kv["nics"], 1, 8) if "nics" in kv else None,
        gpus=_whole("gpus", kv["gpus"], 1, 16) if "gpus" in kv else None,
        speed=speed)


# Each confounder's options, with the check of its value (duration: the trace's length).
_CONFOUNDER_OPTIONS: dict[str, dict[str, Callable[[str, str, float], object]]] = {
    "checkpoint": {
        # A checkpoint every minute at most often: every=0s would loop for ever.
        "every": lambda o, v, d: _seconds(o, v, 60, 30 * 86400.0, "1m to 30d"),
        "dur": lambda o, v, d: _seconds(o, v, 0, 86400.0, "above 0, at most 1d", above=True),
        "first": lambda o, v, d: _seconds(o, v, 0, d, f"0 to {d:g}s (the trace)"),
        "variant": lambda o, v, d: _one_of(o, v, ("sync", "async")),
    },
    "dcqcn_background": {"level": lambda o, v, d: _real(o, v, 0, 1000, "above 0, at most 1000", above=True)},
    "unused_gpus": {"gpus": lambda o, v, d: _whole(o, v, 1, 16)},
    "exporter_restart": {
        "at": lambda o, v, d: _seconds(o, v, 0, d, f"0 to {d:g}s (the trace)"),
        "down": lambda o, v, d: _seconds(o, v, 0, d, f"above 0, at most {d:g}s (the trace)", above=True),
    },
    "node_join": {"at": lambda o, v, d: _seconds(o, v, 0, d, f"0 to {d:g}s (the trace)")},
    "node_leave": {"at": lambda o, v, d: _seconds(o, v, 0, d, f"0 to {d:g}s (the trace)")},
}
# Every confounder but these two falls on some nodes (nodes=N, all or #I+J).
_WHOLE_CLUSTER = ("checkpoint", "dcqcn_background")


def _one_of(option: str, text: str, allowed: tuple[str, ...]) -> str:
    if text not in allowed:
        raise ValueError(f"{option}={text}: one of {', '.join(allowed)}")
    return text


def parse_confounder(text: str, duration: float | None = None) -> ConfounderSpec:
    """``KIND:key=value,...``, e.g. ``checkpoint:every=20m,dur=2m``, ``spare_port:nodes=all``,
    ``unused_gpus:nodes=2,gpus=2``, ``missing_gpu_series:nodes=1``,
    ``exporter_restart:nodes=1,at=30m``, ``node_join:nodes=1,at=10m``,
    ``dcqcn_background:level=8``, ``backup:nodes=4``. Every option is checked here
    (`duration`: the trace's, the bound of a time in it)."""
    kind, kv = _kv(text)
    spec = ConfounderSpec(kind, kv)  # the kind checked first
    options = dict(_CONFOUNDER_OPTIONS.get(kind, {}))
    if kind not in _WHOLE_CLUSTER:
        options["nodes"] = lambda o, v, d: _nodes(o, v)
    unknown = set(kv) - set(options)
    if unknown:
        raise ValueError(f"{text!r}: unknown {kind} option(s) {sorted(unknown)}; known: {sorted(options) or 'none'}")
    for option, value in kv.items():
        options[option](option, value, 30 * 86400.0 if duration is None else duration)
    return spec


# Config faults' numeric options: (low, high, whole number).
_CONFIG_NUMBERS = {"nics": (1, 8, True), "gpus": (1, 16, True), "priority": (0, 7, True), "down": (0, 2, True),
                   "mtu": (68, 65535, True), "numa": (-1, 1023, True), "width": (1, 32, True),
                   "speed": (2.5, 128.0, False)}  # PCIe GT/s


def parse_config_fault(text: str) -> ConfigFaultSpec:
    """``KIND[:culprits=I+J,key=value,...]``, e.g. ``pcie_width:culprits=3,width=8,nics=1``,
    ``ecn_off:culprits=0+5,point=reaction``, ``bond:culprits=2,mode=active-backup``."""
    kind, kv = _kv(text)
    culprits = _indices("culprits", kv.pop("culprits", "0"))
    for option, (low, high, whole) in _CONFIG_NUMBERS.items():
        if option in kv:
            if whole:
                _whole(option, kv[option], low, high)  # type: ignore[arg-type]
            else:
                _real(option, kv[option], low, high, f"{low:g} to {high:g}")
    return ConfigFaultSpec(kind, culprits, kv)


def dataclass_diff(obj, default) -> dict:
    """The fields of `obj` that differ from `default` (for notes and the README)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if getattr(obj, f.name) != getattr(default, f.name)}
