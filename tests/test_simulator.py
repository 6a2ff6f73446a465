"""The cluster simulator (gpunet/simulate): invariants of what it counts, each fault's
signature inside its window and not outside, the trace format, the ground truth, and the
committed replay_data set.

Property tests are seeded randomized loops over small clusters (each simulation takes
~0.1 s), so they are reproducible and fast.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gpunet import contract as C
from gpunet.simulate.cli import build_parser, generate, main, spec_from_args
from gpunet.simulate.cluster import hostname
from gpunet.simulate.engine import simulate
from gpunet.simulate.output import FAMILIES
from gpunet.simulate.params import parse_duration, parse_fault, parse_speed
from gpunet.simulate.readback import node_summary, read_trace, series_of
from gpunet.simulate.suite import COMMITTED, evaluation_entries

REPO = Path(__file__).resolve().parent.parent
REPLAY = REPO / "replay_data"
T0 = 1767225600.0
DERIVED = {C.GPU_BUSY_SECONDS.name, C.GPU_IDLE_SECONDS.name, C.GPU_THROTTLED_SECONDS.name,
           C.NIC_SATURATED_SECONDS.name, C.NODE_NETWORK_STATE_SECONDS.name, C.NODE_NETWORK_BURSTS.name}


def run(args: str):
    a = build_parser().parse_args(args.split() + ["unused.om.gz"])
    return simulate(spec_from_args(a))


def random_args(rng: np.random.Generator) -> str:
    """A small random cluster, scrape and fault mix, with confounders."""
    classes = list(C.BOTTLENECK_CLASSES)
    args = (f"--nodes {rng.integers(4, 10)} --gpus {rng.integers(1, 5)} --nics {rng.integers(1, 5)} "
            f"--nic-speed {rng.choice(['25G', '100G', '200G', '400G'])} --duration {rng.integers(8, 16)}m "
            f"--scrape {rng.choice(['5s', '15s', '30s', '60s'])} --scrape-jitter 50ms --missing-scrapes 0.02 "
            f"--transport {rng.choice(['rdma', 'rdma', 'tcp'])} --wait-traffic {rng.choice(['quiet', 'trickle'])} "
            f"--seed {rng.integers(1, 10**6)}")
    for _ in range(rng.integers(0, 3)):
        cls = rng.choice(classes)
        args += f" --fault {cls}:start={rng.integers(1, 5)}m,dur={rng.integers(1, 4)}m"
        if cls == "link_degraded" and rng.random() < 0.5:
            args += ",variant=flap"
    args += " --confounder exporter_restart:nodes=2 --confounder node_join:nodes=1 --confounder spare_port:nodes=1"
    args += " --confounder checkpoint:every=4m,dur=30s"
    return args


RANDOM_SPECS = [random_args(np.random.default_rng(s)) for s in range(6)]


# --- invariants ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def random_results():
    return [(args, run(args)) for args in RANDOM_SPECS]


def test_counters_never_decrease_except_derived_ones_at_an_exporter_restart(random_results):
    for args, r in random_results:
        restarts = {inst: [T0 + at + down for at, down in setup.restarts]
                    for inst, setup in zip(r.cluster.instances, r.setups)}
        assert any(restarts.values())
        for (name, labels), (ts, vs) in series_of(r).items():
            if not name.endswith("_total"):
                continue
            inst = dict(labels)["instance"]
            for j in np.flatnonzero(np.diff(vs) < -1e-9):
                assert name in DERIVED, (args, name, labels, ts[j], vs[j], vs[j + 1])
                assert any(ts[j] < t <= ts[j + 1] for t in restarts[inst]), (args, name, ts[j])


def test_busy_plus_idle_is_wall_time_per_gpu_and_state_seconds_too(random_results):
    for args, r in random_results:
        series = series_of(r)
        tick = r.spec.scrape.tick
        per_gpu: dict[tuple, list] = {}
        per_node: dict[str, list] = {}
        for (name, labels), (ts, vs) in series.items():
            d = dict(labels)
            if name in (C.GPU_BUSY_SECONDS.name, C.GPU_IDLE_SECONDS.name):
                per_gpu.setdefault((d["instance"], d["gpu"]), []).append((ts, vs))
            elif name == C.NODE_NETWORK_STATE_SECONDS.name:
                per_node.setdefault(d["instance"], []).append((ts, vs))
        assert per_gpu or "--gpus 0" in args
        for key, rows in list(per_gpu.items()) + list(per_node.items()):
            assert len(rows) == (5 if isinstance(key, tuple) else 4)
            ts = rows[0][0]
            assert all(np.array_equal(ts, t) for t, _ in rows)
            total = sum(v for _, v in rows)
            dt, dv = np.diff(ts), np.diff(total)
            ok = dv >= -1e-6  # an exporter restart resets them all: skip that interval
            assert np.all(np.abs(dv[ok] - dt[ok]) <= tick + 2e-3), (args, key, np.max(np.abs(dv[ok] - dt[ok])))


def test_bytes_sent_equal_bytes_received_across_the_fabric(random_results):
    """Ring all-reduce: what a node sends on a rail its successor receives, so over the
    fabric (RDMA NICs; the management NIC talks to storage outside) the sums agree."""
    for args, r in random_results:
        sent = received = 0.0
        for (name, labels), (ts, vs) in series_of(r).items():
            fabric = r.cluster.nics[0].device[:3]  # the RDMA rails (ens...), not eno1
            if not dict(labels).get("device", "").startswith(fabric):
                continue
            if name == C.NIC_TRANSMIT_BYTES.name:
                sent += (vs[-1] - vs[0]) / max(ts[-1] - ts[0], 1)
            elif name == C.NIC_RECEIVE_BYTES.name:
                received += (vs[-1] - vs[0]) / max(ts[-1] - ts[0], 1)
        assert sent > 0
        assert abs(sent - received) <= 0.02 * sent, (args, sent, received)


def test_network_state_follows_the_contract_priority():
    """Whenever a tick had received pauses the node is `paused`, whatever its load: a PFC storm's
    victims spend the storm in `paused`, not in `saturated`/`active`."""
    r = run("--nodes 6 --gpus 2 --nics 2 --duration 12m --seed 4 --fault pfc_storm:start=4m,dur=4m")
    s = node_summary(series_of(r), T0 + 250, T0 + 470)
    for inst, o in s.items():
        assert o["idle_paused"] > 0.9 * o["idle"], (inst, dict(o))


# --- fault signatures ------------------------------------------------------------------------------

WINDOW = (8 * 60, 16 * 60)
BASE = "--nodes 8 --gpus 2 --nics 2 --duration 24m --scrape 15s --seed 11"


def windows(r):
    series = series_of(r)
    a, b = T0 + WINDOW[0], T0 + WINDOW[1]
    inside = node_summary(series, a + 30, b)
    outside = node_summary(series, T0 + 60, a - 30)
    after = node_summary(series, b + 60, T0 + r.spec.duration)
    culprits = r.labels()["incidents"][0]["nodes"]
    return series, inside, outside, after, culprits


def fault(spec: str) -> str:
    return f"{BASE} --fault {spec}:start={WINDOW[0] // 60}m,dur={(WINDOW[1] - WINDOW[0]) // 60}m"


def mean(summary, key, nodes=None):
    return float(np.mean([o[key] for inst, o in summary.items() if nodes is None or inst in nodes]))


def test_pfc_storm_signature():
    _, ins, out, after, (culprit,) = windows(run(fault("pfc_storm")))
    others = [i for i in ins if i != culprit]
    assert ins[culprit]["pause_transmit"] > 1000 * max(mean(ins, "pause_transmit", others), 1.0)
    quiet_before_after = max(out[culprit]["pause_transmit"], after[culprit]["pause_transmit"], 1)
    assert ins[culprit]["pause_transmit"] > 1000 * quiet_before_after
    assert mean(ins, "pause_receive", others) > 100 * max(mean(out, "pause_receive", others), 1.0)
    assert mean(ins, "idle_paused") > 0.5 and mean(out, "idle_paused") < 0.02
    assert mean(ins, "tx_util_max") < 0.3 * mean(out, "tx_util_max")  # throughput collapses


@pytest.mark.parametrize("variant", ["", ",variant=no_ecn"])
def test_network_congestion_signature(variant):
    _, ins, out, after, culprits = windows(run(fault("network_congestion") + variant))
    assert culprits == []
    if variant:
        assert mean(ins, "ecn") == 0 and mean(out, "ecn") == 0 and mean(ins, "cnp_rx") == 0
    else:
        assert mean(ins, "ecn") > 100 * mean(out, "ecn") > 0
        assert mean(ins, "cnp_rx") > 100 * mean(out, "cnp_rx") > 0
    assert mean(ins, "pause_receive") > 50 * max(mean(out, "pause_receive"), 0.1)
    assert mean(ins, "pause_transmit") < 1  # switches pause hosts, not the other way round
    assert mean(ins, "sat_s") == 0 and mean(out, "sat_s") > 0  # well below line rate
    assert mean(ins, "idle_active") + mean(ins, "idle_paused") > 0.15
    assert mean(after, "ecn") < 2 * mean(out, "ecn") + 1


def test_network_bandwidth_signature():
    _, ins, out, after, culprits = windows(run(fault("network_bandwidth")))
    assert culprits == []
    assert mean(ins, "idle_saturated") > max(0.15, 4 * mean(out, "idle_saturated"))
    assert mean(ins, "pause_receive") < 1 and mean(ins, "loss_out_of_sequence") == 0
    # no congestion signal: the healthy background of marks does not rise with the longer bursts
    assert mean(ins, "ecn") < 1.2 * mean(out, "ecn") and mean(ins, "tx_util_max") > 1.5 * mean(out, "tx_util_max")


def test_packet_loss_signature_rdma():
    _, ins, out, after, (culprit,) = windows(run(fault("packet_loss")))
    loss = lambda o: o["loss_out_of_sequence"] + o["loss_sequence_error"] + o["loss_ack_timeout"]  # noqa: E731
    assert loss(ins[culprit]) > 100 and loss(out[culprit]) == 0 and loss(after[culprit]) == 0
    assert all(loss(ins[culprit]) >= loss(o) for o in ins.values())
    assert all(ins[culprit][k] > 0 for k in ("loss_out_of_sequence", "loss_sequence_error", "loss_ack_timeout"))
    assert mean(ins, "tx_util_max") < mean(out, "tx_util_max")


def test_packet_loss_signature_fabric_wide():
    _, ins, out, after, culprits = windows(run(fault("packet_loss") + ",variant=fabric"))
    assert culprits == []
    assert min(o["loss_out_of_sequence"] for o in ins.values()) > 100
    assert max(o["loss_out_of_sequence"] for o in out.values()) == 0


def test_packet_loss_over_tcp_shows_as_retransmits_on_the_sender():
    _, ins, out, after, (culprit,) = windows(run(fault("packet_loss") + " --transport tcp"))
    others = [i for i in ins if i != culprit]
    assert ins[culprit]["retrans"] > 5 * max(ins[o]["retrans"] for o in others)
    assert ins[culprit]["retrans"] > 5 * out[culprit]["retrans"]
    assert all(o["loss_out_of_sequence"] + o["loss_sequence_error"] == 0 for o in ins.values())


def test_link_downshift_signature():
    r = run(fault("link_degraded") + ",speed=100G")
    series, ins, out, after, (culprit,) = windows(r)
    speeds = {dict(lb)["device"]: (ts, vs) for (n, lb), (ts, vs) in series.items()
              if n == C.NIC_LINK_SPEED.name and dict(lb)["instance"] == culprit}
    low = [d for d, (ts, vs) in speeds.items() if vs.min() == 100e9 / 8]
    assert len(low) == 1
    ts, vs = speeds[low[0]]
    inside = (ts >= T0 + WINDOW[0] + 5) & (ts < T0 + WINDOW[1])
    assert np.all(vs[inside] == 100e9 / 8) and np.all(vs[~inside & ((ts < T0 + WINDOW[0]) | (ts > T0 + WINDOW[1] + 5))]
                                                     == 200e9 / 8)
    others = [i for i in ins if i != culprit]
    assert ins[culprit]["sat_s"] > 2 * max(ins[o]["sat_s"] for o in others)
    # renegotiation: carrier down/up when the speed drops (and again when it is fixed)
    at_start = node_summary(series, T0 + WINDOW[0] - 1, T0 + WINDOW[0] + 60)
    assert at_start[culprit]["carrier"] >= 2 and out[culprit]["carrier"] == 0
    assert all(o["carrier"] == 0 for i, o in at_start.items() if i != culprit)
    assert mean(ins, "idle") > mean(out, "idle") + 0.05


def test_link_flap_signature():
    r = run(fault("link_degraded") + ",variant=flap,strength=0.2 --scrape 5s")
    series, ins, out, after, (culprit,) = windows(r)
    assert ins[culprit]["carrier"] >= 6 and out[culprit]["carrier"] == 0 and after[culprit]["carrier"] == 0
    assert all(o["carrier"] == 0 for i, o in ins.items() if i != culprit)
    ups = [(ts, vs) for (n, lb), (ts, vs) in series.items() if n == C.NIC_UP.name and dict(lb)["instance"] == culprit
           and dict(lb)["device"].startswith("ens")]
    downs = np.concatenate([ts[vs == 0] for ts, vs in ups])
    assert len(downs) and np.all((downs >= T0 + WINDOW[0]) & (downs < T0 + WINDOW[1]))
    assert ins[culprit]["loss_ack_timeout"] > 0 and out[culprit]["loss_ack_timeout"] == 0
    assert mean(ins, "idle_quiet") > mean(out, "idle_quiet") + 0.03  # the ring stalls while the link is down


@pytest.mark.parametrize("variant", ["thermal", "power", "hw_slowdown"])
def test_gpu_throttle_signature(variant):
    r = run(fault("gpu_throttle") + f",variant={variant}")
    series, ins, out, after, (culprit,) = windows(r)
    others = [i for i in ins if i != culprit]
    assert ins[culprit]["throttled"] > 0.9 and out[culprit]["throttled"] < 0.05
    assert max(ins[o]["throttled"] for o in others) < 0.05
    clocks = [(ts, vs) for (n, lb), (ts, vs) in series.items()
              if n == C.GPU_SM_CLOCK.name and dict(lb)["instance"] == culprit]
    for ts, vs in clocks:
        inside = (ts >= T0 + WINDOW[0]) & (ts < T0 + WINDOW[1])
        assert vs[inside].max() < 0.8 * vs[~inside].min()
    assert ins[culprit]["idle"] < mean(ins, "idle", others) - 0.1  # the others wait for it


@pytest.mark.parametrize("wait", ["quiet", "trickle"])
def test_straggler_signature(wait):
    r = run(fault("straggler") + f",variant={wait}")
    _, ins, out, after, (culprit,) = windows(r)
    others = [i for i in ins if i != culprit]
    assert ins[culprit]["idle"] < mean(ins, "idle", others) - 0.1
    assert mean(ins, "idle", others) > mean(out, "idle", others) + 0.1
    assert max(o["throttled"] for o in ins.values()) < 0.05  # no visible cause
    assert mean(ins, "pause_receive") < 1 and mean(ins, "ecn") <= 2 * mean(out, "ecn")
    if wait == "quiet":
        assert mean(ins, "idle_quiet", others) > 3 * mean(out, "idle_quiet", others)
    else:  # a trickle keeps the fabric `active` while they wait
        assert mean(ins, "idle_active", others) > mean(out, "idle_active", others) + 0.1


def test_host_bound_signature():
    _, ins, out, after, culprits = windows(run(fault("host_bound")))
    assert culprits == []
    assert mean(ins, "idle_quiet") > mean(out, "idle_quiet") + 0.15
    idle = [o["idle"] for o in ins.values()]
    assert np.std(idle) < 0.02  # nobody stands out
    assert mean(ins, "pause_receive") < 1


@pytest.mark.parametrize("cls", ["straggler", "pfc_storm", "host_bound", "link_degraded"])
def test_subtle_faults_add_five_to_eight_points_of_gpu_idle(cls):
    r = run(f"--nodes 8 --gpus 2 --nics 2 --duration 26m --seed 21 --fault {cls}:start=8m,dur=12m,subtle=1")
    s = series_of(r)
    inside = node_summary(s, T0 + 8 * 60 + 30, T0 + 20 * 60)
    outside = node_summary(s, T0 + 60, T0 + 8 * 60 - 30)
    added = 100 * (mean(inside, "idle") - mean(outside, "idle"))
    assert 4.5 <= added <= 8.5, (cls, added)


# --- confounders and scrapes -----------------------------------------------------------------------

def test_confounders_are_present_and_not_labelled():
    r = run("--nodes 8 --gpus 4 --nics 2 --duration 30m --scrape 15s --seed 31 "
            "--confounder checkpoint:every=10m,dur=2m --confounder spare_port:nodes=2 "
            "--confounder unused_gpus:nodes=1,gpus=2 --confounder missing_gpu_series:nodes=1 "
            "--confounder exporter_restart:nodes=1,at=13m --confounder node_leave:nodes=1,at=20m "
            "--confounder dcqcn_background:level=10")
    assert r.labels()["incidents"] == []
    s = series_of(r)
    by = lambda name: {k: v for k, v in s.items() if k[0] == name}  # noqa: E731
    gpu_nodes = {dict(lb)["instance"] for _, lb in by(C.GPU_BUSY_SECONDS.name)}
    assert len(gpu_nodes) == 7  # one node has no GPU series at all
    missing = (set(r.cluster.instances) - gpu_nodes).pop()
    assert [v for (n, lb), (t, v) in by(C.COLLECTOR_UP.name).items()
            if dict(lb)["instance"] == missing and dict(lb)["collector"] == "gpu"][0].max() == 0
    spare = [lb for (n, lb), (t, v) in by(C.NIC_UP.name).items() if v.max() == 0]
    assert len(spare) == 2
    spare_dev = dict(spare[0])["device"]
    assert not [1 for (n, lb) in by(C.NIC_LINK_SPEED.name) if dict(lb)["device"] == spare_dev]
    unused = [v for (n, lb), (t, v) in by(C.GPU_BUSY_SECONDS.name).items() if np.ptp(v) == 0]
    assert len(unused) == 2
    # checkpoints: every node idles in quiet while eno1 writes at line rate
    eno = [v for (n, lb), (t, v) in by(C.NIC_SATURATED_SECONDS.name).items()
           if dict(lb)["device"] == "eno1" and dict(lb)["direction"] == "transmit"]
    assert sum(np.ptp(v) for v in eno) > 8 * 2 * 60 * 0.5
    # the node that left has no sample after 20m
    last = {dict(lb)["instance"]: t.max() for (n, lb), (t, v) in by(C.TCP_SENT.name).items()}
    assert sorted(last.values())[0] < T0 + 20 * 60 <= sorted(last.values())[1]


def test_scrapes_have_interval_jitter_and_missing_samples():
    r = run("--nodes 4 --gpus 1 --nics 1 --duration 20m --scrape 10s --scrape-jitter 20ms --missing-scrapes 0.05 "
            "--seed 41")
    for node in r.nodes:
        d = np.diff(node.times)
        assert np.all(d > 0)
        assert np.median(d) == pytest.approx(10, abs=0.05)
        assert d.std() > 0 and (d > 15).sum() >= 1  # jitter, and some missing scrapes
        assert len(node.times) < 120


def test_hostname_styles_and_instance_port():
    assert hostname("node", 16) == "node-017"
    assert hostname("rack", 0, "NVIDIA A100-SXM4-80GB") == "gpu-a100-r01-u03"
    assert hostname("dgx", 41) == "dgx042.cluster.local"
    assert hostname("ip", 7) == "10-0-0-17"
    r = run("--nodes 2 --gpus 1 --nics 1 --duration 5m --hostname-style dgx --port 9100 --job train")
    assert r.cluster.instances == ["dgx001.cluster.local:9100", "dgx002.cluster.local:9100"]
    assert {dict(lb)["job"] for _, lb in series_of(r)} == {"train"}


def test_parsers():
    assert parse_duration("1h30m") == 5400 and parse_duration("90s") == 90 and parse_duration("250ms") == 0.25
    assert parse_speed("200G") == 25e9 and parse_speed("25Gb/s") == 25e9 / 8
    f = parse_fault("pfc_storm:start=20m,dur=10m,nodes=2", 3600)
    assert (f.cls, f.start, f.duration, f.nodes) == ("pfc_storm", 1200, 600, 2)
    assert parse_fault("network_bandwidth:start=0,dur=all", 1800).duration == 1800
    with pytest.raises(ValueError):
        parse_fault("pfc_storm:start=1m,when=2", 3600)
    with pytest.raises(ValueError):
        parse_fault("no_such_class:start=1m,dur=1m", 3600)


# --- files: trace format, labels, CLI, promtool -----------------------------------------------------

def test_cli_writes_trace_and_labels(tmp_path, capsys):
    out = tmp_path / "t.om.gz"
    assert main(["--nodes", "4", "--gpus", "2", "--nics", "2", "--duration", "10m", "--seed", "3",
                 "--fault", "pfc_storm:start=3m,dur=4m,nodes=1", str(out)]) == 0
    assert "series" in capsys.readouterr().err
    labels = json.loads((tmp_path / "t.labels.json").read_text())
    assert labels["incidents"][0]["class"] == "pfc_storm"
    assert labels["incidents"][0]["start"] == T0 + 180 and labels["incidents"][0]["end"] == T0 + 420
    assert main(["--fault", "bogus:start=1m", str(out)]) == 2


def check_trace_file(path: Path) -> None:
    """The trace format (docs/trace-format.md): families contiguous, series contiguous in increasing time, job and
    instance on every sample, # EOF last."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        text = fh.read()
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    seen_families, seen_series = set(), set()
    family, series, last_t = None, None, -1.0
    for line in text.splitlines()[:-1]:
        if line.startswith("# TYPE "):
            family = line.split()[2]
            assert family not in seen_families, family
            seen_families.add(family)
            continue
        if line.startswith("#"):
            continue
        name_labels, value, ts = line.rsplit(" ", 2)
        assert name_labels.split("{")[0] in (family, family + "_total"), (family, line)
        assert 'job="' in name_labels and 'instance="' in name_labels
        if name_labels != series:
            assert name_labels not in seen_series, name_labels
            seen_series.add(name_labels)
            series, last_t = name_labels, -1.0
        assert float(ts) > last_t
        last_t = float(ts)
        float(value)


