"""GPUs, through NVML (nvidia-ml-py) on a live node or ``nvml.json`` under a fixture root.

Both backends answer the same questions (which GPUs, their activity now, their details,
XID events since last asked) in plain values; the collectors make samples of them.

nvml.json (tests/fixtures/nodes/README.md) may also hold, per GPU, ``power_w``, ``temperature_c``,
``memory_used_bytes``, ``memory_total_bytes``, ``pcie_tx_bytes_per_second``,
``pcie_rx_bytes_per_second``, ``gpm`` ({sm_active, sm_occupancy, tensor_active} ratios),
``xid_errors`` ({xid: count so far}), and, to stand in for failures, ``lost`` (the GPU
fell off the bus), ``hang_seconds`` (an NVML call that blocks) and ``nvml_error``. A
``timeline`` list of ``{"after": seconds, "gpus": {"<index>": {field: value}}}`` changes
readings as time passes since the backend opened (``timeline_period`` repeats it), so a
test can feed a sequence of readings; the file is also re-read whenever it changes.

A top-level ``sample_period_seconds`` stands in for the driver's utilization sample buffer
(nvmlDeviceGetSamples): the GPUs are then sampled every that many seconds since the backend
opened, each sample taking the timeline's utilization at its time, and each activity read
hands over the samples since the last one (at most ``sample_buffer`` of them, 100 by
default: older ones are lost, as in a driver's ring buffer). Without it the GPUs keep no
buffer and are read at every fast tick.

For workload attribution (collectors/gpu_workload.py) a GPU may list ``processes``, the
compute processes running on it as nvmlDeviceGetComputeRunningProcesses reports them:
``[{"pid": 4242, "used_memory_bytes": 71000000000}]`` (pid: the host's process id, whose
``proc/<pid>/`` files under the same root tell its job), and ``mig_uuids``, the UUIDs of
its MIG devices (``["MIG-..."]``), which the kubelet hands out for ``nvidia.com/mig-*``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from exporter.readers.gpus import REOPEN_SECONDS
from exporter.readers.pci import PCI_DEVICES
from exporter.root import Root, SourceError, TooBig, read_file
from gpunet.contract import ECC_ERROR_TYPES, NVLINK_ERROR_KINDS

# Clock-event reasons (nvmlClocksEventReason*). Only these slow the GPU down; idle,
# application-clock, sync-boost and display-clock reasons are not throttling.
THROTTLE_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake"}
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_NO_PERMISSION = 4
FIXTURE_SAMPLE_BUFFER = 100
# NVML stamps its samples with the CPU's wall clock in microseconds; a stamp further than
# this from time.time() is taken as another clock, and the samples are placed by their
# spacing, the newest now.
PLAUSIBLE_STAMP_SECONDS = 60.0
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
NVML_MEMORY_ERROR_TYPES = (0, 1)  # NVML_MEMORY_ERROR_TYPE_CORRECTED, _UNCORRECTED, as in ECC_ERROR_TYPES
NVML_VOLATILE_ECC = 0  # since the driver loaded (the aggregate counter survives reboots: not a rate)
NVML_NVLINK_MAX_LINKS = 18
NVML_FEATURE_ENABLED = 1
XID_CRITICAL_ERROR = 0x8
GPM_METRICS = {2: "sm_active", 3: "sm_occupancy", 5: "tensor_active"}  # NVML_GPM_METRIC_* ids


class GpuLost(SourceError):
    """The GPU is gone (NVML_ERROR_GPU_IS_LOST, fell off the bus)."""


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    model: str
    pci_address: str
    numa_node: str


class GpuActivity(NamedTuple):
    """What the fast tick needs, of one GPU (a tuple: one per GPU every fast tick)."""

    utilization: float  # 0..1, the fraction of time a kernel ran
    sm_clock_hz: float | None  # None where not asked for (activity(sm_clock=False)) or not known
    reasons: frozenset[str]  # active throttle reasons, contract names
    # The driver's utilization samples newer than the last read, oldest first, as (monotonic
    # seconds, 0..1), each the utilization over the driver's sample period before it; None
    # where the GPU keeps no sample buffer (it is then read at every fast tick).
    history: tuple[tuple[float, float], ...] | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU."""

    pid: int
    used_memory_bytes: float | None = None


