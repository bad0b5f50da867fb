"""``benchmarks/gpu_check.py`` without CUDA, and the wheels it travels with.

The script runs as a child process with no CUDA device visible (``CUDA_VISIBLE_DEVICES=""``),
so it takes the no-GPU path on a GPU machine too; it imports torch and nothing else.
``tools/gpu_wheels.py`` decides which wheels the GPU machine needs: checked here on
made-up METADATA, without a network.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
CASES = [
    "gloo-shared-gpu-buckets",
    "gloo-shared-gpu-splits-inductor",
    "gloo-shared-gpu-precision-fsdp2",
    "gloo-shared-gpu-precision-ddp",
    "gloo-shared-gpu-timeline-fsdp2",
    "gloo-shared-gpu-optimizer-in-backward",
    "nccl-gpu-per-rank",
]


def test_gpu_check_skips_every_case_without_cuda() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.partition(":")[0] for line in lines] == [f"SKIP {case}" for case in CASES]
    assert all("CUDA is not available" in line for line in lines), lines


def _gpu_wheels() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "tools" / "gpu_wheels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gw = _gpu_wheels()

# Made-up METADATA, as pip would find it in each wheel: name -> version -> Requires-Dist.
INDEX: dict[str, dict[str, list[str]]] = {
    "plotly": {"7.1.0": ["narwhals>=1.15.1", "packaging"]},
    "narwhals": {"2.29.0": [], "2.30.0": []},
    "ipywidgets": {
        "8.1.9": [
            "comm>=0.1.3",
            "ipython>=6.1.0",
            "traitlets>=4.3.1",
            'pytest>=3.6.0; extra == "test"',
        ]
    },
    "anywidget": {"0.11.0": ["ipywidgets>=7.6.0", "typing-extensions>=4.2.0", "psygnal>=0.8.1"]},
    "psygnal": {"0.16.1": ['typing-extensions; python_version < "3.12"']},
    "comm": {"0.2.3": []},
    "ipython": {
        "9.18.1": [
            'colorama>=0.4.4; sys_platform == "win32"',
            'pexpect>4.6; sys_platform != "win32" and sys_platform != "emscripten"',
            "pygments>=2.14.0",
            "traitlets>=5.13.0",
            'typing_extensions>=4.6; python_version < "3.12"',
            'exceptiongroup; python_version < "3.11"',
        ]
    },
    "pexpect": {"4.9.0": ["ptyprocess>=0.5"]},
    "ptyprocess": {"0.7.0": []},
    "traitlets": {"5.16.1": [], "5.9.0": []},
    "msgspec": {"0.23.0": ['pyyaml; extra == "yaml"']},
}
PINS = "msgspec==0.23.0\nplotly==7.1.0  # figures\nipywidgets==8.1.9\nanywidget==0.11.0\n"
ROOTS = ["torch>=2.13,<2.14", "ipywidgets>=8", "plotly>=6", "anywidget>=0.9", "msgspec", "numpy"]


def _metadata(name: str, version: str) -> str:
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"]
    lines += [f"Requires-Dist: {r}" for r in INDEX[name][version]]
    return "\n".join(lines) + "\n\nA description.\n"


class FakeIndex:
    """``fetch`` for ``resolve``: the newest version that fits, as pip would pick."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, req: Requirement) -> object:
        self.asked.append(str(req))
        versions = sorted(INDEX[req.name], key=lambda v: tuple(map(int, v.split("."))))
        version = [v for v in versions if req.specifier.contains(v)][-1]
        return gw.Wheel(req.name, version, _metadata(req.name, version))


def test_pins_are_the_exact_versions_of_a_requirements_file() -> None:
    text = "# a comment\n-e .\nmsgspec==0.23.0\nPyYAML==6.0.4  # reads yml\nruff>=0.17\n\n"
    assert gw.parse_pins(text) == {"msgspec": "0.23.0", "pyyaml": "6.0.4"}


def test_requires_skips_extras_and_markers_false_on_the_gpu_machine() -> None:
    got = [str(r) for r in gw.requires(_metadata("ipython", "9.18.1"))]
    assert got == [
        'pexpect>4.6; sys_platform != "win32" and sys_platform != "emscripten"',
        "pygments>=2.14.0",
        "traitlets>=5.13.0",
    ]
    assert gw.requires(_metadata("msgspec", "0.23.0")) == []


