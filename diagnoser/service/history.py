"""The service's history: one SQLite file of reports (stdlib sqlite3), queried per job and
class, bounded in age and size.

A report is kept whole as its JSON document (render(report, "json")), from which the HTML
and markdown pages are rendered on demand; its findings are also rows of their own, so that
`diagnose history` and /reports filter by job and class without reading the documents.
WAL journal and one transaction per write: a service killed at any moment restarts with
every report it had written. Incremental auto-vacuum: deleting reports gives their pages
back to the file system, so the file shrinks under --history-max-bytes instead of only
stopping to grow."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpunet.trace import unwritable

SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,            -- the workload (gpunet_gpu_workload_info), or a group's name
    trigger TEXT NOT NULL,        -- schedule | alert
    window_start REAL NOT NULL,
    window_end REAL NOT NULL,
    data_end REAL NOT NULL,       -- the newest time the verdict rests on
    created REAL NOT NULL,
    verdict TEXT NOT NULL,        -- findings | healthy | inconclusive
    document TEXT NOT NULL,       -- render(report, "json")
    charts TEXT                   -- the HTML page's charts (revive.charts_document), NULL: none
);
CREATE INDEX IF NOT EXISTS reports_by_job ON reports (job, created);
CREATE INDEX IF NOT EXISTS reports_by_time ON reports (created);
CREATE TABLE IF NOT EXISTS findings (
    report_id INTEGER NOT NULL REFERENCES reports (id) ON DELETE CASCADE,
    job TEXT NOT NULL,
    class TEXT NOT NULL,
    culprit TEXT NOT NULL,        -- the first culprit's instance, "" for a class that names none
    device TEXT NOT NULL,         -- the NIC or GPU named, "" when none
    confidence REAL NOT NULL,
    gpu_idle_seconds REAL,
    start REAL NOT NULL,
    end REAL NOT NULL,
    ongoing INTEGER NOT NULL,
    summary TEXT NOT NULL         -- one line for a page (publish.summary_line)
);
CREATE INDEX IF NOT EXISTS findings_by_job_class ON findings (job, class);
CREATE INDEX IF NOT EXISTS findings_by_report ON findings (report_id);
"""
DELETE_BATCH = 50  # reports deleted at a time while the file is over its cap


class HistoryError(Exception):
    """The history file cannot be used (corrupt, unwritable); str() says which and why."""


@dataclass(frozen=True)
class FindingRow:
    cls: str
    culprit: str
    device: str
    confidence: float
    gpu_idle_seconds: float | None
    start: float
    end: float
    ongoing: bool
    summary: str

    def key(self) -> tuple[str, str, str]:
        """What makes two runs' findings "the same": class, culprit and device."""
        return self.cls, self.culprit, self.device


@dataclass(frozen=True)
class Entry:
    """A stored report: what the list pages and the store rule read, without the document."""
    id: int
    job: str
    trigger: str
    window_start: float
    window_end: float
    data_end: float
    created: float
    verdict: str
    findings: tuple[FindingRow, ...]

    def to_dict(self) -> dict:
        return {"id": self.id, "job": self.job, "trigger": self.trigger, "window_start": self.window_start,
                "window_end": self.window_end, "created": self.created, "verdict": self.verdict,
                "findings": [{"class": f.cls, "culprit": f.culprit, "device": f.device, "confidence": f.confidence,
                              "gpu_idle_seconds": f.gpu_idle_seconds, "start": f.start, "end": f.end,
                              "ongoing": f.ongoing, "summary": f.summary} for f in self.findings]}


