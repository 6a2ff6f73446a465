"""GPU collectors over nvml.json fixtures: busy/idle integration, the idle split by network
state, throttling, a GPU lost or hung mid-run, and no NVML at all."""

import json
import math
import time

import pytest
from exporter_harness import Node
from procs import wait_for
from test_fixture_nodes import ethtool, set_ethtool

from exporter.inventory import InventoryOptions
from exporter.readers.gpus import GpuSource
from exporter.readers.nvml import FixtureGpus, GpuActivity, GpuIdentity, GpuLost, reasons_from_mask
from exporter.registry import Registry
from exporter.root import Root
from exporter.sampler import Sampler

STATES = ("paused", "saturated", "active", "quiet")


def nvml(root):
    return json.loads((root / "nvml.json").read_text())


def set_gpu(root, index, **fields):
    doc = nvml(root)
    for gpu in doc["gpus"]:
        if gpu["index"] == index:
            gpu.update(fields)
            for key in [k for k, v in fields.items() if v is None]:
                del gpu[key]
    (root / "nvml.json").write_text(json.dumps(doc))


def idle(node, gpu):
    return {s: node.value("gpunet_gpu_idle_seconds_total", gpu=gpu, network_state=s) for s in STATES}


def gpu_copy(node_copy, name="h100-8gpu"):
    # The GPU nodes link to roce-mlx5's network; copy both so the links still resolve.
    node_copy("roce-mlx5")
    return node_copy(name)


def test_busy_plus_idle_is_wall_time_and_busy_is_utilization(node_copy):
    root = gpu_copy(node_copy)
    node = Node(root).tick(now=0.0)
    for t in (0.2, 0.4, 0.6, 1.0):
        node.tick(slow=False, now=t)
    for gpu in map(str, range(8)):
        busy = node.value("gpunet_gpu_busy_seconds_total", gpu=gpu)
        utilization = nvml(root)["gpus"][int(gpu)]["utilization_gpu"] / 100
        assert busy == pytest.approx(utilization * 1.0)
        assert busy + sum(idle(node, gpu).values()) == pytest.approx(1.0)
        assert idle(node, gpu)["quiet"] == pytest.approx(1.0 - busy)  # a static fixture: no traffic


def test_idle_goes_to_paused_while_the_fabric_receives_pauses(node_copy):
    root = gpu_copy(node_copy)
    node = Node(root).tick(now=0.0)
    set_gpu(root, 0, utilization_gpu=10)
    node.tick(slow=False, now=0.2)  # quiet
    pauses = ethtool(root, "ens1f0np0")["rx_prio3_pause"]
    set_ethtool(root, "ens1f0np0", rx_prio3_pause=pauses + 500)
    node.tick(slow=False, now=0.4)  # pauses arrived in this tick
    node.tick(slow=False, now=0.6)  # quiet again
    split = idle(node, "0")
    assert split["paused"] == pytest.approx(0.2 * 0.9)
    assert split["quiet"] == pytest.approx(0.4 * 0.9)
    assert node.value("gpunet_node_network_state_seconds_total", network_state="paused") == pytest.approx(0.2)


def test_series_the_correlation_does_not_need_refresh_once_a_slow_interval(node_copy):
    """Bytes, busy and idle seconds at every fast tick; per-priority pause frames, utilization
    and throttled seconds at one fast tick per slow interval (1 s here), served in between."""
    root = gpu_copy(node_copy)
    node = Node(root).tick(now=0.0)
    pauses = ethtool(root, "ens1f0np0")["rx_prio3_pause"]
    set_ethtool(root, "ens1f0np0", rx_prio3_pause=pauses + 500, rx_bytes_phy=ethtool(root, "ens1f0np0")["rx_bytes_phy"] + 10)
    set_gpu(root, 0, utilization_gpu=10)
    node.tick(slow=False, now=0.2)
    assert node.value("gpunet_nic_pfc_pause_frames_total", device="ens1f0np0", direction="receive",
                      priority="3") == pauses  # as of the refresh at 0.0
    assert node.value("gpunet_node_network_state_seconds_total", network_state="paused") == pytest.approx(0.2)
    assert node.value("gpunet_nic_receive_bytes_total", device="ens1f0np0") == \
        ethtool(root, "ens1f0np0")["rx_bytes_phy"]
    assert node.value("gpunet_gpu_utilization_ratio", gpu="0") != 0.1
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="0") == pytest.approx(0.2 * 0.1)
    node.tick(slow=False, now=1.0)  # a slow interval after the last refresh
    assert node.value("gpunet_nic_pfc_pause_frames_total", device="ens1f0np0", direction="receive",
                      priority="3") == pauses + 500
    assert node.value("gpunet_gpu_utilization_ratio", gpu="0") == 0.1


