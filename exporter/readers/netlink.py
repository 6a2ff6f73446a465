"""The kernel's network interfaces on plain sockets: netlink messages (``NETLINK_ROUTE``) and
the ``SIOCETHTOOL`` ioctl. Shared by the readers of links (netdev), DCB (dcb) and driver
statistics (ethtool); a library for these (pyroute2) costs more memory than the exporter
itself and imports OpenSSL.

The ioctl's buffers are ``array.array``: the kernel writes into the array's own memory,
whose address ``buffer_info()`` gives, without ctypes.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import socket
import struct

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 1
NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
NLM_F_DUMP_INTR = 0x10  # the set changed while the dump ran: it may miss or repeat entries
DUMP_TRIES = 3
NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
RECV_SIZE = 65536  # the kernel sizes a dump's messages to what the reader asks for

SIOCETHTOOL = 0x8946
IFNAMSIZ = 16
IFREQ_SIZE = 40  # struct ifreq on 64-bit: the name, then a union of at most 24 bytes


class NetlinkError(Exception):
    """The kernel's answer could not be had or made no sense: ``str()`` says why."""

    def __init__(self, what: str, code: int = 0):
        super().__init__(what)
        self.code = code  # the errno the kernel answered, 0 when it did not answer one


def message(msg_type: int, flags: int, seq: int, body: bytes) -> bytes:
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(body), msg_type, flags, seq, 0) + body


def attrs(data: bytes | memoryview) -> list[tuple[int, bytes]]:
    """A message's (or a nested attribute's) attributes: (type, value) in order."""
    out, offset = [], 0
    while offset + 4 <= len(data):
        length, type_ = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        out.append((type_ & 0x3FFF, bytes(data[offset + 4:offset + length])))  # strip NLA_F_NESTED / BYTEORDER
        offset += (length + 3) & ~3
    return out


def error_code(payload: bytes | memoryview) -> int:
    """The errno of an NLMSG_ERROR's payload (0: an acknowledgement)."""
    if len(payload) < 4:
        raise NetlinkError(f"short error message ({len(payload)} bytes)")
    return -struct.unpack_from("=i", payload)[0]


def dump(sock: socket.socket, msg_type: int, body: bytes, seq: int) -> list[memoryview]:
    """Send a dump request and read its multipart answer up to NLMSG_DONE: the payloads
    (after the 16-byte header) of the messages. A dump the kernel marks interrupted (links
    came or went while it ran) is asked again, up to DUMP_TRIES times, with the next
    sequence numbers. Raises NetlinkError, or OSError when the socket fails or times out;
    either way the caller should not reuse the socket."""
    for attempt in range(DUMP_TRIES):
        out, interrupted = _dump_once(sock, msg_type, body, (seq + attempt) & 0xFFFFFFFF)
        if not interrupted:
            return out
    raise NetlinkError(f"the dump was interrupted {DUMP_TRIES} times (devices changing)")


def _dump_once(sock: socket.socket, msg_type: int, body: bytes, seq: int) -> tuple[list[memoryview], bool]:
    sock.send(message(msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, body))
    out: list[memoryview] = []
    interrupted = False
    while True:
        data = memoryview(sock.recv(RECV_SIZE))
        if not data:
            raise NetlinkError("the socket closed mid-answer")
        offset = 0
        while offset < len(data):
            if len(data) - offset < NLMSG_HDR.size:
                raise NetlinkError(f"short message ({len(data) - offset} bytes)")
            length, type_, flags, msg_seq, _ = NLMSG_HDR.unpack_from(data, offset)
            if length < NLMSG_HDR.size or offset + length > len(data):
                raise NetlinkError(f"message of {length} bytes in {len(data) - offset}")
            payload = data[offset + NLMSG_HDR.size:offset + length]
            offset += (length + 3) & ~3
            if msg_seq != seq:
                continue  # an earlier request's (the socket is kept between reads)
            interrupted = interrupted or bool(flags & NLM_F_DUMP_INTR)
            if type_ == NLMSG_DONE:
                # Its payload, where there is one, is the dump's own error (a cut-short dump).
                code = error_code(payload) if len(payload) >= 4 else 0
                if code:
                    raise NetlinkError(f"dump ended with: {os.strerror(code)}", code)
                return out, interrupted
            if type_ == NLMSG_ERROR:
                code = error_code(payload)
                if code:
                    raise NetlinkError(os.strerror(code), code)
                continue
            out.append(payload)


# --- SIOCETHTOOL ---------------------------------------------------------------------------

def ethtool_ioctl(sock: socket.socket, device: str, buffer: array.array) -> None:
    """Run the ethtool command in `buffer` (its first u32 is the command) on a device; the
    kernel answers into `buffer`. Raises OSError (ENODEV, EOPNOTSUPP, EPERM...)."""
    name = os.fsencode(device)
    if len(name) >= IFNAMSIZ:
        raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
    ifreq = struct.pack("@16sP", name, buffer.buffer_info()[0]).ljust(IFREQ_SIZE, b"\0")
    fcntl.ioctl(sock, SIOCETHTOOL, ifreq)


def ethtool_socket() -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def ioctl_problem(e: OSError) -> str:
    """What an ethtool ioctl's error says, for a SourceError."""
    if e.errno == errno.ENODEV:
        return "network device vanished"
    return e.strerror or str(e) or type(e).__name__
