"""The timeline recorder's batching and its CUDA-event path (resolved on the host clock
once the GPU got there), with stand-in events: this machine has no GPU; the GPU check
(``benchmarks/gpu_check.py``, case ``gloo-shared-gpu-timeline-fsdp2``) runs it for real."""

from __future__ import annotations

from typing import Any

from interactive_shard.telemetry import rank as telemetry
from interactive_shard.timeline._recorder import SpanRecorder
from interactive_shard.timeline.events import TimelineSpans


class StandInEvent:
    """``torch.cuda.Event``'s two methods the recorder reads."""

    def __init__(self, ms: float, done: bool = True) -> None:
        self.ms, self.done = ms, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, other: StandInEvent) -> float:
        return other.ms - self.ms


def recorder() -> tuple[SpanRecorder, list[Any]]:
    rec = SpanRecorder("module", None, ["a"])
    sent: list[Any] = []
    rec.emit = lambda event, step=None: sent.append(event)  # type: ignore[method-assign]
    rec.iteration = 1
    return rec, sent


def test_spans_go_out_one_batch_per_iteration_in_end_order() -> None:
    rec, sent = recorder()
    rec.add("forward", "a", 1.0, 3.0)
    rec.add("hook", "h", 2.0, 2.0)
    rec.add_at(2, "backward", "a", 4.0, 5.0)
    rec.send()
    assert [(b.iteration, [s.name for s in b.spans]) for b in sent] == [(1, ["h", "a"]), (2, ["a"])]
    assert all(isinstance(b, TimelineSpans) for b in sent) and rec.recorded == 3
    rec.send()
    assert len(sent) == 2  # nothing held: nothing sent


def test_a_batch_goes_out_with_its_iteration_as_the_step(monkeypatch: Any) -> None:
    emitted: list[tuple[str, dict[str, Any], int | None]] = []
    monkeypatch.setattr(
        telemetry, "emit", lambda kind, payload, step=None: emitted.append((kind, payload, step))
    )
    rec = SpanRecorder("module", None, ["a"])
    rec.iteration = 3
    rec.add("forward", "a", 1.0, 3.0)
    rec.add_at(4, "backward", "a", 4.0, 5.0)
    rec.send()
    watch, *batches = emitted
    assert watch[0] == "timeline_watch" and watch[1]["step_is_iteration"] is True
    assert [(p["iteration"], step) for _, p, step in batches] == [(3, 3), (4, 4)]


def test_cuda_event_spans_wait_for_the_gpu_then_land_on_the_host_clock() -> None:
    rec, sent = recorder()
    rec._anchor = (StandInEvent(0.0), 100.0)  # the anchor event was at host time 100 s
    end = StandInEvent(7.5, done=False)
    rec.add("backward", "a", StandInEvent(5.0), end)
    rec.send()
    assert sent == []  # the GPU has not got there yet: held
    end.done = True
    rec.send()
    [span] = sent[0].spans
    assert (span.kind, span.name) == ("backward", "a")
    assert abs(span.start - 100.005) < 1e-9 and abs(span.end - 100.0075) < 1e-9


def test_the_graph_walk_keeps_the_nodes_it_saw() -> None:
    """A module's backward ends at every node leading back to its input. torch 2.11 frees
    a node's Python object once unreferenced and reuses its id for the next: a walk that
    kept ids only stopped early and found one end node of three, so the module's
    backward span never closed (seen on GPT-2, BERT, ViT and ResNet)."""
    import torch
    from torch import nn

    from interactive_shard.timeline import _graph

    class Block(nn.Module):
        def __init__(self, d: int = 16) -> None:
            super().__init__()
            self.ln, self.qkv, self.o = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(self.ln(x)).split(x.shape[-1], -1)
            return x + self.o(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)

    x = torch.randn(2, 4, 16, requires_grad=True) * 1.0
    sinks = _graph.walk(Block()(x), _graph.boundary(x)).sinks
    assert sorted(n.name() for n in sinks) == [
        "NativeLayerNormBackward0",
        "TBackward0",
        "TBackward0",
    ]