@dataclass(frozen=True)
class GpuDetails:
    """What the slow tick reads; None where the GPU does not say."""

    power_watts: float | None = None
    temperature_celsius: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    pcie_transmit_bytes_per_second: float | None = None
    pcie_receive_bytes_per_second: float | None = None
    gpm: dict[str, float] | None = None  # None: GPM not supported


@dataclass(frozen=True)
class GpuHealth:
    """Error counters and remapping state; None where the GPU does not support it (no ECC on
    consumer parts, no NVLink, no row remapping before Ampere)."""

    ecc_errors: dict[str, int] | None = None  # corrected / uncorrected
    remapped_rows: dict[str, int] | None = None  # correctable / uncorrectable
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    nvlink_errors: dict[str, float] | None = None  # NVLINK_ERROR_KINDS, summed over links ever up


def normalize_pci(bus_id: str) -> str:
    """NVML's '00000000:17:00.0' -> sysfs' '0000:17:00.0'."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    return f"{domain[-4:]:0>4}:{rest}" if sep else bus_id


def reasons_from_mask(mask: int) -> frozenset[str]:
    return frozenset(name for bit, name in THROTTLE_BITS.items() if mask & bit)


# --- fixture backend -------------------------------------------------------------------------

class FixtureGpus:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._started = time.monotonic()
        self._key: tuple[int, int] | None = None
        self._doc: dict = {}
        self._refused: tuple[tuple[int, int], str, str] | None = None  # a file's stat key, and why it was refused
        self._sampled: dict[int, int] = {}  # GPU -> the number of its last sample handed over

    def open(self) -> str:
        return str(self._load().get("driver_version", ""))

    def close(self) -> None:
        pass

    def _load(self) -> dict:
        try:
            st = self.path.stat()
        except OSError as e:
            raise SourceError(str(self.path), e.strerror or str(e)) from e
        key = (st.st_mtime_ns, st.st_size)
        if key == self._key:
            return self._doc
        if self._refused is None or self._refused[0] != key:  # else not read again until it changes
            refused = self._read(key)
            if refused is None:
                return self._doc
            self._refused = (key, *refused)
        # A new error each time: one raised again would grow its traceback by every raise.
        raise SourceError(self._refused[1], self._refused[2])

    def _read(self, key: tuple[int, int]) -> tuple[str, str] | None:
        """Read the document and keep it as the file's at `key`; (where, what) is wrong with
        it where it cannot be kept."""
        try:
            doc = json.loads(read_file(self.path))  # at most MAX_READ: a runaway file must not take the memory
        except OSError as e:
            raise SourceError(str(self.path), e.strerror or str(e)) from e
        except TooBig as e:
            return e.where, e.what
        except json.JSONDecodeError as e:
            return f"{self.path}:{e.lineno}", f"not JSON: {e.msg}"
        except (ValueError, RecursionError) as e:  # bytes that are no UTF-8; arrays nested thousands deep
            return str(self.path), f"not JSON: {e}"
        if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
            return str(self.path), "expected an object with a 'gpus' list"
        self._doc, self._key = doc, key
        return None

    def _entry(self, doc: dict, index: int) -> dict:
        """The GPU's own entry in the document, before the timeline."""
        gpu = next((g for g in doc["gpus"] if g.get("index") == index), None)
        if gpu is None:
            raise GpuLost(f"{self.path} gpu {index}", "GPU no longer listed")
        return gpu

    def _gpu(self, index: int) -> dict:
        """The GPU's entry as the timeline has it now."""
        doc = self._load()
        gpu = dict(self._entry(doc, index))
        for changes in self._timeline(doc, index, time.monotonic() - self._started):
            gpu.update(changes)
        where = f"{self.path} gpu {index}"
        if gpu.get("hang_seconds"):
            time.sleep(float(gpu["hang_seconds"]))
        if gpu.get("lost"):
            raise GpuLost(where, "NVML_ERROR_GPU_IS_LOST: GPU is lost")
        if gpu.get("nvml_error"):
            raise SourceError(where, str(gpu["nvml_error"]))
        return gpu

    @staticmethod
    def _timeline(doc: dict, index: int, elapsed: float) -> list[dict]:
        """The timeline's changes to a GPU in force `elapsed` seconds after the backend opened, in order."""
        period = doc.get("timeline_period")
        if period:
            elapsed %= float(period)
        key = str(index)
        return [step.get("gpus", {}).get(key, {}) for step in doc.get("timeline", [])
                if float(step.get("after", 0)) <= elapsed]

    def gpus(self) -> list[GpuIdentity]:
        out = []
        for g in self._load()["gpus"]:
            try:
                out.append(GpuIdentity(int(g["index"]), str(g.get("uuid", "")), str(g.get("name", "")),
                                       normalize_pci(str(g.get("pci_bus_id", ""))),
                                       "" if g.get("numa_node") is None else str(g["numa_node"])))
            except (KeyError, TypeError, ValueError) as e:
                raise SourceError(str(self.path), f"GPU entry without a valid index: {e}") from e
        return out

    def activity(self, index: int, sm_clock: bool = True) -> GpuActivity:
        now = time.monotonic()
        g = self._gpu(index)
        try:
            utilization = _ratio(g["utilization_gpu"])
            clock = g.get("sm_clock_hz") if sm_clock else None
            reasons = frozenset(g.get("clock_event_reasons", []))
            period = self._doc.get("sample_period_seconds")
            history = None if not period else self._samples(index, float(period), now)
        except (KeyError, TypeError, ValueError) as e:
            raise SourceError(f"{self.path} gpu {index}", f"bad reading: {e!r}") from e
        if history:
            utilization = history[-1][1]
        return GpuActivity(utilization, float(clock) if clock is not None else None, reasons, history)

    def _samples(self, index: int, period: float, now: float) -> tuple[tuple[float, float], ...]:
        """The buffer's samples since the last read: the n-th taken n periods after the backend
        opened, with the timeline's utilization in the middle of the period it stands for."""
        if period <= 0:
            raise ValueError(f"sample_period_seconds must be positive, got {period}")
        doc = self._doc
        newest = int((now - self._started) / period)
        first = max(self._sampled.get(index, -1) + 1, newest - int(doc.get("sample_buffer", FIXTURE_SAMPLE_BUFFER)) + 1, 0)
        self._sampled[index] = newest
        base = self._entry(doc, index).get("utilization_gpu")
        out = []
        for n in range(first, newest + 1):
            utilization = base
            for changes in self._timeline(doc, index, (n - 0.5) * period) if "timeline" in doc else ():
                utilization = changes.get("utilization_gpu", utilization)
            if utilization is None:
                raise KeyError("utilization_gpu")
            out.append((self._started + n * period, _ratio(utilization)))
        return tuple(out)

    def details(self, index: int) -> GpuDetails:
        g = self._gpu(index)

        def num(key: str) -> float | None:
            return float(g[key]) if g.get(key) is not None else None

        gpm = g.get("gpm")
        return GpuDetails(num("power_w"), num("temperature_c"), num("memory_used_bytes"),
                          num("memory_total_bytes"), num("pcie_tx_bytes_per_second"),
                          num("pcie_rx_bytes_per_second"),
                          {k: float(v) for k, v in gpm.items()} if isinstance(gpm, dict) else None)

    def health(self, index: int) -> GpuHealth:
        g = self._gpu(index)

        def counts(key: str, names: tuple[str, ...]) -> dict[str, int] | None:
            value = g.get(key)
            if value is None:
                return None
            if not isinstance(value, dict):
                raise SourceError(f"{self.path} gpu {index}", f"{key}: expected an object")
            return {name: int(value[name]) for name in names if value.get(name) is not None}

        def flag(key: str) -> bool | None:
            return bool(g["row_remapping"][key]) if isinstance(g.get("row_remapping"), dict) else None

        try:
            return GpuHealth(counts("ecc_errors", ECC_ERROR_TYPES), counts("row_remapping", ("correctable",
                                                                                             "uncorrectable")),
                             flag("pending"), flag("failed"), counts("nvlink_errors", NVLINK_ERROR_KINDS))
        except (KeyError, TypeError, ValueError) as e:
            raise SourceError(f"{self.path} gpu {index}", f"bad reading: {e!r}") from e

    def processes(self, index: int) -> list[GpuProcess]:
        g = self._gpu(index)
        where = f"{self.path} gpu {index} processes"
        entries = g.get("processes") or []
        if not isinstance(entries, list):
            raise SourceError(where, "expected a list of {\"pid\": ...}")
        out = []
        for n, p in enumerate(entries):
            try:
                pid = int(p["pid"])
                memory = p.get("used_memory_bytes")
                out.append(GpuProcess(pid, float(memory) if memory is not None else None))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise SourceError(f"{where}[{n}]", f"expected {{\"pid\": <integer>}}, got {p!r} ({e!r})") from e
            if pid <= 0:
                raise SourceError(f"{where}[{n}]", f"pid must be positive, got {pid}")
        return out

    def mig_uuids(self, index: int) -> list[str]:
        return [str(u) for u in self._gpu(index).get("mig_uuids") or []]

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """Cumulative XID errors per (gpu index, xid)."""
        out = {}
        for g in self._load()["gpus"]:
            for xid, count in (g.get("xid_errors") or {}).items():
                out[(int(g["index"]), int(xid))] = int(count)
        return out


