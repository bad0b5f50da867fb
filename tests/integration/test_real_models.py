"""Real models, not toys: the planners against torch on Hugging Face transformers (GPT-2
with its tied head, Llama, BERT whose pooler the loss ignores, ViT, ResNet with its
BatchNorms) and, where they import, torchvision's ResNet-18 and a timm ViT. Small
configs, random weights, never a hub download (``HF_HUB_OFFLINE=1``; every model is
``XModel(XConfig(...))``). About 45 s on 2 CPU cores (75 s with the last two).

Per model, three runs on the module's two CPU ranks:

- eager DDP (a small ``bucket_cap_mb``: several buckets), watched with the timeline:
  ``ish.plan_buckets(..., example_inputs=, loss_fn=)`` equals DDP's buckets in iteration 1
  and after the rebuild; the backward runs from the output end (the last block's
  gradients first); the report renders every view the run has;
- ``torch.compile(ddp, backend="aot_eager")``: ``ish.plan_splits`` equals the partitions
  DDPOptimizer cut;
- FSDP2, one unit per block under the root, with a nested mixed-precision policy:
  ``ish.plan_precision`` equals the dtypes the engine used. Where the planner predicts a
  failure (BatchNorm's float32 running statistics under a bfloat16 unit), the real run
  fails there; every BatchNorm a float32 unit of its own is planned clean and runs as
  planned, and so does the planner's own fix where its bounded search finds one (not for
  ResNet-18's 20 BatchNorms: ``fix`` is None there).
"""

from __future__ import annotations

import functools
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the hub

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

import interactive_shard as ish
from interactive_shard.buckets.analysis import compare as compare_buckets

pytestmark = pytest.mark.slow  # make check leaves it out; make test runs it

transformers = pytest.importorskip("transformers", reason="the real models are transformers'")

# Ranks may be spawned: ship this module's specs and functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ITERATIONS = 3
BF16, FP32 = torch.bfloat16, torch.float32
SECTIONS = {  # the report's section per probe that recorded something
    "buckets": "DDP gradient buckets",
    "ddp": "DDP lifecycle",
    "timeline": "Hook order and overlap timeline",
    "splits": "torch.compile graph splits (DDPOptimizer)",
    "precision": "Mixed precision per unit (FSDP2, FSDP1, DDP)",
}

# -- the models ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A model, its inputs and loss, its blocks, and how each check runs it."""

    build: Callable[[], nn.Module]  # random weights, seeded
    inputs: Callable[[int], dict[str, torch.Tensor]]  # keyword inputs from a seed
    loss: Callable[[Any], torch.Tensor]  # outputs -> the scalar the backward starts from
    blocks: tuple[str, ...]  # fqns, input end first: FSDP2 units, the timeline's order
    blocks_bf16_root: Any = None  # the root's policy: None (float32) or bf16
    find_unused: bool = False  # a parameter the loss never uses (BERT's pooler)
    tied: dict[str, str] | None = None  # alias -> the name DDP reduces the tied weight under
    batchnorm: bool = False  # bf16 blocks fail: BatchNorm's running statistics stay fp32
    planner_fix: bool = False  # the planner's (bounded) search finds a fix of that failure
    bucket_cap_mb: float = 0.25
    split_cap_mb: float = 1.0  # DDPOptimizer's first bucket is 1 MiB, whatever DDP's cap
    requires: str | None = None  # a module to import (pytest.importorskip) first

    def policies(self) -> dict[str, Any]:
        """The nested policy: each block in bf16 (float32 out when the root is)."""
        out = None if self.blocks_bf16_root is not None else FP32
        block = MixedPrecisionPolicy(param_dtype=BF16, output_dtype=out)
        return {"": self.blocks_bf16_root, **dict.fromkeys(self.blocks, block)}


def _seeded(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def seeded() -> nn.Module:
        torch.manual_seed(0)
        return build()

    return seeded


def _numbered(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}.{i}" for i in range(n))


LAYERS, VOCAB, SEQ, BATCH = 3, 512, 16, 2


def _text(seed: int, labels: bool = True) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids} if labels else {"input_ids": ids}


def _images(seed: int, labels: bool = True) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(BATCH, 3, 32, 32, generator=gen)
    if not labels:
        return {"pixel_values": pixels}
    return {"pixel_values": pixels, "labels": torch.randint(0, 10, (BATCH,), generator=gen)}


def _hf_loss(out: Any) -> torch.Tensor:
    return out.loss


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=128,
        n_layer=LAYERS,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return transformers.GPT2LMHeadModel(config)


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return transformers.LlamaForCausalLM(config)


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertModel(config)  # with its pooler, which the loss ignores


def _bert_inputs(seed: int) -> dict[str, torch.Tensor]:
    ids = _text(seed, labels=False)["input_ids"]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _hidden_loss(out: Any) -> torch.Tensor:
    return out.last_hidden_state.pow(2).mean()