def test_idle_goes_to_saturated_while_a_fabric_nic_runs_at_line_rate(node_copy):
    root = gpu_copy(node_copy)
    node = Node(root).tick(now=0.0)
    speed = int((root / "sys/class/net/ens1f1np1/speed").read_text()) * 1e6 / 8
    tx = ethtool(root, "ens1f1np1")["tx_bytes_phy"]
    set_ethtool(root, "ens1f1np1", tx_bytes_phy=tx + int(0.95 * speed * 0.2))
    node.tick(slow=False, now=0.2)
    set_ethtool(root, "ens1f1np1", tx_bytes_phy=tx + int(0.95 * speed * 0.2) + int(0.20 * speed * 0.2))
    node.tick(slow=False, now=0.4)
    split = idle(node, "4")
    assert split["saturated"] == pytest.approx(0.2 * 0.13)
    assert split["active"] == pytest.approx(0.2 * 0.13)


def test_throttle_reasons_count_only_slowdowns():
    assert reasons_from_mask(0x1 | 0x2 | 0x10 | 0x100) == frozenset()  # idle, app clocks, sync boost, display
    assert reasons_from_mask(0x4 | 0x8 | 0x20 | 0x40 | 0x80) == frozenset(
        {"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


def test_throttled_gpu_accrues_its_reasons(node_copy):
    root = gpu_copy(node_copy, "h100-throttled")
    node = Node(root).tick(now=0.0).tick(slow=False, now=2.0)
    throttled = {dict(k)["gpu"] + "/" + dict(k)["reason"]: v
                 for k, v in node.series("gpunet_gpu_throttled_seconds_total").items() if v > 0}
    expected = {f"{g['index']}/{r}": 2.0 for g in nvml(root)["gpus"] for r in g["clock_event_reasons"]}
    assert throttled == pytest.approx(expected) and expected
    slow = next(g for g in nvml(root)["gpus"] if g["clock_event_reasons"])
    assert node.value("gpunet_gpu_sm_clock_hertz", gpu=str(slow["index"])) == slow["sm_clock_hz"]


def test_gpu_lost_mid_run_costs_only_its_series_and_comes_back_monotonic(node_copy):
    root = gpu_copy(node_copy)
    node = Node(root).tick(now=0.0).tick(slow=False, now=1.0)
    busy_before = node.value("gpunet_gpu_busy_seconds_total", gpu="3")
    set_gpu(root, 3, lost=True)
    node.tick(now=2.0)
    assert node.value("gpunet_gpu_up", gpu="3") == 0.0
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="3") is None
    assert not any(dict(k).get("gpu") == "3" for k in node.series("gpunet_gpu_info"))
    assert node.value("gpunet_exporter_collector_errors_total", collector="gpu") >= 1
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="2") > busy_before  # the others go on
    assert node.value("gpunet_nic_transmit_bytes_total", device="ens1f0np0") is not None
    set_gpu(root, 3, lost=None)
    node.tick(now=3.0).tick(slow=False, now=4.0)
    assert node.value("gpunet_gpu_up", gpu="3") == 1.0
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="3") >= busy_before


def test_a_hung_nvml_call_never_blocks_the_tick(node_copy):
    root = gpu_copy(node_copy)
    node = Node(root).tick()
    set_gpu(root, 2, hang_seconds=1.5)
    started = time.monotonic()
    node.tick(slow=False)
    assert time.monotonic() - started < 0.5
    assert node.value("gpunet_gpu_up", gpu="2") == 0.0
    assert node.value("gpunet_gpu_up", gpu="1") == 1.0
    set_gpu(root, 2, hang_seconds=None)
    node.tick(slow=False)  # the hung call is still running: GPU 2 still down, nothing piles up
    assert node.value("gpunet_gpu_up", gpu="2") == 0.0
    # Once the hung call returned (its key is no longer set aside), the next tick reads GPU 2 again.
    calls = node.sampler.collector("gpu").calls
    wait_for(lambda: not calls._stuck, what="the hung NVML call to return")
    node.tick(slow=False)
    assert node.value("gpunet_gpu_up", gpu="2") == 1.0


