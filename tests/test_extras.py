"""`pip install .` is the exporter alone: `diagnose` and `gpunet-simulate` then say in one
line which extra to install, instead of a ModuleNotFoundError traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("entry", "command"), [("diagnoser.cli", "diagnose"), ("gpunet.simulate.cli", "gpunet-simulate")])
def test_a_command_without_its_extra_names_the_extra_in_one_line(entry, command):
    # -S: no site-packages, so neither numpy nor pandas can be found (the base install's view
    # of the diagnoser); the repository itself is on the path as an installed package would be.
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); sys.argv = [{command!r}, '--help']; " \
           f"from {entry} import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{command}: the Python package 'numpy' is missing")
    assert "pip install 'gpunet[diagnoser]'" in lines[0]
