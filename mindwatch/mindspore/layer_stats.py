"""Per-layer health inside the step's own graph: gradient norm, weight norm and update ratio of every layer.

Example::

    train_net = TrainOneStepWithGradNorm(net_with_loss, optimizer, layer_stats=True)
    train_net.mindwatch_layer_params    # ('blocks.0.attn.qkv.weight', 'blocks.0.attn.qkv.bias', ...)
    LayerGrouping(train_net.mindwatch_layer_params).layers   # ('blocks.0.attn.qkv', ...)

A layer is the cell that owns parameters: a parameter's name without its last component
(``blocks.0.attn.qkv.weight`` and ``blocks.0.attn.qkv.bias`` -> ``blocks.0.attn.qkv``), without the
``network.`` that a loss wrapper (``nn.WithLossCell``) puts before every name.
``monitor_config.layers.group`` merges layers: a depth (``2``: ``blocks.0``) or fnmatch patterns (a
layer matching one is named by the pattern).

Per layer, from the reduced gradients (before clipping) and the weights the step started from:
``grad_norm = ||g||``, ``weight_norm = ||w_before||`` and ``update_ratio = ||w_after - w_before|| /
||w_before||`` (what the optimizer really did). The graph returns per-parameter squared sums,
``(3, parameters)``; :class:`LayerGrouping` sums them into layers on the host. The gradient squares
come every step at no extra cost (the global norm needs them); weights and updates only on the steps
the train cell's ``measure_layers`` picks (the weights are copied only then): a graph compiled without
that work runs on the other steps, or, inside another graph, a branch on :class:`LayerStats`' flags.
The callback picks the steps (every ``layers.every``) and reads the result once.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

_LOSS_WRAPPER = "network."


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


_L2_LOSS = ops.L2Loss()  # sum(t**2) / 2 in one kernel (square + sum are two: on CPU each kernel costs ~10 us)


def squares(tensors: tuple) -> ms.Tensor:
    """``sum(t**2)`` of each tensor, in float32, as one vector."""
    return ops.stack([_L2_LOSS(ops.cast(t, ms.float32)) for t in tensors]) * 2.0


#: The Adam-family optimizers and their moments' attributes (first, second), in the order of their parameters.
_MOMENTS: tuple[tuple[type, tuple[str, str]], ...] = (
    (nn.Adam, ("moment1", "moment2")),
    (nn.AdamWeightDecay, ("moments1", "moments2")),
    (nn.Lamb, ("moments1", "moments2")),
)


#: The moments' attributes of Adam-family optimizers known by their attributes alone (MindFormers' ``AdamW``: ``adam_m``
#: and ``adam_v`` Parameters), so that mindwatch imports no optimizer library.
_MOMENT_ATTRIBUTES: tuple[tuple[str, str], ...] = (("exp_avg", "exp_avg_sq"),)


def optimizer_moments(optimizer: object) -> tuple[ms.ParameterTuple, ms.ParameterTuple] | None:
    """The first and second moments of an Adam-family optimizer (``Adam``, ``AdamWeightDecay``, ``Lamb``, MindFormers'
    ``AdamW``), one Parameter each per parameter of the optimizer, in its order; None for another optimizer."""
    found = [names for kind, names in _MOMENTS if isinstance(optimizer, kind)]
    found += [names for names in _MOMENT_ATTRIBUTES if all(hasattr(optimizer, a) for a in names)]
    for first, second in found[:1]:
        m, v = getattr(optimizer, first), getattr(optimizer, second)
        return (m, v) if len(m) == len(v) == len(optimizer.parameters) else None  # type: ignore[attr-defined]
    return None


#: Steps the moments take to settle when the optimizer's beta2 is unknown: MindSpore's Adam default, 0.999.
DEFAULT_SETTLE_STEPS = 1000


def moments_settle_steps(optimizer: object) -> int:
    """Steps before an Adam-family optimizer's moments are a baseline: ``v`` grows from 0 as ``1 - beta2**t``, so for
    about ``1 / (1 - beta2)`` steps (0.999: 1000; MindFormers' AdamW at 0.95: 20); :data:`DEFAULT_SETTLE_STEPS` when its
    ``beta2`` cannot be read."""
    beta2: Any = getattr(optimizer, "beta2", None)
    read = getattr(beta2, "asnumpy", None)
    try:
        value = float(np.asarray(read() if read is not None else beta2, np.float64).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        return DEFAULT_SETTLE_STEPS
    return round(1.0 / (1.0 - value)) if 0.0 < value < 1.0 else DEFAULT_SETTLE_STEPS


class LayerStats(nn.Cell):
    """The per-parameter part of a train step (see the module docstring); used inside our train cells."""

    def __init__(self, weights: ms.ParameterTuple, moments: tuple[ms.ParameterTuple, ms.ParameterTuple] | None = None) -> None:
        """``moments``: the optimizer's first and second moments (:func:`optimizer_moments`), measured after the update."""
        super().__init__()
        #: The parameters measured, in output order.
        self.names = tuple(w.name for w in weights)
        self.zeros = ms.Tensor(np.zeros(len(self.names), np.float32))
        #: The optimizer's moments (None: not an Adam-family optimizer); the rows after the measured three.
        self.moments = moments
        #: 1 on the steps whose weights and updates are measured; set between steps by the callback.
        self.flag = ms.Parameter(ms.Tensor(0, ms.int32), name="mindwatch_layer_stats_on", requires_grad=False)
        #: 1 on the steps whose histograms are taken (:meth:`enable_histograms`).
        self.hist_flag = ms.Parameter(ms.Tensor(0, ms.int32), name="mindwatch_layer_histograms_on", requires_grad=False)
        self.hist_groups: tuple[tuple[int, ...], ...] | None = None
        self.bins = 0

    def enable_histograms(self, groups: Sequence[Sequence[int]], bins: int) -> None:
        """Also histogram each layer's weights and gradients (``groups``: the parameter indices of each layer) on the
        steps whose ``hist_flag`` is set. Call before the graph is compiled (the callback does, at train begin)."""
        self.hist_groups = tuple(tuple(g) for g in groups)
        self.bins = bins
        self.no_histograms = ms.Tensor(np.zeros((2, len(self.hist_groups), bins + 1), np.float32))

    def histograms(self, weights: tuple, grads: tuple) -> ms.Tensor:
        """``(2, layers, bins + 1)``: per layer, counts of ``x / max|x|`` in ``bins`` bins over [-1, 1], then ``max|x|``;
        row 0 the weights, row 1 the gradients."""
        out = []
        for tensors in (weights, grads):
            rows = []
            for group in self.hist_groups:  # type: ignore[union-attr]  # set by enable_histograms (graph code: no assert)
                flat = ops.concat([ops.reshape(ops.cast(tensors[i], ms.float32), (-1,)) for i in group])
                top = ops.reduce_max(ops.abs(flat))
                counts = ops.histc(flat / ops.maximum(top, ops.full_like(top, 1e-30)), self.bins, -1.0, 1.0)
                rows.append(ops.concat([counts, ops.reshape(top, (1,))]))
            out.append(ops.stack(rows))
        return ops.stack(out)

    def result(self, grad_sq: ms.Tensor, weight_sq: ms.Tensor, delta_sq: ms.Tensor, moment_sq: tuple = ()) -> ms.Tensor:
        """``(3, parameters)`` squared sums: gradients, weights before the step, updates (0 where not measured); with
        the optimizer's moments ``(5, parameters)``: then its first and second moments after the update."""
        return ops.stack([grad_sq, weight_sq, delta_sq, *moment_sq])


class LayerGrouping:
    """From a step's per-parameter squared sums to per-layer statistics, on the host (numpy, one product).

    Example::

        grouping = LayerGrouping(train_net.mindwatch_layer_params, group=None)
        grouping.layers                  # ('0', '2')
        stats = grouping.stats(out)      # (3, layers) float32: grad_norm, weight_norm, update_ratio
    """

    def __init__(self, param_names: Sequence[str], group: int | Sequence[str] | None = None) -> None:
        # the loss wrapper (nn.WithLossCell) names every parameter "network.<name in the model>": the model's names read better
        wrapped = all(n.startswith(_LOSS_WRAPPER) for n in param_names)
        names, index = group_layers([n.removeprefix(_LOSS_WRAPPER) if wrapped else n for n in param_names], group)
        self.layers = tuple(names)
        self.params = tuple(param_names)
        self.index = np.asarray(index, np.int64)  # the layer of each parameter
        #: The parameter indices of each layer.
        self.groups = [np.flatnonzero(self.index == j).tolist() for j in range(len(names))]

    def stats(self, squares: np.ndarray, local: bool = False) -> np.ndarray:
        """``(3, layers)``: gradient norm, weight norm and update ratio from ``(3, parameters)`` squared sums; from
        ``(5, parameters)``, ``(5, layers)`` with the norms of the optimizer's two moments; from ``(1, parameters)``
        (MindFormers' ``local_norm``), ``(1, layers)``: the gradient norms alone. ``local``: the last row is this rank's
        own gradients' (``local_grad_norm``), a norm per layer after the others."""
        rows = np.asarray(squares, np.float64)
        norms = []
        if local:
            rows, norms = rows[:-1], [np.sqrt(self._per_layer(rows[-1]))]
        if len(rows) == 1:
            return np.stack([np.sqrt(self._per_layer(rows[0])), *norms]).astype(np.float32)
        g, w, d, *moments = (self._per_layer(row) for row in rows)
        with np.errstate(divide="ignore", invalid="ignore"):  # unmeasured weights (NaN) give a NaN ratio, zero weights 0
            ratio = np.where(w > 0, np.sqrt(d / np.where(w > 0, w, 1.0)), np.where(np.isnan(w), np.nan, 0.0))
        return np.stack([np.sqrt(g), np.sqrt(w), ratio, *(np.sqrt(m) for m in moments), *norms]).astype(np.float32)

    def _per_layer(self, per_param: np.ndarray) -> np.ndarray:
        # a sum by index, not a matrix product: 0 x NaN would spread one layer's NaN to every layer
        return np.bincount(self.index, weights=per_param, minlength=len(self.layers))

    def first_nonfinite(self, grad_sq: np.ndarray) -> str | None:
        """The first layer (in parameter order) whose gradient is NaN or Inf; None when none is, or when every
        layer's is (a NaN loss or activation reaches every gradient, so no layer stands out)."""
        bad = ~np.isfinite(self._per_layer(np.asarray(grad_sq, np.float64)))
        if not bad.any() or bad.all():
            return None
        return self.layers[int(np.argmax(bad))]
