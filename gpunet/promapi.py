"""A client of the Prometheus HTTP API (Prometheus, VictoriaMetrics, Thanos, Mimir...).

Async (aiohttp), with bearer token, basic auth, a custom CA, timeouts and a bound on
concurrent requests. Errors become PromError with a one-line cause; credentials never
appear in a message (URLs are shown without their userinfo, tokens never).
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from gpunet.window import number, rfc3339

# The largest answer a query may return, as decoded from gzip. Memory is bounded whatever a
# server sends: the answers being read at once hold at most CONCURRENCY of these (128 MiB),
# and one at a time is decoded, into at most some 26 times its size (JSON of empty
# objects; an answer of series takes 5 to 17 times). A larger answer is refused as over a
# limit, which the diagnoser splits by nodes and time: its queries of 200 nodes over 120
# windows answer a few MB.
MAX_RESPONSE_BYTES = 16 << 20
CONCURRENCY = 8  # queries in flight at once
MAX_TIMEOUT = 86400.0  # seconds: --timeout 0 or NaN would be no timeout at all, a hang on a silent server


class PromError(Exception):
    """A request to the Prometheus API failed; str() is a one-line cause fit for users."""


# How engines word a refusal over a query limit. Prometheus: "query processing would load
# too many samples into memory" (--query.max-samples); VictoriaMetrics: "cannot select more
# than -search.maxSamplesPerQuery=N samples", "the number of matching timeseries exceeds
# 300000 ... increase -search.max* flag values",
# "-search.maxPointsPerTimeseries"; Thanos and Mimir: "exceeded the maximum number of
# samples/series/chunks", "max-fetched-series-per-query".
_LIMIT = re.compile(r"too many (samples|points|series|chunks)|search\.max|max[-_](samples|fetched|series|chunks)"
                    r"|exceed(s|ed)? (the (maximum|limit)|\d+)", re.IGNORECASE)
# The limit a refusal names, for a warning (the engines' messages run to 300 characters).
# Flags and phrases only, the flag first: the message quotes the query, whose functions are
# named max_...
_LIMIT_NAMES = [re.compile(r) for r in (r"-search\.max\w+(=\d+)?", r"too many \w+", r"max-[a-z-]+",
                                         r"exceed\w* the \w+ \w+ of \w+",
                                         r"[\w ]{0,40}exceeds \d+", r"over \d+ MiB")]
# Limits on the points of each series: a query over fewer series will not pass them.
_PER_SERIES = re.compile(r"PointsPerTimeseries|SamplesPerSeries|too many points")


class PromLimitError(PromError):
    """The server refused a query over one of its limits (samples, series, points per
    series) or its answer was over MAX_RESPONSE_BYTES: a smaller query may pass. `limit`
    names the limit as the server's message does; `per_series`: a limit on each series'
    points, which a query over fewer series does not pass either."""

    def __init__(self, message: str):
        super().__init__(message)
        found = next((m for m in (pattern.search(message) for pattern in _LIMIT_NAMES) if m), None)
        self.limit = found.group(0).strip() if found else message
        self.per_series = bool(_PER_SERIES.search(self.limit))


def _not_the_api(status: int, content_type: str, raw: bytes) -> str:
    """What to say of an answer that is no Prometheus API response, in one line: a web page
    (a wrong URL, a proxy's login) by its title, anything else by its start."""
    text = raw.decode("utf-8", "replace")
    if "html" in content_type or text.lstrip()[:1] == "<":
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.I | re.S)
        page = f"an HTML page{' titled ' + repr(' '.join(title.group(1).split())[:80]) if title else ''}"
        return f"HTTP {status}, {page}, not a Prometheus API answer (a wrong URL, or a proxy asking to log in?)"
    return f"HTTP {status}" + (f": {' '.join(text.split())[:200]}" if text.strip() else "")


