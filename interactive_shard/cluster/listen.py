"""Listen for ranks started elsewhere (``torchrun``, a job script) and show them live.

listener = ish.listen(world_size=2)          # in the notebook
listener.command_env()                        # {"ISH_TELEMETRY": "tcp://...", ...}
# on each rank: ish.watch(model) connects from those variables by itself
# (or interactive_shard.telemetry.rank.connect_from_env())
listener.run                                  # a Run: monitor, buckets, save, to_html
listener.refused                              # {"wrong token": 3, ...}: messages dropped

Beyond this machine (``host="0.0.0.0"`` or the head node's address) a token is
required, and every message must carry it. A message with another token, or from a
rank outside ``0..world_size-1``, is dropped (none of it reaches the run) and counted
by reason in ``refused``; the ``interactive_shard.telemetry.channel`` logger warns at
the first of each reason, naming the rank the message claims and where it came from.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from interactive_shard.cluster.run import Run
from interactive_shard.telemetry import schema
from interactive_shard.telemetry.channel import Collector
from interactive_shard.telemetry.schema import Batch
from interactive_shard.telemetry.store import RunInfo, RunStore
from interactive_shard.ui import live

_EVERY_INTERFACE = {"0.0.0.0", "*"}  # what a rank cannot connect to


class Listener:
    """A collector whose events, from any run id, fill one ``Run``."""

    def __init__(
        self,
        world_size: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        backend: str = "",
        name: str = "external",
    ) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}.")
        info = RunInfo(world_size=world_size, backend=backend, device_types=[], name=name)
        self.run = Run(RunStore(info))
        self.streams_closed: set[int] = set()
        self._collector = Collector(self._on_batch, host=host, port=port, token=token)
        self.closed = False
        live.keep_polling(lambda: self.closed)

    def _on_batch(self, batch: Batch) -> None:
        # Raises for a rank outside the run: the collector counts and drops the batch.
        schema.check_batch(batch, self.run.store.info.world_size)
        self.run.store.extend(batch.events, rank=batch.rank, scalars=batch.scalars)
        if batch.final:
            self.streams_closed.add(batch.rank)

    @property
    def refused(self) -> dict[str, int]:
        """Messages dropped so far, by reason (``"wrong token"``, ``"rank outside the
        run"``, ...; the reasons of ``telemetry.schema`` and ``telemetry.channel``)."""
        return self._collector.rejected_by_reason

    @property
    def address(self) -> str:
        return self._collector.address

    @property
    def token(self) -> str:
        return self._collector.token

    def command_env(self, host: str | None = None) -> dict[str, str]:
        """Environment variables that let ``ish.watch`` on a rank find us (export them
        where the job starts). ``host``: the name the ranks reach this machine by; by
        default the address listened on, or this machine's host name when that is every
        interface (``0.0.0.0``), which no rank can connect to."""
        scheme, _, where = self.address.partition("://")
        bound, _, port = where.rpartition(":")
        if host is None:
            host = socket.gethostname() if bound in _EVERY_INTERFACE else bound
        return {"ISH_TELEMETRY": f"{scheme}://{host}:{port}", "ISH_TOKEN": self.token}

    def wait(self, timeout: float = 60.0) -> Run:
        """Wait until every rank closed its stream (``flush(final=True)`` / exit)."""
        deadline = time.monotonic() + timeout
        while len(self.streams_closed) < self.run.store.info.world_size:
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.run.store.info.world_size)) - self.streams_closed)
                raise TimeoutError(
                    f"ranks {missing} did not finish within {timeout} s{self._why()}."
                )
            live.tick()
            time.sleep(0.02)
        live.tick(force=True)
        return self.run

    def _why(self) -> str:
        """What was refused, if anything: a wrong token or world size explains a wait."""
        refused = self.refused
        if not refused:
            return ""
        counts = ", ".join(f"{reason}: {n}" for reason, n in sorted(refused.items()))
        return (
            f"; messages refused ({counts}): does every rank have this listener's ISH_TOKEN, "
            f"and does the job have {self.run.store.info.world_size} ranks?"
        )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._collector.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        n = self.run.store.info.world_size
        refused = sum(self.refused.values())
        return (
            f"Listener({self.address}, {len(self.streams_closed)} of {n} ranks finished"
            f"{f', {refused} message(s) refused' if refused else ''}"
            f"{', closed' if self.closed else ''})"
        )

    def _ipython_display_(self) -> None:
        self.run._ipython_display_()


def listen(world_size: int, **kwargs: Any) -> Listener:
    """Start a ``Listener`` (see its docstring)."""
    return Listener(world_size, **kwargs)