def _ratio(percent: object) -> float:
    """A utilization in percent as 0..1 (a driver's odd value clamped, not passed on)."""
    return min(max(float(percent) / 100.0, 0.0), 1.0)  # type: ignore[arg-type]


def on_monotonic_clock(stamps_us: list[int], wall_now: float, monotonic_now: float) -> list[float]:
    """NVML's sample stamps (µs of the wall clock) as monotonic seconds; stamps of another
    clock are placed by their spacing, the newest at `monotonic_now`."""
    newest = stamps_us[-1] / 1e6
    if abs(newest - wall_now) <= PLAUSIBLE_STAMP_SECONDS:
        offset = wall_now - monotonic_now
        return [min(s / 1e6 - offset, monotonic_now) for s in stamps_us]
    return [monotonic_now - (newest - s / 1e6) for s in stamps_us]


# --- live backend ----------------------------------------------------------------------------

@dataclass
class _LiveGpu:
    handle: object
    identity: GpuIdentity
    last_sample_us: int = 0
    last_utilization: float = 0.0
    use_samples: bool = True
    gpm_samples: list = field(default_factory=list)  # [previous, current] nvmlGpmSample_t, or []
    gpm_primed: bool = False  # a first GPM sample was taken
    nvlinks: set[int] = field(default_factory=set)  # NVLinks seen up: their errors stay in the sums


