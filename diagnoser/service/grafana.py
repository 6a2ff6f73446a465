"""Each new ongoing finding posted to Grafana as an annotation (--grafana-url with
--grafana-token-file): on every dashboard's time axis, a mark where the cause began, with
its one-line summary and a link to the report. A failed post is one log line."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import aiohttp

from diagnoser.service.history import FindingRow

log = logging.getLogger("gpunet.diagnoser")
POST_TIMEOUT_S = 10.0


class Annotations:
    def __init__(self, grafana_url: str, token_file: str, report_url: Callable[[int], str]):
        self.url = grafana_url.rstrip("/") + "/api/annotations"
        self.token = Path(token_file).read_text(encoding="utf-8").strip()
        self.report_url = report_url
        self._tasks: set[asyncio.Task] = set()

    def post(self, job: str, finding: FindingRow, report_id: int | None) -> None:
        """Post in the background: a slow Grafana does not hold the run."""
        link = f" {self.report_url(report_id)}" if report_id is not None else ""
        body = {"time": int(finding.start * 1000), "tags": ["gpunet", "diagnosis", finding.cls, f"workload:{job}"],
                "text": f"{job}: {finding.summary}{link}"}
        task = asyncio.get_running_loop().create_task(self._send(body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, body: dict) -> None:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=POST_TIMEOUT_S)) as session, \
                    session.post(self.url, json=body, headers={"Authorization": f"Bearer {self.token}"}) as response:
                if response.status >= 300:
                    log.error("Grafana annotation refused: %s: HTTP %d", self.url, response.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.error("Grafana annotation failed: %s: %s", self.url, " ".join(str(e).split()) or type(e).__name__)