def _vit() -> nn.Module:
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=256,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=10,
    )
    return transformers.ViTForImageClassification(config)


def _resnet() -> nn.Module:
    config = transformers.ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 64, 128],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        num_labels=10,
    )
    return transformers.ResNetForImageClassification(config)


def _logits_loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().logsumexp(-1).mean()


def _torchvision_resnet() -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(weights=None, num_classes=10)


def _timm_vit() -> nn.Module:
    import timm

    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        depth=LAYERS,
        num_classes=10,
    )


def _pixels(seed: int) -> dict[str, torch.Tensor]:
    return {"x": _images(seed, labels=False)["pixel_values"]}


MODELS: dict[str, Spec] = {
    "gpt2": Spec(
        _seeded(_gpt2),
        _text,
        _hf_loss,
        _numbered("transformer.h", LAYERS),
        tied={"lm_head.weight": "transformer.wte.weight"},
    ),
    "llama": Spec(
        _seeded(_llama),
        _text,
        _hf_loss,
        _numbered("model.layers", LAYERS),
        blocks_bf16_root=MixedPrecisionPolicy(param_dtype=BF16),
    ),
    "bert": Spec(
        _seeded(_bert),
        _bert_inputs,
        _hidden_loss,
        _numbered("encoder.layer", LAYERS),
        find_unused=True,
    ),
    "vit": Spec(
        _seeded(_vit),
        _images,
        _hf_loss,
        _numbered("vit.layers", LAYERS),
        blocks_bf16_root=MixedPrecisionPolicy(param_dtype=BF16),
    ),
    "resnet": Spec(
        _seeded(_resnet),
        _images,
        _hf_loss,
        _numbered("resnet.encoder.stages", 4),
        batchnorm=True,
        planner_fix=True,
    ),
    "torchvision_resnet18": Spec(
        _seeded(_torchvision_resnet),
        _pixels,
        _logits_loss,
        ("layer1", "layer2", "layer3", "layer4"),
        bucket_cap_mb=5,
        split_cap_mb=10,
        batchnorm=True,
        requires="torchvision",
    ),
    "timm_vit": Spec(
        _seeded(_timm_vit),
        _pixels,
        _logits_loss,
        _numbered("blocks", LAYERS),
        blocks_bf16_root=MixedPrecisionPolicy(param_dtype=BF16),
        requires="timm",
    ),
}


def _spec(name: str) -> Spec:
    spec = MODELS[name]
    if spec.requires is not None:
        pytest.importorskip(
            spec.requires,
            reason=f"{name} needs {spec.requires}, not importable here: make test-torch "
            'TORCH=2.14.1 TORCH_EXTRAS="torchvision==0.29.1 timm==1.0.31" installs both',
        )
    return spec


# -- rank code -----------------------------------------------------------------------------


def _quiet() -> None:
    warnings.filterwarnings("ignore", message=".*find_unused_parameters=True.*")
    transformers.logging.set_verbosity_error()


def _ddp(ctx: Any, name: str) -> list[str]:
    """Eager DDP, watched with the timeline down to the blocks; returns the probes."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    _quiet()
    spec = MODELS[name]
    model = spec.build()
    ddp = DDP(model, bucket_cap_mb=spec.bucket_cap_mb, find_unused_parameters=spec.find_unused)
    depth = max(len(b.split(".")) for b in spec.blocks)
    watch = ish.watch(ddp, timeline=True, depth=depth)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    for step in ctx.steps(ITERATIONS):
        loss = spec.loss(ddp(**spec.inputs(100 * step + ctx.rank)))  # ranks differ
        opt.zero_grad()
        loss.backward()
        opt.step()
    return sorted(watch.probes)


def _compiled(ctx: Any, name: str) -> dict[str, Any]:
    """``torch.compile(ddp, backend="aot_eager")``, watched; one training step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    _quiet()
    torch._dynamo.reset()  # a class compiled by an earlier run would come from the cache
    spec = MODELS[name]
    model = spec.build()
    ddp = DDP(model, bucket_cap_mb=spec.split_cap_mb, find_unused_parameters=spec.find_unused)
    compiled = torch.compile(ddp, backend="aot_eager")
    watch = ish.watch(compiled)
    inputs = spec.inputs(ctx.rank)
    loss = spec.loss(compiled(**inputs))
    loss.backward()
    expected = spec.loss(model(**inputs))  # the same weights, uncompiled
    watch.detach()
    return {
        "probes": sorted(watch.probes),
        "close": torch.allclose(loss, expected, rtol=1e-4, atol=1e-5),
    }


