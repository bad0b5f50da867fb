"""Fetch into ``.whl/`` the wheels ``benchmarks/gpu_check.py`` needs on the lent GPU machine.

That machine runs Python 3.12 on x86_64 Linux with torch, numpy and transformers (and
what they need) installed, reaches no package registry, and takes what a call carries
from this checkout: at most 64 MiB, the working tree included. The package's other run
time dependencies (``pyproject.toml``: msgspec, pyzmq, plotly, ipywidgets, anywidget,
cloudpickle) and theirs travel as wheels in ``.whl/`` (ignored by git). Here, with a
registry in reach::

    make gpu-wheels                 # or: .venv/bin/python tools/gpu_wheels.py

downloads one wheel per package for CPython 3.12 manylinux x86_64: the version pinned
in ``requirements-dev.txt``, else the version installed in the interpreter running
this script when it fits, else the newest that fits. Their dependencies are read from
each wheel's ``METADATA`` (``Requires-Dist``; extras and markers false on that machine
are skipped), leaving out what the machine has (``MACHINE_HAS``) and the standard
library. A wheel already in ``.whl/`` at a fitting version is kept (a second run fetches
nothing); another version of the same package is removed, since two versions of one
package stop the whole install. Wheels in ``.whl/`` that no package needs are reported,
and removed with ``--prune``. The script prints each wheel, the total size (it exits 1
above ``BUDGET_MIB``) and the command to run there, with ``.whl`` carried::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && \
python3 benchmarks/gpu_check.py

(one line; ``gpu_check.py`` stays under 4 minutes, the install takes seconds).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the dev venv runs 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
BUDGET_MIB = 55.0  # the wheels; the rest of the 64 MiB a call carries is the working tree
CARRY_LIMIT_MIB = 64.0
DEVICE_COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
    "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && "
    "python3 benchmarks/gpu_check.py"
)
PYTHON_VERSION = "3.12"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# Tried when none of PLATFORMS matches (pip matches each manylinux_2_N exactly); the
# machine's glibc is newer than all of these.
MORE_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (24, 31, 34, 35))
# The environment markers are evaluated in: CPython 3.12 on x86_64 Linux, no extra.
MARKER_ENV: dict[str, str] = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": "3.12.3",
    "python_version": PYTHON_VERSION,
    "sys_platform": "linux",
    "extra": "",
}
# What the GPU machine has: torch and what it needs, numpy, transformers and what it
# needs (transitively, as transformers 5 declares it). Nothing of these is carried.
MACHINE_HAS = frozenset(
    canonicalize_name(name)
    for name in (
        # torch 2.11 (CUDA 13)
        "torch",
        "triton",
        "filelock",
        "typing-extensions",
        "sympy",
        "mpmath",
        "networkx",
        "jinja2",
        "markupsafe",
        "fsspec",
        "setuptools",
        "cuda-bindings",
        "cuda-pathfinder",
        "cuda-toolkit",
        "nvidia-cublas",
        "nvidia-cuda-cupti",
        "nvidia-cuda-nvrtc",
        "nvidia-cuda-runtime",
        "nvidia-cudnn-cu13",
        "nvidia-cufft",
        "nvidia-cufile",
        "nvidia-curand",
        "nvidia-cusolver",
        "nvidia-cusparse",
        "nvidia-cusparselt-cu13",
        "nvidia-nccl-cu13",
        "nvidia-nvjitlink",
        "nvidia-nvshmem-cu13",
        "nvidia-nvtx",
        "numpy",
        # transformers 5
        "transformers",
        "huggingface-hub",
        "packaging",
        "pyyaml",
        "regex",
        "tokenizers",
        "safetensors",
        "tqdm",
        "typer",
        "click",
        "rich",
        "markdown-it-py",
        "mdurl",
        "pygments",
        "shellingham",
        "annotated-doc",
        "hf-xet",
        "httpx",
        "httpcore",
        "anyio",
        "idna",
        "certifi",
        "h11",
    )
)
REQUIREMENTS = ROOT / "requirements-dev.txt"
PYPROJECT = ROOT / "pyproject.toml"


@dataclass(frozen=True)
class Wheel:
    """One wheel file: its package (canonical name), version and Requires-Dist text."""

    name: str
    version: str
    metadata: str
    path: Path | None = None


def parse_pins(text: str) -> dict[str, str]:
    """``name==version`` lines of a requirements file, by canonical name."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==":
            pins[canonicalize_name(req.name)] = specs[0].version
    return pins


