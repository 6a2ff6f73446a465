"""Readers know where the machine keeps a thing (a file under the root, a netlink or
ethtool call) and return plain Python values. They know nothing of metrics."""
