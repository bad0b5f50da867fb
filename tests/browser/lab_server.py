"""A throw-away JupyterLab server for browser tests.

With the `notebook` package installed the same server also serves Notebook 7's
pages (`/tree`, `/notebooks/<path>`), so one server serves both front ends.

Everything the server reads or writes (config, data, runtime, settings,
workspaces, the notebooks it serves) lives under one temporary folder, so a
test run neither depends on nor changes the user's Jupyter set-up or the repo.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from support import kill_tree

# JupyterLab settings written before start: no news or update pop-ups over the
# notebook, and every cell kept in the DOM (the default windowing leaves
# off-screen cells unrendered, so their widgets could not be checked).
LAB_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {
        "windowingMode": "none",
    },
}
# No websocket pings: a page whose renderer is busy drawing widgets on a
# loaded machine reads no ping for minutes, the server then closes its kernel
# socket, and the replies lost with it leave cells "[*]" for good (seen on the
# 2-core machine). Server and browser share this machine, so nothing is lost.
SERVER_CONFIG: dict[str, Any] = {"ServerApp": {"tornado_settings": {"ws_ping_interval": 0}}}
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LabServer:
    """`start()` it, use `url`/`token`/`api()`, and always `stop()` it."""

    root_dir: Path
    home: Path
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    def start(self) -> None:
        dirs = {name: self.home / name for name in ("config", "data", "runtime", "settings")}
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        (dirs["config"] / "jupyter_server_config.json").write_text(json.dumps(SERVER_CONFIG))
        for rel, value in LAB_SETTINGS.items():
            target = dirs["settings"] / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(value))
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(dirs["config"]),
            "JUPYTER_DATA_DIR": str(dirs["data"]),
            "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
            "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.home / "workspaces"),
        }
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            "--allow-root",
            f"--ServerApp.root_dir={self.root_dir}",
        ]
        with self.log_path.open("wb") as log:
            # A session of its own, so stop() can signal the whole group.
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({self.proc.returncode}):\n{self.log()}")
            try:
                self.api("GET", "/api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.25)
        raise RuntimeError(f"jupyter lab not ready after {START_TIMEOUT_S} s:\n{self.log()}")

    def api(self, method: str, path: str) -> Any:
        request = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def kernel_connected(self, path: str) -> bool:
        """Whether the notebook at `path` has an idle kernel with a front end attached."""
        return any(
            session["path"] == path
            and session["kernel"]["connections"] > 0
            and session["kernel"]["execution_state"] == "idle"
            for session in self.api("GET", "/api/sessions")
        )

    def delete_sessions(self, path: str | None = None) -> None:
        """Shut down the kernel of `path` (default: every kernel), so a next run starts fresh."""
        for session in self.api("GET", "/api/sessions"):
            if path is None or session["path"] == path:
                self.api("DELETE", f"/api/sessions/{session['id']}")

    def log(self, tail: int = 6000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-tail:]

    def stop(self) -> None:
        """Shut down kernels and server; kill whatever is left.

        Kernels run in sessions of their own, so they are collected from the
        process tree before the server goes and killed one by one after.
        """
        if self.proc is None:
            return
        try:
            descendants = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        try:
            self.delete_sessions()
            self.api("POST", "/api/shutdown")
            self.proc.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        kill_tree(self.proc.pid, descendants)
        self.proc.wait()
        self.proc = None
