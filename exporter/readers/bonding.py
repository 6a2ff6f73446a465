"""Linux bonding devices: their mode, transmit hash policy and members' MII status.

``sys/class/net/bonding_masters`` names the bonds (the file exists once the bonding module
is loaded, per network namespace); each bond has ``bonding/mode`` (``802.3ad 4``: the name,
then the number), ``bonding/xmit_hash_policy`` (``layer3+4 1``) and ``bonding/slaves``
(member netdevs, space separated); each member has ``bonding_slave/mii_status`` (``up``,
``down``, ``going down``, ``going back``) in its own folder, which the bond's folder also
links to as ``lower_<member>`` (``slave_<member>`` on old kernels).
"""

from __future__ import annotations

from typing import NamedTuple

from exporter.root import Root, SourceError

NET = "sys/class/net"
MASTERS = f"{NET}/bonding_masters"
# Where a member's folder is, for the bond `b` and the member `m`: its own, then the bond's
# links to it (node_exporter's sysfs fixture has only the bond's slave_ folders).
MEMBER_FOLDERS = ("{m}", "{b}/lower_{m}", "{b}/slave_{m}")


class Bond(NamedTuple):
    name: str
    mode: str  # "802.3ad", "active-backup", ...; "" where the mode file is absent or empty
    xmit_hash_policy: str  # "layer3+4", ...; "" where the file is absent
    members: dict[str, bool]  # member netdev -> MII status is up


def bonds(root: Root, errors: list[SourceError]) -> list[Bond]:
    """The node's bonds; a bond whose folder or member list cannot be read is left out, with
    an error."""
    out = []
    for name in (root.read_optional_str(MASTERS) or "").split():
        try:
            out.append(_bond(root, name, errors))
        except SourceError as e:
            errors.append(e)
    return out


def _bond(root: Root, name: str, errors: list[SourceError]) -> Bond:
    base = f"{NET}/{name}/bonding"
    if not root.exists(base):
        raise SourceError(str(root.path(base)), "bond vanished")
    mode_file = f"{base}/mode"
    try:
        mode = root.read_str(mode_file).split()
        if not mode:
            errors.append(SourceError(str(root.path(mode_file)), "empty"))
    except SourceError as e:
        # Absent: the mode is unknown (""), which is no error; unreadable: it is one. Either
        # way the members are read.
        if root.exists(mode_file):
            errors.append(e)
        mode = []
    policy = (root.read_optional_str(f"{base}/xmit_hash_policy") or "").split()
    members = {}
    for member in root.read_str(f"{base}/slaves").split():
        status = _mii_status(root, name, member)
        if status is None:
            errors.append(SourceError(str(root.path(f"{NET}/{member}/bonding_slave/mii_status")),
                                      "member of a bond without MII status (vanished?)"))
            continue
        members[member] = status == "up"
    return Bond(name, mode[0] if mode else "", policy[0] if policy else "", members)


def _mii_status(root: Root, bond: str, member: str) -> str | None:
    for folder in MEMBER_FOLDERS:
        status = root.read_optional_str(f"{NET}/{folder.format(b=bond, m=member)}/bonding_slave/mii_status")
        if status is not None:
            return status
    return None
