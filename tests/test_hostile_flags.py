"""Flags that cannot work, to diagnose, gpunet-simulate and gpunet-trace: refused before any
work, in one line that names the flag, exit status 2. Never a hang (a timeout of 0 or NaN is
no timeout at all), never a traceback after the whole analysis, never an output path found
unwritable only once the work is done."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from procs import REPO

BASE = REPO / "replay_data" / "pfc_storm.om.gz"


def run(module: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    return result, time.monotonic() - t0


def refused(result: subprocess.CompletedProcess, prog: str, *named: str) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(prog) and all(n in line for n in named), line  # (a subcommand: "gpunet-trace export:")
    assert not result.stdout, result.stdout  # no report: nothing was read
    return line


@pytest.mark.parametrize("flag,value", [
    ("--timeout", "0"), ("--timeout", "nan"), ("--timeout", "-1"), ("--timeout", "inf"), ("--timeout", "1e400"),
    ("--model-params", "-10B"), ("--model-params", "nan"), ("--model-params", "1e400"), ("--model-params", "0"),
    ("--bytes-per-param", "0"), ("--bytes-per-param", "nan"), ("--bytes-per-param", "-2"),
    ("--gpu-hour-price", "1e308"),
])
def test_diagnose_refuses_a_number_that_cannot_work(flag, value):
    result, _ = run("diagnoser.cli", "--replay", str(BASE), "--model-params", "10B", f"{flag}={value}")
    refused(result, "diagnose", flag, repr(value))


def test_diagnose_with_no_timeout_is_refused_not_a_hang_on_a_silent_server():
    """A server that accepts and never answers: --timeout 0 would wait on it for ever."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        for value in ("0", "nan"):
            result, took = run("diagnoser.cli", "--prometheus", url, "--since", "1h", "--timeout", value)
            refused(result, "diagnose", "--timeout")
            assert took < 30


@pytest.mark.parametrize("source", ["replay", "prometheus"])
def test_diagnose_start_after_end_is_a_usage_error_naming_both(source):
    where = ["--replay", str(BASE)] if source == "replay" else ["--prometheus", "http://127.0.0.1:1"]
    result, _ = run("diagnoser.cli", *where, "--start", "2026-01-01T00:20:00Z", "--end", "2026-01-01T00:10:00Z")
    refused(result, "diagnose", "--start 2026-01-01T00:20:00Z", "--end 2026-01-01T00:10:00Z")


def test_diagnose_a_start_in_the_future_of_a_server_is_a_usage_error():
    result, _ = run("diagnoser.cli", "--prometheus", "http://127.0.0.1:1", "--start", "2999-01-01T00:00:00Z")
    refused(result, "diagnose", "--start", "--end (now)")


@pytest.mark.parametrize("slash", ["", "/"])
def test_diagnose_html_into_an_existing_folder_fails_before_the_analysis(tmp_path, slash):
    result, took = run("diagnoser.cli", "--replay", str(BASE), "--html", f"{tmp_path}{slash}")
    refused(result, "diagnose", "--html", "a folder")


def test_diagnose_good_values_still_work(tmp_path):
    page = tmp_path / "r.html"
    result, _ = run("diagnoser.cli", "--replay", str(BASE), "--timeout", "5", "--model-params", "7B",
                    "--bytes-per-param", "4", "--gpu-hour-price", "2.5", "--start", "2026-01-01T00:00:00Z",
                    "--end", "2026-01-01T00:25:00Z", "--html", str(page))
    assert result.returncode == 0 and page.stat().st_size > 0, result.stderr


@pytest.mark.parametrize("out,named", [("/nonexistent-dir/s.om.gz", "no writable folder /nonexistent-dir"),
                                       ("{tmp}", "a folder"), ("{tmp}/", "a folder")])
def test_simulate_checks_its_output_before_the_work(tmp_path, out, named):
    result, took = run("gpunet.simulate.cli", "--nodes", "64", "--duration", "6h", out.format(tmp=tmp_path))
    refused(result, "gpunet-simulate", named)
    assert took < 20  # not after simulating 64 nodes for 6 hours


def test_simulate_refuses_a_negative_seed(tmp_path):
    result, _ = run("gpunet.simulate.cli", "--seed=-1", str(tmp_path / "s.om.gz"))
    refused(result, "gpunet-simulate", "--seed")


