"""Per-layer health inside the step's own graph: gradient norm, weight norm and update ratio of every layer.

Example::

    train_net = TrainOneStepWithGradNorm(net_with_loss, optimizer, layer_stats=True)
    train_net.mindwatch_layers          # ('blocks.0.attn.qkv', 'blocks.0.attn.proj', ...)

A layer is the cell that owns parameters: a parameter's name without its last component
(``blocks.0.attn.qkv.weight`` and ``blocks.0.attn.qkv.bias`` -> ``blocks.0.attn.qkv``).
``monitor_config.layers.group`` merges layers: a depth (``2``: ``blocks.0``) or fnmatch patterns (a
layer matching one is named by the pattern).

Per layer, from the reduced gradients (before clipping) and the weights the step started from:
``grad_norm = ||g||``, ``weight_norm = ||w_before||`` and ``update_ratio = ||w_after - w_before|| /
||w_before||`` (what the optimizer really did). Per-parameter squared sums are summed into layers by
one matrix product. The gradient norms come every step at little cost (the global norm needs the same
squares); weights and updates only on steps whose :class:`LayerStats` flag is set, in a graph branch
the other steps skip (the weights are copied only then). The callback sets the flag every
``layers.every`` steps and reads the ``(3, layers)`` result once.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import mindspore as ms
import numpy as np
from mindspore import nn, ops


def layer_of(param_name: str) -> str:
    """The layer a parameter belongs to: its name without the last component."""
    head, dot, _ = param_name.rpartition(".")
    return head if dot else param_name


def group_layers(param_names: Sequence[str], group: int | Sequence[str] | None = None) -> tuple[list[str], list[int]]:
    """``(layer names in first-seen order, the layer index of each parameter)``.

    ``group``: None keeps every layer; an int keeps that many name components; patterns merge the
    layers that match one into a layer named by the pattern (the first pattern that matches wins).
    """
    names: list[str] = []
    index: list[int] = []
    seen: dict[str, int] = {}
    for p in param_names:
        layer = layer_of(p)
        if isinstance(group, int):
            layer = ".".join(layer.split(".")[:group])
        elif group:
            layer = next((pat for pat in group if fnmatch.fnmatchcase(layer, pat)), layer)
        if layer not in seen:
            seen[layer] = len(names)
            names.append(layer)
        index.append(seen[layer])
    return names, index


def squares(tensors: tuple) -> ms.Tensor:
    """``sum(t**2)`` of each tensor, in float32, as one vector."""
    return ops.stack([ops.reduce_sum(ops.square(ops.cast(t, ms.float32))) for t in tensors])


class LayerStats(nn.Cell):
    """The per-layer part of a train step (see the module docstring); used inside our train cells."""

    def __init__(self, weights: ms.ParameterTuple, group: int | Sequence[str] | None = None) -> None:
        super().__init__()
        names, index = group_layers([w.name for w in weights], group)
        self.names = tuple(names)
        matrix = np.zeros((len(names), len(index)), np.float32)
        matrix[index, np.arange(len(index))] = 1.0
        self.matrix = ms.Tensor(matrix)
        self.zeros = ms.Tensor(np.zeros(len(index), np.float32))
        #: 1 on the steps whose weights and updates are measured; set between steps by the callback.
        self.flag = ms.Parameter(ms.Tensor(0, ms.int32), name="mindwatch_layer_stats_on", requires_grad=False)

    def per_layer(self, per_param: ms.Tensor) -> ms.Tensor:
        return ops.matmul(self.matrix, per_param)

    def result(self, grad_sq: ms.Tensor, weight_sq: ms.Tensor, delta_sq: ms.Tensor) -> ms.Tensor:
        """``(3, layers)``: gradient norm, weight norm, update ratio (0 where the weights are 0 or not measured)."""
        g, w, d = self.per_layer(grad_sq), self.per_layer(weight_sq), self.per_layer(delta_sq)
        ratio = ops.sqrt(d / ops.maximum(w, ops.full_like(w, 1e-30)))
        return ops.stack([ops.sqrt(g), ops.sqrt(w), ratio])
