"""MkDocs hooks that assemble the docs site (``mkdocs.yml``'s ``hooks:``; ``make docs``).

The site's sources live where the project keeps them, never copied into ``docs/``:

* ``index.md`` is ``README.md`` with its links re-pointed from the repository root to
  the site (``docs/x.md`` -> ``x.md``, ``CHANGELOG.md`` -> ``changelog.md``);
* ``changelog.md`` is ``CHANGELOG.md``;
* ``api.md`` (``api_page``) renders with mkdocstrings the docstrings of every name in
  ``interactive_shard.__all__``, of each feature's model (what ``run.<name>`` holds,
  from ``features.FEATURES``) and of ``telemetry.rank`` (ranks started elsewhere);
* ``notebooks/NN-topic.ipynb`` are the committed notebooks with their outputs, each
  rewritten by ``docs_figures.with_figures`` into a temporary folder (deleted after the
  build) so that mkdocs-jupyter renders every view's plotly figure;
* ``assets/plotly.min.js`` is the plotly.js that ships inside the plotly package, so
  the figures draw offline; it and ``assets/ish-figures.js`` are added only to pages
  that hold a figure (4.8 MB is not loaded by every page).
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from docs_figures import FIGURE_CLASS, with_figures
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.docs")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
PLOTLY_ASSET = "assets/plotly.min.js"
LOADER_ASSET = "assets/ish-figures.js"
# README links that leave docs/: where each one lives in the site.
README_LINKS = {"CHANGELOG.md": "changelog.md"}

_workdir: Path | None = None


def plotly_js() -> Path:
    """plotly.js as the plotly package ships it (the same file its offline HTML embeds)."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"plotly.js not found at {path}: reinstall plotly")
    return path


def readme_page(text: str) -> str:
    """README.md's text with its links re-pointed at the site's pages."""

    def repoint(match: re.Match[str]) -> str:
        target = match.group(2)
        if target.startswith("docs/"):
            target = target.removeprefix("docs/")
        target = README_LINKS.get(target, target)
        return f"]{match.group(1)}{target})"

    return re.sub(r"\](\()([^)\s]+)\)", repoint, text)


def api_page() -> str:
    """The API reference as mkdocstrings directives, from ``__all__`` and the features."""
    import interactive_shard
    from interactive_shard.features import FEATURES

    # ``listen`` is also the name of its module (cluster/listen.py), which griffe finds
    # first under that name: its function is rendered by its full path.
    special = {"__version__", "listen"}
    names = [name for name in interactive_shard.__all__ if name not in special]
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings. `import interactive_shard as ish` gives every name",
        f"of the package's `__all__` (version {interactive_shard.__version__}).",
        "",
        "## `interactive_shard`",
        "",
        "::: interactive_shard",
        "    options:",
        "      show_root_heading: false",
        f"      members: [{', '.join(names)}]",
        "",
        "::: interactive_shard.cluster.listen.listen",
        "    options:",
        "      heading: interactive_shard.listen",
        "",
        "## What a run holds, per feature",
        "",
        "`run.<name>` (and a recording's `ish.load(path).<name>`) is the feature's model,",
        "brought up to date on every access; displaying it shows its view.",
        "",
    ]
    for feature in FEATURES:
        module, cls = feature.model.split(":")
        lines += [f"::: {module}.{cls}", "    options:", f"      heading: run.{feature.name}", ""]
    lines += [
        "## Ranks started elsewhere",
        "",
        "::: interactive_shard.telemetry.rank",
        "    options:",
        "      members: [connect, connect_from_env]",
        "",
    ]
    return "\n".join(lines)


def notebook_page(src: Path, dest: Path) -> int:
    """``src`` with its figures (``with_figures``) written to ``dest``; how many."""
    converted, figures = with_figures(nbformat.read(src, as_version=4))
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(converted, dest)
    return figures


def notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The notebooks of the site, in their numbered order."""
    found = sorted(folder.glob("*.ipynb"))
    if not found:
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {folder}")
    return found


def notebook_title(src: Path) -> str:
    """The first line of the notebook's first markdown cell, without its '#'s (some
    notebooks' title line is not a heading, so mkdocs-jupyter's first-h1 rule misses it)."""
    nb = nbformat.read(src, as_version=4)
    for cell in nb.cells:
        lines = [line.strip().lstrip("#").strip() for line in cell.source.splitlines()]
        if cell.cell_type == "markdown" and any(lines):
            return next(line for line in lines if line)
    return src.stem


def on_config(config: Any) -> Any:
    """The nav's "Notebooks" section lists every notebook, after the home page."""
    pages = [{notebook_title(src): f"notebooks/{src.name}"} for src in notebooks()]
    config.nav.insert(1, {"Notebooks": pages})
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files, which must see the notebooks
def on_files(files: Files, config: Any) -> Files:
    global _workdir
    _workdir = Path(tempfile.mkdtemp(prefix="ish-docs-"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=readme_page(readme)))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "changelog.md", content=changelog))
    files.append(File.generated(config, "api.md", content=api_page()))
    for src in notebooks():
        uri = f"notebooks/{src.name}"
        figures = notebook_page(src, _workdir / uri)
        log.info("%s: %d figures", src.name, figures)
        # A File with a source folder, not File.generated: mkdocs-jupyter's wrapper
        # finds the notebook through src_dir, which a generated File does not have.
        files.append(File(uri, str(_workdir), config.site_dir, config.use_directory_urls))
    files.append(File.generated(config, PLOTLY_ASSET, abs_src_path=str(plotly_js())))
    return files


def on_post_page(output: str, page: Page, config: Any) -> str:
    """Pages with a figure load plotly.js and the loader at the end of their body."""
    if f'class="{FIGURE_CLASS}"' not in output:
        return output
    scripts = "".join(
        f'<script src="{get_relative_url(asset, page.url)}"></script>'
        for asset in (PLOTLY_ASSET, LOADER_ASSET)
    )
    head, sep, tail = output.rpartition("</body>")
    if not sep:
        raise ValueError(f"{page.file.src_uri}: the rendered page has no </body>")
    return head + scripts + sep + tail


def on_build_error(error: Exception) -> None:
    on_post_build(None)  # a failed build leaves no temporary notebooks behind


def on_post_build(config: Any) -> None:
    global _workdir
    if _workdir is not None:
        shutil.rmtree(_workdir, ignore_errors=True)
        _workdir = None
