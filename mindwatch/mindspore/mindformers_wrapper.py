"""mindwatch's train wrapper for MindFormers: MindFormers' own train step, with what our train cells add.

Example::

    from mindwatch.mindspore.mindformers import register
    register()      # a YAML's runner_wrapper MFTrainOneStepCell (or a subclass of it) is built as watched_wrapper(it)

    WatchedCPUTrainOneStepCell = watched_wrapper(CPUTrainOneStepCell)   # what register() builds, by hand

``watched_wrapper(cls)`` is a subclass of ``cls``: MindFormers' construct (or the user's override of it) runs as it is
and returns exactly its outputs (MFLossMonitor reads 3, 4, 5 or 7 of them). mindwatch's work goes around the two calls
that construct makes, in the same compiled step:

- its gradient reducer (``self.grad_reducer``): in data parallel, the cross-rank signal (:mod:`rank_signal`) summed in
  the all-reduce's fusion group, with this rank's norm of its gradients in its slot; on measured steps the squared sums
  of each parameter's reduced gradients (before clipping) and, in data parallel, of this rank's own;
- its optimizer (``self.optimizer``): ``skip_steps``' decision and a rewind's pass-over, which apply no update; on
  measured steps the weights before the update, the update itself and the optimizer's moments after it.

What the step measured lives in Parameters (``mindwatch_side_outputs``) that the callback reads after the step beside
the wrapper's own outputs; ``mindwatch_outputs`` names them all. Measured steps are a branch on
:class:`~mindwatch.mindspore.layer_stats.LayerStats`' flag inside the graph (MindFormers' construct takes no argument
of ours to pick a graph with), so an unmeasured step runs none of the measuring kernels; with ``layers`` off (the
callback never calls ``measure_layers``) the step holds no branch at all.
"""

from __future__ import annotations

import logging
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch import metrics as vocab
from mindwatch.mindspore.layer_stats import LayerStats, squares
from mindwatch.mindspore.outputs import MINDFORMERS_LAYOUTS
from mindwatch.mindspore.rank_signal import sum_signal, with_local_norm
from mindwatch.mindspore.train_step import _LayerStatsStep

log = logging.getLogger("mindwatch")

_WATCHED: dict[type, type] = {}


def watched_wrapper(base: type) -> type:
    """The subclass of MindFormers' train wrapper ``base`` (``MFTrainOneStepCell`` or a subclass) that mindwatch watches
    (the module docstring); ``base``'s overrides are kept. One class per ``base``."""
    if getattr(base, "mindwatch_watched", False):
        return base
    if base not in _WATCHED:
        _WATCHED[base] = type(f"Watched{base.__name__}", (MindFormersWatch, base), {"__module__": __name__})
    return _WATCHED[base]


class _Reduce(nn.Cell):
    """The wrapper's gradient reducer, with the signal beside its all-reduce and, on measured steps, the squared sums
    of the reduced gradients and this rank's own (rows 0 and 1 of ``grad_sq``)."""

    def __init__(self, reducer: Any, owner: MindFormersWatch) -> None:
        super().__init__(auto_prefix=False)
        self.reducer = reducer
        self.signal = owner.mindwatch_signal
        self.signal_out = owner.mindwatch_signal_sum
        self.slot = getattr(owner, "_local_norm_slot", None)
        self.signal_sum = getattr(owner, "_signal_sum", None)
        #: The model's RouterStats vectors, summed with the signal (None: no MoE router counted).
        self.routing, self.routing_sum = owner.routing_values, owner.mindwatch_routing_sum
        self.flag = owner.measured.flag
        self.grad_sq = owner.mindwatch_grad_sq
        self.norm_out = owner.mindwatch_grad_norm  # the reduced gradients' norm, for skip_steps' decision
        #: Constants of the compiled step, set before it compiles: skip_steps is on; layers are measured at all.
        self.skipping = self.layers_on = False

    def construct(self, grads):
        if self.signal is not None:
            vector = with_local_norm(self.signal, grads, self.slot)
            summed = sum_signal(self.signal_sum, vector, self.routing, self.routing_sum)
            grads = ops.depend(grads, ops.assign(self.signal_out, summed))
        reduced = self.reducer(grads)
        if self.skipping:
            reduced = ops.depend(reduced, ops.assign(self.norm_out, ops.sqrt(ops.reduce_sum(squares(reduced)))))
        if self.layers_on:  # noqa: SIM102  (a constant, then a branch in the graph)
            if self.flag > 0:
                reduced = ops.depend(reduced, ops.assign(self.grad_sq, ops.stack([squares(reduced), squares(grads)])))
        return reduced


