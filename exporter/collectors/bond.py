"""Bonding devices: one gpunet_bond_info per bond, and each member's MII status."""

from __future__ import annotations

from exporter.collector_registry import register
from exporter.readers.bonding import bonds
from exporter.root import Root, SourceError
from exporter.samples import Sample, TickContext
from gpunet.contract import BOND_INFO, BOND_MEMBER_UP


class BondCollector:
    name = "bond"

    def __init__(self, root: Root):
        self.root = root

    def collect(self, ctx: TickContext, errors: list[SourceError]) -> list[Sample]:
        samples = []
        for bond in bonds(self.root, errors):
            samples.append(Sample(BOND_INFO, (bond.name, bond.mode, bond.xmit_hash_policy), 1.0))
            samples.extend(Sample(BOND_MEMBER_UP, (bond.name, member), 1.0 if up else 0.0)
                           for member, up in bond.members.items())
        return samples


register("bond", "slow", lambda setup: BondCollector(setup.root),
         help="bonds: mode, transmit hash policy, members' MII status")
