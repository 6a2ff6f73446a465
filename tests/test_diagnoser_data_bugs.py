"""How the diagnoser reads imperfect data: a NaN sample in a counter, a node catching up
after a scrape gap, a Prometheus scraped every minute without the TCP collector, marks
counted twice. Each test builds its data with known rates, so that the expected figures
are the inputs'."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from diagnoser.analysis.features import compute
from diagnoser.model.columns import counter_increase
from diagnoser.pipeline import diagnose
from diagnoser.sources import Source, read_frame
from gpunet.trace import write_series

START = 1767225600.0  # 2026-01-01T00:00:00Z, a multiple of every window length
GPUS = ("0", "1")


def small_trace(path: Path, scrape: float, minutes: int, idle: list[float],
                gap: dict[int, tuple[float, float]] | None = None, tcp: bool = True, gpu: bool = True,
                nic: bool = True, marks: tuple[float, float] | None = None,
                names: list[str] | None = None) -> None:
    """A trace of len(idle) nodes scraped every `scrape` seconds (with a little jitter): node k's
    GPUs idle the fraction idle[k] of every second (network_state quiet); `gap`: node -> the
    (from, to) seconds after START in which it was not scraped. Counters start at START."""
    rng = random.Random(11)
    ts_all = [START + scrape * i + rng.uniform(-0.4, 0.4) for i in range(int(minutes * 60 / scrape) + 1)]
    series: list[tuple[str, dict[str, str], list[float], list[float]]] = []
    for k, frac in enumerate(idle):
        base = {"instance": names[k] if names else f"node-{k:03d}:9845", "job": "gpunet"}
        lo, hi = (gap or {}).get(k, (-1.0, -1.0))
        ts = [t for t in ts_all if not lo <= t - START < hi]
        series.append(("gpunet_exporter_collector_up", {**base, "collector": "nic"}, ts, [1.0] * len(ts)))
        if gpu:
            for g in GPUS:
                series.append(("gpunet_gpu_busy_seconds_total", {**base, "gpu": g}, ts,
                               [(1 - frac) * (t - START) for t in ts]))
                series.append(("gpunet_gpu_idle_seconds_total", {**base, "gpu": g, "network_state": "quiet"}, ts,
                               [frac * (t - START) for t in ts]))
        if nic:
            for name in ("gpunet_nic_transmit_bytes_total", "gpunet_nic_receive_bytes_total"):
                series.append((name, {**base, "device": "ens1f0np0"}, ts, [1e9 * (t - START) for t in ts]))
            series.append(("gpunet_nic_up", {**base, "device": "ens1f0np0"}, ts, [1.0] * len(ts)))
            series.append(("gpunet_nic_link_speed_bytes_per_second", {**base, "device": "ens1f0np0"}, ts,
                           [50e9] * len(ts)))
            if marks is not None:  # (ECN-marked packets received, CNPs sent) per second
                for name, rate in zip(("gpunet_nic_ecn_marked_packets_total", "gpunet_nic_cnp_sent_total"), marks):
                    series.append((name, {**base, "device": "ens1f0np0"}, ts, [rate * (t - START) for t in ts]))
        if tcp:
            series.append(("gpunet_tcp_sent_segments_total", base, ts, [1e5 * (t - START) for t in ts]))
    write_series(path, series)


# --- counters: a NaN sample ----------------------------------------------------------------

def test_a_nan_sample_loses_none_of_the_counters_growth():
    """A counter growing 100 a scrape, one sample NaN (a failed read): the growth across the
    NaN sample still counts, once, in the window of the next finite sample."""
    t = np.arange(10) * 15.0
    v = 100.0 * np.arange(10)
    v[3] = np.nan
    whole = counter_increase(t, v, np.array([0.0, 150.0]))
    assert whole[0] == pytest.approx(v[-1] - v[0])
    # the growth from sample 2 to sample 4 lands with sample 4 (t = 60): nothing with sample 3
    split = counter_increase(t, v, np.array([0.0, 50.0, 150.0]))
    assert split == pytest.approx([v[2] - v[0], v[-1] - v[2]])
    # a reset after the NaN sample is still a reset: the counter grew by its new value
    v2 = v.copy()
    v2[4:] -= 350.0  # restarted just before sample 4, counting 50 by then
    assert counter_increase(t, v2, np.array([0.0, 150.0]))[0] == pytest.approx((v[2] - v[0]) + v2[-1])


# --- features: a node catching up after a scrape gap ---------------------------------------

def test_cluster_idle_is_not_diluted_by_a_node_catching_up(tmp_path):
    """Four nodes idling 10, 20, 30 and 40% of the time; the last misses its scrapes for four
    minutes, so the window after the gap holds its growth over five minutes (its busy + idle
    is not the window's GPU time: its split is left out). The cluster's idle in that window
    is the other three nodes' (equal GPU time: their mean), not diluted by the catching-up
    node's GPU time."""
    idle = [0.1, 0.2, 0.3, 0.4]
    trace = tmp_path / "gap.om.gz"
    small_trace(trace, 15.0, 40, idle, gap={3: (600.0, 840.0)})
    frame = read_frame(Source(replay=str(trace)))
    f = compute(frame)
    node_idle = f.node["idle_frac"].unstack("instance")
    late = "node-003:9845"
    catching_up = node_idle.index[node_idle[late].isna() & (f.node["gpu_time"].unstack("instance")[late] >
                                                            1.5 * len(GPUS) * frame.step)]
    assert len(catching_up) == 1, node_idle  # the scenario: one window of catch-up after the gap
    w = catching_up[0]
    others = [n for n in node_idle.columns if n != late]
    # the other nodes' own idle holds (the data are clean), so their mean is the cluster's figure
    assert node_idle.loc[w, others].to_numpy() == pytest.approx(idle[:3], abs=0.01)
    assert f.cluster.at[w, "idle_frac"] == pytest.approx(np.mean(idle[:3]), abs=0.01)
    # and every window where all four report is the mean of all four
    full = node_idle.notna().all(axis=1)
    assert full.sum() >= 20
    assert f.cluster.loc[full, "idle_frac"].to_numpy() == pytest.approx(np.mean(idle), abs=0.01)


# --- prometheus: the scrape interval without the TCP collector -----------------------------

@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_scrape_interval_from_any_counter_and_a_conservative_guess(tmp_path, served):
    """Scraped every 60 s, without the TCP collector: the interval is read from the GPU and
    NIC counters, so every window holds four scrapes (as from the trace file) and its busy
    time is known. With none of the probed counters, 60 s is assumed, and said."""
    idle = [0.1, 0.2, 0.3, 0.4]
    trace = tmp_path / "minute.om.gz"
    small_trace(trace, 60.0, 120, idle, tcp=False)
    start, end = f"{START + 60:.0f}", f"{START + 119 * 60:.0f}"
    from_file = read_frame(Source(replay=str(trace), start=start, end=end))
    from_server = read_frame(Source(prometheus=served(trace), start=start, end=end))
    assert from_file.step >= 4 * 60.0  # a window holds at least four scrapes
    assert from_server.step == from_file.step
    busy = from_server.node["busy"].unstack("instance").iloc[1:-1]  # edges: the server extrapolates
    assert len(busy) >= 10 and np.isfinite(busy.to_numpy()).all(), busy
    assert not any("assumed" in w for w in from_server.warnings)

    # Only gauges: nothing to count scrapes by; the guess is the long interval, and said.
    bare = tmp_path / "bare.om.gz"
    small_trace(bare, 60.0, 120, idle, tcp=False, gpu=False, nic=False)
    said: list[str] = []
    guessed = read_frame(Source(prometheus=served(bare), start=start, end=end), said.append)
    assert guessed.step >= 4 * 60.0
    assert any("assumed 60s" in w for w in guessed.warnings), guessed.warnings
    assert any(m.startswith("warning:") and "assumed 60s" in m for m in said), said


# --- features: ECN marks and the CNPs that answer them ---------------------------------------

def test_the_cnps_that_answer_marks_are_not_counted_as_more_marks(tmp_path):
    """A receiver counts the ECN-marked packets it got and the CNPs it sent back for them (at
    most one per flow and interval): the same congestion counted twice. Marks per GB moved
    are the marks (or the CNPs, where a NIC counts only those), never their sum. Each node
    moves 2 GB a second (1 GB each way) and gets 300 marks a second."""
    trace = tmp_path / "marks.om.gz"
    small_trace(trace, 15.0, 30, [0.2] * 4, marks=(300.0, 240.0))
    f = compute(read_frame(Source(replay=str(trace))))
    inner = f.node["ecn_per_gb"].unstack("instance").iloc[1:-1]
    assert inner.to_numpy() == pytest.approx(300.0 / 2, rel=0.02)
    only_cnps = tmp_path / "cnps.om.gz"
    small_trace(only_cnps, 15.0, 30, [0.2] * 4, marks=(0.0, 240.0))
    f = compute(read_frame(Source(replay=str(only_cnps))))
    assert f.node["ecn_per_gb"].unstack("instance").iloc[1:-1].to_numpy() == pytest.approx(240.0 / 2, rel=0.02)


# --- counters: one bad sample ------------------------------------------------------------------

@pytest.mark.parametrize("bad", [1e9, 5.0])
def test_one_bad_sample_of_a_counter_is_no_burst_and_no_reset(bad):
    """A counter growing 100 a scrape, one sample corrupted far above (or below) its
    neighbours: its growth is the counter's, not a burst of a billion and a reset counting
    everything again."""
    t = np.arange(12) * 15.0
    v = 1000.0 + 100.0 * np.arange(12)
    v[5] = bad
    assert counter_increase(t, v, np.array([0.0, 180.0]))[0] == pytest.approx(1100.0)


def test_a_real_reset_is_still_a_reset():
    """Restarted (an exporter restart): the counter starts again near zero and grows from
    there; that growth counts."""
    t = np.arange(8) * 15.0
    v = np.array([1000.0, 1100.0, 1200.0, 30.0, 130.0, 230.0, 330.0, 430.0])
    assert counter_increase(t, v, np.array([0.0, 120.0]))[0] == pytest.approx(200.0 + 30.0 + 400.0)


# --- PromQL for nodes with any name ------------------------------------------------------------

@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_confirm_queries_match_nodes_whatever_their_names(tmp_path, served):
    """The query a finding prints for on-call to paste names its nodes in a regex inside a
    PromQL string: a quote, a space, a dot or a backslash in a name must neither end the
    string nor reach RE2 as an escape it refuses. Asked of a real Prometheus."""
    import json
    import urllib.parse
    import urllib.request

    from diagnoser.analysis.rules import rule
    from diagnoser.analysis.rules.base import confirm_query

    names = ['node 0 "x"\\ ✓:9845', "dgx001.cluster:9845", "node-(2)+[a]:9845"]
    trace = tmp_path / "names.om.gz"
    small_trace(trace, 15.0, 20, [0.2] * len(names), names=names)
    url = served(trace)
    for name in names:
        query = confirm_query(rule("link_degraded"), [name])
        at = f"{START + 600:.0f}"
        with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": at})) as r:
            answer = json.load(r)
        assert answer["status"] == "success", (query, answer)
        assert {s["metric"]["instance"] for s in answer["data"]["result"]} == {name}, query


def test_a_bad_counter_sample_in_a_trace_is_left_out_and_said(tmp_path):
    """One transmitted-pauses sample of one NIC read a billion too high: no storm of millions of
    pauses a second in the frame, and a note names the series and the time."""
    trace = tmp_path / "spike.om.gz"
    ts = [START + 15.0 * i for i in range(121)]
    pauses = [10.0 * i for i in range(121)]
    pauses[60] += 1e9
    base = {"instance": "node-000:9845", "job": "gpunet", "device": "ens1f0np0"}
    write_series(trace, [("gpunet_nic_pfc_pause_frames_total", {**base, "direction": "transmit", "priority": "3"},
                          ts, pauses),
                         ("gpunet_nic_transmit_bytes_total", base, ts, [1e9 * 15 * i for i in range(121)])])
    frame = read_frame(Source(replay=str(trace)))
    assert np.nansum(frame.node["pfc_tx"].to_numpy()) <= 10.0 * 120
    note = next(w for w in frame.warnings if "gpunet_nic_pfc_pause_frames_total" in w)
    assert 'instance="node-000:9845"' in note and "00:15:00Z" in note, note


# --- features: pauses received on nodes with one rail or eight -----------------------------

def test_pauses_received_are_a_rate_per_fabric_nic(tmp_path):
    """Two nodes with one fabric NIC and two with eight, every NIC receiving 2 pause frames a
    second: the job's rate per NIC is 2 (not 2 on some nodes and 16 on others), and every
    node counts as receiving pauses. A NIC off the fabric (a storage port) does not count."""
    rng = random.Random(5)
    ts = [START + 15.0 * i + rng.uniform(-0.4, 0.4) for i in range(4 * 30 + 1)]
    series: list[tuple[str, dict[str, str], list[float], list[float]]] = []
    for k, rails in enumerate((1, 1, 8, 8)):
        base = {"instance": f"node-{k:03d}:9845", "job": "gpunet"}
        for g in GPUS:
            series.append(("gpunet_gpu_busy_seconds_total", {**base, "gpu": g}, ts, [0.8 * (t - START) for t in ts]))
            series.append(("gpunet_gpu_idle_seconds_total", {**base, "gpu": g, "network_state": "quiet"}, ts,
                           [0.2 * (t - START) for t in ts]))
        for r in range(rails + 1):  # the last one is a storage NIC, off the fabric
            nic = {**base, "device": f"rail{r}"}
            fabric = r < rails
            series.append(("gpunet_nic_fabric", nic, ts, [float(fabric)] * len(ts)))
            series.append(("gpunet_nic_link_speed_bytes_per_second", nic, ts, [50e9] * len(ts)))
            series.append(("gpunet_nic_up", nic, ts, [1.0] * len(ts)))
            for name in ("gpunet_nic_transmit_bytes_total", "gpunet_nic_receive_bytes_total"):
                series.append((name, nic, ts, [1e9 * (t - START) for t in ts]))
            for prio, rate in (("3", 1.5), ("4", 0.5)):  # 2 a second over the priorities
                series.append(("gpunet_nic_pfc_pause_frames_total",
                               {**nic, "direction": "receive", "priority": prio}, ts,
                               [(rate if fabric else 40.0) * (t - START) for t in ts]))
    trace = tmp_path / "rails.om.gz"
    write_series(trace, series)
    f = compute(read_frame(Source(replay=str(trace))))
    per_nic = f.cluster["pfc_rx_per_nic"].dropna()
    assert len(per_nic) >= 5
    # (a window holds the growth of the scrapes that fell in it: 15 s scrapes in 20 s windows
    # give 1.5 to 2.5 a second window by window, 2 on average)
    assert per_nic.mean() == pytest.approx(2.0, rel=0.05)
    assert per_nic.between(1.4, 2.6).all()
    assert (f.cluster.loc[per_nic.index, "pfc_rx_nodes"] == 4).all()
    # the node figure stays the node's sum: 2 and 16 a second
    node_rate = f.node["pfc_rx_rate"].unstack("instance").loc[per_nic.index]
    assert node_rate.mean().to_numpy() == pytest.approx([2.0, 2.0, 16.0, 16.0], rel=0.05)


# --- a job-wide stall, each node's scrapes cutting it at their own moment ------------------

STALL_EDGE = START + 12 * 240.0  # an edge of the 240 s windows that 60 s scrapes give


def stall_trace(path: Path, stall: tuple[float, float], late: str = "", state: str = "quiet") -> None:
    """Eight nodes idle a fifth of the time, and all of `stall` (every GPU, in network_state
    `state`); scraped every 60 s, 2 s after each minute, but `late`, 58 s after it."""
    def idle_seconds(t: float) -> float:
        inside = max(0.0, min(t, stall[1]) - stall[0])
        return 0.2 * (t - START - inside) + inside

    series: list[tuple[str, dict[str, str], list[float], list[float]]] = []
    for k in range(8):
        base = {"instance": f"node-{k:03d}:9845", "job": "gpunet"}
        ts = [START + (58.0 if base["instance"] == late else 2.0) + 60.0 * i for i in range(60)]
        for g in GPUS:
            series.append(("gpunet_gpu_busy_seconds_total", {**base, "gpu": g}, ts,
                           [t - START - idle_seconds(t) for t in ts]))
            series.append(("gpunet_gpu_idle_seconds_total", {**base, "gpu": g, "network_state": state}, ts,
                           [idle_seconds(t) for t in ts]))
        nic = {**base, "device": "ens1f0np0"}
        for name in ("gpunet_nic_transmit_bytes_total", "gpunet_nic_receive_bytes_total"):
            series.append((name, nic, ts, [1e9 * (t - START) for t in ts]))
        series.append(("gpunet_nic_up", nic, ts, [1.0] * len(ts)))
        series.append(("gpunet_nic_link_speed_bytes_per_second", nic, ts, [50e9] * len(ts)))
    write_series(path, series)


def test_a_node_whose_scrapes_cut_a_stall_elsewhere_is_no_straggler(tmp_path):
    """Every GPU stalls for 90 s across a window's edge (a checkpoint). A scrape's growth falls
    in the window the scrape is in: seven nodes put the whole stall in the window after the
    edge (their scrape 2 s after it holds the 57 s before), the late node 53 s of it in the
    window before. So in the window after the edge it seems to idle far less than its peers,
    in the one before far more; over the window and its neighbours it idled as they did. No
    straggler."""
    step, edge, late = 240.0, STALL_EDGE, "node-003:9845"
    trace = tmp_path / "stall.om.gz"
    stall_trace(trace, (edge - 55.0, edge + 35.0), late)
    f = compute(read_frame(Source(replay=str(trace))))
    assert f.frame.step == step
    idle = f.node["idle_frac"].unstack("instance")
    # the timing: in the window after the edge the late node idles ~18 points less ...
    assert idle.loc[edge].drop(late).median() - idle.at[edge, late] > 0.15
    assert idle.at[edge - step, late] - idle.loc[edge - step].drop(late).median() > 0.15  # ... more before it
    # over the three windows it idled as its peers did
    span = f.node["idle_frac_span"].unstack("instance").loc[edge]
    assert abs(span[late] - span.drop(late).median()) < 0.01
    findings = diagnose(Source(replay=str(trace))).findings
    assert "straggler" not in [x.cls for x in findings], findings


@pytest.mark.parametrize("stall, verdict", [((STALL_EDGE - 100.0, STALL_EDGE - 10.0), "healthy"),
                                            ((STALL_EDGE - 300.0, STALL_EDGE + 300.0), "inconclusive")])
def test_a_brief_stall_across_a_window_edge_is_no_unexplained_idle(tmp_path, stall, verdict):
    """A 90 s stall of the whole job straddling an edge of 240 s windows (the scrapes 58 s
    before the edge and 2 s after it cut it in two) raises both windows far above the
    baseline, but fills less than one window: a checkpoint's kind of stall, not sustained
    idle that no rule explains. Ten minutes of it is. (The network neither quiet nor at line
    rate while the GPUs wait: no rule's signature.)"""
    trace = tmp_path / "stall.om.gz"
    stall_trace(trace, stall, state="active")
    report = diagnose(Source(replay=str(trace)))
    g = compute(read_frame(Source(replay=str(trace)))).cluster["idle_frac"]
    assert (g > 0.2 + 0.09).sum() >= 2  # two windows or more far above the baseline either way
    assert report.verdict == verdict, report.inconclusive_reasons
