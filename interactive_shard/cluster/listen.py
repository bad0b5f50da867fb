"""Listen for ranks started elsewhere (``torchrun``, a job script) and show them live.

listener = ish.listen(world_size=2)          # in the notebook
listener.command_env()                        # {"ISH_TELEMETRY": "tcp://...", ...}
# on each rank:  interactive_shard.telemetry.rank.connect_from_env()
listener.run                                  # a Run: monitor, buckets, save, to_html
"""

from __future__ import annotations

import time
from typing import Any

from interactive_shard.cluster.run import Run
from interactive_shard.telemetry import schema
from interactive_shard.telemetry.channel import Collector
from interactive_shard.telemetry.schema import Batch
from interactive_shard.telemetry.store import RunInfo, RunStore
from interactive_shard.ui import live


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
    def address(self) -> str:
        return self._collector.address

    @property
    def token(self) -> str:
        return self._collector.token

    def command_env(self) -> dict[str, str]:
        """Environment variables that let ``connect_from_env()`` on a rank find us."""
        return {"ISH_TELEMETRY": self.address, "ISH_TOKEN": self.token}

    def wait(self, timeout: float = 60.0) -> Run:
        """Wait until every rank closed its stream (``flush(final=True)`` / exit)."""
        deadline = time.monotonic() + timeout
        while len(self.streams_closed) < self.run.store.info.world_size:
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.run.store.info.world_size)) - self.streams_closed)
                raise TimeoutError(f"ranks {missing} did not finish within {timeout} s.")
            live.tick()
            time.sleep(0.02)
        live.tick(force=True)
        return self.run

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._collector.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _ipython_display_(self) -> None:
        self.run._ipython_display_()


def listen(world_size: int, **kwargs: Any) -> Listener:
    """Start a ``Listener`` (see its docstring)."""
    return Listener(world_size, **kwargs)
