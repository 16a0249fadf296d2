"""A small causal Transformer (GPT-style, byte-level vocabulary) written with MindSpore.

Example::

    net = TinyGPT(GPTConfig(layers=2, d_model=64, heads=4, seq_length=64))
    loss_net = LanguageModelLoss(net)
    moe = TinyGPT(GPTConfig(experts=4, top_k=2))   # each block's feed-forward a top-2-of-4 mixture of experts
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch.mindspore.attention import AttentionStats
from mindwatch.mindspore.router_stats import RouterStats


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    seq_length: int = 64
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    #: Experts of each block's feed-forward (a mixture of experts); 0: one dense feed-forward.
    experts: int = 0
    #: The experts each token is routed to.
    top_k: int = 2


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


class MoE(nn.Cell):
    """A top-``k``-of-``experts`` feed-forward: a router picks each token's experts, whose outputs are mixed by the
    router's renormalised probabilities; :class:`~mindwatch.mindspore.router_stats.RouterStats` counts the choices.

    The experts' weights are 3-D Parameters (``w_in``: experts x d_model x hidden), as large MoE models keep them. For a
    model this small every expert runs on every token and the gates zero the ones not chosen (the same outputs and
    gradients as dispatching the tokens, without a scatter). ``expert_bias`` is added to the router's logits and
    trained by no gradient: the load-balancing bias of DeepSeek-V3's auxiliary-loss-free balancing, which a balancing
    scheme adjusts between steps (zero here).
    """

    def __init__(self, d_model: int, hidden: int, experts: int, k: int, seed: int = 0) -> None:
        super().__init__()
        if not 1 <= k <= experts:
            raise ValueError(f"top_k must be between 1 and experts ({experts}), got {k}")
        rng = np.random.default_rng(seed)
        self.experts, self.k = experts, k
        self.router = nn.Dense(d_model, experts, has_bias=False)
        self.expert_bias = ms.Parameter(ms.Tensor(np.zeros(experts, np.float32)), requires_grad=False)
        w_in = rng.normal(0, d_model**-0.5, (experts, d_model, hidden)).astype(np.float32)
        w_out = rng.normal(0, hidden**-0.5, (experts, hidden, d_model)).astype(np.float32)
        self.w_in, self.w_out = ms.Parameter(ms.Tensor(w_in), name="w_in"), ms.Parameter(ms.Tensor(w_out), name="w_out")
        self.gelu = nn.GELU()
        self.router_stats = RouterStats(experts)

    def construct(self, x):
        b, t, c = x.shape
        tokens = x.reshape(-1, c)
        probs = ops.softmax(self.router(tokens) + self.expert_bias, -1)
        top, chosen = ops.topk(probs, self.k)
        chosen = self.router_stats(chosen, probs)
        gates = (ops.one_hot(chosen, self.experts, 1.0, 0.0) * (top / top.sum(-1, keepdims=True)).expand_dims(-1)).sum(1)
        hidden = self.gelu(ops.matmul(tokens.expand_dims(0), self.w_in))  # (experts, tokens, hidden)
        out = ops.matmul(hidden, self.w_out)  # (experts, tokens, d_model)
        return (out * gates.transpose(1, 0).expand_dims(-1)).sum(0).reshape(b, t, c)


class Block(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm((cfg.d_model,))
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm((cfg.d_model,))
        self.mixture = bool(cfg.experts)
        if self.mixture:
            self.moe = MoE(cfg.d_model, 2 * cfg.d_model, cfg.experts, cfg.top_k)
        else:
            self.mlp = nn.SequentialCell(
                nn.Dense(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Dense(4 * cfg.d_model, cfg.d_model)
            )

    def construct(self, x):
        x = x + self.attn(self.ln1(x))
        if self.mixture:
            return x + self.moe(self.ln2(x))
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
