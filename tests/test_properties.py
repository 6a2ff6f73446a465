"""Generated garbage (Hypothesis) against every reader of outside input: the trace reader,
the exporter's sysfs/procfs/ethtool/dcb readers (through the whole sampler), and the web
config loader. None may fail with anything but its documented error, none may hang (a
deadline per example), none may take memory out of proportion to its input."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from conftest import FIXTURES
from exporter_harness import Node
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from diagnoser.sources import replay
from exporter.readers.ethtool import parse_ethtool_stats
from exporter.root import SourceError
from exporter.webconfig import TLS_KEYS, WebConfig, WebConfigError

EXAMPLES = settings(max_examples=60, deadline=3000,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                    derandomize=True)  # the same examples on every run: CI never flakes on a new one

# --- what hostile files hold ---------------------------------------------------------------
NASTY_VALUES = [b"", b"-1", b"18446744073709551616", b"nan", b"inf", b"0x", b"0xffffffffffffffffffff", b"1e400",
                b"\x00\xff\xfe", b"  42\n\n", b"9" * 60, b"up\n", b"-0", b"1 2 3", "ünïcode".encode()]
garbage = st.one_of(st.sampled_from(NASTY_VALUES), st.binary(max_size=200), st.text(max_size=120).map(str.encode))


# --- the trace reader ----------------------------------------------------------------------
TX = "gpunet_nic_transmit_bytes_total"
GOOD = [f"# TYPE {TX[:-6]} counter", f'{TX}{{device="eth0",instance="n1:9845"}} 100 1767225600',
        f'{TX}{{device="eth0",instance="n1:9845"}} 200 1767225615', "# EOF"]
trace_line = st.one_of(
    st.sampled_from(GOOD),
    st.builds(lambda labels, value, ts: f"{TX}{{{labels}}} {value} {ts}",
              st.text(alphabet='abc="{},\\ \n', max_size=30), st.sampled_from(["1", "-5", "nan", "1e308", "x", ""]),
              st.sampled_from(["1767225600", "1767225600000", "-1", "nan", "", "1e30"])),
    st.text(max_size=80),
    st.sampled_from(["# TYPE", "# TYPE \udcff counter", "# EOF", f"# HELP {TX} x", "{}", " ", "a b c d"]),
)


@EXAMPLES
@given(lines=st.lists(trace_line, max_size=40), gz=st.booleans(), cut=st.integers(0, 50))
def test_the_trace_reader_fails_only_with_trace_error(lines, gz, cut):
    import gzip

    data = "\n".join(lines).encode("utf-8", "surrogateescape")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / ("t.om.gz" if gz else "t.om")
        if gz:
            blob = gzip.compress(data)
            path.write_bytes(blob[: max(len(blob) - cut, 1)])  # cut: a truncated stream
        else:
            path.write_bytes(data)
        tracemalloc.start()
        try:
            trace = replay.read(path)
        except replay.TraceError as e:
            assert str(path) in str(e)
        else:
            assert trace.first <= trace.last and trace.series
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    assert peak < 20e6 + 200 * len(data), peak


# --- the exporter's readers, through the sampler ---------------------------------------------
DAMAGEABLE = ["sys/class/net/ens1f0np0/speed", "sys/class/net/ens1f0np0/operstate", "sys/class/net/ens1f0np0/carrier",
              "sys/class/net/ens1f0np0/statistics/rx_bytes", "sys/class/net/ens1f0np0/carrier_changes",
              "sys/class/net/ens1f0np0/mtu", "sys/class/net/ens1f0np0/type", "sys/class/net/ens1f0np0/ecn/roce_rp/enable/3",
              "ethtool/ens1f0np0.txt", "ethtool/ens1f0np0.pause.txt", "proc/net/snmp", "proc/net/netstat",
              "dcb/ens1f0np0.pfc.json", "dcb/ens1f0np0.app.json",
              "sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data",
              "sys/class/infiniband/mlx5_0/ports/1/hw_counters/out_of_sequence",
              "sys/class/infiniband/mlx5_0/ports/1/rate", "sys/class/infiniband/mlx5_0/ports/1/state"]


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine") / "node"
    shutil.copytree(FIXTURES / "roce-mlx5", root)
    for rel in DAMAGEABLE:
        assert (root / rel).exists(), rel
    return root


@EXAMPLES
@given(damage=st.dictionaries(st.sampled_from(DAMAGEABLE), garbage, min_size=1, max_size=6))
def test_the_sampler_turns_any_file_content_into_source_errors(pristine, damage):
    errors = Errors()
    log = logging.getLogger("gpunet.exporter")
    log.addHandler(errors)
    try:
        with tempfile.TemporaryDirectory() as d:
            root = Path(d) / "node"
            shutil.copytree(pristine, root)
            for rel, content in damage.items():
                (root / rel).write_bytes(content)
            node = Node(root).tick(now=100.0).tick(now=101.0)
            text = node.text()
    finally:
        log.removeHandler(errors)
    # No collector crashed (a crash is logged at ERROR with its traceback); damage is a SourceError.
    assert not errors.records, [r.getMessage() for r in errors.records]
    families = list(text_string_to_metric_families(text))
    ups = {s.labels["collector"] for f in families for s in f.samples if s.name == "gpunet_exporter_collector_up"}
    assert {"wire", "netdev", "tcp", "rdma", "inventory"} <= ups
    for f in families:
        for s in f.samples:
            if f.type == "counter" and f.name.startswith("gpunet_"):
                assert s.value >= 0 and s.value == s.value and s.value != float("inf"), (s, damage)


@EXAMPLES
@given(text=st.text(max_size=400))
def test_the_ethtool_parser_keeps_what_is_well_formed(text):
    stats, problems = parse_ethtool_stats(text, "ethtool/x.txt")
    assert all(isinstance(v, int) and v >= 0 for v in stats.values())
    assert all(isinstance(p, SourceError) and str(p).startswith("ethtool/x.txt:") for p in problems)


# --- the web config loader -----------------------------------------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**20), st.floats(allow_nan=True),
                    st.text(max_size=30), st.sampled_from(["TLS12", "TLS13", "RequireAndVerifyClientCert", "1s",
                                                           "$2y$10$" + "a" * 53, "/etc/passwd", "\x00", "x" * 5000]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                             max_size=3), max_leaves=8)
tls_section = st.dictionaries(st.sampled_from(sorted(TLS_KEYS) + ["junk"]), values, max_size=5)
web_doc = st.one_of(
    st.dictionaries(st.sampled_from(["tls_server_config", "basic_auth_users", "http_server_config", "rate_limit",
                                     "junk"]), st.one_of(values, tls_section), max_size=4),
    values,
)


@EXAMPLES
@given(doc=web_doc, raw=st.one_of(st.none(), st.binary(max_size=300)))
def test_the_web_config_loader_fails_only_with_web_config_error(doc, raw):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "web.yml"
        path.write_bytes(raw if raw is not None else json.dumps(doc, default=str).encode())
        try:
            config = WebConfig.load(path)
        except WebConfigError as e:
            assert str(path) in str(e) and "\n" not in str(e).strip()
        else:
            assert config.cached(None) in (True, False, None)
