"""Files the package writes appear whole or not at all (Note [Writing a file whole] in
``telemetry/files.py``): recordings (``run.save``), reports (``run.to_html``) and Chrome traces
(``run.timeline.to_chrome_trace``), on a full disk, in a shared folder, from threads."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import make_store

import interactive_shard as ish
from interactive_shard.telemetry import Event, RunStore, recording
from interactive_shard.testing import FakeTimeline

PREVIOUS = b"the previous file, which must survive a failed write\n" * 20
LIMIT = 4096  # bytes a file may grow to in the full-disk process: less than any new file


def _store(iterations: int = 3) -> RunStore:
    scalars = (Event("scalar", i % 2, i, 1000.0 + i, {"name": "loss", "value": 1.0 / (i + 1)})
               for i in range(20))  # fmt: skip
    return make_store([*FakeTimeline(iterations=iterations).events(), *scalars])


def test_save_does_not_follow_a_symlink_planted_at_the_old_temporary_name(tmp_path: Path) -> None:
    victim = tmp_path / "someone_elses.txt"
    victim.write_bytes(PREVIOUS)
    shared = tmp_path / "shared"
    shared.mkdir()
    planted = shared / "run.jsonl.tmp"
    planted.symlink_to(victim)
    store = _store()
    path = recording.save(store, shared / "run.jsonl")
    assert victim.read_bytes() == PREVIOUS
    assert planted.is_symlink() and planted.resolve() == victim  # left as it was
    assert not path.is_symlink()
    assert ish.load(path).store.events() == store.events()
    assert sorted(p.name for p in shared.iterdir()) == ["run.jsonl", "run.jsonl.tmp"]


def test_concurrent_saves_of_one_path_all_succeed(tmp_path: Path) -> None:
    store = _store(iterations=200)  # long enough for the saves to overlap
    path = tmp_path / "run.jsonl"
    threads = 4
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def save() -> None:
        start.wait()
        try:
            recording.save(store, path)
        except BaseException as err:  # every failure is the finding
            errors.append(err)

    for _ in range(3):
        running = [threading.Thread(target=save) for _ in range(threads)]
        for t in running:
            t.start()
        for t in running:
            t.join()
    assert errors == []
    assert ish.load(path).store.events() == store.events()
    assert [p.name for p in tmp_path.iterdir()] == ["run.jsonl"]  # no temporary file left


def test_a_new_file_gets_the_mode_open_would_give_and_a_rewritten_one_keeps_its_own(
    tmp_path: Path,
) -> None:
    store = _store()
    fresh = recording.save(store, tmp_path / "fresh.jsonl")
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
    kept = tmp_path / "kept.jsonl"
    kept.write_bytes(PREVIOUS)
    kept.chmod(0o640)
    recording.save(store, kept)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640


WRITERS = {
    "save": "run.save(out)",
    "to_html": "run.to_html(out)",
    "to_chrome_trace": "run.timeline.to_chrome_trace(out)",
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_full_disk_leaves_the_previous_file_as_it_was(tmp_path: Path, writer: str) -> None:
    """A process whose files may not grow past ``LIMIT`` bytes (``RLIMIT_FSIZE``: a write
    past it fails with EFBIG, as one on a full disk fails with ENOSPC) rewrites a file."""
    source = recording.save(_store(), tmp_path / "source.jsonl")
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "file"
    out.write_bytes(PREVIOUS)
    script = f"""
import resource, signal, sys
import interactive_shard as ish
import interactive_shard.report, interactive_shard.timeline.chrome  # imported before the limit
run = ish.load({str(source)!r})
run.timeline
out = {str(out)!r}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    {WRITERS[writer]}
except OSError as err:
    print("failed:", err)
    sys.exit(0)
sys.exit("the new file fit: raise nothing, test nothing")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "File too large" in done.stdout
    assert out.read_bytes() == PREVIOUS
    assert [p.name for p in folder.iterdir()] == ["file"]  # no temporary file left