def requires(metadata: str, env: Mapping[str, str] = MARKER_ENV) -> list[Requirement]:
    """The ``Requires-Dist`` of a METADATA text that hold on the machine: no extras."""
    found = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.partition(":")[2].strip())
        if req.marker is not None and not _holds(req.marker, env):
            continue
        found.append(req)
    return found


def _holds(marker: Marker, env: Mapping[str, str]) -> bool:
    """A marker on the machine, with no extra asked for (``extra == "x"`` is false)."""
    return bool(marker.evaluate(dict(env)))


def choose(req: Requirement, pins: Mapping[str, str], installed: Mapping[str, str]) -> Requirement:
    """What to fetch for ``req``: the pin, else the version installed here if it fits,
    else ``req`` itself (pip takes the newest that fits)."""
    name = canonicalize_name(req.name)
    version = pins.get(name)
    if version is None:
        here = installed.get(name)
        if here is not None and req.specifier.contains(here, prereleases=True):
            version = here
    return (
        Requirement(f"{name}=={version}")
        if version is not None
        else Requirement(name + str(req.specifier))
    )


def resolve(
    roots: Iterable[str],
    fetch: Callable[[Requirement], Wheel],
    pins: Mapping[str, str],
    installed: Mapping[str, str],
    has: Iterable[str] = MACHINE_HAS,
    env: Mapping[str, str] = MARKER_ENV,
) -> tuple[list[Wheel], list[str]]:
    """The wheels to carry, one per package, breadth first from ``roots`` (requirement
    strings); and the conflicts seen (a requirement the chosen version does not meet,
    reported, the first choice kept). ``fetch`` gets one pinned requirement per package."""
    skip = {canonicalize_name(n) for n in has}
    chosen: dict[str, Wheel] = {}
    conflicts: list[str] = []
    queue = [(Requirement(r), "pyproject.toml") for r in roots]
    while queue:
        req, by = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in skip:
            continue
        if name in chosen:
            have = chosen[name].version
            if not req.specifier.contains(have, prereleases=True):
                conflicts.append(f"{by} needs {req}, carrying {name} {have}")
            continue
        wheel = fetch(choose(req, pins, installed))
        if not req.specifier.contains(wheel.version, prereleases=True):
            conflicts.append(f"{by} needs {req}, carrying {name} {wheel.version}")
        chosen[name] = wheel
        queue.extend((dep, f"{name} {wheel.version}") for dep in requires(wheel.metadata, env))
    return list(chosen.values()), conflicts


