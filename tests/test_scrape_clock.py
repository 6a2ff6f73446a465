"""Slow reads that follow the scrapes (exporter/scrape_clock.py): the rhythm of each scraper,
what makes it unknown, and over real HTTP, how often a scraped exporter reads its slow
sources and how old what a scrape gets is."""

import shutil
import statistics
import time

import pytest
from conftest import FIXTURES
from exporter_harness import Node
from procs import http_get, start_exporter
from prometheus_client.parser import text_string_to_metric_families
from test_fixture_nodes import ethtool, set_ethtool

from exporter.scrape_clock import (
    DISTRUST_AFTER_SURPRISE,
    MIN_JITTER,
    MIN_SCRAPES,
    UNKNOWN_HOLDS_FOR,
    ScrapeClock,
    should_read,
)

PROMETHEUS = "10.0.0.1"


def scraped(clock: ScrapeClock, times, scraper: str = PROMETHEUS) -> ScrapeClock:
    for t in times:
        clock.seen(scraper, t)
    return clock


def test_a_steady_scraper_is_foretold_once_three_gaps_agree():
    clock = scraped(ScrapeClock(), [100.0, 115.0, 115.0 + 15.02])
    assert clock.next_expected(131.0) is None  # two gaps: not yet
    clock.seen(PROMETHEUS, 145.01)
    due, slack = clock.next_expected(146.0)
    assert due == pytest.approx(160.01, abs=0.03)
    assert 2 * MIN_JITTER <= slack <= 2.0  # two jitters, 5% of the interval each


def test_slow_ticks_read_only_before_a_foretold_scrape():
    clock = scraped(ScrapeClock(), [15.0 * k + 0.3 for k in range(MIN_SCRAPES)])  # ..., 45.3; next at 60.3
    reads = [t for t in range(46, 61) if should_read(clock, float(t), 1.0)]
    # The ticks whose next tick would come after the earliest the scrape may arrive (two
    # jitters early: 58.8).
    assert reads == [58, 59, 60]
    # A read that takes 0.9 s starts a tick earlier, to be published by then.
    assert [t for t in range(46, 61) if should_read(clock, float(t), 1.0, lead=0.9)] == [57, 58, 59, 60]
    assert should_read(None, 50.0, 1.0)  # not following scrapes: every tick


def test_gaps_that_disagree_are_no_rhythm():
    clock = scraped(ScrapeClock(), [0.0, 15.0, 30.0, 47.0])
    assert clock.next_expected(48.0) is None
    assert should_read(clock, 48.0, 1.0)


def test_a_scrape_overdue_makes_every_tick_read_until_the_rhythm_is_known_again():
    clock = scraped(ScrapeClock(), [0.0, 15.0, 30.0, 45.0])
    assert clock.next_expected(59.0) is not None
    assert clock.next_expected(62.0) is None  # due at 60 and not come: restarted elsewhere, or gone
    for t in (67.0, 82.0, 97.0):  # its new offset
        clock.seen(PROMETHEUS, t)
    assert clock.next_expected(98.0) is None  # the gap 45 -> 67 still disagrees
    clock.seen(PROMETHEUS, 112.0)
    assert clock.next_expected(113.0)[0] == pytest.approx(127.0)


def test_two_scrapers_each_keep_their_rhythm_and_the_soonest_counts():
    clock = scraped(ScrapeClock(), [0.0, 15.0, 30.0, 45.0], "10.0.0.1")
    scraped(clock, [7.0, 22.0, 37.0, 52.0], "10.0.0.2")  # an HA pair, another offset
    assert clock.next_expected(53.0)[0] == pytest.approx(60.0)
    clock.seen("10.0.0.1", 60.0)
    assert clock.next_expected(61.0)[0] == pytest.approx(67.0)


def test_a_person_with_curl_makes_every_tick_read_for_a_while_then_no_more():
    clock = scraped(ScrapeClock(), [15.0 * k for k in range(10)])  # ..., 135
    clock.seen("192.168.1.5", 136.0)  # one request: no rhythm
    assert clock.next_expected(137.0) is None
    for k in range(10, 14):  # Prometheus goes on scraping, until 195
        clock.seen(PROMETHEUS, 15.0 * k)
    later = 136.0 + UNKNOWN_HOLDS_FOR + 1
    assert 195 < later < 210
    assert clock.next_expected(later)[0] == pytest.approx(210.0)


