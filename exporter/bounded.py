"""Calls that may hang (an NVML call on a dying GPU), run with a time limit.

Each key (a GPU) has its own worker thread. A call that does not finish in time is left
to finish on its own; until it does, that key is reported as hung and gets no new call,
so one stuck GPU never holds up the tick or the other GPUs.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Callable, Hashable


class Hung(Exception):
    pass


class BoundedCalls:
    def __init__(self, name: str):
        self._name = name
        self._workers: dict[Hashable, cf.ThreadPoolExecutor] = {}
        self._running: dict[Hashable, cf.Future] = {}

    def run(self, calls: dict[Hashable, Callable[[], object]], timeout: float) -> dict[Hashable, object]:
        """{key: result, or the exception it raised, or Hung()} within about `timeout` seconds."""
        futures: dict[Hashable, cf.Future] = {}
        results: dict[Hashable, object] = {}
        for key, fn in calls.items():
            still = self._running.get(key)
            if still is not None and not still.done():
                results[key] = Hung(f"previous call still running after its time limit")
                continue
            worker = self._workers.get(key)
            if worker is None:
                worker = self._workers[key] = cf.ThreadPoolExecutor(1, thread_name_prefix=f"{self._name}-{key}")
            futures[key] = self._running[key] = worker.submit(fn)
        if futures:
            cf.wait(futures.values(), timeout=timeout)
        for key, future in futures.items():
            if not future.done():
                results[key] = Hung(f"no answer within {timeout:.2f}s")
            elif future.exception() is not None:
                results[key] = future.exception()
            else:
                results[key] = future.result()
        return results

    def close(self) -> None:
        for worker in self._workers.values():
            worker.shutdown(wait=False, cancel_futures=True)
        self._workers.clear()
