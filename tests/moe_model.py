"""A tiny mixture of experts for the routing tests, whose router's choices the test keeps for its own counts.

Each MoE layer writes the experts it chose and the router's probabilities into Parameters of its own with an
``ops.assign`` in ``construct`` (``kept_indices``, ``kept_probs``): a test reads them after each step and counts the
choices itself, the independent reference for ``RouterStats``. ``expert_bias`` (trained by no gradient) is added to the
router's logits: a test sets it to send every token to one expert.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch.mindspore import RouterStats

D_MODEL, EXPERTS = 16, 4


class KeptMoE(nn.Cell):
    def __init__(self, tokens: int, k: int, capacity_factor: float | None = None, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.k = k
        self.router = nn.Dense(D_MODEL, EXPERTS, has_bias=False)
        self.expert_bias = ms.Parameter(ms.Tensor(np.zeros(EXPERTS, np.float32)), requires_grad=False)
        w = rng.normal(0, D_MODEL**-0.5, (EXPERTS, D_MODEL, D_MODEL)).astype(np.float32)
        self.experts = ms.Parameter(ms.Tensor(w), name="experts")
        self.kept_indices = ms.Parameter(ms.Tensor(np.zeros((tokens, k), np.int32)), requires_grad=False)
        self.kept_probs = ms.Parameter(ms.Tensor(np.zeros((tokens, EXPERTS), np.float32)), requires_grad=False)
        self.router_stats = RouterStats(EXPERTS, capacity_factor=capacity_factor)

    def construct(self, x):
        probs = ops.softmax(self.router(x) + self.expert_bias, -1)
        top, chosen = ops.topk(probs, self.k)
        chosen = ops.depend(chosen, ops.assign(self.kept_indices, ops.cast(chosen, ms.int32)))
        chosen = ops.depend(chosen, ops.assign(self.kept_probs, probs))
        chosen = self.router_stats(chosen, probs)
        gates = (ops.one_hot(chosen, EXPERTS, 1.0, 0.0) * top.expand_dims(-1)).sum(1)  # (tokens, experts)
        out = ops.matmul(x.expand_dims(0), self.experts)  # (experts, tokens, d_model)
        return x + (out * gates.transpose(1, 0).expand_dims(-1)).sum(0)


class MoENet(nn.Cell):
    """Two MoE layers (``moe0``, ``moe1``) and a linear read-out: ``(tokens, 16) -> (tokens, 1)``."""

    def __init__(self, tokens: int, k: int = 2, capacity_factor: float | None = None) -> None:
        super().__init__()
        self.moe0 = KeptMoE(tokens, k, capacity_factor, seed=0)
        self.moe1 = KeptMoE(tokens, k, capacity_factor, seed=1)
        self.head = nn.Dense(D_MODEL, 1)

    def construct(self, x):
        return self.head(self.moe1(self.moe0(x)))

    def layers(self) -> dict[str, KeptMoE]:
        return {"moe0": self.moe0, "moe1": self.moe1}


def kept(net: MoENet) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each layer's kept ``(indices, probabilities)`` of the step just run."""
    return {
        name: (layer.kept_indices.asnumpy().copy(), layer.kept_probs.asnumpy().copy()) for name, layer in net.layers().items()
    }


def routing_of(indices: np.ndarray, probs: np.ndarray | None = None, capacity_factor: float | None = None) -> dict:
    """The test's own routing statistics of one layer's choices: counts, shares, imbalance, entropy, dropped."""
    counts = np.bincount(indices.ravel(), minlength=EXPERTS).astype(np.float64)
    shares = counts / counts.sum()
    out = {"counts": counts, "shares": shares, "imbalance": shares.max() * EXPERTS}
    if probs is not None:
        p = probs.astype(np.float64)
        out["entropy"] = float(-(p * np.log(np.clip(p, 1e-12, None))).sum(-1).mean())
    if capacity_factor is not None:
        capacity = capacity_factor * counts.sum() / EXPERTS
        out["dropped"] = float(np.maximum(counts - capacity, 0).sum() / counts.sum())
    return out


def batches(steps: int, tokens: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    w = np.linspace(-1, 1, D_MODEL).astype(np.float32)
    out = []
    for _ in range(steps):
        x = rng.standard_normal((tokens, D_MODEL)).astype(np.float32)
        out.append((x, (x @ w).reshape(-1, 1).astype(np.float32)))
    return out
