"""The import graph of ``ensemble_core``, ``flows`` and ``tasks``, read from the source with
``ast`` (every import statement, those inside functions included): no cycles, no Dask or
Prefect in the core, no private name imported across modules, no module re-exporting
another's names, and the run layer's packages importing only downward (the table of
``ensemble_core/runs/__init__.py``; docs/architecture.md draws it). Rules of meaning, not
of length: a module is as long as its one concern. Pure text, no project imports, instant."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ensemble_core", "flows", "tasks")
# The run layer's packages and modules, lowest first: each imports only those below it
# (its own package's modules among themselves freely); the core beneath imports none.
RUN_LAYERS = (
    ("results", "dataset"),
    ("storage",),
    ("training",),
    ("ensemble",),
    ("evaluation",),
    ("prediction",),
    ("monitoring",),
    ("champion",),
    ("report",),
    ("preflight",),
    ("",),  # ensemble_core.runs itself: the pipeline
)
# Libraries the core never imports: orchestration lives in tasks/ and flows/.
ORCHESTRATION = ("prefect", "prefect_dask", "dask", "distributed")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` of the three packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every name ``path`` imports (absolute dotted names; ``from a import b`` gives
    ``a.b`` when that is a module of ours, else ``a``), from every import statement."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules else base)
    return out


def _anchor(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` statement of module ``name`` reads from."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def _private_names(name: str, source: str, path: Path) -> list[str]:
    """Private names of ours that ``source`` (module ``name``) imports: ``from ours import
    _x`` (a private name used outside the module that defines it) and any private module
    (``ours._m``, whether as ``from ours import _m``, ``from ours._m import x`` or ``import
    ours._m``), even from its own package: a module another module imports is one concern
    with a public name."""

    def private(module: str) -> bool:
        return any(part.startswith("_") and not part.startswith("__") for part in module.split("."))

    ours = (*PACKAGES, "benchmarks")
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in ours and private(a.name)]
        if isinstance(node, ast.ImportFrom):
            base = _anchor(name, path, node)
            if base.split(".")[0] not in ours:
                continue
            if private(base):
                found.append(base)
                continue
            found += [f"{base}.{a.name}" for a in node.names if private(a.name)]
    return found


def _re_exports(name: str, source: str, path: Path) -> list[str]:
    """Names in ``__all__`` of a module (not a package's ``__init__``) that it imports from
    another module of ours: a module speaks for its own names; a package's ``__init__`` is
    the one place that gathers its modules' names."""
    if path.name == "__init__.py":
        return []
    tree = ast.parse(source, filename=str(path))
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and _anchor(name, path, node).split(".")[0] in PACKAGES
        for alias in node.names
    }
    public: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            public = [elt.value for elt in node.value.elts if isinstance(elt, ast.Constant)]
    return sorted(set(public) & imported)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles among our modules (one per strongly connected component of more
    than one module, or a module importing itself), Tarjan's algorithm."""
    ours = {name: sorted(dep for dep in deps if dep in graph) for name, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in ours[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in ours[node]:
                found.append(sorted(component))

    for name in sorted(ours):
        if name not in index:
            visit(name)
    return found


def test_the_graph_sees_imports_inside_functions():
    graph = _graph()
    assert "ensemble_core.runs.training.trainer" in graph and "tasks.train" in graph
    # flows/ephemeral.py imports Prefect only inside its functions
    assert any(dep.startswith("prefect") for dep in graph["flows.ephemeral"])


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_imports_neither_prefect_nor_dask():
    offending = {
        name: sorted(dep for dep in deps if dep.split(".")[0] in ORCHESTRATION)
        for name, deps in _graph().items()
        if name.split(".")[0] == "ensemble_core"
    }
    assert {name: deps for name, deps in offending.items() if deps} == {}


def test_no_private_name_is_imported_across_modules():
    """Over the three packages and the benchmarks (which import the flows' modules too)."""
    modules = _modules()
    importers = {**modules, **{f"benchmarks.{p.stem}": p for p in sorted((ROOT / "benchmarks").glob("*.py"))}}
    found = {name: _private_names(name, path.read_text(), path) for name, path in importers.items()}
    assert {name: names for name, names in found.items() if names} == {}


def test_the_private_name_finder_finds_one():
    modules = _modules()
    path = modules["ensemble_core.calibration"]
    planted = "from ensemble_core.metrics import _X, nll\nfrom flows import _cli\nfrom . import _y\n"
    assert _private_names("ensemble_core.calibration", planted, path) == [
        "ensemble_core.metrics._X",
        "flows._cli",
        "ensemble_core._y",
    ]
    planted = (
        "from flows import _cli, ephemeral\n"
        "from tasks._runners import task_runner\n"
        "import flows._server, flows.ephemeral\n"
        "from benchmarks._provenance import stamp\n"
    )
    expected = ["flows._cli", "tasks._runners", "flows._server", "benchmarks._provenance"]  # its own package too
    assert _private_names("flows.predict", planted, modules["flows.predict"]) == expected
    assert _private_names("benchmarks.bench", planted, ROOT / "benchmarks" / "bench.py") == expected


def test_no_module_re_exports_a_siblings_names():
    found = {name: _re_exports(name, path.read_text(), path) for name, path in _modules().items()}
    assert {name: names for name, names in found.items() if names} == {}


def test_the_re_export_finder_finds_one():
    path = _modules()["ensemble_core.runs.champion.promotion"]
    planted = 'from ensemble_core.metrics import nll\nimport numpy\n__all__ = ["nll", "promote"]\n'
    assert _re_exports("ensemble_core.runs.champion.promotion", planted, path) == ["nll"]


def _run_layer(module: str) -> int | None:
    """The layer (index into :data:`RUN_LAYERS`) of a module of ``ensemble_core.runs``;
    -1 for the core beneath it; None outside ``ensemble_core``."""
    if module.split(".")[0] != "ensemble_core":
        return None
    if module != "ensemble_core.runs" and not module.startswith("ensemble_core.runs."):
        return -1
    part = module.split(".")[2] if module.count(".") >= 2 else ""
    return next(i for i, names in enumerate(RUN_LAYERS) if part in names)


def _upward(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Imports that run up the layers: a module importing one of a higher layer, or of
    another package in its own layer."""
    found: dict[str, list[str]] = {}
    for name, deps in graph.items():
        layer = _run_layer(name)
        if layer is None:
            continue
        own = ".".join(name.split(".")[:3])
        for dep in deps:
            dep_layer = _run_layer(dep)
            if dep_layer is None or dep.startswith(own + ".") or dep == own:
                continue
            if dep_layer > layer or (dep_layer == layer and layer >= 0):
                found.setdefault(name, []).append(dep)
    return {name: sorted(deps) for name, deps in found.items()}


def test_the_run_layers_import_only_downward():
    assert _upward(_graph()) == {}


def test_the_layer_rule_finds_an_upward_import():
    graph = {
        "ensemble_core.runs.training.trainer": {
            "ensemble_core.runs.ensemble.select",
            "ensemble_core.runs.storage.lock",
        },
        "ensemble_core.metrics": {"ensemble_core.runs.results"},
        "ensemble_core.runs.ensemble.load": {"ensemble_core.runs.ensemble.pool", "ensemble_core.ensemble_setup"},
    }
    assert _upward(graph) == {
        "ensemble_core.metrics": ["ensemble_core.runs.results"],
        "ensemble_core.runs.training.trainer": ["ensemble_core.runs.ensemble.select"],
    }


def test_every_run_package_has_a_layer():
    runs = ROOT / "ensemble_core" / "runs"
    named = {name for layer in RUN_LAYERS for name in layer if name}
    present = {p.stem for p in runs.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in runs.iterdir() if (p / "__init__.py").exists()
    }
    assert present == named


def test_no_module_re_exports_an_import():
    """An import of a name (not a module: a module imported for its side effect is no
    re-export) from our packages kept only to be re-exported (``# noqa: F401``) outside a
    package's ``__init__``: callers import a name from the module that defines it."""
    found = {}
    modules = _modules()
    for name, path in modules.items():
        if path.name == "__init__.py":
            continue
        lines = [
            line.strip()
            for line in path.read_text().splitlines()
            if "noqa: F401" in line
            and line.lstrip().startswith("from ")
            and line.split()[1].split(".")[0] in PACKAGES
            and f"{line.split()[1]}.{line.split()[3].strip('(,')}" not in modules
        ]
        if lines:
            found[name] = lines
    assert found == {}


@pytest.mark.slow  # three fresh interpreters, 2-4 s each
@pytest.mark.parametrize("module", ["ensemble_core.models.cnn", "ensemble_core.ensemble_setup", "ensemble_core.memory"])
def test_each_entry_module_imports_first_in_a_fresh_interpreter(module):
    """A user's first import may be any public module: none of them may run into an import
    cycle (models -> train -> data -> memory -> models did, until the data package stopped
    importing the memory module at import time)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
