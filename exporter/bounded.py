"""Calls that may hang (an NVML call on a dying GPU), run with a time limit.

A tick's calls run one after another on one worker thread (one hand-off per tick, not
one per GPU). If the batch overruns its limit, the key being called is marked hung, the
worker is abandoned to finish that call on its own (it makes no further calls), and the
calls left run at once on a fresh worker; later ticks skip the hung key until its call
returns. So one stuck GPU or file never holds up the tick or the others.

Workers are daemon threads: a call stuck in the kernel (a read that never returns) cannot be
interrupted, and must not keep the process from exiting on SIGTERM either.
"""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
from collections.abc import Callable, Hashable


class Hung(Exception):
    pass


class BoundedCalls:
    def __init__(self, name: str):
        self._name = name
        self._lanes = 0
        self._lane = self._new_lane()
        self._stuck: dict[Hashable, cf.Future] = {}  # key -> the abandoned batch still in its call
        self._suspects: set[Hashable] = set()  # keys that hung once: called last from then on

    def _new_lane(self) -> _Lane:
        self._lanes += 1
        return _Lane(f"{self._name}-{self._lanes}")

    def run(self, calls: dict[Hashable, Callable[[], object]], timeout: float) -> dict[Hashable, object]:
        """{key: result, or the exception it raised, or Hung()} within about `timeout` seconds."""
        results: dict[Hashable, object] = {}
        for key, future in list(self._stuck.items()):
            if future.done():
                del self._stuck[key]
            else:
                results[key] = Hung("an earlier call has not returned yet")
        todo = sorted(((k, fn) for k, fn in calls.items() if k not in results),
                      key=lambda item: item[0] in self._suspects)
        if not todo:
            return results
        done: dict[Hashable, object] = {}
        # Each round runs what is left; a round that overruns sets the hung key aside and
        # the rest gets a fresh round, so one stuck call costs one time limit, not the tick.
        for _ in range(len(todo)):
            pending = [(k, fn) for k, fn in todo if k not in done and k not in self._stuck]
            if not pending:
                break
            current: list[Hashable | None] = [None]
            abandoned = threading.Event()

            def batch(pending: list[tuple[Hashable, Callable[[], object]]] = pending,
                      current: list[Hashable | None] = current, abandoned: threading.Event = abandoned) -> None:
                for key, fn in pending:
                    if abandoned.is_set():
                        return
                    current[0] = key
                    try:
                        done[key] = fn()
                    except Exception as e:  # noqa: BLE001 - handed to the caller as the result
                        done[key] = e
                current[0] = None

            future = self._lane.submit(batch)
            try:
                future.result(timeout=timeout)
                break
            except cf.TimeoutError:
                abandoned.set()
                hung = current[0]
                self._lane.close()
                self._lane = self._new_lane()
                if hung is None:
                    break
                self._stuck[hung] = future
                self._suspects.add(hung)
        finished = dict(done)
        for key, _ in todo:
            results[key] = finished.get(key, Hung(f"no answer within {timeout:.2f}s"))
        return results

    def close(self) -> None:
        self._lane.close()


class _Lane:
    """One daemon worker thread running submitted calls in order."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue[tuple[cf.Future, Callable[[], None]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> cf.Future:
        future: cf.Future = cf.Future()
        self._jobs.put((future, fn))
        return future

    def close(self) -> None:
        """The worker ends after its current call (at once when idle)."""
        self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                    future.set_exception(e)
