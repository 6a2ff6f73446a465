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
        self._stuck: dict[Hashable, _Job] = {}  # key -> the abandoned batch still in its call
        self._suspects: set[Hashable] = set()  # keys that hung once: called last from then on

    def _new_lane(self) -> _Lane:
        self._lanes += 1
        return _Lane(f"{self._name}-{self._lanes}")

    def run(self, calls: dict[Hashable, Callable[[], object]], timeout: float,
            in_order: bool = False) -> dict[Hashable, object]:
        """{key: result, or the exception it raised, or Hung()} within about `timeout` seconds.
        Keys that hung before are called last, unless `in_order` (a call needs the ones
        before it)."""
        results: dict[Hashable, object] = {}
        if self._stuck:
            for key, job in list(self._stuck.items()):
                if job.finished:
                    del self._stuck[key]
                else:
                    results[key] = Hung("an earlier call has not returned yet")
        todo = [(k, fn) for k, fn in calls.items() if k not in results]
        if self._suspects and not in_order:
            todo.sort(key=lambda item: item[0] in self._suspects)
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

            job = self._lane.submit(batch)
            if job.wait(timeout):
                job.reraise()
                break
            abandoned.set()
            hung = current[0]
            self._lane.close()
            self._lane = self._new_lane()
            if hung is None:
                break
            self._stuck[hung] = job
            self._suspects.add(hung)
        finished = dict(done)  # an abandoned worker may still write its late answer into `done`
        for key, _ in todo:
            results[key] = finished[key] if key in finished else Hung(f"no answer within {timeout:.2f}s")
        return results

    def close(self) -> None:
        self._lane.close()


class _Job:
    """A call handed to a lane; the caller waits on a plain lock the worker releases (a
    concurrent.futures.Future costs a condition variable and more on every tick)."""

    __slots__ = ("fn", "finished", "error", "_done")

    def __init__(self, fn: Callable[[], None]):
        self.fn = fn
        self.finished = False
        self.error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            self.error = e
        finally:
            self.finished = True
            self._done.release()

    def wait(self, timeout: float) -> bool:
        """True once it finished, False when `timeout` seconds passed first."""
        return self.finished or self._done.acquire(timeout=timeout)

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error


class _Lane:
    """One daemon worker thread running submitted calls in order."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> _Job:
        job = _Job(fn)
        self._jobs.put(job)
        return job

    def close(self) -> None:
        """The worker ends after its current call (at once when idle)."""
        self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            job.run()
