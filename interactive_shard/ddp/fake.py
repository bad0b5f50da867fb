"""Synthetic DDP lifecycles, as the lifecycle probe emits them, without ranks. For tests,
benchmarks and offline demos (``Feature.fake``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from interactive_shard.ddp import _checks
from interactive_shard.ddp.events import (
    Caller,
    Collective,
    Hooks,
    LifecycleCheck,
    LifecycleIteration,
    LifecycleWatch,
)
from interactive_shard.telemetry.schema import Event, record_event


@dataclass
class FakeLifecycle:
    """Settings of a fake DDP run; ``events()`` returns every rank's lifecycle events as
    the lifecycle probe emits them: one ``lifecycle_watch`` per rank and instance (its
    construction broadcast of parameters, plus buffers unless ``broadcast_buffers`` is
    off), then per iteration ``forwards`` forwards (each after a buffer broadcast when
    buffers are synced), the gradients ready in reverse order (``shuffled``: rotated by
    one each iteration), one bucket all-reduce per ``bucket`` parameters, the delayed
    parameters' all-reduce, and the ``lifecycle_iteration`` sent when the next iteration
    begins (``split``: in two parts, the forward's and the backward's).

    ``unused`` get no gradient: without ``find_unused_parameters`` (or ``static_graph``)
    their bucket is never reduced, the reduction is unfinished and the ``unfinished``
    check fires. ``dropped_at``: that iteration has one more forward, dropped without a
    backward (``forward_without_backward``). ``twice``: the model is wrapped again after
    the iterations; the new instance (serial 2) carries both instances' hooks
    (``double_hooks``) and trains ``iterations`` more."""

    params: list[str] = field(default_factory=lambda: ["0.weight", "0.bias", "1.weight", "1.bias"])
    param_nbytes: int = 4096  # each
    buffers: list[str] = field(default_factory=lambda: ["0.running_mean"])
    buffer_nbytes: int = 256  # each
    world_size: int = 2
    iterations: int = 3
    forwards: int = 1
    bucket: int = 2  # parameters per gradient bucket
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    delayed: list[str] = field(default_factory=list)
    hook_param: str | None = None
    unused: list[str] = field(default_factory=list)
    shuffled: bool = False
    dropped_at: int | None = None
    steps_in_backward: int = 0
    twice: bool = False
    split: bool = False
    walk_s: float = 0.0004  # find_unused_parameters' graph walk per forward
    t0: float = 1000.0
    period: float = 0.01  # seconds per iteration
    collective_s: float = 0.0005

    @property
    def reducer_params(self) -> list[str]:
        return [p for p in self.params if p not in self.delayed]

    @property
    def param_bytes(self) -> int:
        return len(self.reducer_params) * self.param_nbytes

    @property
    def buffer_bytes(self) -> int:
        return len(self.buffers) * self.buffer_nbytes

    def _collective(self, caller: Caller, nbytes: int, t: float, serial: int) -> Collective:
        op = "all_reduce" if caller in ("reducer", "delayed_all_reduce") else "broadcast"
        return Collective(
            op=op,
            nbytes=nbytes,
            dtype="torch.float32",
            group="0",
            start=t,
            end=t + self.collective_s,
            caller=caller,
            ddp=serial,
        )

    def watch(self, serial: int = 1) -> LifecycleWatch:
        """The instance's watch: settings, construction sync and hooks per parameter."""
        t = self._start(serial, 1) - self.period / 2
        synced = self.param_bytes + (self.buffer_bytes if self.broadcast_buffers else 0)
        owners = list(range(1, serial + 1))  # wrapped again: the old hooks stay
        return LifecycleWatch(
            ddp=serial,
            world_size=self.world_size,
            recorded_from="process_group",
            static_graph=self.static_graph,
            find_unused_parameters=self.find_unused_parameters,
            forward_sync_buffers=self.broadcast_buffers and bool(self.buffers),
            init_sync_buffers=self.broadcast_buffers,
            gradient_as_bucket_view=False,
            delayed=list(self.delayed),
            hook_param=self.hook_param,
            comm_hook=None,
            mixed_precision=None,
            optimizer_in_backward=[],
            params=self.reducer_params,
            param_bytes=self.param_bytes,
            buffers=list(self.buffers),
            buffer_bytes=self.buffer_bytes,
            construction=[self._collective("ddp_init", synced, t, serial)],
            hooks=[
                Hooks(
                    fqn=p,
                    reducer=[] if p in self.delayed else owners,
                    delayed=owners if self.delayed and p == self.hook_param else [],
                )
                for p in self.params
            ],
        )

    def ready(self, iteration: int) -> list[str]:
        """The gradients' ready order in ``iteration``."""
        order = [p for p in reversed(self.params) if p not in self.unused]
        shift = (iteration - 1) % len(order) if self.shuffled and order else 0
        return order[shift:] + order[:shift]

    def finished(self) -> bool:
        return not self.unused or self.find_unused_parameters or self.static_graph

    def _start(self, serial: int, iteration: int) -> float:
        return self.t0 + ((serial - 1) * (self.iterations + 1) + iteration) * self.period

    def iteration(self, serial: int, index: int) -> list[LifecycleIteration]:
        """The iteration's ``lifecycle_iteration`` event(s) (two with ``split``)."""
        t = self._start(serial, index)
        forwards = self.forwards + (1 if index == self.dropped_at else 0)
        front: list[Collective] = []
        for _ in range(forwards):
            if self.broadcast_buffers and self.buffers:
                front.append(self._collective("sync_buffers", self.buffer_bytes, t, serial))
            t += self.period / (4 * forwards)
        back: list[Collective] = []
        reducer = [p for p in reversed(self.reducer_params)]
        for k in range(0, len(reducer), self.bucket):
            names = reducer[k : k + self.bucket]
            if self.finished() or not set(names) & set(self.unused):
                nbytes = len(names) * self.param_nbytes
                back.append(self._collective("reducer", nbytes, t, serial))
            t += self.collective_s
        if self.delayed:
            nbytes = len(self.delayed) * self.param_nbytes
            back.append(self._collective("delayed_all_reduce", nbytes, t, serial))
        walk = self.walk_s * forwards if self.find_unused_parameters else None
        whole = dict(
            iteration=index,
            ddp=serial,
            forwards=forwards,
            dropped=1 if index == self.dropped_at else 0,
            backward=True,
            finished=self.finished(),
            unready=[p for p in self.reducer_params if p in self.unused],
            ready=self.ready(index),
            collectives=front + back,
            walk_s=walk,
            steps_in_backward=self.steps_in_backward,
        )
        if not self.split:
            return [LifecycleIteration(**whole)]  # type: ignore[arg-type]
        ready = self.ready(index)
        half = len(ready) // 2
        first = LifecycleIteration(
            iteration=index,
            ddp=serial,
            forwards=forwards,
            dropped=whole["dropped"],  # type: ignore[arg-type]
            backward=False,
            ready=ready[:half],
            collectives=front,
            walk_s=walk,
        )
        second = LifecycleIteration(
            iteration=index,
            ddp=serial,
            forwards=0,
            dropped=0,
            backward=True,
            finished=self.finished(),
            unready=whole["unready"],  # type: ignore[arg-type]
            ready=ready[half:],
            collectives=back,
            steps_in_backward=self.steps_in_backward,
        )
        return [first, second]

    def checks(self, serial: int, index: int) -> list[LifecycleCheck]:
        """The checks that fire in ``index`` (0: at the watch)."""
        out: list[LifecycleCheck] = []
        if index == 0 and serial > 1:
            fqns, others = list(self.params), list(range(1, serial))
            message = _checks.double_hooks(fqns, serial, others)
            out.append(
                LifecycleCheck(
                    check="double_hooks",
                    iteration=0,
                    ddp=serial,
                    fqns=fqns,
                    others=others,
                    message=message,
                )
            )
        if index >= 1 and index == self.dropped_at:
            message = _checks.forward_without_backward(index)
            out.append(
                LifecycleCheck(
                    check="forward_without_backward",
                    iteration=index,
                    ddp=serial,
                    fqns=[],
                    message=message,
                )
            )
        if index >= 1 and not self.finished():
            unready = [p for p in self.reducer_params if p in self.unused]
            message = _checks.unfinished(index, unready)
            out.append(
                LifecycleCheck(
                    check="unfinished", iteration=index, ddp=serial, fqns=unready, message=message
                )
            )
        return out

    def serials(self) -> list[int]:
        return [1, 2] if self.twice else [1]

    def rank_events(self, rank: int) -> list[Event]:
        out: list[Event] = []
        for serial in self.serials():
            start = self._start(serial, 1)
            out.append(record_event(self.watch(serial), rank, 0, start - self.period / 4))
            out += [
                record_event(c, rank, 0, start - self.period / 4) for c in self.checks(serial, 0)
            ]
            for index in range(1, self.iterations + 1):
                end = self._start(serial, index + 1) - self.period / 8
                out += [record_event(c, rank, index, end) for c in self.checks(serial, index)]
                # Sent when the next iteration begins (the last at the run's flush).
                sent = self._start(serial, index + 1)
                out += [
                    record_event(part, rank, index, sent) for part in self.iteration(serial, index)
                ]
        return out

    def events(self) -> list[Event]:
        out: list[Event] = []
        for rank in range(self.world_size):
            out += self.rank_events(rank)
        return sorted(out, key=lambda e: e.t)


def sample(iterations: int = 3) -> list[Event]:
    """The feature's synthetic run (``Feature.fake``): one DDP on 2 ranks whose ``0.bias``
    gets no gradient, ``iterations`` iterations."""
    return FakeLifecycle(unused=["0.bias"], iterations=iterations).events()