def _fsdp2(ctx: Any, name: str, policies: dict[str, Any], steps: int = 2) -> list[str]:
    """FSDP2 with ``policies`` (fqn -> policy, the root ``""`` last), watched."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _quiet()
    spec = MODELS[name]
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    model = spec.build()
    for fqn, policy in sorted(policies.items(), key=lambda kv: -len(kv[0])):  # inner first
        module = model.get_submodule(fqn)
        fully_shard(module, mesh=mesh, mp_policy=policy or MixedPrecisionPolicy())
    watch = ish.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in ctx.steps(steps):
        loss = spec.loss(model(**spec.inputs(100 * step + ctx.rank)))
        loss.float().backward()
        opt.step()
        opt.zero_grad()
    return sorted(watch.probes)


# -- fixtures ------------------------------------------------------------------------------


def _policies(name: str, which: str) -> dict[str, Any]:
    """ "blocks": the spec's nested policy; "bn_units": that, with every BatchNorm a unit of
    its own computing in fp32 (bf16 out), as one keeps BatchNorm out of bf16; "fix": the
    planner's fix of the blocks' first failure."""
    spec = MODELS[name]
    if which == "blocks":
        return spec.policies()
    if which == "bn_units":
        fp32_out_bf16 = MixedPrecisionPolicy(param_dtype=FP32, output_dtype=BF16)
        batchnorms = [
            fqn
            for fqn, m in spec.build().named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]
        return {**spec.policies(), **dict.fromkeys(batchnorms, fp32_out_bf16)}
    assert which == "fix", which
    fix = _precision_plan(name, "blocks").failures[0].fix
    assert fix is not None, f"{name}: the planner found no fix"
    return fix


@functools.cache
def _precision_plan(name: str, which: str) -> Any:
    spec = MODELS[name]
    return ish.plan_precision(spec.build(), _policies(name, which), example_inputs=spec.inputs(7))


class Runs:
    """``runs(kind, name)``: the run of ``kind`` for the model ``name``, run once for the
    module. Kinds: "ddp", "compiled" and "fsdp2:<which>" (``_policies``); where an FSDP2
    run fails, its ``RankError`` is in ``errors[kind, name]``."""

    def __init__(self, cluster: ish.Cluster) -> None:
        self.cluster = cluster
        self.done: dict[tuple[str, str], ish.Run] = {}
        self.errors: dict[tuple[str, str], ish.RankError] = {}

    def __call__(self, kind: str, name: str) -> ish.Run:
        _spec(name)
        if (kind, name) in self.done:
            return self.done[kind, name]
        if kind == "ddp":
            run = self.cluster.run(_ddp, name)
        elif kind == "compiled":
            run = self.cluster.run(_compiled, name)
        else:
            family, _, which = kind.partition(":")
            assert family == "fsdp2", kind
            run = self.cluster.run(_fsdp2, name, _policies(name, which), wait=False)
            try:
                run.wait()
            except ish.RankError as err:
                self.errors[kind, name] = err
        self.done[kind, name] = run
        return run


@pytest.fixture(scope="module")
def runs(cluster: ish.Cluster) -> Runs:
    return Runs(cluster)


MODEL_NAMES = list(MODELS)


# -- tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_planned_buckets_equal_ddps(runs: Runs, name: str) -> None:
    spec = _spec(name)
    run = runs("ddp", name)
    assert run.results == [["buckets", "ddp", "timeline"]] * 2
    plan = ish.plan_buckets(
        spec.build(),
        example_inputs=spec.inputs(7),
        loss_fn=spec.loss,
        bucket_cap_mb=spec.bucket_cap_mb,
        find_unused_parameters=spec.find_unused,
    )
    bm = run.buckets
    assert bm.iterations == list(range(1, ITERATIONS + 1))
    for iteration in bm.iterations:
        for rank in (0, 1):
            observed = bm.observed(iteration, rank)
            mine = compare_buckets(iteration, rank, plan.iteration(iteration), observed)
            assert mine.matches, (iteration, rank, mine.differences)
            assert [b.nbytes for b in plan.iteration(iteration)] == [b.nbytes for b in observed]
            recorded = bm.compare(iteration, rank)  # re-planned from the recording
            assert recorded.matches, (iteration, rank, recorded.differences)
    assert len(plan.rebuilt) > 1, "a cap this small makes several buckets"
    # Every parameter reduced once: a tied weight under its first name only.
    model = spec.build()
    reduced = [f for b in bm.observed(ITERATIONS, 0) for f in b.fqns]
    assert sorted(reduced) == sorted(n for n, _ in model.named_parameters())
    for alias, name_ in (spec.tied or {}).items():
        assert model.get_parameter(alias) is model.get_parameter(name_)
        assert alias not in reduced and name_ in reduced
    if spec.find_unused:
        # DDP never rebuilds with unused parameters: the construction-time buckets stay.
        assert plan.rebuilt_from_iteration is None and plan.first_iteration == plan.rebuilt
        record = bm.record(1, 0)
        assert record is not None
        assert sorted(record.unready) == ["pooler.dense.bias", "pooler.dense.weight"]
    else:
        assert plan.rebuilt_from_iteration == 2 and len(plan.first_iteration) == 1


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_backward_runs_from_the_output_end(runs: Runs, name: str) -> None:
    spec = _spec(name)
    t = runs("ddp", name).timeline
    blocks = list(spec.blocks)
    names = dict(spec.build().named_parameters())
    for rank in (0, 1):
        for iteration in (2, ITERATIONS):
            forward = t.order(rank, iteration, phase="forward", kinds=["forward"])
            assert [n for n in forward if n in blocks] == blocks
            backward = t.order(rank, iteration, phase="backward", kinds=["backward"])
            assert [n for n in backward if n in blocks] == blocks[::-1]
            # DDP's gradient-ready points: every block's parameters are ready before any
            # of the block before it (the last block's first).
            ready = [
                n.removeprefix("grad_ready:")
                for n in t.order(rank, iteration, phase="backward", kinds=["hook"])
                if n.startswith("grad_ready:")
            ]
            assert set(ready) <= set(names)
            owner = [blocks.index(b) for n in ready for b in blocks if n.startswith(b + ".")]
            assert owner == sorted(owner, reverse=True), owner
            assert set(owner) == set(range(len(blocks)))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_planned_splits_equal_ddpoptimizers(runs: Runs, name: str) -> None:
    spec = _spec(name)
    run = runs("compiled", name)
    for result in run.results:
        assert result["probes"] == ["buckets", "ddp", "splits"]
        assert result["close"], "the compiled loss differs from the uncompiled one"
    plan = ish.plan_splits(spec.build(), spec.inputs(7), bucket_cap_mb=spec.split_cap_mb)
    assert plan.nothing is None
    comparison = run.splits.compare(plan)
    assert comparison.matches, comparison
    assert len(plan.graphs[0].partitions) > 1, "over DDPOptimizer's 1 MiB first bucket: split"
    planned = [[p.fqns for p in g.partitions] for g in plan.graphs]
    for rank in (0, 1):  # a graph break (GPT-2's loss) is a second compilation, as planned
        captured = [[p.fqns for p in c.partitions] for c in run.splits.compilations(rank)]
        assert captured == planned


def _precision_matches(runs: Runs, name: str, which: str) -> ish.Run:
    """The plan of ``which`` is clean, and FSDP2 runs it with the planned dtypes."""
    plan = _precision_plan(name, which)
    assert plan.ok, plan
    run = runs(f"fsdp2:{which}", name)
    assert ("fsdp2:" + which, name) not in runs.errors, runs.errors[f"fsdp2:{which}", name]
    assert run.results == [["precision"]] * 2
    comparison = run.precision.compare(plan)
    assert comparison.matches, comparison.differences
    return run


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_planned_precision_equals_fsdp2s(runs: Runs, name: str) -> None:
    spec = _spec(name)
    plan = _precision_plan(name, "blocks")
    assert [u.fqn for u in plan.units] == ["", *spec.blocks]
    if not spec.batchnorm:
        _precision_matches(runs, name, "blocks")
        return
    # A bf16 BatchNorm meets its fp32 running statistics: planned, and so it runs.
    assert not plan.ok
    first = plan.failures[0]
    assert (first.unit, first.op) == (spec.blocks[0], "batch_norm"), first
    run = runs("fsdp2:blocks", name)
    comparison = run.precision.compare(plan)  # the dtypes up to there, and the failure
    assert comparison.matches, comparison.differences
    error = runs.errors["fsdp2:blocks", name]
    assert error.ranks == [0, 1]
    assert all(first.error in text for text in error.tracebacks.values()), error
    (finding,) = [f for f in run.precision.findings if f.kind == "failure"]
    assert (finding.unit, finding.consumer) == (first.unit, first.consumer)
    # Every BatchNorm a unit of its own in fp32: planned clean, and it runs as planned.
    _precision_matches(runs, name, "bn_units")
    if spec.planner_fix:  # the planner's own fix too
        _precision_matches(runs, name, "fix")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_report_renders_every_view(runs: Runs, name: str, tmp_path: Path) -> None:
    spec = _spec(name)
    for kind, probes in {
        "ddp": ["buckets", "ddp", "timeline"],
        "compiled": ["buckets", "ddp", "splits"],
        "fsdp2:bn_units" if spec.batchnorm else "fsdp2:blocks": ["precision"],
    }.items():
        path = runs(kind, name).to_html(tmp_path / f"{kind}.html")
        page = path.read_text(encoding="utf-8")
        assert path.stat().st_size > 100_000  # plotly.js inline, and the figures
        for probe in probes:
            assert f"<h2>{SECTIONS[probe]}</h2>" in page, (kind, probe)
