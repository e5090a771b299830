"""The architecture rules of docs/architecture.md, checked on the source (AST, no imports executed).

* ``service`` and ``training`` never import each other; both may import ``artifact_contract``.
* No import cycle between modules (every import statement counts, lazy ones inside functions too).
* No private attribute (``x._name``) of an object of another module is read: ``_name`` must be defined in the same
  file (or be accessed on ``self``/``cls``).
* No function in ``service`` takes its host untyped: no parameter named like a host object (``svc``, ``b``,
  ``backend``, ``host``, ``c``, ``coll``, ``collection``) is annotated ``Any`` (type it: the concrete part, or a
  Protocol of what the function uses). Other parameters typed ``Any`` (payloads, JSON values) are fine.
* No branch on an index type's name outside the index registry (``service/collections/index/``), and none on a
  metric's name outside the metric module (``service/collections/metric.py``).
* No file over 400 lines in ``service/`` or ``training/`` (the code as ``ruff format`` writes it: ``make test`` runs
  ``ruff format --check``), and no ``# fmt: skip`` keeping lines packed.

The import rules between packages (layers, independent HTTP dialects, no web framework in the core or inference) are
import-linter contracts in ``pyproject.toml``, checked by ``lint-imports`` in ``make test``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "training", "artifact_contract")
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _resolve(mod: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    base = pkg[: len(pkg) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mod: str) -> set[str]:
    """Project modules imported anywhere in ``mod`` (a submodule named in ``from pkg import sub`` counts as such)."""
    path = MODULES[mod]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, path, node)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for n in names:
            while n and n not in MODULES:
                n = n.rpartition(".")[0]
            if n and n != mod:
                out.add(n)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def test_service_and_training_never_import_each_other():
    bad = [
        (m, i)
        for m, deps in GRAPH.items()
        for i in deps
        if {m.split(".")[0], i.split(".")[0]} == {"service", "training"}
    ]
    assert not bad, bad


def test_no_import_cycles():
    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [(start, [start])], {start}
        while stack:
            node, path = stack.pop()
            for n in GRAPH[node]:
                if n == goal:
                    return path + [n]
                if n not in seen and not goal.startswith(n + "."):  # a package's own __init__ is not a cycle
                    seen.add(n)
                    stack.append((n, path + [n]))
        return None

    cycles = []
    for m, deps in GRAPH.items():
        for d in deps:
            if m.startswith(d + ".") or d.startswith(m + "."):
                continue  # a package and its own submodules (re-exports)
            if (path := reaches(d, m)) is not None:
                cycles.append([m, *path])
    assert not cycles, cycles[:5]


def _defined_privates(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name.startswith("_"):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and node.id.startswith("_") and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_no_private_attribute_of_another_module_is_read():
    bad = []
    for path in MODULES.values():
        tree = ast.parse(path.read_text())
        own = _defined_privates(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                continue
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                continue
            if node.attr not in own:
                bad.append(f"{path.relative_to(REPO)}:{node.lineno} .{node.attr}")
    assert not bad, bad


HOST_NAMES = {"svc", "b", "backend", "host", "c", "coll", "collection"}


def _is_any(annotation: ast.expr | None) -> bool:
    """``Any``, ``typing.Any`` or the string ``"Any"``."""
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Attribute):
        return annotation.attr == "Any" and isinstance(annotation.value, ast.Name) and annotation.value.id == "typing"
    return isinstance(annotation, ast.Constant) and annotation.value == "Any"


def test_no_host_passed_untyped():
    """No free function or helper takes its host object as ``Any`` and reaches into it."""
    bad = [
        f"{path.relative_to(REPO)}:{node.lineno} {node.arg}: Any"
        for mod, path in MODULES.items()
        if mod.startswith("service.") or mod == "service"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.arg) and node.arg in HOST_NAMES and _is_any(node.annotation)
    ]
    assert not bad, bad


def test_no_index_type_branches_outside_the_registry():
    kinds = {"flat", "hnsw", "ivf_pq", "flat_sq", "hnsw_sq", "ivf_sq", "ivf_pq_fs"}
    bad = []
    for mod, path in MODULES.items():
        if mod.startswith("service.collections.index"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                if consts & kinds:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bad, bad


METRIC_MODULE = "service.collections.metric"


def test_no_metric_branches_outside_the_metric_module():
    """Metric policy (normalise for cosine, l2 distances as similarities...) lives in one module."""
    metrics = {"cosine", "dot", "l2"}
    bad = []
    for mod, path in MODULES.items():
        if mod == METRIC_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                if consts & metrics:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bad, bad


@pytest.mark.parametrize("pkg", ["service", "training", "artifact_contract"])
def test_no_formatter_skips(pkg):
    """Lines are not packed past the formatter to meet the line limit."""
    marker = "fmt: " + "skip"
    bad = [
        f"{p.relative_to(REPO)}:{i}"
        for p in (REPO / pkg).rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if marker in line
    ]
    assert not bad, bad


@pytest.mark.parametrize("pkg", ["service", "training"])
def test_no_file_over_400_lines(pkg):
    long = {
        str(p.relative_to(REPO)): n
        for p in (REPO / pkg).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_the_checks_see_the_code():
    """The rules above would catch a violation: the graph has the known edges."""
    assert "service.collections.vector_backend" in GRAPH["service.collections.service"]
    assert "artifact_contract" in GRAPH["service.inference.onnx_encoder"] or any(
        d.startswith("artifact_contract") for d in GRAPH["service.inference.onnx_encoder"]
    )
    assert len(MODULES) > 50
