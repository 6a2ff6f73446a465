"""The shape of the code, held by machines: the linters and the type checker pass, the layer
contracts hold (pyproject.toml's [tool.importlinter]), no module imports another that
imports it back (lazy imports inside functions included), and a bottleneck class's name is
spelt only in its own rule file."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from procs import REPO

BIN = Path(sys.executable).parent
PACKAGES = ("diagnoser", "exporter", "gpunet")


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff():
    result = _run(str(BIN / "ruff"), "check", *PACKAGES, "bench", "tests", "alerts", "dashboards",
                  "replay_data")
    assert result.returncode == 0, result.stdout[-4000:]


def test_mypy_on_the_typed_boundaries():
    result = _run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout[-4000:]


def test_import_contracts():
    result = _run(str(BIN / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:]


def _imports(path: Path, module: str) -> set[str]:
    """Every module of ours this file imports, at the top or inside a function."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in PACKAGES}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "podresources" in path.parts:  # generated gRPC stubs
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in the import graph, as the modules along it; None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)) is not None:
                return cycle
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)) is not None:
            return cycle
    return None


def test_no_import_cycles_lazy_imports_included():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        # `from package import module` names the module; `from module import name` the module
        targets = {m if m in modules else m.rpartition(".")[0] for m in _imports(path, name)}
        # a package's own __init__ importing its submodules is how a package is made, not a cycle
        graph[name] = {t for t in targets if t in modules and t != name and not t.startswith(name + ".")}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("folder", ["diagnoser"])
def test_class_names_are_spelt_only_in_their_rule_files(folder):
    from gpunet.contract import BOTTLENECK_CLASSES

    pattern = re.compile(r"""["']({})["']""".format("|".join(BOTTLENECK_CLASSES)))
    rules = REPO / "diagnoser" / "analysis" / "rules"
    offenders = []
    for path in (REPO / folder).rglob("*.py"):
        if path.parent == rules:
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
