"""A rank's own recording file: what a rank records with no notebook (``ISH_RECORD=DIR``).

Each rank of a job writes one file under ``DIR`` as it goes: a recording header (the
format ``run.save`` writes, with ``extra["rank_file"]`` naming the job, the rank and
when it began), then one event per line. ``ish.load(DIR)`` merges a job's files into
one run (``telemetry/rank_files.py``).

Note [A rank file is never behind by more than a second]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Background: a job's rank may be killed (SIGKILL from the scheduler, the OOM killer) with
no chance to write what it holds, and the issue asks that it lose at most its last second.

Algorithm: the ``FileEmitter`` is an ``Emitter`` whose transport is the file: its
background thread hands what is buffered to the operating system every ``FLUSH_S``
(0.25 s) with one ``write`` (``f.flush()``), and a full buffer (``max_batch`` events) is
written at once, so memory stays bounded however long the job runs. What the kernel
holds survives the process's death; only a machine that fails loses its page cache
(the rank then loses what the kernel had not yet written back). A clean end writes a
``State`` event (finished, or failed with the uncaught error): a file without one
belongs to a rank that ended early, and the loader says so.

Caveats: a write that fails (a full disk) drops its events, counted in ``dropped`` and
logged once; training goes on.
"""

from __future__ import annotations

import io
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import msgspec

import interactive_shard
from interactive_shard.telemetry import schema
from interactive_shard.telemetry._recording_checks import FORMAT, MAX_LINE_BYTES
from interactive_shard.telemetry.emitter import Emitter
from interactive_shard.telemetry.schema import SCALAR, SCHEMA_VERSION

log = logging.getLogger(__name__)

RECORD_ENV = "ISH_RECORD"  # the folder a job's ranks record into
RUN_ID_ENV = "ISH_RUN_ID"  # names the job (default: torchrun's run id or rendezvous)
FLUSH_S = 0.25  # Note [A rank file is never behind by more than a second]
SUFFIX = ".jsonl"


def job_id() -> str:
    """What names this job, the same on every rank of it: ``ISH_RUN_ID``, else torchrun's
    rendezvous id (with its restart count), else its master address and port."""
    given = os.environ.get(RUN_ID_ENV, "").strip()
    if given:
        return given
    run = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    master = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    job = run if run and run != "none" else ":".join(master) if all(master) else ""
    if not job:
        return f"pid-{os.getpid()}"  # one process, no launcher: a job of its own
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return job if restart in ("", "0") else f"{job}/restart-{restart}"


class FileEmitter(Emitter):
    """An ``Emitter`` that writes rank ``rank``'s events to its own file in ``directory``
    (Note [A rank file is never behind by more than a second])."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        rank: int,
        world_size: int,
        *,
        job: str | None = None,
        torch_version: str = "",
        backend: str = "",
        flush_interval: float = FLUSH_S,
        max_batch: int = 2000,
    ) -> None:
        if type(world_size) is not int or not 0 <= rank < world_size <= schema.MAX_WORLD_SIZE:
            raise ValueError(
                f"a rank file needs 0 <= rank < world_size <= {schema.MAX_WORLD_SIZE}; got "
                f"rank {rank!r}, world_size {world_size!r} (torchrun sets RANK and WORLD_SIZE)."
            )
        self.job = job_id() if job is None else job
        self._header: dict[str, Any] = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "package_version": interactive_shard.__version__,
            "torch_version": torch_version,
            "world_size": world_size,
            "backend": backend,
            "device_types": [],
            "name": self.job,
            "extra": {"rank_file": {"job": self.job, "rank": rank, "started": time.time()}},
        }
        super().__init__(
            os.fspath(directory), "", rank, flush_interval=flush_interval, max_batch=max_batch
        )

    def _open(self, address: str, token: str, send_timeout: float) -> None:
        self._lines = msgspec.json.Encoder()
        self._address = address
        folder = Path(address)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(
                f"{RECORD_ENV}={address!r}: cannot make the folder to record into ({exc}). "
                "Point it at a folder every rank can write to."
            ) from exc
        stem = f"{_slug(self.job)}.rank{self.rank:05d}"
        for n in range(1000):  # another run of the same job id recorded here: never overwrite
            self.path = folder / f"{stem}{'' if n == 0 else f'.{n}'}{SUFFIX}"
            try:
                self._file: io.BufferedWriter = open(self.path, "xb")
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"{folder}: 1000 recordings of job {self.job!r} already")
        self._file.write(self._lines.encode(self._header) + b"\n")
        self._file.flush()

    def _send_events(self, events: list[Any], flags: int) -> None:
        if not events:
            return
        rank = self.rank
        rows = [
            e if len(e) == 5 else (SCALAR, rank, e[2], e[3], {"name": e[0], "value": e[1]})
            for e in events
        ]
        try:
            data = self._lines.encode_lines(rows)
        except (TypeError, ValueError, OverflowError) as exc:  # an int > 64 bits
            if len(rows) > 1:  # find the one that cannot be written
                half = len(events) // 2
                self._send_events(events[:half], 0)
                self._send_events(events[half:], flags)
            else:
                self._drop(1, "unsendable", f"a {rows[0][0]!r} event cannot be encoded ({exc})")
            return
        if len(data) > MAX_LINE_BYTES:  # rare: keep the loader's line limit, line by line
            lines = data.splitlines(keepends=True)
            kept = [line for line in lines if len(line) <= MAX_LINE_BYTES]
            if len(kept) < len(lines):
                why = f"an event is over the {MAX_LINE_BYTES}-byte line limit"
                self._drop(len(lines) - len(kept), "unsendable", why)
                data = b"".join(kept)
        try:
            self._file.write(data)
            self._file.flush()  # Note [A rank file is never behind by more than a second]
        except (OSError, ValueError) as exc:  # a full disk; a file closed under us
            self._drop(len(rows), "unwritable", f"writing {self.path} failed ({exc})")

    def _close_transport(self) -> None:
        try:
            self._file.close()
        except OSError as exc:
            log.warning("telemetry: rank %d: closing %s failed (%s)", self.rank, self.path, exc)

    def _after_close(self) -> None:
        pass


def _slug(job: str) -> str:
    """``job`` as part of a file name: what is not a letter, digit, dot or dash is ``_``."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", job)[:80].strip("._") or "job"
