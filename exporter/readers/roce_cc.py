"""RoCE congestion control (ECN / DCQCN): on which priorities it is enabled, at the
notification point (marked packets answered with CNPs) and the reaction point (CNPs slow
the sender down). Each driver keeps it in its own place; where none of these exists the
answer is unknown (empty), never "disabled".

- mlx5 (MLNX_OFED, and kernels that carry its sysfs): ``sys/class/net/<dev>/ecn/roce_np/
  enable/<prio>`` and ``.../roce_rp/enable/<prio>``, ``0`` or ``1`` per priority 0..7.
  Upstream mlx5 keeps DCQCN in firmware (mlxconfig) and shows nothing: unknown.
- bnxt_re (Broadcom's driver package): configfs ``sys/kernel/config/bnxt_re/<rdma_dev>/
  ports/<port>/cc/``, present once someone made the folder (``mkdir``, as
  bnxt_setupcc.sh does): ``ecn_enable`` (congestion control of the function on or off,
  printed ``%#x``: ``0x1`` or ``0``) applies to ``roce_prio`` (``0x3``), both points.
- irdma (Intel's driver package, E810): configfs ``sys/kernel/config/irdma/<rdma_dev>/
  roce_dcqcn_enable`` (``%d``), device-wide (every priority), the reaction point only (the
  CNP a marked packet causes is not a setting there). The kernel's own irdma has no such
  file: unknown.
"""

from __future__ import annotations

from exporter.root import Root, SourceError

PRIORITIES = tuple(str(p) for p in range(8))
MLX5_POINTS = (("roce_np", "notification"), ("roce_rp", "reaction"))


def ecn_enabled(root: Root, netdev: str, rdma_device: str, port: str,
                errors: list[SourceError]) -> dict[tuple[str, str], bool]:
    """{(priority, point): enabled}; empty when the driver does not say. A file that cannot
    be read or holds no number costs only its own entries (an error is appended)."""
    out: dict[tuple[str, str], bool] = {}
    if netdev and root.exists(f"sys/class/net/{netdev}/ecn"):
        for folder, point in MLX5_POINTS:
            for prio in PRIORITIES:
                value = _flag(root, f"sys/class/net/{netdev}/ecn/{folder}/enable/{prio}", errors)
                if value is not None:
                    out[(prio, point)] = value
    if rdma_device and root.exists(f"sys/kernel/config/bnxt_re/{rdma_device}/ports/{port}/cc"):
        cc = f"sys/kernel/config/bnxt_re/{rdma_device}/ports/{port}/cc"
        enabled = _flag(root, f"{cc}/ecn_enable", errors)
        prio = _number(root, f"{cc}/roce_prio", errors)
        if enabled is not None and prio is not None:
            if 0 <= prio < 8:
                out[(str(prio), "notification")] = out[(str(prio), "reaction")] = enabled
            else:
                errors.append(SourceError(str(root.path(f"{cc}/roce_prio")), f"not a priority 0..7: {prio}"))
    if rdma_device:
        enabled = _flag(root, f"sys/kernel/config/irdma/{rdma_device}/roce_dcqcn_enable", errors)
        if enabled is not None:
            for prio in PRIORITIES:
                out[(prio, "reaction")] = enabled
    return out


def _number(root: Root, rel: str, errors: list[SourceError]) -> int | None:
    if not root.exists(rel):
        return None
    try:
        return root.read_int(rel)  # decimal, or 0x... as bnxt_re prints
    except SourceError as e:
        errors.append(e)
        return None


def _flag(root: Root, rel: str, errors: list[SourceError]) -> bool | None:
    value = _number(root, rel, errors)
    if value is None or value in (0, 1):
        return None if value is None else bool(value)
    errors.append(SourceError(str(root.path(rel)), f"expected 0 or 1, not {value}"))
    return None
