"""What the service runs: the schedule (a run every --interval over the last --lookback, never
two at once: one due while the last still runs is skipped and counted) and the queue of
alert-driven diagnoses (bounded, deduplicated by Alertmanager's groupKey while queued or
running, one diagnosis at a time per job). Each run is `diagnose --prometheus URL --since
LOOKBACK --end NOW`'s pipeline, in a worker thread under --run-timeout; a run past it is
abandoned and its result dropped. A failed run is one log line and a metric, and leaves
the last good results to age out (publish.py).

The configuration facts (PFC/ECN, MTU, PCIe, bonds: the audit's snapshot, 700,000 series at
2,048 nodes, which change on maintenance) are read on a slower schedule of their own
(--config-interval), never while a run goes on, and every run audits the newest snapshot;
a run before the first one was read reads its own, as the command does."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TypeVar

from diagnoser.model.netconfig import ConfigSnapshot
from diagnoser.model.report import Report
from diagnoser.pipeline import Options, UnknownJob, diagnose, job_report
from diagnoser.render import render
from diagnoser.render.document import safe
from diagnoser.service.grafana import Annotations
from diagnoser.service.history import History, HistoryError
from diagnoser.service.publish import JobState, Metrics, finding_row
from diagnoser.service.revive import charts_document
from diagnoser.sources import Connection, Source, SourceError, read_config

log = logging.getLogger("gpunet.diagnoser")

KEEP_AT_LEAST_EVERY_S = 3600.0  # an unchanged job still gets a stored report this often
ALERT_WORKERS = 2  # alert-driven diagnoses running at once (of different jobs)
ALERT_MARGIN_S = 600.0  # an alert's window starts this long before its earliest alert began
MAX_ALERT_WINDOW_S = 86400.0  # ... but reaches back no further than this
WHOLE_CLUSTER = "unattributed"  # the job of a cluster whose nodes carry no workload (diagnoser/analysis/jobs.py)


@dataclass(frozen=True)
class AlertRun:
    group_key: str
    jobs: tuple[str, ...]  # () every job
    start: float
    end: float


T = TypeVar("T")


def in_thread(work: Callable[[float, float], T], *args: float) -> asyncio.Future[T]:
    """`work(*args)` in a daemon thread of its own: one abandoned at its deadline (a server
    that does not answer) keeps neither a pool's thread nor the process's exit waiting."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if not future.done():  # abandoned: its result is dropped
            future.set_exception(error) if error is not None else future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, error = work(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the event loop, which says it in one line
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the service stopped meanwhile
            pass

    threading.Thread(target=run, name="diagnosis", daemon=True).start()
    return future


class Runner:
    def __init__(self, args: argparse.Namespace, history: History, metrics: Metrics, annotations: Annotations | None):
        self.args, self.history, self.metrics, self.annotations = args, history, metrics, annotations
        self.ready = asyncio.Event()
        self.pending: list[AlertRun] = []
        self.active_keys: set[str] = set()  # queued or running
        self.running_jobs: list[tuple[str, ...]] = []
        self.changed = asyncio.Condition()
        self._tasks: set[asyncio.Task] = set()
        # The newest configuration snapshot and when it was read (its window's end).
        self.config: ConfigSnapshot | None = None
        self.config_read_at: float | None = None
        self._turns = asyncio.Condition()  # runs and configuration reads take turns
        self._runs_going = 0
        self._reading_config = False
        for entry in history.latest_per_job():  # a restart publishes what was last known, to age out
            metrics.published.states[entry.job] = JobState(entry.verdict, entry.data_end, entry.findings, entry.id)

    # --- the pipeline, in a worker thread ---------------------------------------------------
    def _source(self, since: float, end: float) -> Source:
        a = self.args
        return Source(prometheus=a.prometheus, since=f"{since:.3f}s", end=f"{end:.3f}",
                      connection=Connection(a.bearer_token_file, a.basic_auth_user, a.ca_file, a.timeout),
                      recording_rules=a.recording_rules)

    def _diagnose(self, since: float, end: float) -> Report:
        config, read_at = self.config, self.config_read_at
        report = diagnose(self._source(since, end), Options(grafana_url=self.args.grafana_url, charts=True), config=config)
        if config is not None and read_at is not None:
            report.notes.append(
                f"configuration facts read {max(0.0, end - read_at):.0f}s before the window's end "
                f"(the service reads them every {self.args.config_interval:g}s)")
        return report

    def _read_config(self, since: float, end: float) -> ConfigSnapshot:
        return read_config(self._source(since, end))[3]

    def config_age(self) -> float:
        """Seconds since the newest configuration snapshot was read; NaN before the first."""
        return float("nan") if self.config_read_at is None else max(0.0, time.time() - self.config_read_at)

    async def _turn(self, config: bool) -> None:
        """Wait for this one's turn: a run while no configuration read goes on, a read while
        no run does (they would share the server and the CPU)."""
        async with self._turns:
            if config:
                await self._turns.wait_for(lambda: self._runs_going == 0)
                self._reading_config = True
            else:
                await self._turns.wait_for(lambda: not self._reading_config)
                self._runs_going += 1

    async def _done(self, config: bool) -> None:
        async with self._turns:
            if config:
                self._reading_config = False
            else:
                self._runs_going -= 1
            self._turns.notify_all()

    async def refresh_config(self) -> bool:
        """Read the configuration snapshot of the last --lookback, in its turn; the last one
        stands where it fails. False when it failed."""
        await self._turn(config=True)
        try:
            end = time.time()
            config = await asyncio.wait_for(in_thread(self._read_config, self.args.lookback, end),
                                            self.args.run_timeout)
        except TimeoutError:
            log.error("configuration read abandoned after %gs (--run-timeout): runs audit the last one read",
                      self.args.run_timeout)
            return False
        except Exception as e:  # noqa: BLE001 - one line; the runs go on with the last snapshot
            log.error("configuration read failed: %s", safe(" ".join(str(e).split())[:300]))
            return False
        finally:
            await self._done(config=True)
        self.config, self.config_read_at = config, end
        return True

    async def config_schedule(self) -> None:
        """A configuration read now, then every --config-interval."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            await self.refresh_config()
            due += self.args.config_interval
            await asyncio.sleep(max(0.0, due - loop.time()))

    async def run(self, trigger: str, since: float, end: float, jobs: tuple[str, ...] = ()) -> bool:
        """One diagnosis of (end - since, end]; its reports stored and published. False when it failed."""
        await self._turn(config=False)
        try:
            return await self._run(trigger, since, end, jobs)
        finally:
            await self._done(config=False)

    async def _run(self, trigger: str, since: float, end: float, jobs: tuple[str, ...]) -> bool:
        began = time.monotonic()
        what = f"{trigger} run" + (f" for {', '.join(jobs)}" if jobs else "")
        try:
            report = await asyncio.wait_for(in_thread(self._diagnose, since, end), self.args.run_timeout)
            self._keep(report, trigger, (end - since, end), jobs)
        except TimeoutError:
            self.metrics.runs.labels(trigger, "timeout").inc()
            log.error("%s abandoned after %gs (--run-timeout): the last results stand until they age out",
                      what, self.args.run_timeout)
            return False
        except (SourceError, UnknownJob, HistoryError) as e:
            self.metrics.runs.labels(trigger, "error").inc()
            log.error("%s failed: %s", what, safe(str(e)))
            return False
        except Exception as e:  # noqa: BLE001 - a bug must not end the service; one line, not a traceback
            self.metrics.runs.labels(trigger, "error").inc()
            log.error("%s failed: %s: %s", what, type(e).__name__, safe(" ".join(str(e).split())[:300]))
            return False
        finally:
            self.metrics.duration.labels(trigger).observe(time.monotonic() - began)
            self.ready.set()
        self.metrics.runs.labels(trigger, "ok").inc()
        self.metrics.last_success.set(time.time())
        return True

    def _keep(self, report: Report, trigger: str, window: tuple[float, float], jobs: tuple[str, ...]) -> None:
        """Each job's report: published, and stored where the store rule says (docs/service.md)."""
        per_job = {WHOLE_CLUSTER: report} if report.jobs is None else {
            j.name: job_report(report, j.name) for j in report.jobs}
        missing = [j for j in jobs if j not in per_job]
        if missing:
            raise UnknownJob(f"no job {', '.join(missing)} in this window; jobs found: {', '.join(per_job) or 'none'}")
        for job, one in per_job.items():
            if jobs and job not in jobs:
                continue
            rows = tuple(finding_row(f) for f in one.findings)
            data_end = one.summary.end  # the window's end as read: its newest sample
            last = self.history.latest(job)
            report_id = last.id if last else None
            if (trigger == "alert" or last is None or last.verdict != one.verdict
                    or {f.key() for f in last.findings} != {f.key() for f in rows}
                    or time.time() - last.created >= KEEP_AT_LEAST_EVERY_S):
                report_id = self.history.add(job, trigger, window, data_end, one.verdict, render(one, "json"),
                                             list(rows), charts=charts_document(one))
            previous = self.metrics.published.states.get(job)
            if previous is not None and previous.data_end > data_end:
                continue  # an alert's run over an older window does not replace a newer verdict
            self.metrics.published.states[job] = JobState(one.verdict, data_end, rows, report_id)
            if self.annotations is not None:
                before = {f.key() for f in previous.findings} if previous else set()
                for f in rows:
                    if f.ongoing and f.key() not in before:
                        self.annotations.post(job, f, report_id)
        self.history.prune(self.args.retention, self.args.history_max_bytes)

    # --- the schedule --------------------------------------------------------------------------
    async def schedule(self) -> None:
        """A run every --interval from now on; one due while the last still runs is skipped."""
        current: asyncio.Task | None = None
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            if current is not None and not current.done():
                self.metrics.skipped.inc()
                log.info("scheduled run skipped: the previous one is still running")
            else:
                current = self._spawn(self.run("schedule", self.args.lookback, time.time()))
            due += self.args.interval
            await asyncio.sleep(max(0.0, due - loop.time()))

    def _spawn(self, coroutine: Coroutine[object, object, object]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- the alert queue ---------------------------------------------------------------------
    def submit(self, group_key: str, jobs: tuple[str, ...], earliest_start: float) -> str:
        """'accepted', 'duplicate' (the group is queued or running) or 'full'."""
        if group_key in self.active_keys:
            return "duplicate"
        if len(self.pending) >= self.args.webhook_queue:
            return "full"
        end = time.time()
        start = max(min(earliest_start - ALERT_MARGIN_S, end - self.args.lookback), end - MAX_ALERT_WINDOW_S)
        self.pending.append(AlertRun(group_key, jobs, start, end))
        self.active_keys.add(group_key)
        self._spawn(self._wake())
        return "accepted"

    async def _wake(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def _overlaps(self, jobs: tuple[str, ...]) -> bool:
        return any(not jobs or not running or set(jobs) & set(running) for running in self.running_jobs)

    async def alert_worker(self) -> None:
        while True:
            async with self.changed:
                await self.changed.wait_for(lambda: any(not self._overlaps(a.jobs) for a in self.pending))
                item = next(a for a in self.pending if not self._overlaps(a.jobs))
                self.pending.remove(item)
                self.running_jobs.append(item.jobs)
            try:
                await self.run("alert", item.end - item.start, item.end, item.jobs)
            finally:
                async with self.changed:
                    self.running_jobs.remove(item.jobs)
                    self.active_keys.discard(item.group_key)
                    self.changed.notify_all()

    async def start(self) -> None:
        self._spawn(self.config_schedule())
        self._spawn(self.schedule())
        for _ in range(ALERT_WORKERS):
            self._spawn(self.alert_worker())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