def runtime_roots(pyproject: Path = PYPROJECT) -> list[str]:
    """The package's ``[project] dependencies``."""
    with pyproject.open("rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def installed_versions() -> dict[str, str]:
    """Versions installed in the interpreter running this script, by canonical name."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return found


def read_wheel(path: Path) -> Wheel:
    """A wheel file's name, version and METADATA."""
    name, version, _, _ = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = zf.read(meta).decode("utf-8", "replace")
    return Wheel(str(name), str(version), text, path)


def wheels_in(folder: Path) -> dict[str, list[Wheel]]:
    """The wheels in ``folder``, by canonical name."""
    found: dict[str, list[Wheel]] = {}
    for path in sorted(folder.glob("*.whl")):
        wheel = read_wheel(path)
        found.setdefault(wheel.name, []).append(wheel)
    return found


def _fits(req: Requirement, version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False
    return req.specifier.contains(version, prereleases=True)


class Fetcher:
    """``fetch`` for ``resolve``: a fitting wheel already in the folder, else pip's."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.fetched: list[str] = []
        self.removed: list[str] = []

    def __call__(self, req: Requirement) -> Wheel:
        name = canonicalize_name(req.name)
        there = wheels_in(self.folder).get(name, [])
        keep = [w for w in there if _fits(req, w.version)]
        for wheel in there:
            if wheel is not (keep[0] if keep else None) and wheel.path is not None:
                wheel.path.unlink()  # one version of each package: pip refuses two
                self.removed.append(wheel.path.name)
        if keep:
            return keep[0]
        before = {p.name for p in self.folder.glob("*.whl")}
        self._download(req)
        new = [p for p in self.folder.glob("*.whl") if p.name not in before]
        got = [w for w in map(read_wheel, new) if w.name == name]
        if not got:
            raise SystemExit(f"pip downloaded no wheel of {name} for {req}")
        self.fetched.append(got[0].path.name if got[0].path else name)
        return got[0]

    def _download(self, req: Requirement) -> None:
        for platforms in (PLATFORMS, PLATFORMS + MORE_PLATFORMS):
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
            cmd += ["--only-binary=:all:", "--python-version", PYTHON_VERSION]
            cmd += ["--implementation", "cp", "-d", str(self.folder)]
            for platform in platforms:
                cmd += ["--platform", platform]
            proc = subprocess.run([*cmd, str(req)], capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                return
        raise SystemExit(f"pip download {req} failed:\n{proc.stderr[-2000:]}")


def tree_mib(root: Path = ROOT) -> float | None:
    """What else a call carries: tracked and untracked-not-ignored files, in MiB."""
    proc = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    paths = (root / p.decode() for p in proc.stdout.split(b"\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=WHEELS, help="where the wheels go")
    parser.add_argument("--prune", action="store_true", help="remove wheels no package needs")
    args = parser.parse_args(argv)
    folder: Path = args.dir
    folder.mkdir(parents=True, exist_ok=True)
    fetch = Fetcher(folder)
    pins = parse_pins(REQUIREMENTS.read_text())
    wheels, conflicts = resolve(runtime_roots(), fetch, pins, installed_versions())
    names = {w.path.name for w in wheels if w.path is not None}
    extra = sorted(p for p in folder.glob("*.whl") if p.name not in names)
    if args.prune:
        for path in extra:
            path.unlink()
        fetch.removed += [p.name for p in extra]
        extra = []
    print(f"{len(wheels)} wheels in {folder} ({len(fetch.fetched)} downloaded now):")
    total = 0
    for wheel in sorted(wheels, key=lambda w: w.name):
        size = wheel.path.stat().st_size if wheel.path is not None else 0
        total += size
        print(f"  {size / 2**20:7.2f} MiB  {wheel.path.name if wheel.path else wheel.name}")
    for path in extra:
        total += path.stat().st_size
        print(
            f"  {path.stat().st_size / 2**20:7.2f} MiB  {path.name}  (no package needs it; --prune)"
        )
    for name in fetch.removed:
        print(f"  removed {name}")
    for conflict in conflicts:
        print(f"  conflict: {conflict}")
    mib = total / 2**20
    print(f"total {mib:.2f} MiB (budget {BUDGET_MIB:.0f} MiB)")
    tree = tree_mib()
    if tree is not None:
        carried = mib + tree
        print(
            f"with the working tree: {carried:.2f} MiB of {CARRY_LIMIT_MIB:.0f} MiB a call carries"
        )
        if carried > CARRY_LIMIT_MIB:
            print("  over: the tree counts untracked files git does not ignore (git status)")
    print("On the GPU machine (carry .whl):")
    print(f"  {DEVICE_COMMAND}")
    return 1 if mib > BUDGET_MIB or conflicts else 0


if __name__ == "__main__":
    sys.exit(main())
