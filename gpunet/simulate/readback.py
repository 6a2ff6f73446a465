"""Read a (small) trace back into arrays, and summarise what it shows per node and window.

Used by the simulator's tests and by `python -m gpunet.simulate.readback TRACE` to eyeball a
trace: it is a plain line parser for what TraceWriter writes, not the diagnoser's reader.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+) (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def read_trace(path: str | Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[np.ndarray, np.ndarray]]:
    """{(sample name, sorted labels): (timestamps, values)}."""
    opener = gzip.open if str(path).endswith(".gz") else open
    acc: dict = defaultdict(lambda: ([], []))
    with opener(path, "rt") as fh:
        for line in fh:
            if line.startswith("#"):
                continue
            m = _LINE.match(line.rstrip("\n"))
            if not m:
                raise ValueError(f"{path}: bad line {line!r}")
            labels = tuple(sorted(_LABEL.findall(m.group(3) or "")))
            ts, vs = acc[(m.group(1), labels)]
            ts.append(float(m.group(5)))
            vs.append(float(m.group(4)))
    return {k: (np.array(t), np.array(v)) for k, (t, v) in acc.items()}


def series_of(result) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[np.ndarray, np.ndarray]]:
    """The same mapping as read_trace, straight from a simulation Result (no file)."""
    out = {}
    job = result.spec.cluster.job
    for inst, node in zip(result.cluster.instances, result.nodes):
        for name, rows in node.series.items():
            for labels, values in rows:
                keep = ~np.isnan(values)
                if keep.any():
                    key = (name, tuple(sorted({**labels, "instance": inst, "job": job}.items())))
                    out[key] = (np.round(node.times[keep], 3), values[keep])
    return out


def increase(ts: np.ndarray, vs: np.ndarray, a: float, b: float) -> float:
    """Counter increase over [a, b) from the samples inside it, resets handled (as PromQL would)."""
    sel = (ts >= a) & (ts < b)
    v = vs[sel]
    if len(v) < 2:
        return 0.0
    d = np.diff(v)
    return float(np.where(d < 0, v[1:], d).sum())


def node_summary(series, a: float, b: float) -> dict[str, dict[str, float]]:
    """Per instance over [a, b): GPU idle share by state, pauses/s rx and tx, ECN marks/s,
    loss events/s, fabric throughput as a share of link speed, throttled share."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    speeds: dict[tuple[str, str], float] = {}
    for (name, labels), (_ts, vs) in series.items():
        if name == "gpunet_nic_link_speed_bytes_per_second":
            d = dict(labels)
            speeds[(d["instance"], d["device"])] = float(np.nanmax(vs))
    for (name, labels), (ts, vs) in series.items():
        d = dict(labels)
        inst = d.get("instance")
        span = b - a
        o = out[inst]
        if name == "gpunet_gpu_idle_seconds_total":
            o["idle_" + d["network_state"]] += increase(ts, vs, a, b)
        elif name == "gpunet_gpu_busy_seconds_total":
            o["busy"] += increase(ts, vs, a, b)
        elif name == "gpunet_nic_pfc_pause_frames_total":
            o["pause_" + d["direction"]] += increase(ts, vs, a, b) / span
        elif name == "gpunet_nic_ecn_marked_packets_total":
            o["ecn"] += increase(ts, vs, a, b) / span
        elif name == "gpunet_nic_cnp_received_total":
            o["cnp_rx"] += increase(ts, vs, a, b) / span
        elif name == "gpunet_nic_rdma_loss_events_total":
            o["loss_" + d["kind"]] += increase(ts, vs, a, b) / span
        elif name == "gpunet_tcp_retransmitted_segments_total":
            o["retrans"] += increase(ts, vs, a, b) / span
        elif name == "gpunet_gpu_throttled_seconds_total":
            o["throttled"] += increase(ts, vs, a, b)
        elif name == "gpunet_nic_carrier_changes_total":
            o["carrier"] += increase(ts, vs, a, b)
        elif name == "gpunet_nic_transmit_bytes_total" and d["device"].startswith("ens"):
            sp = speeds.get((inst, d["device"]), 0)
            if sp:
                o["tx_util_max"] = max(o["tx_util_max"], increase(ts, vs, a, b) / span / sp)
        elif name == "gpunet_nic_saturated_seconds_total" and d["device"].startswith("ens"):
            o["sat_s"] = max(o["sat_s"], increase(ts, vs, a, b) / span)
    for _inst, o in out.items():
        wall = o["busy"] + sum(v for k, v in o.items() if k.startswith("idle_"))
        if wall:
            for k in list(o):
                if k.startswith("idle_"):
                    o[k] = o[k] / wall
            o["idle"] = sum(v for k, v in o.items() if k.startswith("idle_"))
            o["throttled"] = o["throttled"] / wall
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0]
    series = read_trace(path)
    t_all = np.concatenate([ts for ts, _ in series.values()])
    t0, t1 = t_all.min(), t_all.max()
    labels_file = Path(str(path).replace(".om.gz", ".labels.json").replace(".om", ".labels.json"))
    windows = [("all", t0, t1)]
    if labels_file.exists():
        for inc in json.loads(labels_file.read_text())["incidents"]:
            windows.append((f"{inc['class']} {inc['nodes'][:3]}", inc["start"], inc["end"]))
            windows.append(("before", max(t0, inc["start"] - 600), inc["start"]))
    keys = ("idle", "idle_paused", "idle_saturated", "idle_active", "idle_quiet", "pause_receive", "pause_transmit",
            "ecn", "cnp_rx", "loss_out_of_sequence", "loss_sequence_error", "loss_ack_timeout", "retrans",
            "throttled", "carrier", "tx_util_max", "sat_s")
    for name, a, b in windows:
        s = node_summary(series, a, b)
        print(f"== {name}  [{a:.0f}, {b:.0f})")
        print("instance".ljust(24) + "".join(k[:9].rjust(10) for k in keys))
        for inst in sorted(s):
            print(inst[:24].ljust(24) + "".join(f"{s[inst].get(k, 0):10.3g}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