class _Update(nn.Cell):
    """The wrapper's optimizer: no update on a skipped or passed-over step; on measured steps, the layers' statistics
    into ``layer_out`` and, on histogram steps, the histograms into ``hist_out``. Reads as the optimizer it wraps
    (``global_step``, ``dynamic_lr``, ... for MindFormers' construct and callbacks)."""

    def __init__(self, optimizer: nn.Optimizer, owner: MindFormersWatch) -> None:
        """Everything from ``owner``, as it is now (a change of settings before compilation builds a new one)."""
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.stats = owner.measured
        self.flag = owner.measured.flag
        self.hist_flag = owner.measured.hist_flag
        self.grad_sq = owner.mindwatch_grad_sq
        self.norm = owner.mindwatch_grad_norm
        self.layer_out = owner.mindwatch_layer_out
        self.hist_out = owner.mindwatch_histograms
        self.local = owner.mindwatch_signal is not None  # data parallel: this rank's own gradient norms too
        self.decision = owner.mindwatch_decision
        self.skipped_out = owner.mindwatch_skipped
        self.pass_over = owner.mindwatch_pass_over
        self.layers_on = owner.mindwatch_layers_on
        self.applied = ms.Tensor(True)
        self.not_applied = ms.Tensor(False)
        # What MindFormers' construct and callbacks read off the optimizer, as plain attributes: a Parameter set on a
        # cell is inserted into it (global_step is the optimizer's already), and the compiler asks a cell for its own.
        for name in ("global_step", "dynamic_lr", "is_group_lr", "is_group"):
            if hasattr(optimizer, name):
                self.__dict__[name] = getattr(optimizer, name)

    @property
    def mindwatch_wrapped(self) -> nn.Optimizer:
        """The optimizer itself (what mindwatch's checkpoints, rewinds and lr changes act on)."""
        return self._cells["optimizer"]

    def construct(self, grads):
        skip = None  # None: nothing of ours skips an update (a constant: no branch in the graph)
        passing = None
        if self.pass_over is not None:
            passing = self.pass_over > 0
            skip = passing
        if self.decision is not None:
            decided = self.decision(self.norm, passing)
            skip = decided if skip is None else ops.logical_or(skip, decided)
            skip = ops.depend(skip, ops.assign(self.skipped_out, ops.cast(decided, ms.float32)))
        if self.hist_out is not None:  # noqa: SIM102  (a constant, then a branch in the graph)
            if self.hist_flag > 0:
                grads = ops.depend(grads, ops.assign(self.hist_out, self.stats.histograms(self._copy(), grads)))
        if self.layers_on:  # noqa: SIM102
            if self.flag > 0:
                return self._measured(grads, skip)
        return self._update(grads, skip)

    def _update(self, grads, skip):
        """The optimizer's update, unless ``skip``; whether it was applied."""
        if skip is None:
            return ops.depend(self.applied, self.optimizer(grads))
        done = self.not_applied
        if not skip:
            done = ops.depend(self.applied, self.optimizer(grads))
        return done

    def _copy(self):
        return tuple(w * 1 for w in self.optimizer.parameters)

    def _measured(self, grads, skip):
        before = self._copy()  # the weights the step started from
        done = self._update(grads, skip)
        after = tuple(ops.depend(w, done) for w in self.optimizer.parameters)  # read once the update is done
        grad_sq = self.grad_sq
        rows = [grad_sq[0], squares(before), squares(tuple(after[i] - before[i] for i in range(len(before))))]
        if self.stats.moments is not None:
            m, v = self.stats.moments
            rows += [squares(tuple(ops.depend(x, done) for x in m)), squares(tuple(ops.depend(x, done) for x in v))]
        if self.local:
            rows.append(grad_sq[1])
        return ops.depend(done, ops.assign(self.layer_out, ops.stack(rows)))