@pytest.mark.parametrize("flag,spec,named", [
    ("--confounder", "checkpoint:every=0s", "every=0s"),  # a checkpoint every 0 s: a loop without end
    ("--confounder", "checkpoint:every=nan", "every=nan"),
    ("--confounder", "checkpoint:every=20m,dur=inf", "dur=inf"),
    ("--confounder", "checkpoint:every=20m,first=2h", "first=2h"),
    ("--confounder", "dcqcn_background:level=nan", "level=nan"),
    ("--confounder", "dcqcn_background:level=-3", "level=-3"),
    ("--confounder", "unused_gpus:nodes=2,gpus=1e9", "gpus=1e9"),
    ("--confounder", "exporter_restart:nodes=1,at=1e400", "at=1e400"),
    ("--confounder", "exporter_restart:nodes=1,down=0s", "down=0s"),
    ("--confounder", "node_join:nodes=-1", "nodes=-1"),
    ("--confounder", "backup:nodes=nan", "nodes=nan"),
    ("--confounder", "checkpoint:evrey=20m", "evrey"),
    ("--fault", "pfc_storm:start=nan,dur=10m", "start=nan"),
    ("--fault", "pfc_storm:start=10m,dur=-5m", "dur=-5m"),
    ("--fault", "pfc_storm:start=10m,dur=10m,strength=nan", "strength=nan"),
    ("--fault", "straggler:start=10m,dur=10m,strength=inf", "strength=inf"),
    ("--fault", "pfc_storm:start=10m,dur=10m,nodes=0", "nodes=0"),
    ("--fault", "link_degraded:start=10m,dur=10m,speed=0G", "speed=0G"),
    ("--fault", "gpu_throttle:start=10m,dur=10m,gpus=nan", "gpus=nan"),
    ("--config-fault", "mtu:culprits=0,mtu=nan", "mtu=nan"),
    ("--config-fault", "pcie_speed:culprits=0,speed=inf", "speed=inf"),
    ("--config-fault", "bond:culprits=0,down=-1", "down=-1"),
])
def test_simulate_refuses_a_fault_or_confounder_option_that_cannot_work(tmp_path, flag, spec, named):
    """Checked before any work, named with its value: never a hang (the command runs under a
    timeout), never a trace of nonsense."""
    out = tmp_path / "s.om.gz"
    result, took = run("gpunet.simulate.cli", "--nodes", "64", "--duration", "1h", f"{flag}={spec}", str(out))
    refused(result, "gpunet-simulate", f"{flag} {spec}", named)
    assert took < 20 and not out.exists()


def test_simulate_fault_and_confounder_options_in_range_still_work(tmp_path):
    out = tmp_path / "s.om.gz"
    result, _ = run("gpunet.simulate.cli", "--nodes", "2", "--gpus", "2", "--nics", "1", "--duration", "3m",
                    "--confounder", "checkpoint:every=1m,dur=10s,first=30s", "--confounder", "dcqcn_background:level=2",
                    "--confounder", "exporter_restart:nodes=#1,at=90s,down=20s",
                    "--fault", "pfc_storm:start=1m,dur=1m,strength=0.5", "--config-fault", "nic_numa:culprits=0,numa=-1",
                    str(out))
    assert result.returncode == 0 and out.stat().st_size > 0, result.stderr


@pytest.mark.parametrize("args,named", [
    (["--since", "1h", "--timeout", "nan"], ["--timeout"]),
    (["--since", "1h", "--timeout=-1"], ["--timeout"]),
    (["--since", "nan"], ["--since"]),
    (["--start", "2000", "--end", "1000"], ["--start 2000", "--end 1000"]),
    (["--start", "1767225600", "--since", "1h"], ["--since", "not both"]),
    ([], ["--since", "--start"]),
])
def test_trace_export_refuses_flags_that_cannot_work(tmp_path, args, named):
    result, _ = run("gpunet.trace_cli", "export", "--prometheus", "http://127.0.0.1:1", *args,
                    str(tmp_path / "x.om.gz"))
    refused(result, "gpunet-trace", *named)


def test_trace_export_checks_its_output_before_the_work():
    result, _ = run("gpunet.trace_cli", "export", "--prometheus", "http://127.0.0.1:1", "--since", "1h",
                    "/nonexistent-dir/x.om.gz")
    refused(result, "gpunet-trace", "no writable folder /nonexistent-dir")


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "9090", "127.0.0.1:http"])
def test_trace_load_refuses_a_listen_address_that_cannot_be(tmp_path, listen):
    result, _ = run("gpunet.trace_cli", "load", str(BASE), "--data", str(tmp_path / "tsdb"), "--listen", listen)
    refused(result, "gpunet-trace", "--listen")
    assert not (tmp_path / "tsdb").exists()
