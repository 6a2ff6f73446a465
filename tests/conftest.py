import shutil
import subprocess
import sys
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


@pytest.fixture
def served(tmp_path):
    """Load a trace into a real Prometheus (gpunet-trace load) and serve it; returns the URL.
    `limits` are extra flags (a lowered --query.max-samples, say)."""
    from procs import REPO, start_prometheus

    from gpunet.trace_cli import prometheus_command

    procs = []

    def serve(trace: Path, *limits: str) -> str:
        data = tmp_path / f"{trace.name}.tsdb"
        result = subprocess.run([sys.executable, "-m", "gpunet.trace_cli", "load", str(trace), "--data", str(data)],
                                cwd=REPO, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        # gpunet-trace load --serve's own command, less its listen address
        args = [a for a in prometheus_command(data, "127.0.0.1:0")[1:] if not a.startswith("--web.listen-address")]
        proc, url = start_prometheus(args + list(limits), tmp_path / f"prom-{trace.name}.log")
        procs.append(proc)
        return url

    yield serve
    for p in procs:
        p.stop()


@pytest.fixture
def victoria(tmp_path):
    """Import a trace into a real VictoriaMetrics; returns the URL. `limits` are extra flags
    (lowered query limits, say)."""
    from procs import Process, free_port, http_get, wait_for

    from gpunet.victoria import import_trace, victoria_command

    procs = []

    def serve(trace: Path, *limits: str) -> str:
        port = free_port()
        proc = Process(victoria_command(tmp_path / f"vm-{port}", f"127.0.0.1:{port}", *limits),
                       tmp_path / f"vm-{port}.log")
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_get(url + "/health")[0] == 200, what="victoria-metrics ready")
        import_trace(trace, url)
        return url

    yield serve
    for p in procs:
        p.stop()


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    from procs import make_pki

    return make_pki(tmp_path / "pki")