def test_generated_trace_is_contract_conformant_and_parses_with_prometheus_client(tmp_path):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    generate(["--nodes", "3", "--gpus", "1", "--nics", "2", "--duration", "6m", "--seed", "5", "--fault",
              "link_degraded:start=2m,dur=2m,variant=flap", "--confounder", "spare_port:nodes=1",
              "--confounder", "exporter_restart:nodes=1,at=3m", "--config-fault", "bond:culprits=0",
              str(tmp_path / "x.om")])
    check_trace_file(tmp_path / "x.om")
    families = list(text_string_to_metric_families((tmp_path / "x.om").read_text()))
    names = {f.name for f in families}
    for metric, _ in FAMILIES:
        if metric is not C.NIC_TRANSMIT_WAIT:  # InfiniBand's alone (the test below)
            assert (metric.name.removesuffix("_total") if metric.type == "counter" else metric.name) in names
    types = {f.name: f.type for f in families}
    assert types["gpunet_nic_transmit_bytes"] == "counter" and types["gpunet_nic_up"] == "gauge"
    assert "gpunet_nic_transmit_wait_ticks" not in names


def test_an_infiniband_fabric_counts_credit_waits_instead_of_pauses_and_marks(tmp_path):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    generate(["--nodes", "3", "--gpus", "1", "--nics", "2", "--duration", "10m", "--seed", "5", "--link-layer",
              "infiniband", "--fault", "network_congestion:start=4m,dur=3m", "--confounder", "spare_port:nodes=1",
              str(tmp_path / "ib.om")])
    check_trace_file(tmp_path / "ib.om")
    families = {f.name: f for f in text_string_to_metric_families((tmp_path / "ib.om").read_text())}
    for ethernet_only in ("gpunet_nic_pfc_pause_frames", "gpunet_nic_ecn_marked_packets", "gpunet_nic_cnp_sent",
                          "gpunet_nic_pfc_enabled", "gpunet_nic_ecn_enabled", "gpunet_nic_qos_trust_info"):
        assert ethernet_only not in families
    layers = {s.labels["device"]: s.labels["link_layer"] for s in families["gpunet_nic_info"].samples}
    assert layers["eno1"] == "Ethernet" and {v for d, v in layers.items() if d != "eno1"} == {"InfiniBand"}
    # per NIC: ticks waited per second, healthy against congested minutes
    waits: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in families["gpunet_nic_transmit_wait_ticks"].samples:
        waits.setdefault((s.labels["instance"], s.labels["device"]), []).append((float(s.timestamp), s.value))
    start = min(t for series in waits.values() for t, _ in series)
    for device, series in waits.items():
        t, v = np.array(series).T
        if np.ptp(v) == 0:  # the spare port, down all along
            continue

        def rate(a, b):
            i, j = np.searchsorted(t, start + a), np.searchsorted(t, start + b)
            return (v[j] - v[i]) / (t[j] - t[i])
        assert rate(260, 400) > 20 * rate(20, 220), device


