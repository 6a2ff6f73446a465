"""Opening NVML on a live node (readers/nvml.py NvmlGpus) when part of it fails: a GPU lost
before the exporter started costs only its own series and says which GPU, NVML failing as a
whole is retried only every REOPEN_SECONDS, and GPM samples are freed.

NVML is absent here: FakePynvml, put in sys.modules as `pynvml`, answers as nvidia-ml-py
would on a node of three GPUs."""

import logging
import sys
import time
from types import SimpleNamespace

import pytest
from exporter_harness import Node

from exporter.inventory import InventoryOptions
from exporter.readers.gpus import GpuSource
from exporter.readers.nvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NvmlGpus,
    on_monotonic_clock,
)
from exporter.root import Root, SourceError
from exporter.sampler import Sampler
from gpunet.contract import NVLINK_ERROR_KINDS

NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakePynvml:
    """nvidia-ml-py on three Hopper GPUs; `lost` fails nvmlDeviceGetUUID as a GPU off the bus
    does; `driver_error` fails nvmlSystemGetDriverVersion, the last call of open. Its GPUs
    keep no utilization sample buffer (they are read at every fast tick, on the ticks' own
    clock, which these tests give by hand); BufferedPynvml's do."""

    NVMLError = NVMLError

    def __init__(self, lost: int | None = None, driver_error: int | None = None):
        self.lost, self.driver_error = lost, driver_error
        self.inits = self.shutdowns = 0
        self.gpm_samples: set[object] = set()  # allocated, not yet freed

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=f"00000000:{0x17 + handle:02X}:00.0".encode())

    def nvmlDeviceGetNumaNodeId(self, handle):
        return 0

    def nvmlDeviceGetUUID(self, handle):
        if handle == self.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return f"GPU-0000000{handle}".encode()

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self):
        sample = object()
        self.gpm_samples.add(sample)
        return sample

    def nvmlGpmSampleFree(self, sample):
        self.gpm_samples.remove(sample)

    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, handle, kinds, events):
        pass

    def nvmlEventSetWait(self, events, timeout_ms):
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, events):
        pass

    def nvmlSystemGetDriverVersion(self):
        if self.driver_error is not None:
            raise NVMLError(self.driver_error)
        return b"550.54.15"

    def nvmlDeviceGetSamples(self, handle, kind, since_us):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=50)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0


@pytest.fixture
def fake_nvml(monkeypatch):
    def install(**failures) -> FakePynvml:
        fake = FakePynvml(**failures)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


def node_with_details(tmp_path, fake: FakePynvml) -> tuple[Node, GpuSource]:
    """A node whose sampler runs the gpu and gpu_details collectors over NVML (`fake`), which
    answers the details' calls (power, temperature, memory, PCIe) with fixed values."""
    for name, value in (("nvmlDeviceGetPowerUsage", 300_000), ("nvmlDeviceGetTemperature", 40),
                        ("nvmlDeviceGetMemoryInfo", SimpleNamespace(used=1, total=2)),
                        ("nvmlDeviceGetPcieThroughput", 0)):
        setattr(fake, name, lambda *args, value=value: value)
    node = Node(tmp_path)
    source = GpuSource(NvmlGpus(Root(tmp_path)))
    node.sampler = Sampler(Root(tmp_path), node.registry, InventoryOptions(), gpus=source,
                           collectors=["gpu", "gpu_details"])
    return node, source


def test_a_gpu_lost_at_start_costs_only_its_series_and_nvml_is_opened_once(tmp_path, fake_nvml, caplog):
    fake = fake_nvml(lost=1)
    node = Node(tmp_path)  # no nvml.json: the harness' own sampler reads no GPU
    source = GpuSource(NvmlGpus(Root(tmp_path)))
    node.sampler = Sampler(Root(tmp_path), node.registry, InventoryOptions(), gpus=source, collectors=["gpu"])
    with caplog.at_level(logging.INFO, logger="gpunet.exporter"):
        for t in (0.0, 0.2, 0.4, 0.6):
            node.tick(slow=False, now=t)
    assert [node.value("gpunet_gpu_up", gpu=gpu) for gpu in "012"] == [1.0, 0.0, 1.0]
    for gpu in "02":
        assert node.value("gpunet_gpu_busy_seconds_total", gpu=gpu) == pytest.approx(0.6 * 0.5)
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="1") is None
    # Opened once, not again at every tick (the back-off is REOPEN_SECONDS; the ticks took far less).
    assert fake.inits == 1
    warnings = [r.getMessage() for r in caplog.records if "NVML" in r.getMessage()]
    assert len(warnings) == 1 and "NVML gpu 1: NVML_ERROR_GPU_IS_LOST" in warnings[0], warnings
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    source.close()
    assert not fake.gpm_samples and fake.shutdowns == 1


