"""A small causal Transformer (GPT-style, byte-level vocabulary) written with MindSpore.

Example::

    net = TinyGPT(GPTConfig(layers=2, d_model=64, heads=4, seq_length=64))
    loss_net = LanguageModelLoss(net)
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch.mindspore.attention import AttentionStats


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    seq_length: int = 64
    layers: int = 2
    d_model: int = 64
    heads: int = 4


class CausalSelfAttention(nn.Cell):
    """Multi-head self-attention with a causal mask; ``softmax`` outputs the attention probabilities, and
    :class:`~mindwatch.mindspore.attention.AttentionStats` reports their entropy and the max logit."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.d_model // cfg.heads
        self.qkv = nn.Dense(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Dense(cfg.d_model, cfg.d_model)
        self.softmax = nn.Softmax(axis=-1)
        self.stats = AttentionStats()  # entropy and max logit, through the graph (GRAPH mode too)
        self.scale = 1.0 / float(np.sqrt(self.head_dim))
        mask = np.triu(np.full((cfg.seq_length, cfg.seq_length), -1e9, dtype=np.float32), k=1)
        self.mask = ms.Tensor(mask)

    def construct(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = ops.matmul(q, k.swapaxes(-1, -2)) * self.scale + self.mask[:t, :t]
        probs = self.stats(scores, self.softmax(scores))
        y = ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(b, t, c)
        return self.proj(y)


class Block(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm((cfg.d_model,))
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm((cfg.d_model,))
        self.mlp = nn.SequentialCell(nn.Dense(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Dense(4 * cfg.d_model, cfg.d_model))

    def construct(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Cell):
    """Token + position embeddings, ``layers`` Transformer blocks, a linear head over bytes."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = ms.Parameter(
            ms.Tensor(np.random.default_rng(0).normal(0, 0.02, (cfg.seq_length, cfg.d_model)).astype(np.float32)), name="pos"
        )
        self.blocks = nn.CellList([Block(cfg) for _ in range(cfg.layers)])
        self.ln_f = nn.LayerNorm((cfg.d_model,))
        self.head = nn.Dense(cfg.d_model, cfg.vocab_size)

    def construct(self, ids):
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class LanguageModelLoss(nn.Cell):
    """Mean next-byte cross-entropy of ``network(ids)`` against ``targets``."""

    def __init__(self, network: TinyGPT) -> None:
        super().__init__()
        self.network = network
        self.vocab = network.cfg.vocab_size
        self.ce = nn.CrossEntropyLoss()

    def construct(self, ids, targets):
        logits = self.network(ids)
        return self.ce(logits.reshape(-1, self.vocab), targets.reshape(-1))


class LanguageModelEval(LanguageModelLoss):
    """For ``Model.eval``: the loss of :class:`LanguageModelLoss`, the logits and the targets flattened to one row per
    byte: every metric gets the three, ``set_indexes`` picks (``nn.Loss().set_indexes([0])``,
    ``nn.Accuracy().set_indexes([1, 2])``)."""

    def construct(self, ids, targets):
        logits = self.network(ids).reshape(-1, self.vocab)
        labels = targets.reshape(-1)
        return self.ce(logits, labels), logits, labels
