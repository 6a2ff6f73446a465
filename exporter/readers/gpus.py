"""The node's GPU backend (NVML on a live node, nvml.json under a fixture root), opened
once and shared: the GPU collectors ask it about activity, details and processes, and
the PCIe collector reads the links of the GPUs it lists."""

from __future__ import annotations

import threading
import time

from exporter.root import SourceError

REOPEN_SECONDS = 30.0  # how often to retry NVML when it could not be opened


class GpuSource:
    """One opened GPU backend (readers/nvml.py: NvmlGpus or FixtureGpus) and the GPUs it listed."""

    def __init__(self, backend):
        self.backend = backend
        self.driver_version: str | None = None
        self.identities = []
        self._next_attempt = 0.0
        self._open_error: SourceError | None = None
        self._generation = 0  # the backend's generation the identities were listed at
        self._lock = threading.Lock()  # the fast and the slow tick both open it

    def ensure_open(self) -> None:
        """Open the backend once; on failure raise (collector down) and retry later, with
        the same error meanwhile so that it is logged once. A GPU the backend set up after
        the start (its `generation` moved) is listed from then on."""
        if self.driver_version is not None:
            generation = getattr(self.backend, "generation", 0)
            if generation != self._generation:
                self.identities, self._generation = self.backend.gpus(), generation
            return
        with self._lock:
            self._open_locked()

    def _open_locked(self) -> None:
        if self.driver_version is not None:
            return
        now = time.monotonic()
        if now < self._next_attempt and self._open_error is not None:
            raise self._open_error
        self._next_attempt = now + REOPEN_SECONDS
        try:
            driver_version = self.backend.open()
            self.identities = self.backend.gpus()
        except SourceError as e:
            self._open_error = e
            raise
        except Exception as e:  # noqa: BLE001 - what the backend did not foresee waits as long
            self._open_error = SourceError(f"GPU backend {type(self.backend).__name__}", f"open failed: {e!r}")
            raise self._open_error from e
        self._generation = getattr(self.backend, "generation", 0)
        self.driver_version = driver_version

    def close(self) -> None:
        self.backend.close()
