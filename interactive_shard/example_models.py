"""Models of real layouts for planners, figures and benchmarks: build them without memory.

``Llama`` is a Llama-like decoder-only transformer with the 7B layout by default
(``LlamaConfig()``: 32 blocks of attention q/k/v/o and MLP gate/up/down projections,
two RMSNorm weights each, token embedding, final norm and an untied ``lm_head``: 291
parameters, 6.74 B elements). Built under ``torch.device("meta")`` it holds shapes and
dtypes only, so planning its 25 GiB of fp32 gradients costs nothing:

>>> with torch.device("meta"):                       # doctest: +SKIP
...     model = Llama(LlamaConfig())
>>> ish.plan_buckets(model)                          # doctest: +SKIP

Parameter names and registration order follow Hugging Face's ``LlamaForCausalLM``
(``model.layers.0.self_attn.q_proj.weight`` ...), which decides DDP's reducer order.
The forward is a plain causal attention (no rotary embedding, no KV cache): enough to
run a small config for a ready order, not a language model. Only torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of the model; the defaults are Llama-2-7B's."""

    vocab_size: int = 32_000
    dim: int = 4096
    layers: int = 32
    heads: int = 32
    hidden: int = 11_008  # MLP width
    eps: float = 1e-5

    @property
    def parameters(self) -> int:
        """Parameter tensors: 9 per block, embedding, final norm, lm_head."""
        return 9 * self.layers + 3

    @property
    def elements(self) -> int:
        block = 4 * self.dim * self.dim + 3 * self.dim * self.hidden + 2 * self.dim
        return self.layers * block + 2 * self.vocab_size * self.dim + self.dim


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.heads = config.heads
        dim = config.dim
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, dim))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.hidden, bias=False)
        self.up_proj = nn.Linear(config.dim, config.hidden, bias=False)
        self.down_proj = nn.Linear(config.hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.dim, config.eps)
        self.post_attention_layernorm = RMSNorm(config.dim, config.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.dim, config.eps)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Llama(nn.Module):
    """Token ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``."""

    def __init__(self, config: LlamaConfig | None = None) -> None:
        super().__init__()
        self.config = config or LlamaConfig()
        self.model = Decoder(self.config)
        self.lm_head = nn.Linear(self.config.dim, self.config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(tokens))


def llama_7b(dtype: torch.dtype = torch.float32) -> Llama:
    """The 7B layout on the meta device: shapes and dtypes, no memory."""
    with torch.device("meta"):
        return Llama(LlamaConfig()).to(dtype)
