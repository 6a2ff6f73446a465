"""Parsers of what the kernel prints: ethtool -S text, /proc/net/snmp, sysfs rates, CLI speeds."""

import argparse

import pytest

from exporter.readers.ethtool import parse_ethtool_stats
from exporter.readers.procfs import PartialTable, read_snmp_table
from exporter.readers.rdma import parse_rate
from exporter.root import Root, SourceError
from exporter.settings import parse_link_speed, parse_listen, parse_speed


def test_ethtool_text_parses_and_reports_malformed_lines_with_their_line():
    text = "NIC statistics:\n     rx_bytes_phy: 1200\n     tx_prio3_pause: 7\n     garbage line\n" \
           "     rx_vport_rdma_unicast_bytes: 18446744073709551615\n     bad: -3\n"
    stats, problems = parse_ethtool_stats(text, "ethtool/x.txt")
    bad = stats.pop("bad")  # a counter whose value is no number: unknown, not absent
    assert bad != bad
    assert stats == {"rx_bytes_phy": 1200, "tx_prio3_pause": 7,
                     "rx_vport_rdma_unicast_bytes": 18446744073709551615}
    assert [p.where for p in problems] == ["ethtool/x.txt:4", "ethtool/x.txt:6"]


def test_snmp_table(tmp_path):
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/snmp").write_text(
        "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: InSegs OutSegs RetransSegs\nTcp: 10 20 3\n")
    table = read_snmp_table(Root(tmp_path), "proc/net/snmp")
    assert table["Tcp"] == {"InSegs": 10, "OutSegs": 20, "RetransSegs": 3}


def test_truncated_snmp_line_costs_only_its_protocol(tmp_path):
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/snmp").write_text("Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: InSegs OutSegs\nTcp: 10\n")
    with pytest.raises(PartialTable) as err:
        read_snmp_table(Root(tmp_path), "proc/net/snmp")
    assert err.value.table == {"Ip": {"Forwarding": 1, "DefaultTTL": 64}}
    assert err.value.where.endswith("proc/net/snmp:4")
    assert "Tcp has 1 values for 2 fields" in err.value.what


def test_only_the_protocols_asked_for_are_parsed_and_checked(tmp_path):
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/snmp").write_text("Ip: Forwarding DefaultTTL\nIp: 1\nTcp: InSegs OutSegs\nTcp: 10 20\n")
    assert read_snmp_table(Root(tmp_path), "proc/net/snmp", {"Tcp"}) == {"Tcp": {"InSegs": 10, "OutSegs": 20}}
    with pytest.raises(PartialTable):  # asked for, the malformed Ip pair is reported
        read_snmp_table(Root(tmp_path), "proc/net/snmp", {"Ip", "Tcp"})


def test_unreadable_file_names_its_path(tmp_path):
    with pytest.raises(SourceError) as err:
        Root(tmp_path).read_int("sys/class/net/eth9/speed")
    assert err.value.where == str(tmp_path / "sys/class/net/eth9/speed")


@pytest.mark.parametrize("text,expected", [
    ("400 Gb/sec (4X NDR)", 400e9 / 8), ("100 Gb/sec (2X HDR)", 100e9 / 8), ("25 Gb/sec (1X EDR)", 25e9 / 8),
    ("2.5 Gb/sec (1X SDR)", 2.5e9 / 8), ("invalid", None)])
def test_ib_rate(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text,bits", [("200Mbit", 200e6), ("100G", 100e9), ("25Gbit/s", 25e9), ("400gbps", 400e9),
                                       ("1.5Gbit", 1.5e9)])
def test_link_speed_units(text, bits):
    assert parse_speed(text) == bits / 8


def test_link_speed_needs_a_unit_and_a_device():
    with pytest.raises(argparse.ArgumentTypeError):
        parse_speed("200")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_link_speed("200Mbit")
    assert parse_link_speed("veth0=200Mbit") == ("veth0", 25e6)


def test_listen_addresses():
    assert parse_listen(":9845") == ("0.0.0.0", 9845)
    assert parse_listen("127.0.0.1:1") == ("127.0.0.1", 1)
    assert parse_listen("[::1]:9845") == ("::1", 9845)


def test_settings_from_file_environment_and_flags_with_the_same_names(tmp_path, monkeypatch):
    from exporter.settings import parse_args

    config = tmp_path / "gpunet.yml"
    config.write_text("fast-interval: 0.5\nslow-interval: 3\nlink-speed: [veth0=200Mbit]\nno-gpu: true\n"
                      "web.config.file: /etc/gpunet/web.yml\n")
    args = parse_args(["--config", str(config)])
    assert (args.fast_interval, args.slow_interval, args.no_gpu, args.web_config_file) == \
        (0.5, 3.0, True, "/etc/gpunet/web.yml")
    assert args.link_speed == [("veth0", 25e6)]
    monkeypatch.setenv("GPUNET_SLOW_INTERVAL", "2")
    monkeypatch.setenv("GPUNET_LISTEN", "127.0.0.1:19845")
    args = parse_args(["--config", str(config), "--fast-interval", "0.1"])
    assert (args.fast_interval, args.slow_interval, args.listen) == (0.1, 2.0, ("127.0.0.1", 19845))


def test_unknown_or_bad_settings_are_refused(tmp_path, capsys):
    from exporter.settings import parse_args

    config = tmp_path / "gpunet.yml"
    config.write_text("fast-intervall: 0.5\n")
    with pytest.raises(SystemExit):
        parse_args(["--config", str(config)])
    assert "unknown setting 'fast-intervall'" in capsys.readouterr().err
    config.write_text("link-speed: [veth0=200]\n")
    with pytest.raises(SystemExit):
        parse_args(["--config", str(config)])
    assert "say the unit" in capsys.readouterr().err
