"""Train-step cells that compute the global gradient norm inside the graph.

Example::

    from mindwatch.mindspore import TrainOneStepWithGradNorm
    train_net = TrainOneStepWithGradNorm(nn.WithLossCell(net, loss_fn), optimizer, max_grad_norm=1.0)
    model = Model(train_net)
    model.train(epochs, ds, callbacks=[MonitorCallback("monitor.yaml")])

The norm is ``sqrt(sum(g**2))`` over every (reduced) gradient, before clipping. Each cell
declares its outputs in ``mindwatch_outputs`` so the callback reads them by name; the
learning rate returned is the one this step used (read before the optimizer advances).
With ``layer_stats=True`` a last output holds the per-layer statistics of :mod:`mindwatch.mindspore.layer_stats`.
With ``skip_steps`` switched on (the callback calls :meth:`~_LayerStatsStep.skip_steps` at train begin) a step whose
gradient norm (or loss) is an outlier is not applied (:mod:`mindwatch.mindspore.skip_step`), and a last output says so.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.nn.wrap.loss_scale import _ascend_grad_overflow

from mindwatch import metrics as vocab
from mindwatch.mindspore.attention import attention_stats_cells
from mindwatch.mindspore.layer_stats import LayerStats, optimizer_moments, squares
from mindwatch.mindspore.rank_signal import local_norm_slot, routing_parameters, signal_size, sum_signal, with_local_norm
from mindwatch.mindspore.skip_step import SkipDecision, skip_decision


class _LayerStatsStep:
    """What both train cells share: the norm and clipping, and for ``layer_stats`` the outputs they declare and the
    measured update."""

    layer_stats: LayerStats | None
    #: What the cells this mixes into have (nn.TrainOneStepCell and its loss-scale sibling).
    weights: Any
    network: Any
    optimizer: Any
    max_grad_norm: float | None
    #: The outputs of the cell class itself; an instance adds what its measurements return.
    mindwatch_outputs: tuple[str, ...] = ()

    def _setup_layer_stats(self, enabled: bool) -> None:
        self._setup_signal()
        #: ``skip_steps``' decision (a Cell with its statistics in Parameters); None: off, and none of its kernels.
        self.skip_decision: SkipDecision | None = None
        self._skip_by_loss = False
        #: A rewind's flag: while set, a step passes over its batch without an update; None: off (no kernel of it).
        self.mindwatch_pass_over: ms.Parameter | None = None
        self.layer_stats = LayerStats(self.weights, optimizer_moments(self.optimizer)) if enabled else None
        self._measure_next = False
        self._flags_on = (False, False)  # what the flag Parameters hold (read without a device sync)
        if self.layer_stats is not None:
            self.mindwatch_layer_params = self.layer_stats.names
            #: The statistics carry the optimizer's moments too (an Adam-family optimizer: ``adam_m_norm``, ...).
            self.mindwatch_layer_moments = self.layer_stats.moments is not None
        cells = attention_stats_cells(self.network)
        #: The attention cells whose AttentionStats the step returns (mindwatch.mindspore.attention).
        self.mindwatch_attention_layers = tuple(name for name, _ in cells)
        self.attention_values = ms.ParameterTuple([cell.values for _, cell in cells]) if cells else None
        self._declare_outputs()

    def _setup_signal(self) -> None:
        """In data parallel (the cell reduces its gradients), the cross-rank signal vector every step sums
        (:mod:`mindwatch.mindspore.rank_signal`): the actions a rank asks for reach every rank after the same step."""
        self.mindwatch_signal = None
        #: The RouterStats' vectors the signal's AllReduce sums too, and where their sum goes (None: no MoE router).
        self.routing_values = self.mindwatch_routing_sum = None
        if not getattr(self, "reducer_flag", False):
            return
        from mindspore.communication import get_group_size, get_rank

        size = signal_size(get_group_size())
        self.mindwatch_signal = ms.Parameter(ms.Tensor(np.zeros(size, np.float32)), name="mindwatch_signal", requires_grad=False)
        #: This rank's ``local_grad_norm`` slot: the norm of its gradients before the all-reduce goes there, in the step.
        self._local_norm_slot = local_norm_slot(get_rank(), get_group_size())
        # in the gradients' fusion group: it rides on their all-reduce where the backend fuses them
        self._signal_sum = ops.AllReduce().add_prim_attr("fusion", 1)
        self.routing_values, self.mindwatch_routing_sum = routing_parameters(self.network)

    def _declare_outputs(self) -> None:
        """``mindwatch_outputs``: the cell's own outputs, then what the switched-on measurements add, in order."""
        extra: tuple[str, ...] = ()
        if self.layer_stats is not None:
            extra += ("layer_stats",) + (("layer_histograms",) if self.layer_stats.hist_groups is not None else ())
        if self.attention_values is not None:
            extra += ("attention",)
        if self.mindwatch_signal is not None:
            extra += ("signal",)
        if self.skip_decision is not None:
            extra += (vocab.SKIPPED,)
        self.mindwatch_outputs = (*type(self).mindwatch_outputs, *extra)

    @staticmethod
    def _set_flag(flag: ms.Parameter, value: int) -> None:
        """Set a flag the compiled step reads, between steps: a host-side ``set_data``, no kernel launched (a kernel
        queued behind a collective a dead rank never joins would wait there, and the training thread with it)."""
        flag.set_data(ms.Tensor(value, ms.int32))

    def skip_steps(self, settings: Any) -> None:
        """Skip the update of a step whose metric is an outlier (``monitor_config.skip_steps``); before compilation.

        The callback calls it at train begin when ``skip_steps.enabled``: the decision and its statistics join
        the graph, and a last output, ``skipped``, says whether the step's update was skipped.
        """
        self.skip_decision = skip_decision(settings)
        self._skip_by_loss = settings.metric == vocab.LOSS
        self._declare_outputs()

    def can_pass_over(self) -> None:
        """Let a rewind pass over batches (``pass_over``); before compilation. The callback calls it at train begin when
        the run takes snapshots (``monitor_config.rewind``)."""
        if self.mindwatch_pass_over is None:
            flag = ms.Parameter(ms.Tensor(0, ms.int32), name="mindwatch_pass_over", requires_grad=False)
            self.mindwatch_pass_over = flag

    def pass_over(self, on: bool) -> None:
        """From the next step on, apply no update (``on``), or apply them again; between steps."""
        assert self.mindwatch_pass_over is not None, "pass_over needs can_pass_over() before the graph compiled"
        self._set_flag(self.mindwatch_pass_over, int(on))

    def _skip(self, loss, norm, skip_update):
        """``(skip_update or the decision's skip, (skipped,))``; ``(skip_update, ())`` with ``skip_steps`` off. A batch
        a rewind passes over updates nothing, and its value does not join the decision's statistics."""
        passing = None
        if self.mindwatch_pass_over is not None:
            passing = self.mindwatch_pass_over > 0
            skip_update = ops.logical_or(skip_update, passing)
        if self.skip_decision is None:
            return skip_update, ()
        skip = self.skip_decision(loss if self._skip_by_loss else norm, passing)
        return ops.logical_or(skip_update, skip), (ops.cast(skip, ms.float32),)

    def _signal(self, local_grads):
        """``(the signal vector summed over the ranks,)`` with this rank's norm of ``local_grads`` (its gradients
        before the all-reduce) in its slot, or ``()`` outside data parallel."""
        if self.mindwatch_signal is None:
            return ()
        vector = with_local_norm(self.mindwatch_signal, local_grads, self._local_norm_slot)
        return (sum_signal(self._signal_sum, vector, self.routing_values, self.mindwatch_routing_sum),)

    def measure_layers(self, layers: bool, histograms: bool = False) -> None:
        """Measure the weights and updates (``layers``) and take the histograms (``histograms``) on the next steps.

        Called between steps (the callback does, every ``layers.every`` and ``layers.histogram_every`` steps).
        Called by Python (``Model.train`` without dataset sink, or PyNative) the cell runs one of two graphs
        compiled without a branch: one that measures and one that measures nothing, so the other steps cost
        what a cell without ``layer_stats`` costs. Compiled inside another graph (a dataset-sink loop, a
        wrapper cell) the same choice is a branch on two flag Parameters.
        """
        stats = self.layer_stats
        if stats is None:
            return
        self._measure_next = measure = bool(layers or histograms)
        wanted = (measure, bool(histograms))
        for flag, on, was in zip((stats.flag, stats.hist_flag), wanted, self._flags_on, strict=True):
            if on != was:
                self._set_flag(flag, int(on))
        self._flags_on = wanted

    def __call__(self, *inputs, **kwargs):
        if self.layer_stats is not None and not kwargs:
            # a Python constant picks one of two graphs compiled without the measuring branch (measure_layers)
            return super().__call__(*inputs, measure=self._measure_next)
        return super().__call__(*inputs, **kwargs)

    def _measuring(self, measure):
        """Whether this step measures the weights: ``measure`` when called by Python, else the flag (a graph branch)."""
        return self.layer_stats.flag > 0 if measure is None else measure

    def enable_layer_histograms(self, groups, bins: int) -> None:
        """Histograms of each layer's weights and gradients as an output (before compilation; see LayerStats)."""
        assert self.layer_stats is not None, "enable_layer_histograms needs a cell built with layer_stats=True"
        self.layer_stats.enable_histograms(groups, bins)
        self._declare_outputs()

    def _attention(self, loss):
        """``(the AttentionStats values of this step's forward, (cells, 2))``, or ``()`` when the model has none."""
        if self.attention_values is None:
            return ()
        return (ops.stack([ops.depend(v, loss) for v in self.attention_values]),)

    def _norm_and_clip(self, grads):
        """``(grads clipped to max_grad_norm, their squared sums, the global norm before clipping, this step's lr)``."""
        grad_sq = squares(grads)
        norm = ops.sqrt(ops.reduce_sum(grad_sq))
        if self.max_grad_norm is not None:
            grads = _clip(grads, norm, self.max_grad_norm)
        return grads, grad_sq, norm, _current_lr(self.optimizer)

    def _measured_outputs(self, loss, grads, grad_sq, skip_update, measure):
        """Apply the optimizer (unless ``skip_update``); ``(loss, (statistics,))``, or ``(loss, (statistics, histograms))``
        with histograms (taken before the update)."""
        if self.layer_stats.hist_groups is None:
            loss, stats = self._measured_update(loss, grads, grad_sq, skip_update, measure)
            return loss, (stats,)
        hist = self._histograms(grads, measure)
        loss, stats = self._measured_update(ops.depend(loss, hist), grads, grad_sq, skip_update, measure)
        return loss, (stats, hist)

    def _histograms(self, grads, measure):
        """The layers' histograms of this step's weights (before the update) and gradients, or zeros on other steps."""
        stats = self.layer_stats
        if measure is False:
            return stats.no_histograms
        if stats.hist_flag > 0:  # a branch without side effects: skipping it costs nothing measurable
            return stats.histograms(tuple(w * 1 for w in self.weights), grads)
        return stats.no_histograms

    def _measured_update(self, loss, grads, grad_sq, skip_update, measure):
        """Apply the optimizer (unless ``skip_update``) and return ``(loss, per-layer statistics)``."""
        stats = self.layer_stats
        if self._measuring(measure):
            before = tuple(w * 1 for w in self.weights)  # a copy: the weights the step started from
            weight_sq = squares(before)
            if not skip_update:
                loss = ops.depend(loss, self.optimizer(grads))
            after = tuple(ops.depend(w, loss) for w in self.weights)  # read once the update is done
            delta_sq = squares(tuple(after[i] - before[i] for i in range(len(before))))
        else:
            if not skip_update:
                loss = ops.depend(loss, self.optimizer(grads))
            weight_sq = stats.zeros
            delta_sq = stats.zeros
        return loss, stats.result(grad_sq, weight_sq, delta_sq, self._moment_squares(loss, measure))

    def _moment_squares(self, loss, measure):
        """``(the squared sums of the optimizer's first moments, of its second)`` once the update (behind ``loss``) is
        done; zeros on a step that measures nothing; ``()`` for an optimizer without moments. Compiled inside another
        graph (``measure`` None) they are taken every step: a branch would have to return them both ways."""
        stats = self.layer_stats
        if stats.moments is None:
            return ()
        if measure is False:
            return (stats.zeros, stats.zeros)
        m, v = stats.moments
        return (squares(tuple(ops.depend(x, loss) for x in m)), squares(tuple(ops.depend(x, loss) for x in v)))


