"""The package's boundaries, checked on its source (see docs/architecture.md).

* No import circle between the package's parts (a folder, or a top-level module).
  Imports inside functions count (a lazy import is still a dependency); imports under
  ``if TYPE_CHECKING:`` do not (they exist for the type checker only). The feature
  list names its parts by string, which is how a part is reached without an import.
* No model or planner imports a view, and only views and ``ui/`` import ipywidgets.
* ``import interactive_shard`` and writing a report load no widget library.
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

from interactive_shard import features

PACKAGE = Path(__file__).resolve().parents[2] / "interactive_shard"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports at run time (absolute names)."""
    found: set[str] = set()
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _part(module: str) -> str | None:
    """The part a module belongs to: ``cluster`` for ``interactive_shard.cluster.run``."""
    parts = module.split(".")
    if parts[0] != "interactive_shard" or len(parts) < 2:
        return None
    return parts[1]


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _part_graph() -> dict[str, set[tuple[str, str]]]:
    """part -> {(imported part, the importing module)}; the API facade is left out."""
    graph: dict[str, set[tuple[str, str]]] = {}
    for name, path in _sources().items():
        if name == "interactive_shard":  # __init__ re-exports everything by design
            continue
        mine = _part(name)
        assert mine is not None
        for target in _imports(path):
            theirs = _part(target)
            if theirs is not None and theirs != mine and theirs != "__init__":
                graph.setdefault(mine, set()).add((theirs, name))
    return graph


def test_no_import_circle_between_parts() -> None:
    graph = {part: {t for t, _ in edges} for part, edges in _part_graph().items()}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*path, start]
                if nxt not in path:
                    stack.append((nxt, [*path, nxt]))
        return None

    for part in sorted(graph):
        cycle = cycle_from(part)
        if cycle:
            edges = _part_graph()
            who = [
                f"{a} -> {b} (in {sorted(m for t, m in edges[a] if t == b)})"
                for a, b in itertools.pairwise(cycle)
            ]
            raise AssertionError("import circle between parts:\n  " + "\n  ".join(who))


FEATURE_FOLDERS = sorted({f.model.split(".")[1] for f in features.FEATURES})
# What a feature may import: the shared layers, the planners' reading of example inputs,
# and the feature list (it names every part by string: importing it imports no feature).
SHARED = {"telemetry", "probing", "ui", "example_inputs", "features"}
NO_FEATURES = ("cluster", "telemetry", "probing", "ui")  # layers that name no feature


def test_the_feature_folders_are_the_feature_list() -> None:
    assert {"buckets", "monitor", "timeline"} <= set(FEATURE_FOLDERS)  # read from the list
    for feature in features.FEATURES:  # an entry's parts live in its folder (the run's
        # own events, which the monitor reads, in telemetry/)
        refs = [feature.model, feature.view, feature.figures, feature.summary, feature.probe]
        folders = {ref.split(".")[1] for ref in refs if ref}
        assert len(folders) == 1, f"{feature.name}'s parts span {sorted(folders)}"


def test_a_feature_imports_only_the_shared_layers_and_itself() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for part, edges in _part_graph().items()
        if part in FEATURE_FOLDERS
        for target, module in edges
        if target not in SHARED
    )
    assert not wrong, "a feature reaches beyond the shared layers:\n  " + "\n  ".join(wrong)


def test_the_shared_layers_and_the_cluster_import_no_feature() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for part, edges in _part_graph().items()
        if part in NO_FEATURES
        for target, module in edges
        if target in FEATURE_FOLDERS
    )
    assert not wrong, "a shared layer names a feature:\n  " + "\n  ".join(wrong)


def test_models_and_planners_import_no_view_and_no_widgets() -> None:
    for name, path in _sources().items():
        imported = _imports(path)
        if name.endswith((".model", ".plan", ".figures", ".events")) or ".figures_" in name:
            views = sorted(m for m in imported if m.endswith(".view") or ".view." in m)
            assert not views, f"{name} imports views {views}"
        if not (name.endswith(".view") or ".ui" in name):
            widgets = sorted(m for m in imported if m.split(".")[0] in ("ipywidgets", "anywidget"))
            assert not widgets, f"{name} imports {widgets}: only */view.py and ui/ may"


def test_import_and_report_load_no_widget_library(tmp_path: Path) -> None:
    script = f"""
import sys
import interactive_shard as ish
from interactive_shard.testing import FakeRun, mlp_params
from interactive_shard.telemetry.store import RunInfo, RunStore
assert "ipywidgets" not in sys.modules, "import interactive_shard loaded ipywidgets"
store = RunStore(RunInfo(world_size=2, backend="gloo", device_types=["cpu"]))
store.extend(FakeRun(mlp_params(3, 64), bucket_cap_mb=0.02).events())  # a subprocess: no support
ish.Run(store).to_html({str(tmp_path / "report.html")!r})
loaded = sorted(m for m in ("ipywidgets", "anywidget") if m in sys.modules)
assert not loaded, f"run.to_html loaded {{loaded}}"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "DDP gradient buckets" in (tmp_path / "report.html").read_text(encoding="utf-8")