def test_a_gpu_that_could_not_be_set_up_is_tried_again_after_the_back_off(tmp_path, fake_nvml, monkeypatch):
    """A GPU lost at the start and brought back later (a GPU reset, a driver that was still
    setting it up) is set up again, no more often than every REOPEN_SECONDS and only by the
    slow reads (the fast tick's short time limit is no place for NVML's set-up): its series
    come back, under its real identity, and its XID events are listened to."""
    from exporter.readers import nvml

    monkeypatch.setattr(nvml, "REOPEN_SECONDS", 0.3)
    fake = fake_nvml(lost=1)
    asked: list[int] = []
    registered: list[int] = []
    get_handle = fake.nvmlDeviceGetHandleByIndex
    fake.nvmlDeviceGetHandleByIndex = lambda i: asked.append(i) or get_handle(i)
    fake.nvmlDeviceRegisterEvents = lambda handle, kinds, events: registered.append(handle)
    fake.nvmlGpmQueryDeviceSupport = lambda handle: SimpleNamespace(isSupportedDevice=0)
    node, source = node_with_details(tmp_path, fake)
    node.tick(now=0.0)
    node.tick(slow=False, now=0.2)
    assert node.value("gpunet_gpu_up", gpu="1") == 0.0
    assert asked.count(1) == 1 and sorted(registered) == [0, 2]  # not asked again within the back-off
    assert source.identities[1].uuid == ""
    fake.lost = None  # the GPU is back
    time.sleep(0.35)
    node.tick(slow=False, now=0.4)
    assert asked.count(1) == 1  # the fast tick does not set it up
    node.tick(now=0.6)
    node.tick(slow=False, now=0.8)
    node.tick(slow=False, now=1.0)
    assert asked.count(1) == 2 and sorted(registered) == [0, 1, 2]
    assert [node.value("gpunet_gpu_up", gpu=gpu) for gpu in "012"] == [1.0, 1.0, 1.0]
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="1") == pytest.approx(0.4 * 0.5)
    assert node.value("gpunet_gpu_power_watts", gpu="1") == 300.0
    assert source.identities[1].uuid == "GPU-00000001"
    assert fake.inits == 1
    source.close()
    assert not fake.gpm_samples  # the samples of the GPU set up later are freed too


def test_nvml_failing_as_a_whole_is_undone_and_retried_only_after_the_back_off(fake_nvml):
    fake = fake_nvml(driver_error=NVML_ERROR_UNKNOWN)
    source = GpuSource(NvmlGpus(Root("/")))
    for _ in range(3):
        with pytest.raises(SourceError, match=f"^NVML: NVML error {NVML_ERROR_UNKNOWN}$"):
            source.ensure_open()
    assert fake.inits == 1 and fake.shutdowns == 1
    assert not fake.gpm_samples  # the three GPUs' samples, allocated before it failed, are freed


def test_a_backend_that_fails_unforeseen_is_retried_only_after_the_back_off():
    class Broken:
        opened = 0

        def open(self):
            self.opened += 1
            raise ZeroDivisionError("a bug")

    backend = Broken()
    source = GpuSource(backend)
    for _ in range(3):
        with pytest.raises(SourceError, match=r"^GPU backend Broken: open failed: ZeroDivisionError\('a bug'\)$"):
            source.ensure_open()
    assert backend.opened == 1


class NvLinkPynvml(FakePynvml):
    """Four NVLinks per GPU, each with some errors; `down` links report disabled, and their
    counters answer only where `down_readable`."""

    NOT_SUPPORTED = 3

    def __init__(self):
        super().__init__()
        self.down: set[int] = set()
        self.down_readable = True

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        raise NVMLError(self.NOT_SUPPORTED)

    def nvmlDeviceGetRemappedRows(self, handle):
        raise NVMLError(self.NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if link >= 4:
            raise NVMLError(self.NOT_SUPPORTED)
        return 0 if link in self.down else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter):
        if link in self.down and not self.down_readable:
            raise NVMLError(self.NOT_SUPPORTED)
        return 10 * (link + 1) + counter


