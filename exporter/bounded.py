"""Calls that may hang (a sysfs read stuck in a driver, an NVML call on a dying GPU), run
with a time limit, without a thread hand-off per call.

A `Lane` is one daemon worker thread that runs a tick on its own schedule (or a job handed
to it). Its calls that may hang go through `BoundedCalls.call` (or `run`, for a batch),
which runs them right there, on the worker, each under its time limit: the worker notes
the call it is in (a frame), and a `Watchdog` thread, which wakes once in a while (once a
second in the exporter), looks at the frames. When a call
overruns its limit, its key is marked hung, the worker is abandoned to finish that call on
its own, and a fresh worker starts the interrupted tick again, in which the hung key answers
`Hung` at once; so do later ticks, until the abandoned call returns. An abandoned worker
that comes back from its call does nothing more: `Abandoned` unwinds it.

So one stuck GPU or file costs its own series (and the tick's time limit, once) and never
holds up the others, while a tick that hangs nowhere costs no hand-off at all: the worker
wakes on its own schedule and the watchdog's wake-ups are a few checks of a list.

A caller that is not a lane's worker (a test calling a tick or a collector directly) hands
its calls to a lane and supervises it itself while it waits (`Lane.call`), with the same
outcome.

Workers are daemon threads: a call stuck in the kernel (a read that never returns) cannot be
interrupted, and must not keep the process from exiting on SIGTERM either.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import NamedTuple

# How often a caller that waits on a lane looks at its frames (only tests and one-off
# scrapes wait on a lane; the running exporter's lanes are watched by a Watchdog).
SUPERVISE_EVERY = 0.02


class Hung(Exception):
    pass


class Abandoned(BaseException):
    """Raised in an abandoned worker when its call returns: unwinds it without running more
    (a BaseException, so that no collector's `except Exception` keeps it going)."""


class _Frame(NamedTuple):
    calls: BoundedCalls
    key: Hashable
    deadline: float  # monotonic


log = logging.getLogger("gpunet.exporter")
_local = threading.local()  # .worker: the _Worker this thread is (absent on other threads)


class BoundedCalls:
    """Calls under a time limit, by key. Keys that hung once are called last from then on,
    unless the caller needs its calls in order."""

    def __init__(self, name: str):
        self._name = name
        self._stuck: dict[Hashable, _Worker] = {}  # key -> the abandoned worker still in its call
        self._suspects: set[Hashable] = set()  # keys that hung once
        self._lane: Lane | None = None  # for callers that are no lane's worker

    def call(self, key: Hashable, timeout: float, fn: Callable[..., object], *args: object) -> object:
        """fn(*args), or the exception it raised, or Hung(): one call under its time limit."""
        worker: _Worker | None = getattr(_local, "worker", None)
        if worker is None:
            return self.run({key: lambda: fn(*args)}, timeout)[key]
        return self._call_on(worker, key, timeout, fn, args)

    def run(self, calls: dict[Hashable, Callable[[], object]], timeout: float,
            in_order: bool = False) -> dict[Hashable, object]:
        """{key: result, or the exception it raised, or Hung()}: each call gets `timeout`
        seconds before it is set aside (see the module's docstring)."""
        worker: _Worker | None = getattr(_local, "worker", None)
        if worker is None:
            if self._lane is None:
                self._lane = Lane(self._name)
            # Restarted on a fresh worker if a call hangs: what was done is kept.
            done: dict[Hashable, object] = {}
            self._lane.call(lambda: self._run_on(_local.worker, calls, timeout, in_order, done))
            return {key: done[key] for key in calls}
        return self._run_on(worker, calls, timeout, in_order, {})

    def _run_on(self, worker: _Worker, calls: dict[Hashable, Callable[[], object]], timeout: float,
                in_order: bool, done: dict[Hashable, object]) -> dict[Hashable, object]:
        keys = list(calls)
        if self._suspects and not in_order:
            keys.sort(key=self._suspects.__contains__)
        for key in keys:
            if key not in done:
                done[key] = self._call_on(worker, key, timeout, calls[key], ())
        return done

    def _call_on(self, worker: _Worker, key: Hashable, timeout: float, fn: Callable[..., object],
                 args: tuple) -> object:
        if worker.abandoned:  # set aside between two calls: it makes no more
            raise Abandoned
        if key in self._stuck:
            return Hung("an earlier call has not returned yet")
        frame = _Frame(self, key, time.monotonic() + timeout)
        worker.frames.append(frame)
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - handed to the caller as the result
            return e
        finally:
            worker.leave(frame)

    def close(self) -> None:
        if self._lane is not None:
            self._lane.close()


class _Worker:
    def __init__(self, lane: Lane, number: int):
        self.lane = lane
        self.frames: list[_Frame] = []  # the bounded calls it is in, outermost first
        self.abandoned = False
        # Taken by the worker to leave a frame and by the watchdog to abandon it: a call that
        # returns just as it is found late either finishes (and the worker goes on) or is
        # abandoned (and the worker stops), never both.
        self.lock = threading.Lock()
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.job: _Job | None = None  # the job it is in, None in a scheduled tick or idle
        self.thread = threading.Thread(target=self._work, name=f"{lane.name}-{number}", daemon=True)

    def leave(self, frame: _Frame) -> None:
        with self.lock:
            self.frames.pop()
            if not self.abandoned:
                return
        # Abandoned while in this call (or a call inside it): the key it was set aside under
        # answers again, and the worker unwinds.
        if frame.calls._stuck.get(frame.key) is self:
            del frame.calls._stuck[frame.key]
        raise Abandoned

    def overdue(self, now: float) -> _Frame | None:
        """The innermost call past its limit, marked hung, this worker abandoned; None when
        every call is within its limit (or the worker is idle). Innermost: an NVML call of
        one GPU that hangs inside the GPU collector costs that GPU, not the collector, even
        when the watchdog looks only after both limits passed."""
        with self.lock:
            if self.abandoned:
                return None
            for frame in reversed(self.frames):
                if now > frame.deadline:
                    self.abandoned = True
                    frame.calls._stuck[frame.key] = self
                    frame.calls._suspects.add(frame.key)
                    return frame
        return None

    def _work(self) -> None:
        _local.worker = self
        lane = self.lane
        try:
            while True:
                wait = lane._until_next_tick()
                try:
                    job = self.jobs.get(timeout=wait) if wait is None or wait > 0 else self.jobs.get_nowait()
                except queue.Empty:
                    lane._run_scheduled_tick()
                    continue
                if job is None:
                    return
                self.job = job
                job.run()
                self.job = None
        except Abandoned:
            return


class _Job:
    """A function handed to a lane by a caller that waits for it. A job interrupted by a hang
    runs again from its start on the next worker, so it must make sense to run twice."""

    __slots__ = ("fn", "result", "error", "done")

    def __init__(self, fn: Callable[[], object]):
        self.fn = fn
        self.result: object = None
        self.error: Exception | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.result = self.fn()
        except Exception as e:  # noqa: BLE001 - handed to the caller
            self.error = e
        self.done.set()


class Lane:
    """A worker thread that runs a tick on a schedule (once `schedule` was called) and the jobs
    handed to it; replaced by a fresh one when a bounded call on it overruns its limit."""

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._workers = 0  # started so far: names them
        self._interval: float | None = None
        self._tick: Callable[[bool], object] | None = None
        self._deadline = 0.0
        self._closed = False
        # Started at the first schedule or call: a lane made and never used (a sampler built
        # and ticked by hand, as tests do) holds no thread.
        self._worker = self._new_worker()

    def _new_worker(self) -> _Worker:
        self._workers += 1
        return _Worker(self, self._workers)

    def _hand(self, job: _Job) -> None:
        """Queue a job for the worker, started if it was not (under self._lock)."""
        if self._closed:
            raise RuntimeError(f"lane {self.name} is closed")
        if self._worker.thread.ident is None:
            self._worker.thread.start()
        self._worker.jobs.put(job)

    @property
    def replaced(self) -> int:
        """Workers abandoned in a hung call so far."""
        return self._workers - 1

    # --- a tick on a schedule (the running exporter) --------------------------------------
    def schedule(self, interval: float, tick: Callable[[bool], object]) -> None:
        """Run `tick(late)` every `interval` seconds from now, the first at once; `late`: the
        tick comes more than an interval after its time (the missed ones are skipped, not
        run in a burst). A tick that raises is a bug: it is logged by `tick` itself."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"lane {self.name} is closed")
            self._interval, self._tick = interval, tick
            self._deadline = time.monotonic()
            self._hand(_Job(lambda: None))  # wakes the worker to take up its schedule

    def _until_next_tick(self) -> float | None:
        return None if self._interval is None else self._deadline - time.monotonic()

    def _run_scheduled_tick(self) -> None:
        interval, tick = self._interval, self._tick
        if interval is None or tick is None:  # closed meanwhile
            return
        now = time.monotonic()
        late = now - self._deadline > interval
        # The next tick an interval after this one's time, or after now when this one is late.
        # Set first: a tick interrupted by a hang is not run again, the next one comes at once.
        self._deadline = (now if late else self._deadline) + interval
        tick(late)

    # --- a job handed over by a caller that waits (tests, one-off scrapes) ------------------
    def call(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the worker and return what it returns (or raise what it raised),
        supervising the worker while waiting."""
        job = _Job(fn)
        with self._lock:
            self._hand(job)
        while not job.done.wait(SUPERVISE_EVERY):
            try:
                self.supervise()
            except RuntimeError:  # no thread to start a fresh worker: the next look tries again
                pass
        if job.error is not None:
            raise job.error
        return job.result

    # --- supervision -----------------------------------------------------------------------
    def supervise(self, now: float | None = None) -> Hashable | None:
        """Replace the worker when a call on it overruns its limit; the key set aside, if any.
        A job it was in runs again at once on the fresh worker, before what was queued; a
        scheduled tick it was in is not run again, but the next one is due at once."""
        worker = self._worker
        frame = worker.overdue(time.monotonic() if now is None else now)
        if frame is None and not worker.abandoned:
            return None
        with self._lock:
            if self._worker is not worker:  # replaced meanwhile, by another supervisor
                return None
            fresh = self._new_worker()
            # Started first: should it fail (no threads left), the abandoned worker stays in
            # place with its queue, and the next look tries again (with the same number).
            try:
                fresh.thread.start()
            except BaseException:
                self._workers -= 1
                raise
            interrupted = worker.job
            if interrupted is not None and self._closed:  # nobody would run it again: its caller is told
                interrupted.error = RuntimeError(f"lane {self.name} closed while a call on it hung")
                interrupted.done.set()
            elif interrupted is not None:
                fresh.jobs.put(interrupted)
            while True:  # what was queued for the abandoned worker moves over, in order
                try:
                    fresh.jobs.put(worker.jobs.get_nowait())
                except queue.Empty:
                    break
            self._worker = fresh
        return frame.key if frame is not None else None

    def close(self) -> None:
        """The worker ends after its current job or tick (at once when idle)."""
        with self._lock:
            self._closed = True
            self._interval = self._tick = None
            self._worker.jobs.put(None)

    def join(self, timeout: float) -> None:
        if self._worker.thread.ident is not None:  # never started: nothing to wait for
            self._worker.thread.join(timeout)


class Watchdog:
    """One thread that supervises lanes every `every` seconds: a hung call is set aside
    within its limit plus `every`."""

    def __init__(self, lanes: list[Lane], every: float):
        self._lanes = lanes
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gpunet-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._every):
            now = time.monotonic()
            for lane in self._lanes:
                try:
                    lane.supervise(now)
                except Exception:  # noqa: BLE001 - a thread that cannot start: the next look tries again
                    log.exception("watchdog: lane %s", lane.name)
