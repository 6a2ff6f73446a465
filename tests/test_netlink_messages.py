"""The netlink dump reader (exporter/readers/netlink.py) against answers written here byte by
byte, as the kernel frames them: on any host, where tests/test_netlink_readers.py checks the
same code against a real kernel in network namespaces."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from exporter.readers.netlink import NLM_F_DUMP_INTR, NLMSG_DONE, NLMSG_ERROR, NetlinkError, dump

RTM_NEWLINK = 16
HEADER = struct.Struct("=IHHII")


def msg(type_: int, seq: int, payload: bytes, flags: int = 2) -> bytes:  # 2: NLM_F_MULTI
    raw = HEADER.pack(HEADER.size + len(payload), type_, flags, seq, 0) + payload
    return raw + b"\0" * (-len(raw) % 4)


def done(seq: int, code: int = 0, flags: int = 2) -> bytes:
    return msg(NLMSG_DONE, seq, struct.pack("=i", -code), flags)


def answer(*datagrams: bytes) -> list[bytes]:
    """Run dump() with these datagrams waiting as the kernel's answer; its payloads."""
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with ours, kernel:
        ours.settimeout(1.0)
        for d in datagrams:
            kernel.send(d)
        return [bytes(p) for p in dump(ours, 18, b"\0" * 16, seq=7)]


def test_a_multipart_answer_over_several_reads_comes_back_whole_and_in_order():
    got = answer(msg(RTM_NEWLINK, 7, b"link-a..") + msg(RTM_NEWLINK, 7, b"link-b.."),
                 msg(RTM_NEWLINK, 7, b"link-c.."), done(7))
    assert got == [b"link-a..", b"link-b..", b"link-c.."]


def test_messages_of_an_earlier_request_are_skipped():
    got = answer(msg(RTM_NEWLINK, 6, b"stale..."), done(6), msg(RTM_NEWLINK, 7, b"fresh..."), done(7))
    assert got == [b"fresh..."]


def test_an_interrupted_dump_is_asked_again():
    """Links came or went while the kernel dumped: its answer may miss or repeat some."""
    got = answer(msg(RTM_NEWLINK, 7, b"partial.", flags=2 | NLM_F_DUMP_INTR), done(7, flags=2 | NLM_F_DUMP_INTR),
                 msg(RTM_NEWLINK, 8, b"whole..."), done(8))
    assert got == [b"whole..."]


def test_a_dump_that_keeps_being_interrupted_is_an_error():
    interrupted = [m for seq in (7, 8, 9) for m in (msg(RTM_NEWLINK, seq, b"partial.", flags=2 | NLM_F_DUMP_INTR),
                                                    done(seq))]
    with pytest.raises(NetlinkError, match="interrupted 3 times"):
        answer(*interrupted)


@pytest.mark.parametrize("datagram, says", [
    (done(7, errno.EMSGSIZE), "dump ended with: Message too long"),
    (msg(NLMSG_ERROR, 7, struct.pack("=i", -errno.ENODEV) + b"\0" * 16), "No such device"),
    (msg(RTM_NEWLINK, 7, b"x" * 8)[:10], "short message"),
    (struct.pack("=IHHII", 400, RTM_NEWLINK, 2, 7, 0) + b"x" * 8, "message of 400 bytes"),
])
def test_a_kernel_error_or_a_broken_message_is_an_error_that_says_so(datagram, says):
    with pytest.raises(NetlinkError, match=says):
        answer(datagram)