def test_infiniband_refuses_what_it_has_no_part_of(tmp_path, capsys):
    for extra, word in ((["--fault", "pfc_storm:start=1m,dur=1m"], "no PFC"),
                        (["--config-fault", "ecn_off:culprits=0"], "an Ethernet setting"),
                        (["--transport", "tcp"], "IPoIB")):
        code = main(["--nodes", "2", "--duration", "5m", "--link-layer", "infiniband", *extra, str(tmp_path / "x.om")])
        assert code == 2 and word in capsys.readouterr().err
        assert not (tmp_path / "x.om").exists()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_loads_a_generated_trace(tmp_path):
    trace = tmp_path / "p.om"
    stats = generate(["--nodes", "3", "--gpus", "2", "--nics", "1", "--duration", "8m", "--seed", "6",
                      "--fault", "straggler:start=2m,dur=3m", str(trace)])
    result = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(trace), str(tmp_path / "d")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert str(stats["samples"]) in result.stdout  # every sample became a block sample


# --- the committed set ------------------------------------------------------------------------------

def committed():
    """The simulated traces of replay_data/ (real recorded traces may lie beside them)."""
    return [REPLAY / f"{e.name}.om.gz" for e in COMMITTED]


def test_committed_set_covers_every_class_healthy_and_two_incidents():
    assert all(p.exists() for p in committed()), "run: python -m gpunet.simulate.suite replay_data/"
    labels = [json.loads(p.with_name(p.name.replace(".om.gz", ".labels.json")).read_text()) for p in committed()]
    classes = {i["class"] for lab in labels for i in lab["incidents"]}
    assert classes == set(C.BOTTLENECK_CLASSES)
    assert sum(1 for lab in labels if not lab["incidents"]) >= 3
    assert sum(1 for lab in labels if len(lab["incidents"]) == 2) >= 2
    assert sum(p.stat().st_size for p in committed()) < 10e6
    assert "python -m gpunet.simulate.suite replay_data/" in (REPLAY / "README.md").read_text()


