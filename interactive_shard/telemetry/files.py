"""Every file the package writes (recordings, reports, Chrome traces) appears whole or
not at all.

Note [Writing a file whole]
~~~~~~~~~~~~~~~~~~~~~~~~~~~

Background: writing in place (``path.write_text``) truncates the old file first, so a
full disk or an exception midway leaves neither the old content nor the new. A fixed
temporary name beside it (``run.jsonl.tmp``) is no better in a shared folder: whoever
plants a symlink there has the write follow it onto another file, and two saves of one
path race on the one name (the first ``replace`` moves it away under the second).

Algorithm:

1. ``mkstemp`` creates a private temporary file in the target's folder (so the final
   rename stays on one file system), named ``.<name>.<random>.tmp``; it opens with
   ``O_CREAT | O_EXCL``, which never follows a symlink and never reuses a name.
2. The content goes there; then ``fsync``, so the rename cannot land before the data.
3. The file gets the mode a plain ``open`` would leave: the target's own when it
   exists, else ``0o666`` less the umask (``mkstemp`` makes it ``0o600``).
4. ``os.replace`` puts it onto the target in one step: a reader sees the old file or
   the new one, never a part.

On any failure (``BaseException`` too: a ``KeyboardInterrupt`` mid-save) the temporary
file is removed and the target is untouched.

Caveats: a target that is itself a symlink is replaced by a file, not written through.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["write_bytes", "write_text", "written"]


@contextlib.contextmanager
def written(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file whose content replaces ``path`` when the block ends cleanly; when it
    raises, ``path`` stays as it was and nothing is left beside it."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), _mode(target))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` whole (Note [Writing a file whole]); returns the path."""
    with written(path) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` whole; returns the path."""
    return write_bytes(path, text.encode("utf-8"))


def _mode(target: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:  # no such file yet: what open() would create
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask. Read from /proc where it can be (setting it to read it back
    would change it, for a moment, under every other thread creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