class NvmlGpus:
    """The real thing. NVML is thread-safe; calls that may hang are bounded by the caller."""

    def __init__(self, root: Root):
        self.root = root
        self._nvml: Any = None  # the pynvml module, once open
        self._gpus: dict[int, _LiveGpu] = {}
        self._unopened: dict[int, SourceError] = {}  # GPUs NVML lists that could not be set up: why
        self._retry_at: dict[int, float] = {}  # unopened GPU -> when to try setting it up again (monotonic)
        self._retrying: set[int] = set()  # unopened GPUs a thread is setting up again now
        # GPUs set up once and lost since (off the bus, being reset): kept for their identity,
        # under which they show down, their handle (an XID event names it) and their GPM
        # samples (a slow read on an abandoned worker may still hold them).
        self._lost: dict[int, _LiveGpu] = {}
        # A lost GPU set up again: its old self, until it is set up again once more (its GPM
        # samples are freed then, or at close).
        self._retired: dict[int, _LiveGpu] = {}
        # Held for moments, never across a call that may hang: a GPU set up again joins the
        # others, a GPU lost leaves them (the GPU dicts are replaced, never changed, so that
        # readers on other lanes iterate a whole one), and close() lets them all go.
        self._commit = threading.Lock()
        # Bumped when a GPU is set up after the start: the GPU source then lists the GPUs again.
        self.generation = 0
        self._events: object | None = None  # the XID event set, where NVML offers one
        self._xids: dict[tuple[int, int], int] = {}

    def _error(self, where: str, e: Exception) -> SourceError:
        value = getattr(e, "value", None)
        if value == NVML_ERROR_GPU_IS_LOST:
            return GpuLost(where, f"NVML_ERROR_GPU_IS_LOST: {e}")
        return SourceError(where, str(e))

    def _failed(self, gpu: _LiveGpu, where: str, e: Exception) -> SourceError:
        """The SourceError for an NVML error of a call on `gpu`; a GPU that says it is lost
        is let go (_lose)."""
        error = self._error(where, e)
        if isinstance(error, GpuLost):
            self._lose(gpu, error)
        return error

    def _lose(self, gpu: _LiveGpu, error: GpuLost) -> None:
        """A GPU that was set up and is lost now: its handle is let go and it is set up again
        as one that failed at the start is, every REOPEN_SECONDS from a slow read, with a
        fresh handle (a GPU reset, or a bus rescan after it fell off, brings it back). Until
        then it answers why, without an NVML call, under the identity it had. A late answer
        from a handle already replaced (a call that hung through the set-up) changes nothing."""
        index = gpu.identity.index
        with self._commit:
            if self._gpus.get(index) is not gpu or self._nvml is None:
                return
            self._not_set_up(index, error, "lost")  # first: a reader never finds it in neither
            self._lost = {**self._lost, index: gpu}
            self._gpus = {i: g for i, g in self._gpus.items() if i != index}

    def open(self) -> str:
        try:
            import pynvml
        except ImportError as e:
            raise SourceError("NVML", f"nvidia-ml-py is not installed: {e}") from e
        try:
            pynvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise SourceError("NVML", f"cannot initialise NVML (no NVIDIA driver?): {e}") from e
        self._nvml = pynvml
        self._gpus, self._unopened, self._events, self._xids = {}, {}, None, {}  # a retry starts afresh
        self._lost, self._retired = {}, {}
        self._retry_at = {}
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                # One GPU that fails here (lost before the exporter started, or not ready yet)
                # costs only its own series: the others are read, it reports why at every read
                # of it, and it is set up again every REOPEN_SECONDS (a GPU reset brings it back).
                try:
                    self._gpus[i] = self._open_gpu(i)
                except Exception as e:  # noqa: BLE001 - NVMLError of any kind
                    self._not_set_up(i, e)
            self._events = self._xid_events()
            return _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception as e:  # noqa: BLE001 - NVML itself failed: undo it all, to be retried afresh
            self.close()
            raise self._error("NVML", e) from e

    def _open_gpu(self, i: int) -> _LiveGpu:
        nv = self._nvml
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        pci = normalize_pci(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
        try:
            numa = str(nv.nvmlDeviceGetNumaNodeId(handle))
        except Exception:  # noqa: BLE001 - older drivers: ask sysfs
            numa = self.root.read_optional_str(f"{PCI_DEVICES}/{pci}/numa_node") or ""
            numa = numa if numa.isdigit() else ""
        ident = GpuIdentity(i, _text(nv.nvmlDeviceGetUUID(handle)), _text(nv.nvmlDeviceGetName(handle)), pci, numa)
        # Last, once nothing else can fail: the samples are freed only with a GPU that was kept.
        return _LiveGpu(handle, ident, gpm_samples=self._gpm_alloc(handle))

    def _not_set_up(self, index: int, e: Exception, why: str = "could not be set up") -> None:
        """(Under _commit, or before the GPUs are shared.)"""
        error = e if isinstance(e, SourceError) else self._error(f"NVML gpu {index}", e)
        self._unopened = {**self._unopened, index: type(error)(
            error.where, f"{error.what} ({why}; tried again every {REOPEN_SECONDS:g}s)")}
        self._retry_at[index] = time.monotonic() + REOPEN_SECONDS

    def _set_up_again(self, index: int) -> None:
        """Try again to set up a GPU that could not be at the start, once its back-off passed.
        Only the slow reads try (details, health), whose time limits leave NVML the time a GPU
        just reset may take; the fast tick's short limit would set the fast lane's worker
        aside. One thread per GPU at a time: a set-up that hangs holds back that GPU's
        retries only, until it returns."""
        if time.monotonic() < self._retry_at.get(index, 0.0):
            return
        with self._commit:
            nv = self._nvml
            if nv is None or index in self._retrying or index not in self._unopened:
                return
            self._retrying.add(index)
        try:
            try:
                gpu = self._open_gpu(index)
            except Exception as e:  # noqa: BLE001 - NVMLError of any kind: still not
                with self._commit:
                    if self._nvml is nv:
                        self._not_set_up(index, e, "lost" if index in self._lost else "could not be set up")
                return
            with self._commit:
                if self._nvml is not nv:  # closed meanwhile: nothing keeps it
                    _free_gpm(nv, gpu.gpm_samples)
                    return
                if self._events is not None:
                    try:
                        nv.nvmlDeviceRegisterEvents(gpu.handle, XID_CRITICAL_ERROR, self._events)
                    except Exception:  # noqa: BLE001 - not supported on this GPU
                        pass
                self._gpus = {**self._gpus, index: gpu}
                self._unopened = {i: e for i, e in self._unopened.items() if i != index}
                if index in self._lost:
                    retired = self._retired.pop(index, None)
                    if retired is not None:
                        _free_gpm(nv, retired.gpm_samples)
                    self._retired[index] = self._lost[index]
                    self._lost = {i: g for i, g in self._lost.items() if i != index}
                self._retry_at.pop(index, None)
                self.generation += 1
        finally:
            with self._commit:
                self._retrying.discard(index)

    def _gpm_alloc(self, handle: object) -> list:
        """Two GPM samples to compare, or [] where the GPU has no GPM (pre-Hopper, old driver)."""
        nv = self._nvml
        samples: list = []
        try:
            if nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                samples.append(nv.nvmlGpmSampleAlloc())
                samples.append(nv.nvmlGpmSampleAlloc())
        except Exception:  # noqa: BLE001 - no GPM: free the one sample that may have been made
            _free_gpm(nv, samples)
            return []
        return samples

    def _xid_events(self) -> object:
        """An event set that XID errors of every GPU set up arrive in; None where unsupported."""
        nv = self._nvml
        try:
            events = nv.nvmlEventSetCreate()
        except Exception:  # noqa: BLE001
            return None
        for gpu in self._gpus.values():
            try:
                nv.nvmlDeviceRegisterEvents(gpu.handle, XID_CRITICAL_ERROR, events)
            except Exception:  # noqa: BLE001 - not supported on this GPU
                pass
        return events

    def close(self) -> None:
        with self._commit:
            self._close()

    def _close(self) -> None:
        if self._nvml is not None:
            # nvmlShutdown does not free GPM samples: a failed open retried would leak them.
            for gpu in [*self._gpus.values(), *self._lost.values(), *self._retired.values()]:
                samples, gpu.gpm_samples = gpu.gpm_samples, []
                _free_gpm(self._nvml, samples)
            if self._events is not None:
                try:
                    self._nvml.nvmlEventSetFree(self._events)
                except Exception:  # noqa: BLE001
                    pass
                self._events = None
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nvml = None

    def gpus(self) -> list[GpuIdentity]:
        """Every GPU NVML lists; one that could not be set up with only its index known, so
        that its series show it down (each read raises why)."""
        with self._commit:  # both of one moment: a GPU set up meanwhile is in one of them, once
            gpus, not_set_up, lost = self._gpus, self._unopened, self._lost
        unopened = [lost[i].identity if i in lost else GpuIdentity(i, "", "", "", "") for i in not_set_up]
        return sorted([*(g.identity for g in gpus.values()), *unopened], key=lambda g: g.index)

    def _live(self, index: int, retry: bool = False) -> _LiveGpu:
        """The GPU, or raise why it is not; `retry`: set it up again if it could not be and
        its back-off passed (slow reads only: see _set_up_again)."""
        if retry and index in self._unopened:
            self._set_up_again(index)
        with self._commit:  # both of one moment: a GPU lost or set up meanwhile is in one of them
            gpu, error = self._gpus.get(index), self._unopened.get(index)
        if error is not None:
            # A fresh exception each time: one raised again and again would grow its traceback.
            raise type(error)(error.where, error.what)
        if gpu is None:
            raise SourceError(f"NVML gpu {index}", "no such GPU")
        return gpu

    def activity(self, index: int, sm_clock: bool = True) -> GpuActivity:
        nv, gpu = self._nvml, self._live(index)
        where = f"NVML gpu {index}"
        try:
            utilization, history = self._utilization(gpu)
            clock = nv.nvmlDeviceGetClockInfo(gpu.handle, NVML_CLOCK_SM) * 1e6 if sm_clock else None
            try:
                mask = nv.nvmlDeviceGetCurrentClocksEventReasons(gpu.handle)
            except AttributeError:
                mask = nv.nvmlDeviceGetCurrentClocksThrottleReasons(gpu.handle)
        except Exception as e:  # noqa: BLE001
            raise self._failed(gpu, where, e) from e
        return GpuActivity(utilization, clock, reasons_from_mask(mask), history)

    def _utilization(self, gpu: _LiveGpu) -> tuple[float, tuple[tuple[float, float], ...] | None]:
        """The mean of the driver's utilization samples since the last read, and those
        samples (monotonic seconds, 0..1; the driver samples every 1/6 to 1 s, finer than a
        slow interval); the utilization rates and None where the GPU keeps no samples."""
        nv = self._nvml
        if gpu.use_samples:
            try:
                _, samples = nv.nvmlDeviceGetSamples(gpu.handle, NVML_GPU_UTILIZATION_SAMPLES, gpu.last_sample_us)
                fresh = sorted((s.timeStamp, s.sampleValue.uiVal) for s in samples if s.timeStamp > gpu.last_sample_us)
                if not fresh:
                    return gpu.last_utilization, ()
                gpu.last_sample_us = fresh[-1][0]
                values = [_ratio(value) for _, value in fresh]
                gpu.last_utilization = sum(values) / len(values)
                times = on_monotonic_clock([stamp for stamp, _ in fresh], time.time(), time.monotonic())
                return gpu.last_utilization, tuple(zip(times, values))
            except nv.NVMLError as e:
                if e.value == NVML_ERROR_NOT_FOUND:  # no new sample since last time
                    return gpu.last_utilization, ()
                if e.value == NVML_ERROR_GPU_IS_LOST:
                    raise
                if e.value in (NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED):
                    gpu.use_samples = False  # a GPU without the sample buffer: the rates from now on
                # else a passing error (a timeout): the rates this once, the samples at the next read
        return _ratio(nv.nvmlDeviceGetUtilizationRates(gpu.handle).gpu), None

    def _optional(self, gpu: _LiveGpu, fn, *args):
        """fn(the GPU's handle, *args); None where the GPU does not support it, a SourceError
        where the GPU is lost."""
        try:
            return fn(gpu.handle, *args)
        except self._nvml.NVMLError as e:
            if e.value == NVML_ERROR_GPU_IS_LOST:
                raise self._failed(gpu, f"NVML gpu {gpu.identity.index}", e) from e
            return None

    def details(self, index: int) -> GpuDetails:
        gpu = self._live(index, retry=True)
        nv = self._nvml
        opt = partial(self._optional, gpu)
        power = opt(nv.nvmlDeviceGetPowerUsage)
        temp = opt(nv.nvmlDeviceGetTemperature, NVML_TEMPERATURE_GPU)
        mem = opt(nv.nvmlDeviceGetMemoryInfo)
        tx = opt(nv.nvmlDeviceGetPcieThroughput, NVML_PCIE_UTIL_TX_BYTES)
        rx = opt(nv.nvmlDeviceGetPcieThroughput, NVML_PCIE_UTIL_RX_BYTES)
        return GpuDetails(power / 1000.0 if power is not None else None, float(temp) if temp is not None else None,
                          float(mem.used) if mem is not None else None, float(mem.total) if mem is not None else None,
                          tx * 1024.0 if tx is not None else None, rx * 1024.0 if rx is not None else None,
                          self._gpm(gpu))

    def health(self, index: int) -> GpuHealth:
        gpu = self._live(index, retry=True)
        nv = self._nvml
        opt = partial(self._optional, gpu)
        ecc = {name: opt(nv.nvmlDeviceGetTotalEccErrors, error_type, NVML_VOLATILE_ECC)
               for name, error_type in zip(ECC_ERROR_TYPES, NVML_MEMORY_ERROR_TYPES)}
        rows = opt(nv.nvmlDeviceGetRemappedRows)  # (correctable, uncorrectable, pending, failed)
        return GpuHealth({k: int(v) for k, v in ecc.items() if v is not None} or None,
                         {"correctable": int(rows[0]), "uncorrectable": int(rows[1])} if rows else None,
                         bool(rows[2]) if rows else None, bool(rows[3]) if rows else None,
                         self._nvlink_errors(gpu, opt))

    def _nvlink_errors(self, gpu: _LiveGpu, opt) -> dict[str, float] | None:
        """Each error kind summed over the links that were ever up; None without NVLink. A link
        that goes down stays in the sum: taken out, its errors would make the sum drop, which
        reads as a reset and counts every error again when it is back. Where a down link's
        counter cannot be read, the kind's sum is unknown (NaN: its last value stands)."""
        nv = self._nvml
        for link in range(NVML_NVLINK_MAX_LINKS):
            if link not in gpu.nvlinks and opt(nv.nvmlDeviceGetNvLinkState, link) == NVML_FEATURE_ENABLED:
                gpu.nvlinks.add(link)
        if not gpu.nvlinks:
            return None
        totals = dict.fromkeys(NVLINK_ERROR_KINDS, 0.0)
        for link in sorted(gpu.nvlinks):
            up: bool | None = None  # asked only when a counter does not answer
            for counter, kind in enumerate(NVLINK_ERROR_KINDS):
                value = opt(nv.nvmlDeviceGetNvLinkErrorCounter, link, counter)
                if value is not None:
                    totals[kind] += int(value)
                    continue
                if up is None:
                    up = opt(nv.nvmlDeviceGetNvLinkState, link) == NVML_FEATURE_ENABLED
                if not up:  # a counter the GPU does not have is skipped; one of a link down is unknown
                    totals[kind] = math.nan
        return totals

    def processes(self, index: int) -> list[GpuProcess]:
        nv, gpu = self._nvml, self._live(index)
        try:
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(gpu.handle)
            except nv.NVMLError as e:
                # In MIG mode the whole GPU's list needs privileges; each MIG device's does not.
                if e.value != NVML_ERROR_NO_PERMISSION or not self._mig_handles(gpu):
                    raise
                procs = [p for h in self._mig_handles(gpu) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
        except Exception as e:  # noqa: BLE001
            raise self._failed(gpu, f"NVML gpu {index} compute processes", e) from e
        # usedGpuMemory is None where the driver cannot say (no permission, MIG).
        return [GpuProcess(int(p.pid), float(p.usedGpuMemory) if p.usedGpuMemory is not None else None)
                for p in procs]

    def mig_uuids(self, index: int) -> list[str]:
        return [_text(self._nvml.nvmlDeviceGetUUID(h)) for h in self._mig_handles(self._live(index))]

    def _mig_handles(self, gpu: _LiveGpu) -> list:
        """The GPU's MIG devices; none when MIG is off or unsupported."""
        nv = self._nvml
        try:
            current, _ = nv.nvmlDeviceGetMigMode(gpu.handle)
        except Exception:  # noqa: BLE001 - not a MIG-capable GPU
            return []
        if not current:
            return []
        out = []
        for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(gpu.handle)):
            try:
                out.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, i))
            except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_FOUND: no MIG device in that slot
                continue
        return out

    def _gpm(self, gpu: _LiveGpu) -> dict[str, float] | None:
        """GPM metrics between this call's sample and the previous one (Hopper and newer)."""
        if not gpu.gpm_samples:
            return None
        nv = self._nvml
        previous, current = gpu.gpm_samples
        try:
            nv.nvmlGpmSampleGet(gpu.handle, current)
            gpu.gpm_samples = [current, previous]  # the next call compares against this one
            if not gpu.gpm_primed:
                gpu.gpm_primed = True
                return {}
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = previous, current
            for i, metric_id in enumerate(GPM_METRICS):
                request.metrics[i].metricId = metric_id
            nv.nvmlGpmMetricsGet(request)
            return {GPM_METRICS[request.metrics[i].metricId]: request.metrics[i].value / 100.0
                    for i in range(len(GPM_METRICS)) if request.metrics[i].nvmlReturn == 0}
        except Exception:  # noqa: BLE001 - GPM hiccups cost only GPM
            return {}

    def xid_counts(self) -> dict[tuple[int, int], int]:
        if self._events is None:
            return dict(self._xids)
        nv = self._nvml
        for _ in range(1000):  # drain what arrived since the last tick, never block
            try:
                event = nv.nvmlEventSetWait(self._events, 0)
            except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: nothing more
                break
            # Whole dicts (another lane replaces them); a lost GPU's too: the XID that says it
            # fell off the bus comes after the fast tick has let it go.
            known = [*self._gpus.values(), *self._lost.values(), *self._retired.values()]
            index = next((g.identity.index for g in known if _same_handle(g.handle, event.device)), -1)
            key = (index, int(event.eventData))
            self._xids[key] = self._xids.get(key, 0) + 1
        return dict(self._xids)


def _same_handle(a, b) -> bool:
    import ctypes

    try:
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    except Exception:  # noqa: BLE001
        return False


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _free_gpm(nv: Any, samples: list) -> None:
    for sample in samples:
        try:
            nv.nvmlGpmSampleFree(sample)
        except Exception:  # noqa: BLE001 - freeing is best effort: nothing else to do
            pass