@pytest.mark.parametrize("path", committed(), ids=lambda p: p.name)
def test_committed_labels_match_the_contract(path):
    labels = json.loads(path.with_name(path.name.replace(".om.gz", ".labels.json")).read_text())
    assert set(labels) == {"incidents", "notes"} and isinstance(labels["notes"], str)
    series = read_trace(path) if path.stat().st_size < 400e3 else None
    for inc in labels["incidents"]:
        assert set(inc) == {"class", "start", "end", "nodes"}
        assert inc["class"] in C.BOTTLENECK_CLASSES
        assert isinstance(inc["start"], float) and isinstance(inc["end"], float) and inc["start"] < inc["end"]
        assert all(isinstance(n, str) and ":" in n for n in inc["nodes"])
        localised = inc["class"] in ("pfc_storm", "link_degraded", "gpu_throttle", "straggler")
        assert bool(inc["nodes"]) == localised or inc["class"] == "packet_loss"
        if series is not None:
            instances = {dict(lb)["instance"] for _, lb in series}
            assert set(inc["nodes"]) <= instances
            t = np.concatenate([ts for ts, _ in series.values()])
            assert t.min() - 60 <= inc["start"] and inc["end"] <= t.max() + 60


def test_smallest_committed_trace_is_well_formed():
    path = min(committed(), key=lambda p: p.stat().st_size)
    check_trace_file(path)
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    with gzip.open(path, "rt") as fh:
        assert sum(len(f.samples) for f in text_string_to_metric_families(fh.read())) > 10000