def test_corrupt_nvml_json_takes_down_only_the_gpu_collectors(node_copy):
    root = gpu_copy(node_copy)
    (root / "nvml.json").write_text('{"driver_version": "550", "gpus": [\n  {"index": 0,\n')
    node = Node(root).tick().tick(slow=False)
    assert node.value("gpunet_exporter_collector_up", collector="gpu") == 0.0
    assert node.value("gpunet_exporter_collector_up", collector="wire") == 1.0
    assert node.value("gpunet_nic_transmit_bytes_total", device="ens1f0np0") is not None


def skip_where_nvml_works() -> None:
    """These tests are about machines whose NVML fails; a GPU machine skips them."""
    import pynvml
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return
    pytest.skip("this machine has a working NVIDIA driver")


def test_a_host_without_the_nvidia_driver_runs_no_gpu_collector_and_says_so_once():
    import os
    import subprocess

    from procs import REPO, exporter_command
    skip_where_nvml_works()
    result = subprocess.run(exporter_command("scrape", "--duration", "1.5"), cwd=REPO, capture_output=True,
                            text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    # A CPU node: nothing for the GPU collectors to read, so none runs (no collector down to alert on).
    assert 'collector="gpu' not in result.stdout
    assert 'gpunet_exporter_collector_up{collector="wire"} 1.0' in result.stdout
    assert "gpunet_tcp_sent_segments_total" in result.stdout
    lines = [l for l in result.stderr.splitlines() if "NVIDIA" in l or "NVML" in l]
    assert len(lines) == 1 and "GPU collectors off" in lines[0], result.stderr


def test_a_driver_that_is_there_but_fails_reports_the_gpu_collectors_down(tmp_path, monkeypatch):
    """/dev/nvidiactl present (here a stand-in file) but NVML failing: a GPU node whose driver
    is broken, which must show as collectors down."""
    from exporter import cli, settings
    from exporter.readers.nvml import NvmlGpus
    skip_where_nvml_works()
    control = tmp_path / "nvidiactl"
    control.write_text("")
    monkeypatch.setattr(cli, "NVIDIA_DRIVER_PATHS", (str(control),))
    args = settings.parse_args(["--root", "/", "scrape"])
    source = cli.gpu_source(args, Root("/"))
    assert source is not None and isinstance(source.backend, NvmlGpus)
    registry = Registry()
    sampler = Sampler(Root("/"), registry, InventoryOptions(), gpus=source, collectors=["gpu", "wire"])
    sampler.slow_tick()
    sampler.fast_tick()
    assert registry.collector_status()["gpu"].up is False


def test_gpu_health_is_what_nvml_says_and_absent_where_the_gpu_does_not_say(node_copy):
    """ECC, row remapping and NVLink errors as nvml.json holds them (NVML's own readings),
    counters that never go down when the driver reloads, and no series at all for a GPU
    that does not support them."""
    root = gpu_copy(node_copy)
    doc = nvml(root)
    node = Node(root).tick(now=0.0)
    for g in doc["gpus"]:
        gpu = str(g["index"])
        for kind, n in g["ecc_errors"].items():
            assert node.value("gpunet_gpu_ecc_errors_total", gpu=gpu, type=kind) == n
        for kind, n in g["nvlink_errors"].items():
            assert node.value("gpunet_gpu_nvlink_errors_total", gpu=gpu, kind=kind) == n
        remap = g["row_remapping"]
        for cause in ("correctable", "uncorrectable"):
            assert node.value("gpunet_gpu_remapped_rows", gpu=gpu, cause=cause) == remap[cause]
        assert node.value("gpunet_gpu_row_remap_pending", gpu=gpu) == float(remap["pending"])
        assert node.value("gpunet_gpu_row_remap_failed", gpu=gpu) == float(remap["failed"])
    sick = next(g for g in doc["gpus"] if g["ecc_errors"]["corrected"])
    # The driver reloads: NVML's volatile counters start again from zero; the exported ones go on.
    before = node.value("gpunet_gpu_ecc_errors_total", gpu=str(sick["index"]), type="corrected")
    sick["ecc_errors"]["corrected"] = 3
    (root / "nvml.json").write_text(json.dumps(doc))
    node.tick(now=31.0)  # read every config interval (30 s), not every slow tick
    assert node.value("gpunet_gpu_ecc_errors_total", gpu=str(sick["index"]), type="corrected") == before + 3
    # A GPU that does not report them (consumer parts, no NVLink): no series, not zeros.
    for g in doc["gpus"]:
        for key in ("ecc_errors", "nvlink_errors", "row_remapping"):
            g.pop(key)
    (root / "nvml.json").write_text(json.dumps(doc))
    node.tick(now=62.0)
    assert not node.series("gpunet_gpu_nvlink_errors_total") and not node.series("gpunet_gpu_remapped_rows")


# --- GPUs with a utilization sample buffer --------------------------------------------------
PERIOD = 1 / 6  # the driver's sample period on data-centre GPUs


class BufferedGpus:
    """A GPU backend on the test's clock (`clock`, set before each tick): two GPUs whose
    driver samples utilization every PERIOD, `utilization(time)` at each sample, handed
    over as NVML's buffer is, the samples since the last read."""

    def __init__(self, utilization):
        self.utilization = utilization
        self.clock = 0.0
        self.reads = 0
        self.lost: set[int] = set()
        self._sampled: dict[int, int] = {}

    def open(self):
        return "550.54.15"

    def close(self):
        pass

    def gpus(self):
        return [GpuIdentity(i, f"GPU-{i}", "H100", f"0000:{0x18 + i:02x}:00.0", "0") for i in (0, 1)]

    def activity(self, index, sm_clock=True):
        self.reads += 1
        if index in self.lost:
            raise GpuLost(f"gpu {index}", "NVML_ERROR_GPU_IS_LOST")
        newest = int(self.clock / PERIOD + 1e-9)
        first = self._sampled.get(index, -1) + 1
        self._sampled[index] = newest
        history = tuple((n * PERIOD, self.utilization(n * PERIOD)) for n in range(first, newest + 1))
        return GpuActivity(history[-1][1] if history else 0.0, 1.98e9, frozenset(), history)


def buffered_node(node_copy, utilization):
    root = node_copy("roce-mlx5")
    node = Node(root)
    backend = BufferedGpus(utilization)
    # A slow interval of 5 s: the reads once a second are the GPU collector's own, not the refresh's.
    node.sampler = Sampler(Root(root), node.registry, InventoryOptions(), slow_interval=5.0, gpus=GpuSource(backend),
                           collectors=["wire", "gpu"])
    return root, node, backend


def test_a_gpu_with_a_sample_buffer_is_read_once_a_second_and_each_sample_split_by_the_ticks_it_spans(node_copy):
    """Each driver sample's idle time goes to the network states of the fast ticks its period
    spans, as a fine-grained integration of the same timelines says, while the GPUs are
    read once a second rather than at every fast tick."""
    def utilization(t):
        return 0.9 if t < 0.5 else 0.1 if t < 1.3 else 0.7

    root, node, backend = buffered_node(node_copy, utilization)
    paused_ticks = {0.6, 1.4}  # the fast ticks (t - 0.2, t] in which the fabric received pauses
    times = [round(0.2 * i, 1) for i in range(11)]  # 0.0 .. 2.0
    for t in times:
        if t in paused_ticks:
            pauses = ethtool(root, "ens1f0np0")["rx_prio3_pause"]
            set_ethtool(root, "ens1f0np0", rx_prio3_pause=pauses + 100)
        backend.clock = t
        node.tick(slow=t == 0.0, now=t)
    assert backend.reads == 2 * 3  # at 0.0, 1.0 and 2.0: three reads a GPU, where polling makes eleven

    # The same, integrated on a 0.1 ms grid: sample n holds utilization(n * PERIOD) over its
    # period before, and the state is the tick's that holds the instant.
    expected = dict.fromkeys(STATES, 0.0)
    busy = 0.0
    step = 1e-4
    for k in range(int(2.0 / step)):
        x = (k + 0.5) * step
        u = utilization(math.ceil(x / PERIOD - 1e-9) * PERIOD)
        tick_end = round(math.ceil(x / 0.2 - 1e-9) * 0.2, 1)
        state = "paused" if tick_end in paused_ticks else "quiet"
        busy += u * step
        expected[state] += (1 - u) * step
    for gpu in "01":
        assert node.value("gpunet_gpu_busy_seconds_total", gpu=gpu) == pytest.approx(busy, abs=1e-3)
        assert idle(node, gpu) == pytest.approx(expected, abs=1e-3)
        assert expected["paused"] > 0.1  # the paused ticks fall between reads, and count
        assert node.value("gpunet_gpu_up", gpu=gpu) == 1.0


def test_a_buffered_gpu_counts_nothing_from_before_its_first_read_and_a_lost_one_shows_at_the_next_read(node_copy):
    root, node, backend = buffered_node(node_copy, lambda t: 0.5)
    backend.clock = 30.0  # the driver has sampled for a while before the exporter's first read
    node.tick(now=30.0)
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="0") == 0.0
    backend.clock = 31.0
    node.tick(slow=False, now=31.0)
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="0") == pytest.approx(0.5)
    backend.lost.add(1)
    for t in (31.2, 31.4):  # between reads: GPU 1 is not asked, and shows as at its last read
        backend.clock = t
        node.tick(slow=False, now=t)
    assert node.value("gpunet_gpu_up", gpu="1") == 1.0
    backend.clock = 32.0
    node.tick(slow=False, now=32.0)
    assert node.value("gpunet_gpu_up", gpu="1") == 0.0
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="1") is None
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="0") == pytest.approx(1.0)
    backend.lost.clear()  # back (a GPU reset): its buffer holds the time it was away, which is not counted
    for t in (32.2, 33.2):
        backend.clock = t
        node.tick(slow=False, now=t)
    assert node.value("gpunet_gpu_up", gpu="1") == 1.0
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="1") == pytest.approx(0.5 + 0.5 * 1.0, abs=0.1)


