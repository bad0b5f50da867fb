"""A GPT-style transformer for the planners at scale: 32 blocks, built on the meta device.

``transformer()`` is what ``benchmarks/bench_planners.py`` and the planners' big-model
tests plan: ``ish.plan_splits`` traces it with dynamo (meta tensors in, no memory, no
process group) and ``ish.plan_precision`` gets one FSDP unit per block. A block is
pre-norm attention (one ``qkv`` projection, ``scaled_dot_product_attention``) and an
MLP, each added to the residual stream; parameters are registered in the order the
forward uses them, so DDP's reverse order is the reverse of ``named_parameters()``.
Only torch is imported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BLOCKS, WIDTH, HEADS, VOCAB = 32, 256, 4, 1000


class Block(nn.Module):
    def __init__(self, width: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Transformer(nn.Module):
    """Token embedding, ``blocks`` blocks (``blocks.0`` ...), a final norm and the head."""

    def __init__(
        self, blocks: int = BLOCKS, width: int = WIDTH, heads: int = HEADS, vocab: int = VOCAB
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def transformer(blocks: int = BLOCKS, *, device: str = "meta", **sizes: int) -> Transformer:
    """The model on ``device`` (meta: shapes and dtypes only)."""
    with torch.device(device):
        return Transformer(blocks, **sizes)


def tokens(batch: int = 2, seq: int = 16, *, device: str = "meta") -> torch.Tensor:
    """A batch of token ids for ``Transformer.forward``."""
    return torch.zeros(batch, seq, dtype=torch.long, device=device)