def test_resolve_fetches_one_pinned_wheel_per_package_the_machine_lacks() -> None:
    fetch = FakeIndex()
    installed = {"narwhals": "2.29.0", "traitlets": "5.9.0", "comm": "0.2.3"}
    wheels, conflicts = gw.resolve(ROOTS, fetch, gw.parse_pins(PINS), installed)
    got = {w.name: w.version for w in wheels}
    assert got == {
        "ipywidgets": "8.1.9",  # pinned
        "plotly": "7.1.0",
        "anywidget": "0.11.0",
        "msgspec": "0.23.0",
        "comm": "0.2.3",  # installed here and fits
        "ipython": "9.18.1",
        "traitlets": "5.9.0",  # installed here; ipython wants >=5.13 (a conflict, below)
        "narwhals": "2.29.0",  # installed here, not the newest
        "psygnal": "0.16.1",
        "pexpect": "4.9.0",
        "ptyprocess": "0.7.0",
    }
    assert len(fetch.asked) == len(got)  # one fetch per package
    # what the machine has (torch, numpy, packaging, pygments, typing-extensions) and
    # what only another platform, Python or an extra needs is not carried
    for name in ("torch", "numpy", "packaging", "pygments", "typing-extensions", "colorama"):
        assert name not in got
    for name in ("exceptiongroup", "pytest", "pyyaml"):
        assert name not in got
    assert "ipywidgets==8.1.9" in fetch.asked and "narwhals==2.29.0" in fetch.asked
    # traitlets was first asked for by ipywidgets (>=4.3.1: the installed 5.9.0 fits),
    # then ipython needs >=5.13.0: one version is kept and the conflict reported
    assert conflicts == ["ipython 9.18.1 needs traitlets>=5.13.0, carrying traitlets 5.9.0"]


def test_resolve_reports_no_conflict_when_every_version_fits() -> None:
    installed = {"traitlets": "5.16.1"}
    wheels, conflicts = gw.resolve(ROOTS, FakeIndex(), gw.parse_pins(PINS), installed)
    assert conflicts == []
    names = [w.name for w in wheels]
    assert len(names) == len(set(names))


def _wheel_file(folder: Path, name: str, version: str) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", _metadata(name, version))
    return path


def test_fetcher_keeps_a_fitting_wheel_and_removes_other_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = _wheel_file(tmp_path, "traitlets", "5.9.0")
    downloads: list[str] = []

    def download(self: object, req: Requirement) -> None:
        downloads.append(str(req))
        _wheel_file(tmp_path, req.name, str(req.specifier).removeprefix("=="))

    monkeypatch.setattr(gw.Fetcher, "_download", download)
    fetch = gw.Fetcher(tmp_path)
    assert fetch(Requirement("traitlets>=5")).version == "5.9.0"  # already there: kept
    assert downloads == [] and old.exists()
    assert fetch(Requirement("traitlets==5.16.1")).version == "5.16.1"
    assert downloads == ["traitlets==5.16.1"]
    assert sorted(p.name for p in tmp_path.glob("*.whl")) == ["traitlets-5.16.1-py3-none-any.whl"]
    assert fetch(Requirement("traitlets==5.16.1")).version == "5.16.1"  # a second run
    assert downloads == ["traitlets==5.16.1"]


def test_every_runtime_dependency_the_machine_lacks_is_pinned() -> None:
    pins = gw.parse_pins((ROOT / "requirements-dev.txt").read_text())
    roots = [Requirement(r) for r in gw.runtime_roots()]
    missing = {r.name for r in roots} - gw.MACHINE_HAS
    assert missing == {"msgspec", "pyzmq", "plotly", "ipywidgets", "anywidget", "cloudpickle"}
    assert missing <= set(pins)


def test_the_device_command_is_documented_as_the_script_prints_it() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert gw.DEVICE_COMMAND in readme
    assert "make gpu-wheels" in readme
    doc = " ".join(gw.__doc__.split())
    assert gw.DEVICE_COMMAND in doc
