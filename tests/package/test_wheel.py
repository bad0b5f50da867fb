"""The distribution: ``python -m build`` makes a wheel and an sdist that pass ``twine check``,
and the wheel alone (no source tree) runs the demo in a fresh virtual environment that
already has its own torch, which the install leaves exactly as it was.

The torch put in the fresh environment first is ``ISH_WHEEL_TORCH`` (default
``torch==2.13.0``, the CPU build this machine installs from disk; any other release
pulls a CUDA build of several GB here, see the README's "Installing" section).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO_ROOT

import interactive_shard
from interactive_shard.features import FEATURES

# Installing torch and the wheel's dependencies into a fresh venv takes minutes.
pytestmark = pytest.mark.timeout(1800)

TORCH_SPEC = os.environ.get("ISH_WHEEL_TORCH", "torch==2.13.0")
BUILD_TIMEOUT_S = 600
INSTALL_TIMEOUT_S = 900
DEMO_TIMEOUT_S = 600


def _run(cmd: list[str | Path], timeout: float, cwd: Path | None = None) -> str:
    """Run ``cmd``; on failure the assertion shows its output (the reason, not a code)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{output[-4000:]}"
    return output


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", out, REPO_ROOT], BUILD_TIMEOUT_S)
    return out


def _one(dist: Path, pattern: str) -> Path:
    (found,) = dist.glob(pattern)
    return found


def test_wheel_and_sdist_pass_twine_check(dist: Path) -> None:
    version = interactive_shard.__version__
    wheel = _one(dist, f"interactive_shard-{version}-py3-none-any.whl")
    sdist = _one(dist, f"interactive_shard-{version}.tar.gz")
    output = _run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist], 120)
    assert output.count("PASSED") == 2, output


def test_the_wheel_holds_the_package_its_metadata_and_nothing_else(dist: Path) -> None:
    with zipfile.ZipFile(_one(dist, "*.whl")) as wheel:
        names = wheel.namelist()
        info = f"interactive_shard-{interactive_shard.__version__}.dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
    assert {n.split("/")[0] for n in names} == {"interactive_shard", info}
    assert "interactive_shard/py.typed" in names  # typed package: checkers read its hints
    assert f"{info}/licenses/LICENSE" in names
    for feature in FEATURES:  # every part of every entry of the feature list
        parts = (feature.model, feature.view, feature.figures, feature.summary, feature.fake)
        for ref in filter(None, parts):
            assert ref.partition(":")[0].replace(".", "/") + ".py" in names, ref
    assert f"Version: {interactive_shard.__version__}" in metadata
    assert "Requires-Dist: torch<2.16,>=2.11" in metadata
    assert "License-Expression: BSD-3-Clause" in metadata


def test_the_sdist_carries_tests_notebooks_docs_and_the_changelog(dist: Path) -> None:
    with tarfile.open(_one(dist, "*.tar.gz")) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for needed in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "Makefile"):
        assert needed in names
    assert any(n.startswith("notebooks/") and n.endswith(".ipynb") for n in names)
    assert "tests/package/test_wheel.py" in names and "docs/events.md" in names
    assert not any("__pycache__" in n or "screenshots/" in n for n in names)


def _torch_state(python: Path) -> dict[str, str]:
    """torch's version, where it lives and a digest of its RECORD (every file it owns)."""
    code = (
        "import json, importlib.metadata as m; d = m.distribution('torch'); "
        "print(json.dumps({'version': d.version, 'path': str(d.locate_file('')), "
        "'record': d.read_text('RECORD')}))"
    )
    found = json.loads(_run([python, "-c", code], 120).strip().splitlines()[-1])
    found["record"] = hashlib.sha256(found["record"].encode()).hexdigest()
    return found


@pytest.fixture
def venv_with_torch(tmp_path: Path) -> Iterator[Path]:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], 120)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", TORCH_SPEC], INSTALL_TIMEOUT_S)
    yield python


def test_demo_runs_from_the_wheel_alone_and_leaves_torch_alone(
    dist: Path, venv_with_torch: Path, tmp_path: Path
) -> None:
    python = venv_with_torch
    before = _torch_state(python)
    install = _run(
        [python, "-m", "pip", "install", _one(dist, "*.whl")], INSTALL_TIMEOUT_S, cwd=tmp_path
    )
    assert "Uninstalling torch" not in install
    assert _torch_state(python) == before  # same version, place and files
    # Outside the source tree: only the installed wheel can be imported.
    where = _run([python, "-c", "import interactive_shard as i; print(i.__file__)"], 120, tmp_path)
    assert str(python.parents[1]) in where and str(REPO_ROOT) not in where
    out = tmp_path / "demo"
    demo = [python, "-m", "interactive_shard", "demo", "--out", out, "--steps", "4"]
    printed = _run(demo, DEMO_TIMEOUT_S, cwd=tmp_path)
    assert f"Report: {out / 'index.html'}" in printed
    report = (out / "index.html").read_text()
    for section in ("DDP gradient buckets", "graph splits (DDPOptimizer)", "Mixed precision"):
        assert section in report
    check = (
        "import sys, interactive_shard as ish; run = ish.load(sys.argv[1]); "
        "kinds = run.store.kinds(); "
        "print(run.store.info.world_size, 'ddp_iteration' in kinds and 'split_compile' in kinds, "
        "run.buckets.health == [])"
    )
    printed = _run([python, "-c", check, out / "run.jsonl"], 120)
    assert printed.split()[-3:] == ["2", "True", "True"]  # both ranks, DDP and splits, healthy
