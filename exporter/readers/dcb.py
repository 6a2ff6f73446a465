"""DCB (IEEE 802.1Qaz/Qbb) settings of a netdev: the priorities with PFC, and what the NIC
trusts to put a received packet in a priority (the PCP of its VLAN tag, or its DSCP).

Live, one dcbnl request answers both: ``RTM_GETDCB`` with ``DCB_CMD_IEEE_GET`` on a
NETLINK_ROUTE socket (what iproute2's ``dcb`` sends). The
answer nests, under ``DCB_ATTR_IEEE``: ``DCB_ATTR_IEEE_PFC`` (struct ieee_pfc, whose second
byte ``pfc_en`` is the bitmap of priorities with PFC), ``DCB_ATTR_IEEE_APP_TABLE`` (struct
dcb_app entries: selector, priority, protocol) and, from Linux 6.1 on drivers that have
one, ``DCB_ATTR_DCB_APP_TRUST_TABLE`` (the selectors trusted, in order). A device without
DCB operations (veth, lo, bonds, most VMs' NICs) answers EOPNOTSUPP: that is "unknown",
not an error.

Under a fixture root the same facts come from the JSON that iproute2's ``dcb`` prints:

- ``dcb/<dev>.pfc.json``: ``dcb -j pfc show dev <dev>``, of which ``prio_pfc`` (eight
  booleans, priority 0 first) is read. No such file: the device has no DCB.
- ``dcb/<dev>.app.json``: ``dcb -j app show dev <dev>``, of which ``dscp_prio`` (pairs
  ``[dscp, priority]``) is read. Optional: no file is an empty APP table.

Trust: the APP trust table when the driver keeps one (dscp or pcp, whichever comes first
in it); otherwise dscp when the APP table maps some DSCP value to a priority (mlx5, ice and
bnxt_en switch to DSCP classification when given DSCP entries), else pcp, the 802.1Q
default.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
from dataclasses import dataclass

from exporter.readers.netlink import NLM_F_REQUEST, NLMSG_ERROR, attrs, error_code, message
from exporter.root import Root, SourceError

RTM_GETDCB = 78
DCB_CMD_IEEE_GET = 21
DCB_ATTR_IFNAME = 1
DCB_ATTR_IEEE = 13
DCB_ATTR_IEEE_PFC = 2
DCB_ATTR_IEEE_APP_TABLE = 3
DCB_ATTR_DCB_APP_TRUST_TABLE = 11
SEL_DSCP = 5  # IEEE_8021QAZ_APP_SEL_DSCP
SEL_PCP = 255  # DCB_APP_SEL_PCP
PRIORITIES = 8


@dataclass(frozen=True)
class DcbSettings:
    pfc_enabled: tuple[bool, ...] | None  # per priority 0..7; None: the driver does not say
    trust: str | None  # "pcp", "dscp", or None when neither is trusted
    dscp_prio: tuple[tuple[int, int], ...] = ()  # the APP table's (dscp, priority) entries


def read_dcb(root: Root, device: str) -> DcbSettings | None:
    """The device's DCB settings; None when it has no DCB. SourceError when the answer
    cannot be had or makes no sense."""
    if root.is_live:
        return _read_netlink(device)
    return _read_files(root, device)


def trust_of(app_trust: list[int] | None, has_dscp_entries: bool) -> str | None:
    """What classifies received packets: the trust table's first of dscp/pcp, else dscp
    when the APP table has DSCP entries, else pcp."""
    if app_trust is not None:
        first = next((s for s in app_trust if s in (SEL_DSCP, SEL_PCP)), None)
        return None if first is None else ("dscp" if first == SEL_DSCP else "pcp")
    return "dscp" if has_dscp_entries else "pcp"


# --- fixture files ------------------------------------------------------------------------

def _load_json(root: Root, rel: str) -> object:
    try:
        return json.loads(root.read_text(rel))
    except json.JSONDecodeError as e:
        where, what = f"{root.path(rel)}:{e.lineno}", f"not JSON: {e.msg}"
    except RecursionError:  # arrays nested thousands deep
        where, what = str(root.path(rel)), "not JSON: nested too deep"
    # Raised outside the handler: the decoder's error, which holds the whole text, is not
    # kept as its context.
    raise SourceError(where, what)


def _read_files(root: Root, device: str) -> DcbSettings | None:
    pfc_rel, app_rel = f"dcb/{device}.pfc.json", f"dcb/{device}.app.json"
    if not root.exists(pfc_rel):
        return None
    pfc = _load_json(root, pfc_rel)
    prio_pfc = pfc.get("prio_pfc") if isinstance(pfc, dict) else None
    del pfc  # the errors below must not keep a large document alive through their traceback
    if not (isinstance(prio_pfc, list) and len(prio_pfc) == PRIORITIES and all(isinstance(v, bool) for v in prio_pfc)):
        raise SourceError(str(root.path(pfc_rel)), "expected 'prio_pfc': eight true/false values")
    pairs: list = []
    if root.exists(app_rel):
        app = _load_json(root, app_rel)
        pairs = app.get("dscp_prio", []) if isinstance(app, dict) else None
        del app
        if not (isinstance(pairs, list) and all(_is_dscp_pair(p) for p in pairs)):
            raise SourceError(str(root.path(app_rel)), "expected 'dscp_prio': [[dscp, priority], ...]")
    return DcbSettings(tuple(prio_pfc), trust_of(None, bool(pairs)), tuple((p[0], p[1]) for p in pairs))


def _is_dscp_pair(pair: object) -> bool:
    return (isinstance(pair, list) and len(pair) >= 2 and isinstance(pair[0], int) and isinstance(pair[1], int)
            and 0 <= pair[0] < 64 and 0 <= pair[1] < PRIORITIES)


# --- dcbnl -------------------------------------------------------------------------------

def _read_netlink(device: str) -> DcbSettings | None:
    name = device.encode() + b"\0"
    attr = struct.pack("=HH", 4 + len(name), DCB_ATTR_IFNAME) + name + b"\0" * (-len(name) % 4)
    body = struct.pack("=BBH", socket.AF_UNSPEC, DCB_CMD_IEEE_GET, 0) + attr
    request = message(RTM_GETDCB, NLM_F_REQUEST, 1, body)
    where = f"dcbnl {device}"
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
            sock.settimeout(2.0)
            sock.send(request)
            reply = sock.recv(65536)
    except OSError as e:
        raise SourceError(where, e.strerror or str(e)) from e
    if len(reply) < 20:
        raise SourceError(where, f"short reply ({len(reply)} bytes)")
    _, msg_type = struct.unpack_from("=IH", reply)
    if msg_type == NLMSG_ERROR:
        code = error_code(reply[16:])  # the reply holds 20 bytes or more
        if code == errno.EOPNOTSUPP:
            return None  # no DCB operations on this device
        if code == errno.ENODEV:
            raise SourceError(where, "network device vanished")
        raise SourceError(where, os.strerror(code))
    ieee = next((v for t, v in attrs(reply[20:]) if t == DCB_ATTR_IEEE), None)
    if ieee is None:
        return None
    pfc_enabled, dscp_prio, app_trust = None, (), None
    for type_, value in attrs(ieee):
        if type_ == DCB_ATTR_IEEE_PFC and len(value) >= 2:
            pfc_enabled = tuple(bool(value[1] >> p & 1) for p in range(PRIORITIES))
        elif type_ == DCB_ATTR_IEEE_APP_TABLE:
            apps = [struct.unpack_from("=BBH", v) for _, v in attrs(value) if len(v) >= 4]
            dscp_prio = tuple((protocol, prio) for selector, prio, protocol in apps if selector == SEL_DSCP)
        elif type_ == DCB_ATTR_DCB_APP_TRUST_TABLE:
            app_trust = [v[0] for _, v in attrs(value) if v]
    return DcbSettings(pfc_enabled, trust_of(app_trust, bool(dscp_prio)), dscp_prio)
