"""The docs site's converters (tools/docs_figures.py, tools/docs_hooks.py), without a build."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import nbformat
import plotly.graph_objects as go
import plotly.io as pio
import pytest

import interactive_shard

ROOT = Path(__file__).resolve().parents[2]
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


def _tool(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "tools"))  # docs_hooks imports docs_figures, as mkdocs lets it
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "tools"))


docs_figures = _tool("docs_figures")
docs_hooks = _tool("docs_hooks")


def view_output(figure: dict | None, html: str = "<b>summary</b>") -> nbformat.NotebookNode:
    """A displayed view's output as the display hook writes it (ui/fallback.py)."""
    data: dict = {WIDGET: {"version_major": 2, "version_minor": 0, "model_id": "m1"}}
    data["text/plain"] = "summary"
    data["text/html"] = html
    if figure is not None:
        data[PLOTLY] = figure
    return nbformat.v4.new_output("display_data", data=data)


def figure(title: str) -> dict:
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]), layout={"title": {"text": title}})
    return json.loads(pio.to_json(fig))


def notebook(*outputs: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("view", outputs=[out]) for out in outputs]
    return nb


def test_plotly_output_becomes_a_figure_placeholder_with_its_summary() -> None:
    nb = notebook(view_output(figure("buckets")), view_output(figure("timeline")))
    converted, count = docs_figures.with_figures(nb)
    assert count == 2
    for i, cell in enumerate(converted.cells):
        (output,) = cell.outputs
        assert list(output.data) == ["text/html"]  # widget and plotly mime both gone
        html = output.data["text/html"]
        assert f'<div class="ish-figure" id="ish-figure-{i}"></div>' in html
        assert html.endswith("<b>summary</b>")
        data = re.search(r'data-for="ish-figure-\d">(.*)</script>', html)
        assert data is not None
        assert json.loads(data.group(1)) == cell_figure(nb, i)
    # The committed notebook is not touched.
    assert PLOTLY in nb.cells[0].outputs[0].data and WIDGET in nb.cells[0].outputs[0].data


def cell_figure(nb: nbformat.NotebookNode, i: int) -> dict:
    return dict(nb.cells[i].outputs[0].data[PLOTLY])


def test_a_label_cannot_end_the_data_script() -> None:
    converted, _ = docs_figures.with_figures(notebook(view_output(figure("</script><b>x"))))
    html = converted.cells[0].outputs[0].data["text/html"]
    assert html.count("</script>") == 1
    data = re.search(r'data-for="ish-figure-0">(.*)</script>', html)
    assert data is not None
    assert json.loads(data.group(1))["layout"]["title"]["text"] == "</script><b>x"


def test_widget_without_figure_keeps_its_summary_not_the_widget() -> None:
    converted, count = docs_figures.with_figures(notebook(view_output(None)))
    assert count == 0
    assert converted.cells[0].outputs[0].data == {"text/html": "<b>summary</b>"}
    plain_only = nbformat.v4.new_output(
        "display_data", data={WIDGET: {"model_id": "m"}, "text/plain": "VBox(<x>)"}
    )
    converted, _ = docs_figures.with_figures(notebook(plain_only))
    assert converted.cells[0].outputs[0].data == {"text/html": "<pre>VBox(&lt;x&gt;)</pre>"}


def test_other_outputs_are_left_alone() -> None:
    text = nbformat.v4.new_output("stream", name="stdout", text="[rank 0] hi\n")
    table = nbformat.v4.new_output("execute_result", data={"text/plain": "3"}, execution_count=1)
    nb = notebook(text, table)
    converted, count = docs_figures.with_figures(nb)
    assert count == 0
    assert converted == nb


def test_a_malformed_figure_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"not a plotly figure .*'data' list"):
        docs_figures.with_figures(notebook(view_output({"data": "bars"})))


def test_readme_links_point_at_site_pages() -> None:
    text = "![m](docs/monitor.png) [a](docs/architecture.md) [c](CHANGELOG.md) [w](https://x.y)"
    assert docs_hooks.readme_page(text) == (
        "![m](monitor.png) [a](architecture.md) [c](changelog.md) [w](https://x.y)"
    )
    # Every relative link of the real README lands on a page or file of the site.
    site_files = {p.name for p in (ROOT / "docs").iterdir()} | {"changelog.md", "index.md"}
    page = docs_hooks.readme_page((ROOT / "README.md").read_text(encoding="utf-8"))
    targets = re.findall(r"\]\(([^)\s]+)\)", page)
    assert targets
    for target in targets:
        if "://" not in target and not target.startswith("#"):
            assert target.split("#")[0] in site_files, target


def test_api_page_names_every_public_name_and_feature_model() -> None:
    from interactive_shard.features import FEATURES

    page = docs_hooks.api_page()
    members = re.search(r"members: \[(.*)\]", page)
    assert members is not None
    listed = set(members.group(1).split(", ")) | {"listen"}
    assert listed == set(interactive_shard.__all__) - {"__version__"}
    assert "::: interactive_shard.cluster.listen.listen" in page
    for feature in FEATURES:
        assert f"::: {feature.model.replace(':', '.')}" in page
        assert f"heading: run.{feature.name}" in page


def test_notebooks_are_listed_in_order(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no notebooks"):
        docs_hooks.notebooks(tmp_path)
    for name in ("02-b.ipynb", "01-a.ipynb"):
        nbformat.write(notebook(), tmp_path / name)
    assert [p.name for p in docs_hooks.notebooks(tmp_path)] == ["01-a.ipynb", "02-b.ipynb"]
    assert [p.name for p in docs_hooks.notebooks()] == sorted(
        p.name for p in (ROOT / "notebooks").glob("*.ipynb")
    )


def test_notebook_title_is_its_first_markdown_line(tmp_path: Path) -> None:
    nb = notebook()
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("\n 03 · Graph splits\n\nText"))
    nbformat.write(nb, tmp_path / "03-x.ipynb")
    assert docs_hooks.notebook_title(tmp_path / "03-x.ipynb") == "03 · Graph splits"
    nb.cells[0].source = "# 03 · A heading"
    nbformat.write(nb, tmp_path / "03-x.ipynb")
    assert docs_hooks.notebook_title(tmp_path / "03-x.ipynb") == "03 · A heading"
    nbformat.write(notebook(), tmp_path / "04-y.ipynb")
    assert docs_hooks.notebook_title(tmp_path / "04-y.ipynb") == "04-y"


def test_doctest_lines_are_fenced_as_code() -> None:
    docs_griffe = _tool("docs_griffe")
    text = "Usage.\n\n    >>> bm = run.buckets\n    >>> bm.health\n    'ok'\n\nAfter."
    assert docs_griffe.fence_doctests(text) == (
        "Usage.\n\n    ```pycon\n    >>> bm = run.buckets\n    >>> bm.health\n    'ok'\n"
        "    ```\n\nAfter."
    )
    assert docs_griffe.fence_doctests(">>> x\n... y") == "```pycon\n>>> x\n... y\n```"
    assert docs_griffe.fence_doctests("no code") == "no code"
