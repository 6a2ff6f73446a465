"""Calls under a time limit without a hand-off per call (exporter/bounded.py): a hung call
costs its own key, the tick goes on on a fresh worker, and the abandoned worker does nothing
more once its call returns."""

import threading
import time

import pytest

from exporter.bounded import BoundedCalls, Hung, Lane, Watchdog


class Parts:
    """Lanes, bounded calls and watchdogs of one test, closed after it; `release` lets go
    of the calls that hang."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closers: list = []

    def lane(self, name: str) -> Lane:
        lane = Lane(name)
        self.closers.append(lane.close)
        return lane

    def calls(self, name: str) -> BoundedCalls:
        calls = BoundedCalls(name)
        self.closers.append(calls.close)
        return calls

    def watchdog(self, lanes: list[Lane], every: float) -> Watchdog:
        watchdog = Watchdog(lanes, every)
        self.closers.append(watchdog.stop)
        watchdog.start()
        return watchdog


@pytest.fixture
def parts():
    made = Parts()
    yield made
    made.release.set()
    for close in reversed(made.closers):
        close()


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_hung_call_costs_its_key_only_and_answers_again_once_it_returns(parts):
    calls, release = parts.calls("test-calls"), parts.release
    started = time.monotonic()
    results = calls.run({"a": lambda: 1, "stuck": lambda: release.wait(10) and 2, "c": lambda: 3}, timeout=0.1)
    assert time.monotonic() - started < 1.0
    assert results["a"] == 1 and results["c"] == 3
    assert isinstance(results["stuck"], Hung)
    # Still in its call: answered at once, and the others still run.
    started = time.monotonic()
    again = calls.run({"a": lambda: 10, "stuck": lambda: 20}, timeout=2.0)
    assert time.monotonic() - started < 1.0  # not its limit
    assert again["a"] == 10 and isinstance(again["stuck"], Hung)
    release.set()
    wait_until(lambda: not isinstance(calls.run({"stuck": lambda: 30}, timeout=0.1)["stuck"], Hung))
    assert calls.run({"stuck": lambda: 30}, timeout=0.1) == {"stuck": 30}


def test_exceptions_are_results_and_keys_come_back_in_the_order_asked(parts):
    results = parts.calls("test-errors").run({"x": lambda: 1 / 0, "y": lambda: "fine"}, timeout=1.0)
    assert list(results) == ["x", "y"]
    assert isinstance(results["x"], ZeroDivisionError) and results["y"] == "fine"


def test_a_scheduled_tick_goes_on_on_a_fresh_worker_and_the_abandoned_one_does_nothing_more(parts):
    lane, calls, release = parts.lane("test-tick"), parts.calls("test-tick-calls"), parts.release
    hang_once = threading.Event()
    after_the_call: list[str] = []  # the thread that went on after the bounded call, per tick
    ticks: list[tuple[str, bool]] = []

    def tick(late: bool) -> None:
        calls.run({"read": lambda: release.wait(10) if not hang_once.is_set() else "ok"}, timeout=0.05)
        after_the_call.append(threading.current_thread().name)
        ticks.append((threading.current_thread().name, late))

    hang_once.set()  # the first ticks answer at once
    parts.watchdog([lane], every=0.05)
    lane.schedule(0.02, tick)
    wait_until(lambda: len(ticks) >= 3)
    first_worker = ticks[0][0]
    hang_once.clear()  # the next tick hangs in its read
    wait_until(lambda: lane.replaced == 1)
    hang_once.set()
    count = len(ticks)
    wait_until(lambda: len(ticks) >= count + 5)  # ticks go on while the read is stuck
    assert all(name != first_worker for name, _ in ticks[count:])
    by_first_worker = after_the_call.count(first_worker)
    release.set()  # the abandoned worker's call returns: it must not go on with its tick
    # It unwound (its thread ended) rather than going on: nothing more can come from it.
    wait_until(lambda: first_worker not in {t.name for t in threading.enumerate()})
    assert after_the_call.count(first_worker) == by_first_worker
    assert lane.replaced == 1


def test_a_job_interrupted_by_a_hang_runs_again_and_its_caller_gets_the_answer(parts):
    lane, calls, release = parts.lane("test-job"), parts.calls("test-job-calls"), parts.release
    runs: list[str] = []

    def job() -> dict:
        runs.append(threading.current_thread().name)
        return calls.run({"slow": lambda: release.wait(10), "fast": lambda: "yes"}, timeout=0.05)

    result = lane.call(job)
    assert isinstance(result["slow"], Hung) and result["fast"] == "yes"
    assert len(runs) == 2 and runs[0] != runs[1]  # run again on the fresh worker
    assert lane.replaced == 1


def test_an_exception_in_a_job_reaches_its_caller_and_the_lane_goes_on(parts):
    lane = parts.lane("test-raise")
    with pytest.raises(KeyError):
        lane.call(lambda: {}["missing"])
    assert lane.call(lambda: 42) == 42
    assert lane.replaced == 0


def test_a_tick_that_overruns_its_interval_makes_the_next_one_late_not_a_burst(parts):
    lane = parts.lane("test-late")
    ticks: list[tuple[float, bool]] = []

    def tick(late: bool) -> None:
        ticks.append((time.monotonic(), late))
        if len(ticks) == 2:
            time.sleep(0.25)  # overruns two intervals of 0.05 s

    lane.schedule(0.05, tick)
    wait_until(lambda: len(ticks) >= 6)
    lane.close()
    assert [late for _, late in ticks[:2]] == [False, False]
    assert ticks[2][1] is True  # the tick after the overrun is late...
    assert ticks[3][0] - ticks[2][0] > 0.03  # ...and the missed ones are not run in a burst
    assert not any(late for _, late in ticks[3:6])


def test_close_ends_the_worker_and_a_closed_lane_takes_nothing_more(parts):
    lane = parts.lane("test-close")
    lane.schedule(0.01, lambda late: None)
    lane.close()
    lane.join(1.0)
    assert not lane._worker.thread.is_alive()
    with pytest.raises(RuntimeError):
        lane.call(lambda: 1)
    with pytest.raises(RuntimeError):
        lane.schedule(0.01, lambda late: None)


def test_a_hung_inner_call_costs_its_own_key_even_when_the_watchdog_looks_late(parts):
    """An NVML call of one GPU (0.05 s) inside the GPU collector (0.2 s): a watchdog that
    looks only after both limits passed sets aside that GPU, not the collector."""
    lane, release = parts.lane("test-nested"), parts.release
    outer, inner = parts.calls("test-outer"), parts.calls("test-inner")
    answers: list[dict] = []

    def collector() -> dict:
        return inner.run({gpu: (lambda gpu=gpu: release.wait(10) if gpu == 2 else gpu) for gpu in range(4)},
                         timeout=0.05)

    def tick(late: bool) -> None:
        answers.append(outer.run({"gpu": collector}, timeout=0.2))

    parts.watchdog([lane], every=0.5)
    lane.schedule(0.1, tick)
    wait_until(lambda: len(answers) >= 2)
    for answer in answers[:2]:
        assert not isinstance(answer["gpu"], Hung), answer  # the collector answers...
        assert isinstance(answer["gpu"][2], Hung)  # ...without the GPU that hung
        assert [answer["gpu"][g] for g in (0, 1, 3)] == [0, 1, 3]


def test_a_caller_waiting_on_a_hung_job_is_told_when_the_lane_closes(parts):
    lane, calls, release = parts.lane("test-closed"), parts.calls("test-closed-calls"), parts.release
    outcome: list[object] = []
    in_call = threading.Event()

    def wait_for_job() -> None:
        try:
            outcome.append(lane.call(lambda: calls.run({"stuck": lambda: in_call.set() or release.wait(10)},
                                                       timeout=0.2)))
        except RuntimeError as e:
            outcome.append(e)

    waiter = threading.Thread(target=wait_for_job)
    waiter.start()
    assert in_call.wait(5.0)  # the job is in its call, within its limit
    lane.close()
    waiter.join(2.0)
    assert not waiter.is_alive(), "the caller still waits for a job nobody will run"
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError)



def test_a_fresh_worker_that_cannot_start_is_tried_again_and_not_counted(parts, monkeypatch):
    """Out of threads (RuntimeError: can't start new thread), the abandoned worker stays in
    place and the watchdog's next look tries again; `replaced` counts the workers that did
    start, and the ticks go on on the one that did."""
    lane, calls, release = parts.lane("test-start"), parts.calls("test-start-calls"), parts.release
    refusals = []
    start = threading.Thread.start

    def refuse_once(thread: threading.Thread) -> None:
        if thread.name == "test-start-2" and not refusals:
            refusals.append(thread.name)
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refuse_once)
    ticks: list[str] = []

    def tick(late: bool) -> None:
        calls.run({"read": lambda: release.wait(10) if not ticks else "ok"}, timeout=0.05)
        ticks.append(threading.current_thread().name)

    parts.watchdog([lane], every=0.05)
    lane.schedule(0.02, tick)
    wait_until(lambda: len(ticks) >= 3)
    assert refusals == ["test-start-2"]  # the first look's fresh worker
    assert lane.replaced == 1
    assert set(ticks) == {"test-start-2"}  # the next look started one, under the same number


def test_a_lane_holds_no_thread_until_it_is_given_work(parts):
    def threads(prefix: str) -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]

    lane = parts.lane("test-lazy")
    idle = Lane("test-never-used")
    assert threads("test-lazy") == [] and threads("test-never-used") == []
    assert lane.call(lambda: threading.current_thread().name) == "test-lazy-1"
    assert threads("test-lazy") == ["test-lazy-1"]
    idle.close()
    idle.join(1.0)  # closed and joined without ever starting
    assert threads("test-never-used") == []
