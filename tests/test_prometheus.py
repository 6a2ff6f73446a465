"""A real Prometheus server scrapes a running exporter; PromQL returns the series."""

import json
import shutil
import urllib.parse

import pytest
from conftest import FIXTURES
from procs import http_get, start_exporter, start_prometheus, wait_for

pytestmark = [pytest.mark.prometheus,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")]

NODE = FIXTURES / "roce-mlx5"


def ethtool_value(device: str, name: str) -> int:
    for line in (NODE / "ethtool" / f"{device}.txt").read_text().splitlines():
        key, _, value = line.strip().partition(": ")
        if key == name:
            return int(value)
    raise KeyError(name)


@pytest.fixture
def prometheus(tmp_path):
    started = []

    def start(targets: list[str], scrape_interval: str = "1s"):
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": [{"job_name": "gpunet", "static_configs": [{"targets": targets}]}]}))
        proc, url = start_prometheus([f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}"],
                                     tmp_path / "prometheus.log")
        started.append(proc)
        return url

    yield start
    for proc in started:
        proc.stop()


def query(url: str, promql: str) -> list[dict]:
    status, _, body = http_get(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def test_prometheus_scrapes_the_exporter_and_promql_returns_the_series(tmp_path, prometheus):
    exporter, exporter_url = start_exporter(tmp_path, "--root", str(NODE))
    try:
        target = exporter_url.removeprefix("http://")
        prom = prometheus([target])
        result = wait_for(lambda: query(prom, "gpunet_nic_transmit_bytes_total"), timeout=30,
                          what="gpunet series in prometheus")
        by_device = {r["metric"]["device"]: float(r["value"][1]) for r in result}
        # The RoCE ports report the driver's physical-port counters (RDMA included).
        assert by_device["ens1f0np0"] == ethtool_value("ens1f0np0", "tx_bytes_phy")
        assert by_device["ens1f1np1"] == ethtool_value("ens1f1np1", "tx_bytes_phy")
        assert all(r["metric"]["instance"] == target and r["metric"]["job"] == "gpunet" for r in result)

        pauses = query(prom, 'sum by (device) (gpunet_nic_pfc_pause_frames_total{direction="transmit",priority="3"})')
        assert {r["metric"]["device"]: float(r["value"][1]) for r in pauses}["ens1f0np0"] == \
            ethtool_value("ens1f0np0", "tx_prio3_pause")

        targets = json.loads(http_get(prom + "/api/v1/targets")[2])["data"]["activeTargets"]
        assert targets[0]["health"] == "up" and targets[0]["lastError"] == ""
        # The exporter's self-metrics say every collector works on this fixture.
        down = query(prom, "gpunet_exporter_collector_up == 0")
        assert down == [], down
    finally:
        exporter.stop()