def test_the_errors_of_an_nvlink_that_went_down_stay_in_the_sums(monkeypatch):
    """Summed over the links up only, a link going down would make the sums drop: a reset to
    the exporter's counters, which would then count every error of the others again."""
    fake = NvLinkPynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = NvmlGpus(Root("/"))
    gpus.open()
    before = gpus.health(0).nvlink_errors
    crc_flit = NVLINK_ERROR_KINDS.index("crc_flit")
    assert before is not None and before["crc_flit"] == sum(10 * (link + 1) + crc_flit for link in range(4))
    fake.down = {2}
    assert gpus.health(0).nvlink_errors == before  # its counters still read: the same sums
    fake.down_readable = False
    unknown = gpus.health(0).nvlink_errors
    assert unknown is not None and all(v != v for v in unknown.values())  # NaN: the last value stands
    gpus.close()


class FlakySamplesPynvml(FakePynvml):
    """The utilization sample buffer times out once, or is not supported at all."""

    def __init__(self, samples_error: int):
        super().__init__()
        self.samples_error: int | None = samples_error
        self.sample_reads = 0

    def nvmlDeviceGetSamples(self, handle, kind, since_us):
        self.sample_reads += 1
        if self.samples_error is not None:
            error, self.samples_error = self.samples_error, (self.samples_error if self.samples_error == 3 else None)
            raise NVMLError(error)
        return 0, [SimpleNamespace(timeStamp=since_us + 1, sampleValue=SimpleNamespace(uiVal=50))]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=20)


@pytest.mark.parametrize(("error", "reads_samples_again"), [(NVML_ERROR_TIMEOUT, True), (3, False)])
def test_a_passing_sample_buffer_error_costs_one_reading_and_an_unsupported_buffer_the_rest(
        monkeypatch, error, reads_samples_again):
    fake = FlakySamplesPynvml(error)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = NvmlGpus(Root("/"))
    gpus.open()
    assert gpus.activity(0).utilization == pytest.approx(0.2)  # the rates, this once
    reads = fake.sample_reads
    second = gpus.activity(0).utilization
    assert (fake.sample_reads > reads) == reads_samples_again
    assert second == pytest.approx(0.5 if reads_samples_again else 0.2)
    gpus.close()


