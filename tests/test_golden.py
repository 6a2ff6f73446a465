"""Golden scrapes: each fixture node's scrape equals its reviewed expected output.

Regenerate after an intended change with `scripts/test --update-goldens -k golden` and
review the diff of tests/golden/ like code.
"""

import shutil
import subprocess

import pytest
from conftest import FIXTURES, GOLDEN
from exporter_harness import Node

NODES = sorted(p.name for p in FIXTURES.iterdir() if (p / "sys").is_dir()) if FIXTURES.is_dir() else []


@pytest.mark.parametrize("name", NODES)
def test_scrape_matches_golden(name, update_goldens):
    # Two ticks one second apart on the test's clock: counters as the fixture holds them,
    # derived counters (GPU busy/idle, state seconds) over exactly that second.
    text = Node(FIXTURES / name).tick(now=100.0).tick(slow=False, now=101.0).stable_text()
    golden = GOLDEN / f"{name}.prom"
    if update_goldens:
        golden.write_text(text)
    assert golden.exists(), f"no golden for {name}: run scripts/test --update-goldens -k golden"
    assert text == golden.read_text()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
@pytest.mark.parametrize("name", NODES)
def test_promtool_finds_no_problem(name):
    text = Node(FIXTURES / name).tick().tick(slow=False).text()
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_on_the_live_machine():
    text = Node("/").tick().tick(slow=False).text()
    assert "gpunet_tcp_sent_segments_total" in text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
