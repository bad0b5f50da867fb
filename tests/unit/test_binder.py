"""binder/: what can be checked without Binder (README, "Binder", says what cannot).

repo2docker builds from ``environment.yml`` (conda-forge's CPU-only ``pytorch-cpu``,
named by package, no index address) and then runs ``postBuild``.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess

import tomllib
import yaml
from support import REPO_ROOT

BINDER = REPO_ROOT / "binder"


def _environment() -> dict[str, object]:
    loaded = yaml.safe_load((BINDER / "environment.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _conda_specs() -> dict[str, str]:
    deps = _environment()["dependencies"]
    assert isinstance(deps, list) and all(isinstance(d, str) for d in deps)  # no pip section
    return {re.split(r"[<>=!]", d, maxsplit=1)[0]: d for d in deps}


def _runtime_requirements() -> dict[str, str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!\[ ]", r, maxsplit=1)[0]: r for r in project["dependencies"]}


def test_binder_names_no_index_address_and_one_environment_file() -> None:
    files = sorted(p.name for p in BINDER.iterdir())
    assert files == ["environment.yml", "postBuild"]  # repo2docker uses the first spec it finds
    for name in files:
        text = (BINDER / name).read_text()
        assert "://" not in text and "index-url" not in text and "find-links" not in text, name


def test_environment_takes_cpu_torch_from_conda_forge_within_the_supported_bounds() -> None:
    env = _environment()
    assert env["channels"] == ["conda-forge", "nodefaults"]
    specs = _conda_specs()
    torch_bounds = _runtime_requirements()["torch"].removeprefix("torch")
    assert specs["pytorch-cpu"] == f"pytorch-cpu{torch_bounds}"
    assert "pytorch" not in specs  # a bare pytorch could resolve to a CUDA build


def test_environment_has_every_runtime_dependency_and_the_front_ends() -> None:
    specs = _conda_specs()
    for name, requirement in _runtime_requirements().items():
        if name == "torch":
            continue
        assert name in specs, f"{requirement} (pyproject.toml) is missing in environment.yml"
        assert specs[name] == requirement, f"{specs[name]!r} != pyproject's {requirement!r}"
    assert {"jupyterlab", "notebook", "ipykernel"} <= set(specs)


def test_post_build_is_executable_strict_bash_and_installs_only_the_package() -> None:
    post = BINDER / "postBuild"
    assert os.stat(post).st_mode & stat.S_IXUSR
    lines = post.read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    assert next(line for line in lines if line and not line.startswith("#")) == "set -euo pipefail"
    assert "python -m pip install --no-deps ." in lines
    subprocess.run(["bash", "-n", str(post)], check=True)  # it parses
