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
    return subprocess.run([sys.executable, "-m", "exporter.cli", "--root", ROOT, "--no-gpu", *args, "scrape"],
                          cwd=REPO, capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("flag,value", [
    ("--fast-interval", "0"), ("--fast-interval", "-1"), ("--fast-interval", "nan"), ("--fast-interval", "inf"),
    ("--slow-interval", "0"), ("--config-interval", "-5"), ("--workload.interval", "0"), ("--duration", "nan"),
    ("--web.max-requests", "0"), ("--web.max-requests", "-1"), ("--listen", ":99999"), ("--listen", ":0"),
])
def test_a_flag_that_cannot_work_is_refused(flag, value):
    result = exporter(f"{flag}={value}")
    assert result.returncode == 2, (result.stdout[-300:], result.stderr)
    assert "Traceback" not in result.stderr and flag.lstrip("-").split(".")[0] in result.stderr


def test_the_same_check_holds_for_environment_and_config_file(tmp_path):
    result = exporter(env={"GPUNET_FAST_INTERVAL": "0"})
    assert result.returncode == 2 and "fast-interval" in result.stderr and "Traceback" not in result.stderr
    config = tmp_path / "gpunet.yml"
    config.write_text("slow-interval: -1\n")
    result = exporter("--config", str(config))
    assert result.returncode == 2 and "slow-interval" in result.stderr and "Traceback" not in result.stderr


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
