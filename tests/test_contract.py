"""The contract module matches the contract document, and the docs match the module."""

import re
from pathlib import Path

from gpunet import contract

REPO = Path(__file__).resolve().parent.parent
# The specification's metric table, kept in the repository so that the check runs everywhere;
# where the specification itself sits beside the repository, the copy is checked against it.
SPEC_TABLE = REPO / "tests" / "fixtures" / "contract-metrics.md"
SPEC = REPO.parent / "shared" / "spec" / "contract.md"
METRIC_ROW = re.compile(r"^\| `(gpunet_[a-z_]+)` \| (gauge|counter)[^|]*\| ([^|]*)\|", re.M)


def test_docs_metrics_is_generated_from_the_contract_module():
    assert (REPO / "docs" / "metrics.md").read_text() == contract.metrics_markdown()


def test_the_class_catalogue_is_the_rules_own():
    from diagnoser.analysis.rules import RULES, classes_markdown

    text = (REPO / "docs" / "classes.md").read_text()
    assert text == classes_markdown(), "docs/classes.md is stale: python -m diagnoser.analysis.rules > docs/classes.md"
    assert all(f"## `{name}`" in text for name in RULES) and len(RULES) == 8


def test_every_metric_of_the_contract_document_is_defined_with_its_labels():
    rows = METRIC_ROW.findall(SPEC_TABLE.read_text())
    if SPEC.exists():
        assert METRIC_ROW.findall(SPEC.read_text()) == rows, f"{SPEC_TABLE} differs from {SPEC}"
    assert len(rows) >= 20
    for name, type_, labels in rows:
        spec = contract.BY_NAME.get(name)
        assert spec is not None, f"{name} missing from gpunet/contract.py"
        assert spec.type == type_ and spec.contract, name
        expected = tuple(re.findall(r"\b(device|direction|priority|kind|gpu|uuid|model|pci_address|numa_node|"
                                    r"rdma_device|port|driver|link_layer|network_state|reason)\b",
                                    re.sub(r"\([^)]*\)", "", labels)))
        assert spec.labels == expected, (name, spec.labels, expected)
