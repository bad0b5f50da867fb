"""Rank output in the kernel: cut into lines, every store of it bounded.

Note [Bounded rank output]
--------------------------
Background: a rank may print without limit (a loss per step for a million steps, a
``\\r`` progress bar that never ends its line, a 5 MB exception message). The kernel
lives longer than any run and must not grow with what a rank prints, nor spend time
quadratic in a line's length, nor make a run unsaveable because one line is long.

Bounds, each stated here and in the README:
1. A line keeps its first ``MAX_LINE_CHARS`` bytes; the rest is counted in a marker
   (``… [N more bytes cut]``). ``LineBuffer`` holds at most that much of a line that
   has not ended yet, so a long line costs linear time. A ``\\r`` followed by more text
   starts the line over, as on a terminal: a progress bar is its last state.
2. ``cluster.logs[rank]``: the latest ``CLUSTER_LOG_LINES`` lines (and at most
   ``CLUSTER_LOG_CHARS`` characters) of each rank over all runs; ``cluster.logs_dropped``
   counts the older ones.
3. A run keeps (in its store, so in its recording) the first ``RUN_HEAD_LINES`` and the
   last ``RUN_TAIL_LINES`` lines of each rank, with a marker saying how many between
   them were not kept. The tail joins the store when the run ends.
4. Echo prints at most ``ECHO_LINES`` lines per refresh and says how many it skipped;
   it reads its own queue, never the store (whose scalars it would have to build).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable

MAX_LINE_CHARS = 8192
CLUSTER_LOG_LINES = 10_000
CLUSTER_LOG_CHARS = 4 * 2**20
RUN_HEAD_LINES = 10_000
RUN_HEAD_CHARS = 4 * 2**20
RUN_TAIL_LINES = 1000
RUN_TAIL_CHARS = 2**20
ECHO_LINES = 1000


def cut(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` whole, or its first ``limit`` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … [{len(text) - limit:,} more characters cut]"


def cut_lines(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` with each line cut to ``limit`` characters (a traceback's message)."""
    if len(text) <= limit:
        return text
    return "\n".join(cut(line, limit) for line in text.split("\n"))


class LineBuffer:
    """Splits one byte stream into lines in linear time, holding at most one cut line."""

    def __init__(self, limit: int = MAX_LINE_CHARS) -> None:
        self._limit = limit
        self._line = bytearray()
        self._cut = 0  # bytes of the current line beyond the limit
        self._cr = False  # the current line ends in a carriage return so far

    def feed(self, data: bytes) -> list[str]:
        """The lines ``data`` completes (without their line breaks)."""
        lines: list[str] = []
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self._add(data[start:end])
            lines.append(self._take())
            start = end + 1
        self._add(data[start:])
        return lines

    def close(self) -> list[str]:
        """The unfinished last line, if any (the stream ended)."""
        return [self._take()] if self._line or self._cut else []

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        if self._cr:  # text after a carriage return: the line was redrawn
            self._restart()
        redraw = piece.rfind(b"\r", 0, len(piece) - 1)
        if redraw >= 0:
            self._restart()
            piece = piece[redraw + 1 :]
        self._cr = piece.endswith(b"\r")
        if self._cr:
            piece = piece[:-1]
        room = self._limit - len(self._line)
        self._line += piece[: max(room, 0)]
        self._cut += max(len(piece) - room, 0)

    def _restart(self) -> None:
        self._line.clear()
        self._cut, self._cr = 0, False

    def _take(self) -> str:
        text = self._line.decode(errors="replace")
        if self._cut:
            text += f" … [{self._cut:,} more bytes cut]"
        self._restart()
        return text


