"""A source that never answers (a FIFO in a fixture root: opening it blocks, as a driver
stuck in a read does) costs its own collector and nothing else: the server listens, the
other collectors and the GPU's fast-tick counters keep moving, and SIGTERM still ends the
process within 5 s."""

import asyncio
import os
import shutil
import time

import pytest
from conftest import FIXTURES
from procs import REPO, Process, exporter_command, free_port, http_get, up, values, wait_for


def busy(v: dict) -> float:
    return sum(value for (name, _), value in v.items() if name == "gpunet_gpu_busy_seconds_total")


def ticks(v: dict, tick: str) -> float:
    return v.get(("gpunet_exporter_ticks_total", (("tick", tick),)), 0.0)


def node_with_fifo(tmp_path, relative: str):
    root = tmp_path / "node"
    shutil.copytree(FIXTURES / "h100-8gpu", root)  # its links into roce-mlx5 copied as files
    target = root / relative
    assert target.exists(), relative
    target.unlink()
    os.mkfifo(target)  # no writer ever opens it: open() for reading blocks forever
    return root


@pytest.mark.parametrize("relative, hung", [
    ("ethtool/ens1f0np0.txt", {"wire", "driver_stats"}),  # the driver's counters: every fast tick
    ("sys/class/net/ens1f0np0/statistics/rx_bytes", {"netdev"}),  # a slow-tick source
    ("sys/class/net/ens1f1np1/speed", {"inventory"}),  # read by discovery, before anything else
])
def test_a_hung_read_costs_its_collector_only(tmp_path, relative, hung):
    root = node_with_fifo(tmp_path, relative)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = Process(exporter_command("--root", str(root), "--listen", f"127.0.0.1:{port}", "--fast-interval", "0.1",
                                    "--slow-interval", "0.5"), tmp_path / "exporter.log", cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        started = time.monotonic()
        wait_for(lambda: http_get(url + "/healthz")[0] == 200, timeout=10, what="healthy despite the hung read")
        assert time.monotonic() - started < 8, "the first tick waited on the hung source"
        first = wait_for(lambda: (v := values(url)) and all(up(v, c) == 0 for c in hung) and up(v, "gpu") == 1 and v,
                         what=f"{hung} reported down")
        # Two slow ticks and a few fast ones more (begun after `first`, and ended: a tick is
        # counted as it begins, and `first` may leave out one already begun), whatever the load.
        second = wait_for(lambda: (v := values(url)) and ticks(v, "slow") >= ticks(first, "slow") + 4
                          and ticks(v, "fast") >= ticks(first, "fast") + 5 and v, what="more ticks after the first scrape")
        assert busy(second) > busy(first), "the GPUs' fast-tick counters froze"
        collectors = {dict(labels)["collector"]: value for (name, labels), value in second.items()
                      if name == "gpunet_exporter_collector_up"}
        assert {c for c, value in collectors.items() if value == 0} == hung, collectors
        assert len(collectors) > 10
        assert http_get(url + "/healthz")[0] == 200
        warnings = [line for line in proc.log().splitlines() if "WARNING" in line and "hung:" in line]
        assert len(warnings) == len(hung), warnings  # once per collector, not once per tick
    finally:
        t0 = time.monotonic()
        code = proc.stop(timeout=10)
        took = time.monotonic() - t0
    assert took < 5 and code == 0, f"SIGTERM took {took:.1f}s (exit {code})\n{proc.log()}"


async def test_a_tick_abandoned_in_a_hang_is_still_counted(tmp_path):
    """gpunet_exporter_ticks_total counts every tick that began, the one a hung read held
    (and whose worker was set aside) included."""
    from exporter_harness import Node

    from exporter.bounded import Abandoned

    fifo = "sys/class/net/ens1f0np0/statistics/rx_bytes"
    node = Node(node_with_fifo(tmp_path, fifo), slow_interval=0.3)
    sampler = node.sampler
    began = {"slow": 0}
    abandoned = []
    slow_tick = sampler._slow_tick

    def counted_slow_tick(now=None, collect=True):
        began["slow"] += 1
        try:
            slow_tick(now, collect)
        except Abandoned:
            abandoned.append(began["slow"])
            raise

    sampler._slow_tick = counted_slow_tick
    await sampler.start()
    try:
        deadline = time.monotonic() + 15
        # The first slow tick hangs in the FIFO; the watchdog sets its worker aside, and the
        # FIFO is then opened for writing once so that the abandoned read returns.
        while not sampler._slow_lane.replaced and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sampler._slow_lane.replaced, "the hung slow tick was never set aside"
        os.close(os.open(sampler.root.path(fifo), os.O_WRONLY))
        while not abandoned and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        while began["slow"] < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        started = began["slow"]
        counted = node.value("gpunet_exporter_ticks_total", tick="slow")
        came_back = list(abandoned)  # before the FIFO is let go below, which may return a later hung read
    finally:
        await sampler.stop()
        try:  # a later tick's read may be stuck in the FIFO again: let it return
            os.close(os.open(sampler.root.path(fifo), os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: no reader is waiting
            pass
    assert len(came_back) == 1, came_back  # the tick whose worker was set aside came back, and unwound
    assert counted is not None and counted >= started >= 3, (counted, started)


def test_each_problem_is_logged_once_while_it_lasts_however_many_come_and_go(tmp_path, caplog):
    """A collector with one lasting problem and another, new, at every run (a device come and
    gone) logs every new one, beyond MAX_LOGGED_PROBLEMS of them, and the lasting one once; a
    problem that goes and comes back is logged again."""
    import logging

    from exporter_harness import Node

    from exporter.root import SourceError
    from exporter.sampler import MAX_LOGGED_PROBLEMS

    class Churning:
        name = "churning"
        runs = 0
        lasting = True

        def collect(self, ctx, errors):
            self.runs += 1
            if self.lasting:
                errors.append(SourceError("/sys/class/infiniband/mlx5_9/ports/1/counters", "No such device"))
            errors.append(SourceError(f"/sys/class/net/veth{self.runs}/statistics", "gone while read"))
            return []

    node = Node(tmp_path, collectors=[])
    collector = Churning()
    node.sampler.slow.append(collector)

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("collector churning:")]

    with caplog.at_level(logging.WARNING, logger="gpunet.exporter"):
        for _ in range(MAX_LOGGED_PROBLEMS + 10):
            node.tick(fast=False)
        assert [m for m in logged() if "mlx5_9" in m] == [
            "collector churning: /sys/class/infiniband/mlx5_9/ports/1/counters: No such device"]
        assert [int(m.split("/veth")[1].split("/")[0]) for m in logged() if "veth" in m] == \
            list(range(1, collector.runs + 1))
        collector.lasting = False
        node.tick(fast=False)
        collector.lasting = True
        node.tick(fast=False)
        assert len([m for m in logged() if "mlx5_9" in m]) == 2
