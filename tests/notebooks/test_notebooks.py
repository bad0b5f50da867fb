"""Run every notebook in notebooks/ with nbval in strict mode.

Each notebook is one test. It runs in a temporary copy of its folder (files
the notebook writes stay out of the repo) through `nbval_plugin.py` in a
child process, on a kernel of the interpreter running this test
(`--nbval-current-env`), with outputs compared after `sanitize.cfg`.

Set ISH_NOTEBOOKS_DIR to validate the notebooks of another folder.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import kill_tree, notebook_params, notebooks_dir

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
RUNNER = HERE / "nbval_plugin.py"
SANITIZE = HERE / "sanitize.cfg"

CELL_TIMEOUT_S = 300
# A whole notebook: long enough for many slow cells, short enough to end a hung run.
NOTEBOOK_TIMEOUT_S = 1500
OUTPUT_TAIL_CHARS = 20_000
# Kernel tracebacks are coloured; the colour codes only clutter a failure report.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def run_nbval(notebook: Path, work: Path) -> tuple[int, str]:
    """Copy the notebook's folder under `work` and run nbval on the copy."""
    copy_dir = work / "notebooks"
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
    shutil.copytree(notebook.parent, copy_dir, ignore=ignore)
    # An ini of our own pins rootdir and keeps the repo's pytest options
    # (and any conftest.py above the notebooks) out of the nbval run.
    ini = work / "pytest.ini"
    ini.write_text("[pytest]\n")
    cmd = [
        sys.executable,
        str(RUNNER),
        str(copy_dir / notebook.name),
        "--nbval",
        "--nbval-current-env",
        f"--nbval-sanitize-with={SANITIZE}",
        f"--nbval-cell-timeout={CELL_TIMEOUT_S}",
        f"--rootdir={work}",
        f"--config-file={ini}",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        "--color=no",
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=NOTEBOOK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        output, _ = proc.communicate()
        output += f"\n[timed out after {NOTEBOOK_TIMEOUT_S} s]"
        return -1, ANSI_ESCAPE.sub("", output)
    return proc.returncode, ANSI_ESCAPE.sub("", output)


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S + 60)
@pytest.mark.parametrize("notebook", notebook_params())
def test_notebook_outputs_match(notebook: Path, tmp_path: Path) -> None:
    code, output = run_nbval(notebook, tmp_path)
    summary = output.strip().splitlines()[-1] if output.strip() else "(no output)"
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        pytest.skip(f"{notebook.name} has no code cells")
    if code != pytest.ExitCode.OK:
        pytest.fail(
            f"nbval failed for {notebook} (exit {code}): {summary}\n{output[-OUTPUT_TAIL_CHARS:]}",
            pytrace=False,
        )
    print(f"{notebook.name}: {summary}")
