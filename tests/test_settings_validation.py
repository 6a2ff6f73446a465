"""Settings that cannot work are refused where they are read, with the setting's name and
exit status 2, never a traceback and never a busy loop: the flags, their GPUNET_*
environment variables and --config keys alike."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from procs import REPO

ROOT = str(REPO / "tests" / "fixtures" / "nodes" / "roce-mlx5")


def exporter(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "--root", ROOT, "--no-gpu", *args, "scrape"],
                          cwd=REPO, capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("flag,value", [
    ("--fast-interval", "0"), ("--fast-interval", "-1"), ("--fast-interval", "nan"), ("--fast-interval", "inf"),
    ("--slow-interval", "0"), ("--config-interval", "-5"), ("--workload.interval", "0"), ("--duration", "nan"),
    ("--web.max-requests", "0"), ("--web.max-requests", "-1"), ("--listen", ":99999"), ("--listen", ":0"),
    ("--nic-include", "("), ("--nic-exclude", "[z-a]"), ("--root", "/nonexistent"), ("--web.max-connections", "0"),
    ("--web.header-timeout", "nan"), ("--web.idle-timeout", "0"), ("--web.write-timeout", "-3"),
    ("--link-speed", "veth0=0G"), ("--link-speed", "veth0=1.2.3G"), ("--log-level", "loud"),
])
def test_a_flag_that_cannot_work_is_refused(flag, value):
    result = exporter(f"{flag}={value}")
    assert result.returncode == 2, (result.stdout[-300:], result.stderr)
    # argparse's usage, then one line that names the flag
    assert "Traceback" not in result.stderr and flag in result.stderr.strip().splitlines()[-1], result.stderr


def test_the_same_check_holds_for_environment_and_config_file(tmp_path):
    result = exporter(env={"GPUNET_FAST_INTERVAL": "0"})
    assert result.returncode == 2 and "fast-interval" in result.stderr and "Traceback" not in result.stderr
    config = tmp_path / "gpunet.yml"
    config.write_text("slow-interval: -1\n")
    result = exporter("--config", str(config))
    assert result.returncode == 2 and "slow-interval" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("variable, value", [("GPUNET_NO_GPU", "maybe"), ("GPUNET_COLLECTOR_TCP", "sometimes"),
                                             ("GPUNET_LOG_LEVEL", "loud"), ("GPUNET_NIC_INCLUDE", "(")])
def test_an_environment_variable_that_cannot_work_is_refused(variable, value):
    result = exporter(env={variable: value})
    assert result.returncode == 2 and variable in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("variable, expected", [
    ("GPUNET_COLLECTOR_TCPP", "environment variable GPUNET_COLLECTOR_TCPP: no collector named 'tcpp'"),
    ("GPUNET_NO_COLLECTOR_FOO", "environment variable GPUNET_NO_COLLECTOR_FOO: no collector named 'foo'"),
    ("GPUNET_FAST_INTERVALL", "unknown setting GPUNET_FAST_INTERVALL (environment variable); "
                              "did you mean GPUNET_FAST_INTERVAL?"),
    ("GPUNET_NOTHING_LIKE_IT", "unknown setting GPUNET_NOTHING_LIKE_IT (environment variable)"),
])
def test_an_unknown_environment_variable_is_refused_like_an_unknown_config_key(variable, expected):
    """A typo in a GPUNET_* variable was ignored where the same typo in --config is refused."""
    result = exporter(env={variable: "1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"gpunet-exporter: error: {expected}"), result.stderr


def test_an_unknown_config_key_names_the_nearest_setting(tmp_path):
    config = tmp_path / "gpunet.yml"
    config.write_text("collector.tcpp: true\nfast-intervall: 1\n")
    result = exporter("--config", str(config))
    assert result.returncode == 2 and "setting collector.tcpp: no collector named 'tcpp'" in result.stderr
    config.write_text("fast-intervall: 1\n")
    result = exporter("--config", str(config))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(
        "unknown setting 'fast-intervall' (in --config or GPUNET_* variables); did you mean 'fast-interval'?")


def test_the_variables_of_the_projects_other_tools_are_no_mistake():
    """The systemd unit's environment file sets GPUNET_EXPORTER_OPTS; diagnose and the Slurm
    prolog read theirs from the same environment."""
    result = exporter("--duration", "0.1", env={"GPUNET_EXPORTER_OPTS": "--no-gpu", "GPUNET_PROMETHEUS_URL": "http://x",
                                                "GPUNET_SLURM_DIR": "/tmp", "GPUNET_GPU_IDS": "uuid"})
    assert result.returncode == 0, result.stderr


def test_a_snapshot_into_a_folder_that_cannot_be_written_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = subprocess.run([sys.executable, "-m", "exporter", "--root", ROOT, "--no-gpu", "snapshot",
                             str(blocker / "out")], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert str(blocker) in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("flag", ["--gpus=0", "--overlap=2", "--comm-ratio=nan", "--scrape=0s", "--tick=0",
                                  "--missing-scrapes=1.5", "--start=nan", "--duration=0", "--step-time=-1s",
                                  "--nodes=0", "--nic-speed=fast", "--compress-level=12"])
def test_the_simulator_refuses_a_setting_that_cannot_work(tmp_path, flag):
    result = subprocess.run([sys.executable, "-m", "gpunet.simulate.cli", str(tmp_path / "x.om.gz"), "--duration=10m",
                             flag], cwd=REPO, capture_output=True, text=True, timeout=60)
    name = flag.split("=")[0].lstrip("-").split("-")[0]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert name in result.stderr.strip().splitlines()[-1], result.stderr


def test_good_values_still_work():
    result = exporter("--fast-interval", "0.05", "--slow-interval", "0.5", "--duration", "0.3")
    assert result.returncode == 0, result.stderr
    assert "gpunet_nic_transmit_bytes_total" in result.stdout


@pytest.mark.parametrize("price", ["-1", "nan", "inf", "ten"])
def test_diagnose_refuses_a_price_that_is_no_price(price):
    result = subprocess.run([sys.executable, "-m", "diagnoser.cli", "--replay",
                             str(REPO / "replay_data" / "healthy_basic.om.gz"), f"--gpu-hour-price={price}"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--gpu-hour-price" in result.stderr and "Traceback" not in result.stderr
