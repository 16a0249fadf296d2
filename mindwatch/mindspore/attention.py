"""Attention statistics in GRAPH mode: a cell an attention layer owns, and our train cells return its values.

Example::

    from mindwatch.mindspore.attention import AttentionStats

    class SelfAttention(nn.Cell):
        def __init__(self, ...):
            ...
            self.stats = AttentionStats()

        def construct(self, x):
            scores = ops.matmul(q, k.swapaxes(-1, -2)) * self.scale + mask
            probs = self.stats(scores, ops.softmax(scores, -1))   # the probabilities unchanged
            ...

A compiled graph cannot call back into Python, so forward hooks see nothing in GRAPH mode. Instead,
on the steps its flag is set, :class:`AttentionStats` writes two numbers into a Parameter of its own:
the attention entropy (``-sum(p log p)`` over the keys, averaged over batch, heads and queries, in nats)
and the largest attention logit (the score before the softmax, which MindFormers also tracks: it
grows before attention collapses). ``TrainOneStepWithGradNorm`` (and its loss-scale sibling) find
every such cell of the network and return their values as one ``(cells, 2)`` output after the loss;
the callback sets the flags every ``attention_entropy.every`` steps and records
``attention_entropy/<layer>`` and ``attention_max_logit/<layer>``, ``<layer>`` being the attention cell.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch import metrics as vocab
from mindwatch.mindspore.measured_cells import owned_cells

#: The metrics an attention layer's statistics are recorded as, in the order of AttentionStats' values.
ATTENTION_METRICS: tuple[str, ...] = vocab.attention_names()


class AttentionStats(nn.Cell):
    """Identity on the attention probabilities; on sampled steps it keeps their entropy and the max logit."""

    def __init__(self) -> None:
        super().__init__()
        #: 1 on the steps that are sampled; set between steps by the callback.
        self.on = ms.Parameter(ms.Tensor(0, ms.int32), requires_grad=False)
        #: ``[entropy, max logit]`` of the last sampled step.
        self.values = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), requires_grad=False)

    def construct(self, scores, probs):
        if self.on > 0:
            p = ops.cast(ops.stop_gradient(probs), ms.float32)
            entropy = -(p * ops.log(ops.clamp(p, 1e-12, None))).sum(axis=-1).mean()
            top = ops.reduce_max(ops.cast(ops.stop_gradient(scores), ms.float32))
            probs = ops.depend(probs, ops.assign(self.values, ops.stack([entropy, top])))
        return probs


def attention_stats_cells(network: nn.Cell) -> list[tuple[str, AttentionStats]]:
    """Every :class:`AttentionStats` under ``network``, with the name of the attention cell that owns it."""
    return owned_cells(network, AttentionStats)
