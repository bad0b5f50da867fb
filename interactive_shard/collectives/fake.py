"""A synthetic 2-rank ledger, as the recorder sends it, without ranks: DDP's construction
sync, then per iteration a buffer broadcast, the gradient buckets' all-reduces (from
C++) and the user's loss all-reduce (``Feature.fake``)."""

from __future__ import annotations

from interactive_shard.collectives.events import Ledger, LedgerEntry, LedgerGroup
from interactive_shard.telemetry.schema import Event, record_event

BUCKETS = ((262_144, [256, 256]), (4_096, [1024]))  # (numel, shape) of each bucket


def sample(iterations: int = 3, world_size: int = 2, t0: float = 1000.0) -> list[Event]:
    """``iterations`` DDP iterations on ``world_size`` ranks, one ``ledger`` event per
    rank and iteration (the recorder batches what arrived between its ticks)."""
    group = LedgerGroup(name="0", ranks=list(range(world_size)))
    out = []
    for rank in range(world_size):
        t, seq = t0 + rank * 1e-3, 0
        first = [_e(0, "broadcast", [64], 256, "DDP construction sync", t)]
        seq = 1
        for it in range(1, iterations + 1):
            t += 0.05
            batch = first if it == 1 else []
            first = []
            batch.append(_e(seq, "broadcast", [16], 64, "DDP buffer sync", t))
            seq += 1
            for k, (numel, shape) in enumerate(BUCKETS):
                caller = "DDP gradient bucket (C++ Reducer)"
                batch.append(_e(seq, "all_reduce", shape, 4 * numel, caller, t + 0.01 * (k + 1)))
                seq += 1
            batch.append(_e(seq, "all_reduce", [], 4, "train.py:42 in step", t + 0.04))
            seq += 1
            event = Ledger(entries=batch, groups=[group] if it == 1 else [], issued={"0": seq})
            out.append(record_event(event, rank, it, t + 0.045))
    return sorted(out, key=lambda e: e.t)


def _e(seq: int, op: str, shape: list[int], nbytes: int, caller: str, t: float) -> LedgerEntry:
    return LedgerEntry(
        group="0",
        seq=seq,
        op=op,
        dtype="torch.float32",
        shape=shape,
        nbytes=nbytes,
        caller=caller,
        state="completed",
        start=t,
        end=t + 0.002,
    )
