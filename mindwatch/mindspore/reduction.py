"""A functional loop's step read in one compiled call: the loss, its scalars, the gradients' squared sums.

Example::

    read = StepReduction()
    values = read((loss, tokens), grads)      # one host read: [loss, tokens, |g_0|^2, |g_1|^2, ...]

    layers = LoopLayerStats(optimizer.parameters, hist_groups=None, bins=0)
    layers.snapshot()                                     # before a measured step: the weights it starts from
    squares, hist = layers.measure(grad_squares, grads, histograms=False)   # after it: (3, parameters), as the train cells return

Each function is compiled by ``ms.jit`` once per number of tensors: the tensors are passed one by one or
as a ``ms.mutable`` tuple (a plain tuple argument is a compile-time constant: it would compile again every
step). The squares are
``sum(t**2)`` in float32, as in :mod:`mindwatch.mindspore.layer_stats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch.mindspore.layer_stats import LayerStats, squares

_L2_LOSS = ops.L2Loss()
#: Up to this many scalar Tensors without gradients are read one by one (``asnumpy``), not in a compiled call.
_READ_APART = 4


@ms.jit
def _scalars_and_squares(scalars, grads):
    return ops.concat([_means(scalars), squares(grads)])


@ms.jit
def _scalars_and_square_sum(scalars, grads):
    return ops.concat([_means(scalars), _square_sum(grads)])


@ms.jit
def _scalars(scalars):
    return _means(scalars)


@ms.jit
def _squares(grads):
    return squares(grads)


@ms.jit
def _squares_sum(grads):
    return _square_sum(grads)


def _square_sum(tensors):
    """``[sum(t**2) over every tensor]``: one concatenation and one kernel (a kernel a tensor costs ~10 us each on CPU)."""
    return ops.reshape(_L2_LOSS(_flat(tensors)) * 2.0, (1,))


def _flat(tensors):
    return ops.concat([ops.reshape(ops.cast(t, ms.float32), (-1,)) for t in tensors])


def grad_norm(grads: Sequence[Any]) -> Any:
    """The global L2 norm of ``grads``, computed where it is called: inside your own ``@ms.jit`` step it costs one
    concatenation and one kernel in that graph, and ``run.step`` reads one scalar instead of every gradient.

    Example::

        import mindwatch.mindspore as mw

        @ms.jit
        def train_step(x, y):
            loss, grads = grad_fn(x, y)
            optimizer(grads)
            return loss, mw.grad_norm(grads)

        loss, norm = train_step(x, y)
        run.step(loss=loss, grad_norm=norm)     # per-layer statistics need run.step(grads=...) instead
    """
    return ops.sqrt(_L2_LOSS(_flat(grads)) * 2.0)


def _means(scalars):
    return ops.stack([ops.cast(t, ms.float32).mean() for t in scalars])


@ms.jit
def _stack_values(*values):
    return ops.stack(values)


@ms.jit
def _concat_values(*values):
    return ops.concat(values)


@ms.jit
def _squares_of(*tensors):
    return squares(tensors)


@ms.jit
def _copy(*tensors):
    return tuple(t * 1 for t in tensors)


@ms.jit
def _weights_and_updates(*before_and_after):
    n = len(before_and_after) // 2
    before, after = before_and_after[:n], before_and_after[n:]
    return ops.stack([squares(before), squares(tuple(after[i] - before[i] for i in range(n)))])


class StepReduction:
    """Scalars (a mean each) and the gradients' per-tensor squared sums, read in one device call."""

    def __call__(self, scalars: Sequence[ms.Tensor], grads: Sequence[ms.Tensor] = (), *, per_tensor: bool = True) -> np.ndarray:
        """``[the mean of each scalar tensor..., sum(g**2) of each gradient...]`` as float64; without ``per_tensor``
        one ``sum(g**2)`` over all the gradients in place of the per-gradient sums (cheaper: what ``grad_norm`` needs)."""
        if scalars and grads:
            both = _scalars_and_squares if per_tensor else _scalars_and_square_sum
            out = both(ms.mutable(tuple(scalars)), ms.mutable(tuple(grads)))
        elif scalars and len(scalars) <= _READ_APART and all(t.size == 1 for t in scalars):
            # a few scalars alone: one host read each costs less than a compiled call (~1 ms of CPU on CPU)
            return np.array([float(t.asnumpy().reshape(())) for t in scalars], np.float64)
        elif scalars:  # (an empty mutable tuple cannot be passed)
            out = _scalars(ms.mutable(tuple(scalars)))
        else:
            out = (_squares if per_tensor else _squares_sum)(ms.mutable(tuple(grads)))
        return out.asnumpy().astype(np.float64)

    @staticmethod
    def stack(values: Sequence[Any]) -> np.ndarray:
        """Small Parameters (the attention statistics) in one read."""
        return _stack_values(*values).asnumpy()

    @staticmethod
    def concat(values: Sequence[Any]) -> np.ndarray:
        """Small 1-D Parameters of any lengths (the routing statistics) in one read, end to end."""
        return _concat_values(*values).asnumpy()