def test_a_failed_link_load_costs_a_buffered_read_only_its_own_tick(node_copy, caplog):
    """link_load failing on the tick that reads the GPUs (a bug): the states of the ticks
    before still split the read's samples."""
    root, node, backend = buffered_node(node_copy, lambda t: 0.0)
    update = node.sampler.link_load.update

    def failing(now, *args):
        if now == 1.0:
            raise RuntimeError("a bug in link_load")
        return update(now, *args)

    node.sampler.link_load.update = failing
    for t in [round(0.2 * i, 1) for i in range(6)]:
        if t == 0.6:
            set_ethtool(root, "ens1f0np0", rx_prio3_pause=ethtool(root, "ens1f0np0")["rx_prio3_pause"] + 100)
        backend.clock = t
        node.tick(slow=t == 0.0, now=t)
    assert idle(node, "0")["paused"] == pytest.approx(0.2, abs=0.01)
    assert sum(idle(node, "0").values()) == pytest.approx(1.0, abs=0.01)


def test_the_fixture_buffer_samples_the_timeline_at_its_period_and_loses_what_overflows(tmp_path):
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({
        "driver_version": "550.54.15", "sample_period_seconds": 0.05, "sample_buffer": 20,
        "gpus": [{"index": 0, "uuid": "GPU-0", "utilization_gpu": 20}],
        "timeline": [{"after": 0.2, "gpus": {"0": {"utilization_gpu": 80}}}]}))
    gpus = FixtureGpus(path)
    gpus.open()
    time.sleep(0.12)
    first = gpus.activity(0).history
    time.sleep(0.15)
    second = gpus.activity(0).history
    assert first and second
    stamps = [t for t, _ in first + second]
    assert all(b - a == pytest.approx(0.05) for a, b in zip(stamps, stamps[1:]))  # one period apart, none twice
    for at, value in first + second:  # the utilization in the middle of the period before the sample
        assert value == (0.8 if at - 0.025 - gpus._started >= 0.2 - 1e-9 else 0.2)
    time.sleep(1.1)
    assert len(gpus.activity(0).history) == 20  # the buffer's size: older samples are gone