def redact(url: str) -> str:
    """The URL without user:password@."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


@dataclass
class Auth:
    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False


class PrometheusClient:
    def __init__(self, url: str, auth: Auth | None = None, timeout: float = 60.0, concurrency: int = CONCURRENCY):
        auth = auth or Auth()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PromError(f"not an http(s) URL: {redact(url)}")
        if parts.username is not None and auth.username is None:  # http://user:pass@host
            auth.username, auth.password = parts.username, parts.password or ""
        self.url = redact(url).rstrip("/")
        self._auth = auth
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._semaphore = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._in_flight: set[asyncio.Task] = set()  # the tasks waiting on a request
        self.requests = 0
        self.bytes_received = 0  # as on the wire (gzip where the server compresses)
        self.bytes_decoded = 0  # the JSON those bytes hold

    async def __aenter__(self) -> PrometheusClient:
        # gzip only, decoded here: the bytes on the wire are counted, and the cap on an answer
        # holds for what it decodes to.
        headers = {"Accept-Encoding": "gzip"}
        if self._auth.bearer_token:
            headers["Authorization"] = f"Bearer {self._auth.bearer_token}"
        basic = aiohttp.BasicAuth(self._auth.username, self._auth.password or "") if self._auth.username else None
        ssl_ctx: ssl.SSLContext | bool = True
        if self._auth.ca_file:
            ssl_ctx = ssl.create_default_context(cafile=self._auth.ca_file)
        if self._auth.insecure_skip_verify:
            ssl_ctx = False
        self._session = aiohttp.ClientSession(headers=headers, auth=basic, timeout=self._timeout,
                                              auto_decompress=False, connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=32))
        return self

    async def __aexit__(self, *exc) -> None:
        # Requests still in flight (the siblings of one that failed, when the caller leaves on
        # its error) are cancelled, not left to fail on the closed session as the loop ends.
        self._closed = True
        for task in self._in_flight:
            task.cancel()
        if self._session is not None:
            await self._session.close()

    async def _read(self, resp: aiohttp.ClientResponse, path: str) -> bytes:
        """The body, decoded from gzip where it was sent so, refused past MAX_RESPONSE_BYTES
        (a server streaming without end must not take the diagnoser's memory with it)."""
        gzipped = resp.headers.get("Content-Encoding", "").lower() == "gzip"
        if not gzipped and (resp.content_length or 0) > MAX_RESPONSE_BYTES:
            raise PromLimitError(f"{self.url}{path}: an answer of {resp.content_length} bytes, over the "
                                 f"{MAX_RESPONSE_BYTES >> 20} MiB a query may return: refused")
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
        body = bytearray()
        async for chunk in resp.content.iter_chunked(1 << 20):
            self.bytes_received += len(chunk)
            body += inflate.decompress(chunk, MAX_RESPONSE_BYTES + 1 - len(body)) if inflate else chunk
            if len(body) > MAX_RESPONSE_BYTES:
                raise PromLimitError(f"{self.url}{path}: an answer of over {MAX_RESPONSE_BYTES >> 20} MiB: refused "
                                     "(a query too large, or a server that never ends its body?)")
        if inflate:
            try:
                body += inflate.flush()
            except zlib.error as e:
                raise PromError(f"{self.url}{path}: a gzip answer that does not decode ({e})") from None
        self.bytes_decoded += len(body)
        return bytes(body)

    async def _get(self, path: str, params: list[tuple[str, str]], method: str = "POST",
                   decode: Callable[[bytes], object] = json.loads) -> object:
        if self._closed:  # asked after the client closed (a sibling of a request that failed): abandoned
            raise asyncio.CancelledError
        task = asyncio.current_task()
        assert task is not None
        self._in_flight.add(task)
        try:
            return await self._ask(path, params, method, decode)
        except PromError as e:
            # Raised without the frames it came through: a caller holds the error while it runs
            # the halves of a query refused over a limit, and those frames hold the answer read
            # (up to MAX_RESPONSE_BYTES each: against a server that never ends its answers, all
            # of them at once, 22 GB).
            e.__context__ = None  # (an aiohttp error's frames, the answer read so far with them)
            raise e.with_traceback(None) from None
        finally:
            self._in_flight.discard(task)

    async def _ask(self, path: str, params: list[tuple[str, str]], method: str,
                   decode: Callable[[bytes], object]) -> object:
        assert self._session is not None, "use 'async with PrometheusClient(...)'"
        url = self.url + path
        async with self._semaphore:
            self.requests += 1
            try:
                # POST form where the API allows it: long PromQL and many match[] fit.
                request = self._session.post(url, data=params) if method == "POST" else \
                    self._session.get(url, params=params)
                async with request as resp:
                    raw = await self._read(resp, path)
                    if resp.status in (401, 403):
                        raise PromError(f"{self.url}: unauthorised (HTTP {resp.status}); check the token or "
                                        f"basic auth")
                    try:
                        body = decode(raw) if raw else {}
                    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
                        body = {}
                    if not isinstance(body, dict):
                        raise PromError(f"{self.url}{path}: an answer that is no API response (a JSON "
                                        f"{type(body).__name__})")
                    if resp.status >= 400 or body.get("status") != "success":
                        cause = str(body.get("error") or _not_the_api(resp.status, resp.content_type, raw))
                        raise (PromLimitError if _LIMIT.search(cause) else PromError)(f"{self.url}{path}: {cause}")
                    return body["data"]
            except TimeoutError:
                raise PromError(f"{self.url}{path}: no answer within {self._timeout.total:.0f}s") from None
            except aiohttp.ClientConnectorError as e:
                raise PromError(f"{self.url}: cannot connect ({e.os_error.strerror if e.os_error else e})") \
                    from None
            except aiohttp.ClientError as e:
                raise PromError(f"{self.url}{path}: {type(e).__name__}: {e}") from None

    async def query(self, expr: str, time: float, decode: Callable[[bytes], object] = json.loads) -> dict:
        """`decode`: the body's parser, as query_range's."""
        return await self._get("/api/v1/query", [("query", expr), ("time", f"{time:.3f}")],  # type: ignore
                               decode=decode)

    async def query_range(self, expr: str, start: float, end: float, step: float,
                          decode: Callable[[bytes], object] = json.loads) -> dict:
        """`decode`: the body's parser (a caller may read the points into arrays itself)."""
        # nocache=1: VictoriaMetrics otherwise moves start and end of a query of 50 points or
        # more to multiples of the step (for its result cache), and the points then miss the
        # windows asked for; other engines ignore it.
        return await self._get("/api/v1/query_range", [("query", expr), ("start", f"{start:.3f}"), ("end", f"{end:.3f}"),
                                                        ("step", f"{step:g}"), ("nocache", "1")], decode=decode)  # type: ignore

    async def series(self, matches: list[str], start: float, end: float) -> list[dict]:
        params = [("match[]", m) for m in matches] + [("start", f"{start:.3f}"), ("end", f"{end:.3f}")]
        return await self._get("/api/v1/series", params)  # type: ignore

    async def label_values(self, label: str, matches: list[str], start: float, end: float) -> list[str]:
        params = [("match[]", m) for m in matches] + [("start", f"{start:.3f}"), ("end", f"{end:.3f}")]
        return await self._get(f"/api/v1/label/{label}/values", params, "GET")  # type: ignore

    async def metadata(self) -> dict[str, list[dict]]:
        try:
            return await self._get("/api/v1/metadata", [], "GET")  # type: ignore
        except PromError:
            return {}  # not every engine serves metadata: types then come from the contract


# Every exporter and every trace carries it, a few series per node: cheap to look for.
PRESENCE_METRIC = "gpunet_exporter_collector_up"


async def where_data_is(client: PrometheusClient, now: float) -> str:
    """Where the server holds gpunet series, for a message about a window that holds none.
    Bisects time with the label-values API, which reads only the index of the storage
    blocks a range touches (Prometheus: blocks of 2 h and more; VictoriaMetrics: days), so
    the span it finds is as fine as the blocks, and costs some 40 index look-ups."""
    async def holds(start: float, end: float) -> bool:
        return bool(await client.label_values("instance", [PRESENCE_METRIC], start, end))

    if not await holds(0.0, now):
        return f"the server holds no {PRESENCE_METRIC} series at all (is it scraping the exporters?)"
    first_lo, first_hi = 0.0, now  # data in [0, first_hi], none in [0, first_lo)
    last_lo, last_hi = 0.0, now  # data in [last_lo, now], none after last_hi
    while first_hi - first_lo > 3600:
        mid = (first_lo + first_hi) / 2
        first_lo, first_hi = (first_lo, mid) if await holds(0.0, mid) else (mid, first_hi)
    while last_hi - last_lo > 3600:
        mid = (last_lo + last_hi) / 2
        last_lo, last_hi = (mid, last_hi) if await holds(mid, now) else (last_lo, mid)

    async def samples_near(low: float, high: float) -> bool:  # read the samples: is the index's answer true?
        answer = await client.query(f"count(last_over_time({PRESENCE_METRIC}[{int(high - low) + 7200}s]))", high)
        return bool(answer.get("result"))

    # Some servers answer label queries over long ranges from a global index, whatever the
    # range (VictoriaMetrics past a month): the samples at both ends must confirm the span.
    if await samples_near(first_lo, first_hi) and await samples_near(last_lo, last_hi):
        return f"it holds gpunet series from about {rfc3339(first_lo)} to {rfc3339(last_hi)}"
    return "it holds gpunet series at other times (this server's index cannot narrow them down: look with --start/--end)"


def add_connection_arguments(parser) -> None:
    """The flags every command that talks to a Prometheus API takes, spelled once."""
    parser.add_argument("--bearer-token-file", help="file holding a bearer token for the Prometheus API")
    parser.add_argument("--basic-auth-user", help="basic auth user (password from $GPUNET_PROMETHEUS_PASSWORD)")
    parser.add_argument("--ca-file", help="CA certificate(s) to verify the server")
    parser.add_argument("--timeout", type=number(0.001, MAX_TIMEOUT, " seconds"), default=60.0,
                        help="seconds per request (default 60)")


def client_from_arguments(url: str, args) -> PrometheusClient:
    import os
    from pathlib import Path

    token = Path(args.bearer_token_file).read_text().strip() if args.bearer_token_file else None
    auth = Auth(bearer_token=token, username=args.basic_auth_user,
                password=os.environ.get("GPUNET_PROMETHEUS_PASSWORD"), ca_file=args.ca_file)
    return PrometheusClient(url, auth, timeout=args.timeout)
