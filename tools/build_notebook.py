"""Execute a notebook (or build one from a cell script): keep text outputs, drop widget state.

Cells in the script are separated by lines '# %%' (code) or '# %% [markdown]'
(markdown; the cell's lines are '# ' comments). Usage:

    python tools/build_notebook.py cells.py notebooks/NN-topic.ipynb
    python tools/build_notebook.py notebooks/NN-topic.ipynb notebooks/NN-topic.ipynb
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def parse(text: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            blocks.append(("markdown" if "[markdown]" in line else "code", []))
        elif blocks:
            blocks[-1][1].append(line)
    for kind, lines in blocks:
        source = "\n".join(lines).strip("\n")
        if kind == "markdown":
            source = "\n".join(line.removeprefix("# ").removeprefix("#") for line in lines)
            nb.cells.append(nbformat.v4.new_markdown_cell(source.strip("\n")))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(source))
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main(src: str, dest: str) -> None:
    path = Path(src)
    nb = nbformat.read(path, as_version=4) if path.suffix == ".ipynb" else parse(path.read_text())
    resources = {"metadata": {"path": str(Path(dest).parent)}}
    NotebookClient(nb, timeout=600, kernel_name="python3", resources=resources).execute()
    nb.metadata.pop("widgets", None)  # saved widget state is megabytes of plotly.js
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, dest)


if __name__ == "__main__":
    main(*sys.argv[1:3])
