"""torch's Flight Recorder and process-group sequence numbers (private names).

Measured here on torch 2.11.0, 2.13.0 and 2.15.0 with gloo (the same on each):

- ``TORCH_FR_BUFFER_SIZE`` is read when the recorder is first used (the first collective),
  not at ``init_process_group``: set after the group exists, before any collective, it
  still turns recording on.
- ``torch._C._distributed_c10d._dump_fr_trace_json()`` returns the whole ring as JSON
  bytes (``entries``: ``collective_seq_id`` from 1 per group, ``process_group`` as
  ``[group_name, description]``, ``profiling_name`` as ``"gloo:all_reduce"``,
  ``input_sizes``, ``input_dtypes`` as ``"Float"``, ``retired``, ``time_created_ns`` on
  the wall clock). It costs ~30 us an entry (60-70 ms for 2,048), with or without
  ``onlyActive`` (gloo entries are never "active" in its sense): read it rarely.
- ``ProcessGroup._get_sequence_number_for_group()``: collectives issued in the group so
  far (the ``collective_seq_id`` of the last one), cheap (a C++ counter).

Dump files (``ish.load_flight_recorder``), measured on 2.11.0, 2.12.1, 2.13.0, 2.14.1 and
2.15.0 with gloo (2026-12; no NCCL here): ``_dump_fr_trace()`` (what
``TORCH_FR_DUMP_TEMP_FILE<rank>`` files hold) is a protocol-2 pickle of plain data only
(dict, list, tuple, str, int, bool, None: no global), format ``version`` "2.10" on all.
Against the JSON form its entries add ``frames`` (the stack, innermost first, frame dicts
shared among entries through the pickle's memo), hold ``process_group`` as a tuple and
``time_discovered_*_ns`` as None where JSON says 0, and the dump has no
``nccl_comm_state``; ``pg_status`` values are ints (strings in JSON). ``pg_config`` of a
gloo job has one group keyed ``""`` whose ``ranks`` text is ``"[]"`` up to 2.13 and
``"[0, 1]"`` from 2.14 (the ledger infers members from the entries). 2.15 adds a
``backend="gloo"`` argument to both dump functions (one recorder per backend). A dump
taken just after a collective returned may hold it unretired (a race, seen for a barrier
on 2.11 and 2.13): the ledger reads it as pending.
"""

from __future__ import annotations

import os
from typing import Any

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"


def enable(entries: int) -> bool:
    """Turn recording on with a ring of ``entries`` unless the user chose a size (set it
    before the first collective); True when it records."""
    if BUFFER_ENV not in os.environ:
        os.environ[BUFFER_ENV] = str(entries)
    try:
        return int(os.environ[BUFFER_ENV]) > 0
    except ValueError:
        return False


def dump_json() -> bytes | None:
    """The ring as torch's JSON dump; None where this torch has no such function."""
    import torch._C._distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return None
    out: Any = dump()
    return out if isinstance(out, bytes) else str(out).encode()


def issued(group: Any) -> int | None:
    """Collectives issued in ``group`` so far (None: unknown)."""
    try:
        return int(group._get_sequence_number_for_group())
    except Exception:  # a backend without it, or a destroyed group
        return None