class _Histograms(nn.Cell):
    def __init__(self, stats: LayerStats) -> None:
        super().__init__()
        self.stats = stats

    def construct(self, *weights_and_grads):
        n = len(weights_and_grads) // 2
        return self.stats.histograms(weights_and_grads[:n], weights_and_grads[n:])


class LoopLayerStats:
    """The weights' and updates' squared sums of a step whose update the loop did itself (``optimizer(grads)``).

    The weights the step starts from are copied by :meth:`snapshot` at the end of the step before (the
    weights only change in the step), so only measured steps copy them.
    """

    def __init__(
        self,
        weights: Sequence[ms.Parameter],
        groups: Sequence[Sequence[int]] | None,
        bins: int,
        moments: tuple[Sequence[ms.Parameter], Sequence[ms.Parameter]] | None = None,
    ) -> None:
        """``moments``: the optimizer's first and second moments, one per weight (``optimizer_moments``)."""
        self.weights = tuple(weights)
        #: The optimizer's moments, first then second, read after the step (None: not an Adam-family optimizer).
        self.moments = (*moments[0], *moments[1]) if moments is not None else None
        self.names = tuple(w.name for w in self.weights)
        self._before: tuple[Any, ...] | None = None
        self._histograms: Any = None
        if groups is not None and bins:
            stats = LayerStats(ms.ParameterTuple(self.weights))
            stats.enable_histograms(groups, bins)
            self._histograms = ms.jit(_Histograms(stats).construct)

    def snapshot(self) -> None:
        """Keep a copy of the weights: the next step measures its update against it."""
        self._before = _copy(*self.weights)

    def measure(self, grad_squares: np.ndarray, grads: Sequence[Any], histograms: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """``(3, parameters)`` squared sums (the gradients' given, the weights' before the step, its update's; NaN
        without a snapshot; with the optimizer's moments, ``(5, parameters)``: then theirs, after the step) and, with
        ``histograms``, ``(2, layers, bins + 1)`` of the weights before the step and
        ``grads`` (see ``LayerStats.histograms``; None when off)."""
        before, self._before = self._before, None
        hist = None
        if histograms and self._histograms is not None:
            hist = self._histograms(*(before or self.weights), *grads).asnumpy()
        moments = (
            _squares_of(*self.moments).asnumpy().reshape(2, -1) if self.moments is not None else np.zeros((0, len(self.names)))
        )
        if before is None:
            nan = np.full(len(self.names), np.nan)
            return np.stack([grad_squares, nan, nan, *moments]), hist
        both = _weights_and_updates(*before, *self.weights).asnumpy()
        return np.concatenate([grad_squares[None, :], both.astype(np.float64), moments.astype(np.float64)]), hist