class History:
    """The open history file. Not shared between threads: the service uses it from its event
    loop only (writes are a few milliseconds)."""

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        if not readonly and (problem := unwritable(self.path)):
            raise HistoryError(f"{self.path}: {problem}")
        try:
            if readonly:
                if not self.path.is_file():
                    raise HistoryError(f"{self.path}: no such file")
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)
            else:
                self.db = sqlite3.connect(self.path, isolation_level=None)  # transactions explicit below
                self.db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # effective on a new file only
                self.db.execute("PRAGMA journal_mode = WAL")
                self.db.execute("PRAGMA synchronous = NORMAL")  # WAL: durable at checkpoints, never corrupt
                self.db.execute("PRAGMA foreign_keys = ON")
                self.db.executescript(SCHEMA)
            check = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise HistoryError(f"{self.path}: corrupt SQLite file ({check})")
            self.db.execute("SELECT count(*) FROM reports").fetchone()
        except sqlite3.Error as e:
            raise HistoryError(f"{self.path}: {e}") from None

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def add(self, job: str, trigger: str, window: tuple[float, float], data_end: float, verdict: str,
            document: str, findings: list[FindingRow], created: float | None = None,
            charts: str | None = None) -> int:
        """Store one report and its findings in one transaction; its id."""
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO reports (job, trigger, window_start, window_end, data_end, created, verdict, document, "
                "charts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job, trigger, window[0], window[1], data_end, time.time() if created is None else created, verdict,
                 document, charts))
            report_id = int(cursor.lastrowid or 0)
            db.executemany("INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [(report_id, job, f.cls, f.culprit, f.device, f.confidence, f.gpu_idle_seconds, f.start,
                             f.end, int(f.ongoing), f.summary) for f in findings])
        return report_id

    def document(self, report_id: int) -> str | None:
        row = self.db.execute("SELECT document FROM reports WHERE id = ?", (report_id,)).fetchone()
        return row[0] if row else None

    def charts(self, report_id: int) -> str | None:
        row = self.db.execute("SELECT charts FROM reports WHERE id = ?", (report_id,)).fetchone()
        return row[0] if row else None

    def entries(self, job: str | None = None, cls: str | None = None, since: float | None = None,
                limit: int = 1000, ids: list[int] | None = None) -> list[Entry]:
        """Reports newest first, narrowed to a job, to those with a finding of a class, to
        those created after `since`, to the given ids."""
        where: list[str] = []
        params: list[object] = []
        if ids is not None:
            where.append(f"r.id IN ({','.join('?' * len(ids)) or 'NULL'})")
            params.extend(ids)
        if job is not None:
            where.append("r.job = ?")
            params.append(job)
        if cls is not None:
            where.append("EXISTS (SELECT 1 FROM findings f WHERE f.report_id = r.id AND f.class = ?)")
            params.append(cls)
        if since is not None:
            where.append("r.created >= ?")
            params.append(since)
        rows = self.db.execute(
            "SELECT id, job, trigger, window_start, window_end, data_end, created, verdict FROM reports r"
            + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.created DESC, r.id DESC LIMIT ?",
            (*params, limit)).fetchall()
        found: dict[int, list[FindingRow]] = {row[0]: [] for row in rows}
        if rows:
            marks = ",".join("?" * len(rows))
            for f in self.db.execute(
                    "SELECT report_id, class, culprit, device, confidence, gpu_idle_seconds, start, end, ongoing, "
                    f"summary FROM findings WHERE report_id IN ({marks}) ORDER BY rowid", list(found)):
                found[f[0]].append(FindingRow(f[1], f[2], f[3], f[4], f[5], f[6], f[7], bool(f[8]), f[9]))
        return [Entry(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], tuple(found[row[0]])) for row in rows]

    def latest(self, job: str | None = None) -> Entry | None:
        entries = self.entries(job=job, limit=1)
        return entries[0] if entries else None

    def latest_per_job(self) -> list[Entry]:
        """Each job's newest report: what the service publishes again after a restart."""
        ids = [row[0] for row in self.db.execute("SELECT max(id) FROM reports GROUP BY job")]
        return self.entries(ids=ids, limit=len(ids))

    def size(self) -> int:
        """Bytes on disk: the file and its write-ahead log."""
        return sum(os.path.getsize(p) for p in (self.path, Path(f"{self.path}-wal")) if p.exists())

    def prune(self, retention: float, max_bytes: int, now: float | None = None) -> int:
        """Delete reports older than `retention` seconds, then the oldest while the file is
        over `max_bytes` (the newest report always stays); give the pages back. Returns the
        reports deleted."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            deleted = db.execute("DELETE FROM reports WHERE created < ?", (now - retention,)).rowcount
        while self._used_bytes() > max_bytes:
            with self._transaction() as db:
                gone = db.execute("DELETE FROM reports WHERE id IN (SELECT id FROM reports WHERE id < "
                                  "(SELECT max(id) FROM reports) ORDER BY created, id LIMIT ?)",
                                  (DELETE_BATCH,)).rowcount
            deleted += gone
            if not gone:
                break
        if deleted:
            self.db.executescript("PRAGMA incremental_vacuum;")  # run to its end (execute() frees one page)
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the freed pages leave the file now
        return deleted

    def _used_bytes(self) -> int:
        page_size, pages, free = (self.db.execute(f"PRAGMA {p}").fetchone()[0]
                                  for p in ("page_size", "page_count", "freelist_count"))
        return int(page_size * (pages - free))