def _clip(grads: tuple, norm: ms.Tensor, max_norm: float) -> tuple:
    scale = ops.minimum(max_norm / (norm + 1e-6), ops.ones_like(norm))
    return tuple(g * ops.cast(scale, g.dtype) for g in grads)


def _current_lr(optimizer: nn.Optimizer) -> ms.Tensor:
    lr = optimizer.get_lr()
    if isinstance(lr, tuple):  # group learning rates: report the first group's
        lr = lr[0]
    return ops.cast(ops.reshape(lr, ()), ms.float32)


class TrainOneStepWithGradNorm(_LayerStatsStep, nn.TrainOneStepCell):
    """``nn.TrainOneStepCell`` that also returns the global gradient norm and the learning rate.

    Outputs ``(loss, grad_norm, lr)``. With ``max_grad_norm`` the gradients are clipped to
    that global norm (``grad_norm`` is the norm before clipping).
    """

    mindwatch_outputs = (vocab.LOSS, vocab.GRAD_NORM, vocab.LR)

    def __init__(
        self,
        network: nn.Cell,
        optimizer: nn.Optimizer,
        sens: float = 1.0,
        max_grad_norm: float | None = None,
        layer_stats: bool = False,
    ) -> None:
        super().__init__(network, optimizer, sens=sens)
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        self.max_grad_norm = max_grad_norm
        self._setup_layer_stats(layer_stats)

    def construct(self, *inputs, measure=None):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        local_grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(local_grads)
        grads, grad_sq, norm, lr = self._norm_and_clip(grads)
        attention = self._attention(loss)
        signal = self._signal(local_grads)
        nonfinite = ops.logical_not(ops.isfinite(norm))  # a NaN/Inf gradient is not applied (the weights stay finite)
        skip_update, skipped = self._skip(loss, norm, nonfinite)
        if self.layer_stats is None:
            if not skip_update:
                loss = ops.depend(loss, self.optimizer(grads))
            return (loss, norm, lr) + attention + signal + skipped
        loss, measured = self._measured_outputs(loss, grads, grad_sq, skip_update, measure)
        return (loss, norm, lr) + measured + attention + signal + skipped