class LineRing:
    """The latest lines of one rank, at most ``max_lines`` and ``max_chars``; ``dropped``
    counts the older ones and ``total`` every line added."""

    def __init__(self, max_lines: int, max_chars: int) -> None:
        self._lines: deque[str] = deque()
        self._max_lines, self._max_chars = max_lines, max_chars
        self._chars = 0
        self.total = 0
        self.dropped = 0

    def add(self, line: str) -> None:
        self._lines.append(line)
        self._chars += len(line)
        self.total += 1
        while len(self._lines) > self._max_lines or (
            self._chars > self._max_chars and len(self._lines) > 1
        ):
            self._chars -= len(self._lines.popleft())
            self.dropped += 1

    def lines(self) -> list[str]:
        return list(self._lines)

    def since(self, total: int) -> list[str]:
        """The lines added after the ring had ``total`` lines (those still held)."""
        new = min(self.total - total, len(self._lines))
        return list(self._lines)[len(self._lines) - new :] if new > 0 else []


# (stream, text, time) of one line a rank wrote
Line = tuple[str, str, float]


class RunOutput:
    """What one run keeps of each rank's output (Note [Bounded rank output], 3-4).

    ``add`` says whether a line belongs in the run's store now (the head); later lines
    wait in a tail ring until ``finish`` hands them, after a marker, to the store.
    Thread-safe: the supervisor adds, the notebook's main thread echoes and finishes.
    """

    def __init__(self, world_size: int) -> None:
        self._lock = threading.Lock()
        self._head_lines = [0] * world_size
        self._head_chars = [0] * world_size
        self._tails: list[deque[Line]] = [deque() for _ in range(world_size)]
        self._tail_chars = [0] * world_size
        self._between = [0] * world_size  # lines neither in the head nor in the tail
        self._finished = False
        self._echo: deque[tuple[int, str, str]] = deque()
        self.echo_skipped = 0

    def add(self, rank: int, stream: str, text: str) -> bool:
        """Note a line; True when it goes into the store now (the head)."""
        with self._lock:
            if len(self._echo) >= ECHO_LINES:
                self._echo.popleft()
                self.echo_skipped += 1
            self._echo.append((rank, stream, text))
            if self._head_lines[rank] < RUN_HEAD_LINES and (
                self._head_chars[rank] + len(text) <= RUN_HEAD_CHARS
            ):
                self._head_lines[rank] += 1
                self._head_chars[rank] += len(text)
                return True
            if self._finished:  # after the run ended: counted, not kept
                self._between[rank] += 1
                return False
            tail = self._tails[rank]
            tail.append((stream, text, time.monotonic()))
            self._tail_chars[rank] += len(text)
            while len(tail) > RUN_TAIL_LINES or (
                self._tail_chars[rank] > RUN_TAIL_CHARS and len(tail) > 1
            ):
                self._tail_chars[rank] -= len(tail.popleft()[1])
                self._between[rank] += 1
            return False

    def take_echo(self) -> tuple[list[tuple[int, str, str]], int]:
        """The lines to echo since the last call, and how many were skipped meanwhile."""
        with self._lock:
            lines, skipped = list(self._echo), self.echo_skipped
            self._echo.clear()
            self.echo_skipped = 0
            return lines, skipped

    def tail(self, rank: int) -> list[str]:
        """Rank ``rank``'s lines not in the store yet: a marker and the tail."""
        with self._lock:
            return [text for _, text, _ in self._pending(rank)]

    def finish(self) -> Iterable[tuple[int, Line]]:
        """Once, when the run ends: each rank's marker and tail, for the store."""
        with self._lock:
            self._finished = True
            out = [(rank, line) for rank in range(len(self._tails)) for line in self._pending(rank)]
            for tail in self._tails:
                tail.clear()
            return out

    def _pending(self, rank: int) -> list[Line]:
        tail = list(self._tails[rank])
        between = self._between[rank]
        if between:
            marker = (
                f"[… {between:,} line(s) of rank {rank}'s output not kept: a run keeps the "
                f"first {RUN_HEAD_LINES:,} and the last {RUN_TAIL_LINES:,} lines of each rank]"
            )
            at = tail[0][2] if tail else time.monotonic()
            tail.insert(0, ("stdout", marker, at))
        return tail

    def not_kept(self, rank: int) -> int:
        with self._lock:
            return self._between[rank]