def test_committed_traces_regenerate_to_the_same_bytes(tmp_path):
    entry = next(e for e in COMMITTED if e.name == "host_bound")
    generate(entry.argv(tmp_path))
    assert (tmp_path / "host_bound.om.gz").read_bytes() == (REPLAY / "host_bound.om.gz").read_bytes()
    assert (tmp_path / "host_bound.labels.json").read_text() == (REPLAY / "host_bound.labels.json").read_text()


def test_evaluation_suite_covers_what_issue_5_asks():
    entries = evaluation_entries(1000)
    assert len(entries) >= 40
    assert [e.args for e in entries] == [e.args for e in evaluation_entries(1000)]  # same seed, same suite
    assert [e.args for e in entries] != [e.args for e in evaluation_entries(2000)]
    tags = [t for e in entries for t in e.tags]
    for cls in C.BOTTLENECK_CLASSES:
        assert tags.count(cls) >= 3, cls
    for tag in ("healthy", "subtle", "big", "scrape60", "two", "overlap", "no_ecn", "tcp"):
        assert tag in tags, tag
    assert tags.count("subtle") == len(C.BOTTLENECK_CLASSES) and tags.count("healthy") >= 5
    for e in entries:  # every command parses into a valid spec
        spec = spec_from_args(build_parser().parse_args(e.argv(Path("/nonexistent"))))
        if "big" in e.tags:
            assert 64 <= spec.cluster.nodes <= 128
        if "scrape60" in e.tags:
            assert spec.scrape.interval == 60 and all(180 <= f.duration <= 300 for f in spec.faults)
