"""The configuration audit end to end: real exporters over fixture nodes, a real Prometheus
scraping them, `diagnose --audit` on the server and on the trace exported from it. What
must be found is what the fixtures' README says was put in them."""

import json
import shutil
import subprocess
import sys

import pytest
from conftest import FIXTURES
from procs import REPO, http_get, start_exporter, start_prometheus, wait_for

pytestmark = [pytest.mark.prometheus,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")]

BAD = FIXTURES / "misconfigured-mlx5"
GOOD = FIXTURES / "h100-8gpu"  # roce-mlx5's NICs, PFC and ECN on priority 3, with 8 GPUs


def read(path) -> str:
    return (path).read_text().strip()


def audit(*args: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "diagnoser.cli", *args, "--audit", "--format", "json"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def by_check(doc: dict) -> dict[str, dict[str, list[str]]]:
    return {f["check"]: f["devices"] for f in doc["configuration"]}


@pytest.fixture
def fleet(tmp_path):
    """Three exporters (two healthy GPU nodes, one misconfigured node) and a Prometheus
    scraping them every second: (url, {fixture name: instance})."""
    procs = []
    try:
        nodes = {}
        for name, root, extra in (("good-1", GOOD, ()), ("good-2", GOOD, ()), ("bad", BAD, ("--no-gpu",))):
            proc, url = start_exporter(tmp_path, "--root", str(root), *extra)
            procs.append(proc)
            nodes[name] = url.removeprefix("http://")
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [
            {"job_name": "gpunet", "static_configs": [{"targets": list(nodes.values())}]}]}))
        prom, url = start_prometheus([f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}"],
                                     tmp_path / "prometheus.log")
        procs.append(prom)

        def every_node_has_config() -> bool:
            q = "count by (instance) (gpunet_nic_pcie_current_link_width)"
            _, _, body = http_get(f"{url}/api/v1/query?query={q.replace(' ', '%20')}")
            return len(json.loads(body)["data"]["result"]) == 3
        wait_for(every_node_has_config, timeout=30, what="configuration series of the three nodes")
        yield url, nodes
    finally:
        for proc in procs:
            proc.stop()


def test_audit_from_real_exporters_names_what_the_fixtures_hold(fleet, tmp_path):
    url, nodes = fleet
    bad, good = nodes["bad"], [nodes["good-1"], nodes["good-2"]]
    net = BAD / "sys/class/net"
    # The premises, from the fixture's files.
    assert read(net / "ens1f0np0/ecn/roce_rp/enable/3") == "0" and read(net / "ens1f0np0/mtu") == "1500"
    assert int(read(net / "ens1f1np1/device/current_link_width")) < int(read(net / "ens1f1np1/device/max_link_width"))
    assert read(net / "eno2/bonding_slave/mii_status") == "down"
    assert read(net / "bond0/bonding/mode").split()[0] == "active-backup"

    from_server = audit("--prometheus", url, "--since", "1m")
    print("\n[audit] " + "; ".join(f"{f['check']}: {f['devices']}" for f in from_server["configuration"]))
    found = by_check(from_server)
    assert found["ecn_off_on_pfc_priority"][bad] == ["ens1f0np0"], found
    assert "ens1f1np1" in found["nic_pcie_degraded"][bad], found
    assert found["bond_member_down"][bad] == ["bond0"]
    member = next(f for f in from_server["configuration"] if f["check"] == "bond_member_down")
    assert "eno2" in json.dumps(member) and "eno1" not in json.dumps(member)
    assert "ens1f0np0" in str(found.get("roce_small_mtu", {}).get(bad, [])) + \
        str(found.get("mtu_mismatch", {}).get(bad, [])), found
    # The healthy nodes' first port (PFC and ECN on 3, x16, MTU 9000) is in no finding.
    for devices in found.values():
        for node in good:
            assert "ens1f0np0" not in devices.get(node, []), (node, devices)

    # The same audit from the trace exported from that server.
    trace = tmp_path / "fleet.om.gz"
    export = subprocess.run([sys.executable, "-m", "gpunet.trace_cli", "export", "--prometheus", url, "--since",
                             "1m", str(trace)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert export.returncode == 0, export.stderr
    assert by_check(audit("--replay", str(trace))) == found