def test_a_request_before_its_time_makes_the_address_distrusted_for_long():
    """A 15 s job and a 60 s job behind one address (a proxy): the last three gaps agree
    between the 60 s job's requests, so the first of those is not foretold. It gets stale
    series once; the address is then not trusted for DISTRUST_AFTER_SURPRISE."""
    times = sorted([15.0 * k for k in range(8)] + [67.0])  # ..., 60, 67 (the 60 s job), 75, ...
    clock = ScrapeClock()
    for t in times[:5]:  # 0, 15, 30, 45, 60
        clock.seen(PROMETHEUS, t)
    assert clock.next_expected(61.0)[0] == pytest.approx(75.0)  # trusted, and wrong
    for t in times[5:]:  # 67: before its time
        clock.seen(PROMETHEUS, t)
    later = 67.0 + DISTRUST_AFTER_SURPRISE
    for k in range(8, int(later // 15) + 2):  # a steady 15 s rhythm again: still distrusted
        clock.seen(PROMETHEUS, 15.0 * k)
        if 15.0 * k + 1 < later:
            assert clock.next_expected(15.0 * k + 1) is None, k
    assert clock.next_expected(15.0 * (int(later // 15) + 1) + 1) is not None


def test_a_scraper_that_grows_late_and_comes_back_on_time_is_no_surprise():
    """Two late requests the rhythm still accepts stretch the interval it sees; the next one,
    on time, comes before that but within the slack: not distrusted."""
    clock = scraped(ScrapeClock(), [0.0, 1.0, 2.15, 3.3, 4.0, 5.0, 6.0, 7.0])
    assert clock.next_expected(7.1)[0] == pytest.approx(8.0)


def test_a_distrusted_slow_scraper_holds_the_reads_between_its_requests():
    """Beside a steady 15 s scraper, one every 5 min that came before its time is not
    trusted: until it is again, every tick reads, also between its requests."""
    clock = ScrapeClock()
    for t in sorted([(15.0 * k, "10.0.0.1") for k in range(80)] + [(300.0 * k, "10.0.0.2") for k in range(4)]
                    + [(1080.0, "10.0.0.2")]):  # 1080: before its time (due at 1200)
        clock.seen(t[1], t[0])
    assert clock.next_expected(1186.0) is None  # 106 s after its last request, a minute and more


def test_a_scrape_that_came_late_does_not_make_the_next_one_look_early():
    clock = scraped(ScrapeClock(), [0.0, 15.0, 30.0, 45.0])
    clock.seen(PROMETHEUS, 60.9)  # a stall: 0.9 s late
    clock.seen(PROMETHEUS, 75.0)  # on time: not before its time
    for t in (90.0, 105.0, 120.0):
        clock.seen(PROMETHEUS, t)
    assert clock.next_expected(121.0)[0] == pytest.approx(135.0)


def test_a_scraper_with_a_five_minute_interval_is_learned():
    clock = scraped(ScrapeClock(), [300.0 * k for k in range(MIN_SCRAPES)])
    assert clock.next_expected(901.0)[0] == pytest.approx(1200.0)


def test_times_from_another_clock_are_no_rhythm():
    clock = scraped(ScrapeClock(), [1000.0, 1015.0, 1030.0, 1045.0])
    assert clock.next_expected(5.0) is None  # a test's clock beside the monotonic one: read


def test_a_scraper_that_stopped_is_forgotten_after_three_of_its_intervals():
    clock = scraped(ScrapeClock(), [100.0, 115.0, 130.0, 145.0], "10.0.0.1")  # then stops
    scraped(clock, [0.0, 60.0, 120.0, 180.0], "10.0.0.2")
    assert clock.next_expected(161.0) is None  # 10.0.0.1 was due at 160: overdue
    assert clock.next_expected(189.0) is None
    assert clock.next_expected(191.0)[0] == pytest.approx(240.0)  # three of its intervals on: forgotten


def test_the_fast_tick_refreshes_its_slow_series_before_a_foretold_scrape_only(node_copy):
    """Per-priority pause frames are made at one fast tick per slow interval; scraped every
    15 s at a steady rhythm, at the fast ticks in the slow interval before the scrape."""
    root = node_copy("roce-mlx5")
    node = Node(root, follow_scrapes=True).tick(now=0.0)
    plain = Node(root).tick(now=0.0)  # not following scrapes
    for t in (0.0, 15.0, 30.0, 45.0):  # on the test's clock, as the ticks
        node.sampler.scrapes.seen(PROMETHEUS, t)
    pauses = ethtool(root, "ens1f0np0")["rx_prio3_pause"]
    set_ethtool(root, "ens1f0np0", rx_prio3_pause=pauses + 500)

    def shown() -> float | None:
        return node.value("gpunet_nic_pfc_pause_frames_total", device="ens1f0np0", direction="receive", priority="3")

    for now in (45.2, 46.0, 50.0, 57.0):
        node.tick(slow=False, now=now)
        assert shown() == pauses, now  # as of the refresh at 0.0: no scrape would see a refresh
    node.tick(slow=False, now=58.4)  # the next scrape may come before the tick a slow interval on
    assert shown() == pauses + 500
    # Not following scrapes, it refreshes once a slow interval.
    plain.tick(slow=False, now=1.0)
    assert plain.value("gpunet_nic_pfc_pause_frames_total", device="ens1f0np0", direction="receive",
                       priority="3") == pauses + 500


def test_a_scheduled_slow_tick_reads_only_when_a_scrape_is_due(node_copy):
    """The slow tick as the running exporter schedules it (its first always reads): scrapes
    foretold 15 s apart, it runs discovery alone until the next scrape may come before the
    tick after."""
    root = node_copy("roce-mlx5")
    node = Node(root, follow_scrapes=True)
    sampler = node.sampler
    stat = root / "sys/class/net/ens1f0np0/statistics/rx_packets"

    def scheduled_tick() -> float | None:
        sampler._slow_lane.call(lambda: sampler._scheduled_slow_tick(False))
        return node.value("gpunet_nic_netdev_receive_packets_total", device="ens1f0np0")

    now = time.monotonic()
    for k in range(MIN_SCRAPES):  # the latest just now: the next due in 15 s
        sampler.scrapes.seen(PROMETHEUS, now - 15.0 * (MIN_SCRAPES - 1 - k))
    first = int(stat.read_text())
    assert scheduled_tick() == first  # the first tick reads, whatever the scrapes
    stat.write_text(f"{first + 1000}\n")
    assert scheduled_tick() == first  # not yet
    assert node.value("gpunet_exporter_ticks_total", tick="slow") == 2  # it did tick: discovery
    clock = sampler.scrapes = ScrapeClock()
    for k in range(MIN_SCRAPES):  # the latest 14.5 s ago: due in half a second
        clock.seen(PROMETHEUS, now - 14.5 - 15.0 * (MIN_SCRAPES - 1 - k))
    assert scheduled_tick() == first + 1000


# --- over real HTTP -------------------------------------------------------------------------

def test_a_steadily_scraped_exporter_reads_its_slow_sources_before_each_scrape_only(tmp_path):
    """A statistic the netdev collector cannot parse is an error at each of its reads: the
    error count tells how often it read. Two exporters at once, scraped every 2 s with a slow
    tick every 0.1 s: the one following the scrapes reads at the few ticks before each scrape
    (the slack, 0.5 s, and one), the one with --slow-read every-tick twenty times a scrape;
    what a scrape of the first shows was read within a slow interval and the slack."""
    node = tmp_path / "node"
    shutil.copytree(FIXTURES / "roce-mlx5", node, symlinks=True)
    broken = next(node.glob("sys/class/net/*/statistics/rx_errors"))
    broken.write_text("not a number\n")
    slow = 0.1
    started = [start_exporter(tmp_path, "--root", str(node), "--no-gpu", "--slow-interval", str(slow),
                              "--slow-read", mode) for mode in ("before-scrape", "every-tick")]
    try:
        scrapes = scrape_steadily([url for _, url in started], 12, 2.0)
    finally:
        for proc, _ in started:
            proc.stop()
    reads = []
    for bodies in scrapes:
        errors = [metric_values(body, "gpunet_exporter_collector_errors_total", collector="netdev")
                  for _, body in bodies]
        # From the 6th scrape on the rhythm is known (4 scrapes); the median, so that a stall
        # of the machine (which makes every tick read for three scrapes) does not decide.
        reads.append(statistics.median(b - a for a, b in zip(errors[5:], errors[6:])))
    following, every_tick = reads
    assert following <= 0.5 * every_tick, reads
    ages = [wall - metric_values(body, "gpunet_exporter_collector_last_run_timestamp_seconds", collector="netdev")
            for wall, body in scrapes[0][5:]]
    assert all(age >= 0 for age in ages), ages
    assert sorted(ages)[-2] <= slow + 2 * MIN_JITTER + 0.3, ages  # all but one: a stall may hold one back


def metric_values(body: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def scrape_steadily(urls: list[str], count: int, period: float) -> list[list[tuple[float, str]]]:
    """`count` scrapes of each URL, `period` apart (on a fixed grid, so that the test's own
    delays do not become the exporters' jitter; the URLs spread over the period); for each
    URL, each scrape's body and the wall time it had come by."""
    out: list[list[tuple[float, str]]] = [[] for _ in urls]
    start = time.monotonic()
    for k in range(count):
        for i, url in enumerate(urls):
            time.sleep(max(0.0, start + (k + i / len(urls)) * period - time.monotonic()))
            status, _, body = http_get(f"{url}/metrics")
            assert status == 200
            out[i].append((time.time(), body.decode()))  # after the answer: what it shows was read before
    return out
