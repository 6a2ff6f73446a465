"""What a running exporter has imported: only what serving its node needs. A node without
GPUs, and an install without pandas, never load the diagnoser's stack or NVML's bindings;
settings files (yaml) and prometheus_client are not needed to serve at all."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES
from procs import http_get, start_exporter

# Serve's imports, then a few ticks and a render, as the daemon does; then what was loaded.
PROGRAM = """
import sys
from exporter.cli import make_sampler, serve  # noqa: F401  (serve's imports too)
from exporter.settings import build_parser
from exporter.registry import Registry
root = sys.argv[1]
registry = Registry(root)
sampler = make_sampler(build_parser().parse_args(["--root", root]), registry)
for _ in range(2):
    sampler.slow_tick()
    sampler.fast_tick()
registry.render(openmetrics=True, gzipped=True)
print(" ".join(sorted({m.split(".")[0] for m in sys.modules})))
"""
NEVER = {"pandas", "numpy", "diagnoser", "pynvml", "prometheus_client", "yaml", "pyroute2"}


@pytest.mark.parametrize("node", ["roce-mlx5", "h100-8gpu"])
def test_serving_a_fixture_node_imports_none_of_the_heavy_stacks(node):
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(FIXTURES / node)], capture_output=True, text=True,
                            timeout=60, check=True)
    loaded = set(result.stdout.split())
    assert "exporter" in loaded
    assert not loaded & NEVER, sorted(loaded & NEVER)


def openssl_mapped(pid: int) -> bool:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return any(name in maps for name in ("libssl", "libcrypto", "/_ssl.", "/_hashlib."))


@pytest.mark.parametrize("web_config", [None, "{}\n"])
def test_openssl_is_loaded_only_with_a_web_config_file(tmp_path, web_config):
    """Plain HTTP needs no TLS library nor OpenSSL's digests (libssl and libcrypto, 7 MB of
    the exporter's memory); a web config file, which may turn TLS and passwords on, gets them.
    Nor does it map the C++ runtime, for aiohttp's lists of signal handlers."""
    args = ["--root", str(FIXTURES / "h100-8gpu")]
    if web_config is not None:
        (tmp_path / "web.yml").write_text(web_config)
        args += ["--web.config.file", str(tmp_path / "web.yml")]
    proc, url = start_exporter(tmp_path, *args)
    try:
        assert http_get(url + "/metrics")[0] == 200
        assert openssl_mapped(proc.popen.pid) == (web_config is not None)
        assert "libstdc++" not in Path(f"/proc/{proc.popen.pid}/maps").read_text()
    finally:
        proc.stop()