class TrainOneStepWithGradNormAndLossScale(_LayerStatsStep, nn.TrainOneStepWithLossScaleCell):
    """Loss-scale train step returning ``(loss, overflow, loss_scale, lr, grad_norm)`` (MindFormers' order).

    ``scale_sense`` is a ``DynamicLossScaleUpdateCell``/``FixedLossScaleUpdateCell`` or a Tensor,
    as for ``nn.TrainOneStepWithLossScaleCell``. The norm is of the unscaled gradients; steps
    that overflow skip the update, as in MindSpore's own cell.
    """

    mindwatch_outputs = vocab.STEP_OUTPUTS

    def __init__(
        self,
        network: nn.Cell,
        optimizer: nn.Optimizer,
        scale_sense,
        max_grad_norm: float | None = None,
        layer_stats: bool = False,
    ) -> None:
        super().__init__(network, optimizer, scale_sense)
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        self.max_grad_norm = max_grad_norm
        self._setup_layer_stats(layer_stats)
        # MindSpore's own overflow check uses an Ascend-only op off GPU; on CPU check for inf/nan directly.
        self._cpu_target = ms.get_context("device_target") == "CPU"

    def get_overflow_status(self, status, compute_output):
        if self._cpu_target:
            return self._get_distributed_overflow_status_on_infnan_mode(_ascend_grad_overflow, compute_output)
        return super().get_overflow_status(status, compute_output)

    def construct(self, *inputs, measure=None):
        weights = self.weights
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        scaling_sens_filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, weights)(*inputs, scaling_sens_filled)
        local_grads = self.hyper_map(ops.partial(_grad_scale, scaling_sens), grads)
        grads = self.grad_reducer(local_grads)
        cond = self.get_overflow_status(status, grads)
        overflow = self.process_loss_scale(cond)
        grads, grad_sq, norm, lr = self._norm_and_clip(grads)
        attention = self._attention(loss)
        signal = self._signal(local_grads)
        skip_update, skipped = self._skip(loss, norm, overflow)
        if self.layer_stats is None:
            if not skip_update:
                loss = ops.depend(loss, self.optimizer(grads))
            return (loss, overflow, ops.cast(scaling_sens, ms.float32), lr, norm) + attention + signal + skipped
        loss, measured = self._measured_outputs(loss, grads, grad_sq, skip_update, measure)
        return (loss, overflow, ops.cast(scaling_sens, ms.float32), lr, norm) + measured + attention + signal + skipped


_grad_scale = ops.MultitypeFuncGraph("mindwatch_grad_scale")


@_grad_scale.register("Tensor", "Tensor")
def _scale_grad(scale, grad):
    return grad * ops.cast(ops.Reciprocal()(scale), ops.dtype(grad))
