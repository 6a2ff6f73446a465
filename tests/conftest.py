import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "nodes"
GOLDEN = Path(__file__).parent / "golden"


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true",
                     help="rewrite tests/golden/*.prom from the current exporter output")


@pytest.fixture
def update_goldens(request):
    return request.config.getoption("--update-goldens")


@pytest.fixture
def node_copy(tmp_path):
    """A writable copy of a fixture node, for tests that change counters between ticks."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(FIXTURES / name, dest, symlinks=True)
        return dest

    return copy