class MindFormersWatch(_LayerStatsStep):
    """What :func:`watched_wrapper` adds to MindFormers' wrapper (the module docstring); mixed in before it."""

    mindwatch_watched = True
    #: The gradients' squared sums are taken on measured steps only (a branch), not every step as in our cells.
    mindwatch_grads_every_step = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # MindFormers' wrapper (or the user's subclass of it), as it is
        self.max_grad_norm = None
        #: MindFormers' own outputs: the loss, overflow, loss scale, lr and global norm (and with local_norm, two more).
        self._own_outputs = MINDFORMERS_LAYOUTS[7 if getattr(self, "local_norm", False) else 5]
        self._setup_layer_stats(True)
        stats = self.layer_stats
        assert stats is not None
        n = len(stats.names)
        local = self.mindwatch_signal is not None
        rows = 3 + (2 if stats.moments is not None else 0) + (1 if local else 0)
        self.mindwatch_layer_out = _zeros((rows, n), "mindwatch_layer_out")
        self.mindwatch_grad_sq = _zeros((2, n), "mindwatch_grad_sq")
        self.mindwatch_grad_norm = _zeros((), "mindwatch_grad_norm_reduced")
        signal = self.mindwatch_signal
        self.mindwatch_signal_sum = _zeros(signal.shape, "mindwatch_signal_sum") if signal is not None else None
        #: The rows of ``mindwatch_layer_out`` hold this rank's own gradient norms last (``local_grad_norm``).
        self.mindwatch_local_grad_norms = local
        self.mindwatch_skipped: ms.Parameter | None = None
        self.mindwatch_decision: Any = None
        self.mindwatch_histograms: ms.Parameter | None = None
        #: Whether the layers are measured at all (the callback's first measure_layers, before the step compiles): off,
        #: the step holds none of the measuring branch.
        self.mindwatch_layers_on = False
        reducer: Any = self.grad_reducer  # type: ignore[has-type]  # MindFormers' (or MindSpore's identity)
        self.grad_reducer = _Reduce(reducer, self)
        self._mindwatch_optimizer = self.optimizer
        self._watch_update()

    def _watch_update(self) -> None:
        """(Re)build the optimizer's gate from the settings as they are now (before the graph compiles)."""
        self.optimizer = _Update(self._mindwatch_optimizer, self)
        self._declare_outputs()

    @property
    def measured(self) -> LayerStats:
        """The layers' statistics (always on in this wrapper: measured steps are a branch)."""
        assert self.layer_stats is not None
        return self.layer_stats

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return nn.Cell.__call__(self, *inputs, **kwargs)  # one graph: measured steps are a branch in it

    def _declare_outputs(self) -> None:
        """``mindwatch_outputs``: MindFormers' outputs, then the Parameters of ``mindwatch_side_outputs`` by name."""
        if not hasattr(self, "mindwatch_layer_out"):  # called by _setup_layer_stats before they exist
            return
        side: list[tuple[str, Any]] = [("layer_stats", self.mindwatch_layer_out)]
        if self.mindwatch_histograms is not None:
            side.append(("layer_histograms", self.mindwatch_histograms))
        if self.mindwatch_signal_sum is not None:
            side.append(("signal", self.mindwatch_signal_sum))
        if self.mindwatch_skipped is not None:
            side.append((vocab.SKIPPED, self.mindwatch_skipped))
        self.mindwatch_outputs = (*self._own_outputs, *(name for name, _ in side))
        #: The Parameters the callback reads after the step, beside the wrapper's own outputs.
        self.mindwatch_side_outputs = tuple(p for _, p in side)

    def skip_steps(self, settings: Any) -> None:
        """``skip_steps``: the decision on the reduced gradients' norm before clipping (``metric: loss``: MindFormers'
        construct hands the loss to no call of ours, so the norm decides, with a warning)."""
        super().skip_steps(settings)
        if self._skip_by_loss:
            log.warning("mindwatch: skip_steps.metric loss: with MindFormers' wrapper the gradient norm decides")
        self.mindwatch_decision, self.skip_decision = self.skip_decision, None  # the gate holds it, once
        self.mindwatch_skipped = _zeros((), "mindwatch_skipped")
        self.grad_reducer.skipping = True
        self._watch_update()

    @staticmethod
    def _set_flag(flag: ms.Parameter, value: int) -> None:
        """``ops.assign``, not ``set_data``: with MindFormers' wrapper on MindSpore 2.9, a flag changed by ``set_data``
        after the step compiled kept, inside the step, the value it had before."""
        ops.assign(flag, ms.Tensor(value, ms.int32))

    def measure_layers(self, layers: bool, histograms: bool = False) -> None:
        if not self.mindwatch_layers_on:  # the first call, at train begin: the measuring branch joins the step
            self.mindwatch_layers_on = self.grad_reducer.layers_on = True
            self._watch_update()
        super().measure_layers(layers, histograms)

    def can_pass_over(self) -> None:
        super().can_pass_over()
        self._watch_update()

    def enable_layer_histograms(self, groups: Any, bins: int) -> None:
        super().enable_layer_histograms(groups, bins)
        stats = self.layer_stats
        assert stats is not None
        empty = stats.no_histograms.copy()
        self.mindwatch_histograms = ms.Parameter(empty, name="mindwatch_layer_histograms", requires_grad=False)
        self._watch_update()


def _zeros(shape: tuple[int, ...], name: str) -> ms.Parameter:
    return ms.Parameter(ms.Tensor(np.zeros(shape, np.float32)), name=name, requires_grad=False)


__all__ = ["MindFormersWatch", "watched_wrapper"]