def test_a_gpu_lost_while_running_shows_down_under_its_identity_and_is_set_up_again(tmp_path, fake_nvml,
                                                                                     monkeypatch):
    """A GPU that answered, then says NVML_ERROR_GPU_IS_LOST (fell off the bus, being reset):
    its series show it down under the labels it had, no NVML call is made for it until the
    back-off passed, the XID that comes with the loss is still its own, and a slow read then
    sets it up again with a fresh handle; its counters go on from where they were. A late
    answer from the old handle (a call that hung through the set-up) changes nothing."""
    from exporter.readers import nvml

    clock = [1000.0]  # the back-off's clock, moved by hand: the ticks' own times are given
    monkeypatch.setattr(nvml, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    fake = fake_nvml()
    asked: list[int] = []
    sampled: list[int] = []
    events: list[SimpleNamespace] = []
    get_handle, get_rates = fake.nvmlDeviceGetHandleByIndex, fake.nvmlDeviceGetUtilizationRates
    stale: set[int] = set()  # handles of a GPU reset since

    def handle(i):  # a fresh handle each time a GPU is set up: 1, then 101, ...
        asked.append(i)
        return get_handle(i) + 100 * (asked.count(i) - 1)

    def rates(h):
        sampled.append(h % 100)
        if h % 100 == fake.lost or h in stale:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return get_rates(h % 100)

    def wait(event_set, timeout_ms):
        if not events:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return events.pop()

    fake.nvmlDeviceGetHandleByIndex = handle
    fake.nvmlDeviceGetUtilizationRates = rates
    fake.nvmlEventSetWait = wait
    for name in ("nvmlDeviceGetPciInfo", "nvmlDeviceGetUUID", "nvmlDeviceGetNumaNodeId"):
        plain = getattr(fake, name)
        setattr(fake, name, lambda h, plain=plain: plain(h % 100))
    node, source = node_with_details(tmp_path, fake)
    node.tick(now=0.0)
    node.tick(slow=False, now=0.2)
    busy = node.value("gpunet_gpu_busy_seconds_total", gpu="1")
    assert busy == pytest.approx(0.2 * 0.5) and asked.count(1) == 1
    old = source.backend._gpus[1]

    fake.lost = 1
    node.tick(slow=False, now=0.4)
    events.append(SimpleNamespace(device=old.handle, eventData=79))  # drained by the next slow tick
    node.tick(now=0.6)
    node.tick(slow=False, now=0.8)
    assert [node.value("gpunet_gpu_up", gpu=gpu) for gpu in "012"] == [1.0, 0.0, 1.0]
    assert sampled.count(1) == 3  # asked at 0.0, 0.2 and 0.4 (lost); not again: it answers why without NVML
    assert asked.count(1) == 1  # not set up again within the back-off
    assert source.backend.gpus()[1].uuid == "GPU-00000001"  # listed as the GPU it was
    assert source.backend.xid_counts() == {(1, 79): 1}
    info = [s for s in node.registry.published()["gpu_details"] if s.metric.name == "gpunet_gpu_info"]
    assert [s.labels for s in info if s.labels[0] == "1"] == []  # a lost GPU's info goes with its series

    fake.lost = None  # reset: the GPU is back
    stale.add(old.handle)
    clock[0] += nvml.REOPEN_SECONDS
    node.tick(slow=False, now=1.0)
    assert asked.count(1) == 1  # the fast tick does not set it up
    node.tick(now=1.2)
    node.tick(slow=False, now=1.4)
    node.tick(slow=False, now=1.6)
    assert asked.count(1) == 2
    assert [node.value("gpunet_gpu_up", gpu=gpu) for gpu in "012"] == [1.0, 1.0, 1.0]
    # its busy seconds go on from where they stopped: the ticks after it came back, not the gap
    assert node.value("gpunet_gpu_busy_seconds_total", gpu="1") == pytest.approx(busy + 0.4 * 0.5)
    assert source.identities[1].uuid == "GPU-00000001" and fake.inits == 1

    # the old handle answers late, from a call that hung through the set-up: nothing changes
    late = source.backend._failed(old, "NVML gpu 1", NVMLError(NVML_ERROR_GPU_IS_LOST))
    assert "NVML_ERROR_GPU_IS_LOST" in str(late)
    node.tick(slow=False, now=1.8)
    assert node.value("gpunet_gpu_up", gpu="1") == 1.0 and source.backend._gpus[1] is not old
    source.close()
    assert not fake.gpm_samples  # the lost handle's samples are freed too


class BufferedPynvml(FakePynvml):
    """GPUs with a utilization sample buffer, stamped as NVML stamps it: µs of the wall clock."""

    def __init__(self):
        super().__init__()
        self.buffer: list[tuple[int, int]] = []  # (stamp, percent), as the driver holds them

    def nvmlDeviceGetSamples(self, handle, kind, since_us):
        fresh = [SimpleNamespace(timeStamp=stamp, sampleValue=SimpleNamespace(uiVal=percent))
                 for stamp, percent in self.buffer if stamp > since_us]
        if not fresh:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return 0, fresh


def test_the_sample_buffer_is_handed_over_on_the_monotonic_clock_once_each(monkeypatch):
    fake = BufferedPynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = NvmlGpus(Root("/"))
    gpus.open()
    wall = time.time()
    # Out of order, and one value past 100%: sorted, and clamped.
    fake.buffer = [(int((wall - 1 / 3) * 1e6), 250), (int((wall - 0.5) * 1e6), 40), (int((wall - 1 / 6) * 1e6), 60)]
    first = gpus.activity(0)
    ages = [time.monotonic() - at for at, _ in first.history]
    assert ages == pytest.approx([0.5, 1 / 3, 1 / 6], abs=0.05)
    assert [value for _, value in first.history] == [0.4, 1.0, 0.6]
    assert first.utilization == pytest.approx((0.4 + 1.0 + 0.6) / 3)
    assert gpus.activity(0).history == ()  # nothing new: still a buffered GPU, with no sample
    fake.buffer.append((int(time.time() * 1e6), 10))
    assert [value for _, value in gpus.activity(0).history] == [0.1]
    gpus.close()


def test_stamps_of_another_clock_are_placed_by_their_spacing_the_newest_now():
    assert on_monotonic_clock([1_000_000, 1_500_000], wall_now=1.7e9, monotonic_now=500.0) == [499.5, 500.0]
    wall, monotonic = 1.7e9, 500.0
    stamps = [int((wall - 0.25) * 1e6), int(wall * 1e6)]
    assert on_monotonic_clock(stamps, wall, monotonic) == pytest.approx([499.75, 500.0])
