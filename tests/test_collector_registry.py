"""Collectors register themselves (exporter/collector_registry.py); the sampler and the
--collector.NAME / --no-collector.NAME flags are built from that list."""

from __future__ import annotations

import asyncio
import re
import subprocess

import pytest
from conftest import FIXTURES
from procs import REPO, exporter_command
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli import make_sampler
from exporter.collector_registry import register, registered
from exporter.registry import Registry
from exporter.settings import parse_args

NODE = FIXTURES / "h100-jobs"  # RDMA NICs, GPUs and their workloads: most collectors have something to read
NODES = [NODE, *sorted(p for p in FIXTURES.iterdir() if (p / "sys").is_dir() and p != NODE)]
NAMES = [r.name for r in registered()]
GPU_NAMES = [r.name for r in registered() if r.needs_gpu]


def scrape(*flags: str) -> str:
    """One real exporter run over the fixture node: `gpunet-exporter scrape`, in a subprocess."""
    out = subprocess.run(exporter_command("--root", str(NODE), "--duration", "0.6", *flags, "scrape"),
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def up_labels(text: str) -> set[str]:
    return {s.labels["collector"] for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "gpunet_exporter_collector_up"}


class Run:
    """The CLI's own parse_args and make_sampler, ticked by hand: two slow and two fast ticks,
    so that what one collector learns (the GPUs) has reached the others."""

    def __init__(self, *flags: str, node=NODE):
        self.registry = Registry(root_label=node.name)
        self.sampler = make_sampler(parse_args(["--root", str(node), *flags]), self.registry)
        for now in (100.0, 101.0):
            self.sampler.slow_tick(now)
            self.sampler.fast_tick(now)
        asyncio.run(self.sampler.stop())
        self.published = self.registry.published()
        self.text = self.registry.render(openmetrics=False).decode()

    def series(self, *collectors: str) -> set[tuple[str, tuple[str, ...]]]:
        """(metric, label values) of what these collectors published; all of them when none is named."""
        return {(s.metric.name, s.labels) for name, samples in self.published.items()
                if not collectors or name in collectors for s in samples}


@pytest.fixture(scope="module")
def full_runs() -> dict[str, Run]:
    return {node.name: Run(node=node) for node in NODES}


@pytest.fixture(scope="module")
def full(full_runs) -> Run:
    return full_runs[NODE.name]


def test_every_registered_collector_publishes_under_its_name():
    labels = up_labels(scrape(*(f"--collector.{n}" for n in NAMES)))
    assert set(NAMES) <= labels
    # Besides the collectors, only the sampler's own steps report as one.
    assert labels - set(NAMES) == {"inventory", "link_load"}


def test_collectors_run_at_the_tick_they_registered(full):
    ticks = {r.name: r.tick for r in registered()}
    assert {c.name for c in full.sampler.slow} == {n for n, t in ticks.items() if t == "slow"}
    assert {c.name for c in [*full.sampler.link_load_inputs, *full.sampler.fast]} == \
        {n for n, t in ticks.items() if t == "fast"}
    assert [c.name for c in full.sampler.link_load_inputs] == ["wire"]
    assert full.sampler.collector("qos").interval == 30.0  # refresh="config": --config-interval
    assert full.sampler.collector("gpu_workload").interval == 10.0  # refresh="workload"


@pytest.mark.parametrize("name", NAMES)
def test_no_collector_removes_its_series_and_keeps_the_others(full_runs, name):
    # the first fixture node where the collector has something to publish
    node = next((n for n in NODES if full_runs[n.name].series(name)), None)
    assert node is not None, f"no fixture node gives {name} anything to publish: add its files to one"
    full = full_runs[node.name]
    part = Run(f"--no-collector.{name}", node=node)
    assert name in full.published and name not in part.published
    assert f'collector="{name}"' not in part.text
    assert not full.series(name) & part.series()
    # link_load derives from the wire collector's samples: without it, it is not run either.
    gone = {name, "link_load"} if name == "wire" else {name}
    assert set(part.published) == set(full.published) - gone
    others = [c for c in part.published if c != "link_load"]
    assert part.series(*others) == full.series(*others)
    for other in others:
        assert f'gpunet_exporter_collector_up{{collector="{other}"}}' in part.text


def test_no_collector_flag_in_a_real_run():
    labels = up_labels(scrape("--no-collector.bond", "--no-collector.tcp"))
    assert labels == set(NAMES) - {"bond", "tcp"} | {"inventory", "link_load"}


def test_disable_defaults_runs_only_the_collectors_named(full):
    part = Run("--collector.disable-defaults", "--collector.tcp", "--collector.nic_info")
    assert set(part.published) == {"inventory", "tcp", "nic_info"}
    assert part.series("tcp", "nic_info") == full.series("tcp", "nic_info")
    assert part.sampler.gpus is None


def test_turning_off_the_gpu_collectors_is_no_gpu():
    by_flags = Run(*(f"--no-collector.{n}" for n in GPU_NAMES))
    no_gpu = Run("--no-gpu")
    assert by_flags.sampler.gpus is None and no_gpu.sampler.gpus is None
    assert by_flags.series() == no_gpu.series()
    assert not [s for s in no_gpu.series() if s[0].startswith("gpunet_gpu_")]
    # --no-gpu wins over a collector turned on by name
    assert "gpu" not in Run("--no-gpu", "--collector.gpu").published


def test_collector_settings_from_the_environment_and_the_config_file(tmp_path, monkeypatch):
    config = tmp_path / "gpunet.yml"
    config.write_text("collector.bond: false\nno-collector.qos: true\ncollector.pcie: true\n")
    monkeypatch.setenv("GPUNET_NO_COLLECTOR_TCP", "1")
    monkeypatch.setenv("GPUNET_COLLECTOR_RDMA", "false")
    run = Run("--config", str(config), "--collector.qos")  # a flag overrides the file
    assert set(run.published) == set(NAMES) - {"bond", "tcp", "rdma"} | {"inventory", "link_load"}


def test_an_unknown_collector_setting_is_an_error(tmp_path, capsys):
    config = tmp_path / "gpunet.yml"
    config.write_text("collector.foo: true\n")
    with pytest.raises(SystemExit) as e:
        parse_args(["--config", str(config)])
    assert e.value.code == 2
    assert "setting collector.foo: no collector named 'foo'" in capsys.readouterr().err


def test_help_lists_one_flag_pair_per_registered_collector():
    out = subprocess.run(exporter_command("--help"), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    on = re.findall(r"(?<![\w-])--collector\.([\w-]+)", out.stdout)
    off = re.findall(r"--no-collector\.([\w-]+)", out.stdout)
    assert set(on) - {"NAME"} == set(NAMES) | {"disable-defaults"}
    assert set(off) - {"NAME"} == set(NAMES)


@pytest.mark.parametrize("flag", ["--collector.foo", "--no-collector.foo", "--collector.gpu_d"])
def test_an_unknown_collector_flag_is_a_clear_argparse_error(flag):
    out = subprocess.run(exporter_command("--root", str(NODE), flag, "scrape"), cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("usage: gpunet-exporter")
    name = flag.split(".", 1)[1]
    assert f"error: {flag}: no collector named {name!r}; the collectors are {', '.join(NAMES)}" in out.stderr
    assert out.stdout == ""


def test_a_collector_registers_once_under_a_plain_name():
    with pytest.raises(ValueError, match="registered twice"):
        register("tcp", "slow", lambda setup: None, help="again")
    with pytest.raises(ValueError, match="lower case"):
        register("Bad-Name", "slow", lambda setup: None, help="no")
    with pytest.raises(ValueError, match="fast tick"):
        register("slow_feeder", "slow", lambda setup: None, help="no", feeds_link_load=True)
    assert [r.name for r in registered()] == NAMES
