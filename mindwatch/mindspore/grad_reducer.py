"""``DistributedGradReducer`` with mindwatch's cross-rank signal inside: a loop's signal rides on its gradient reduction.

Example::

    import mindwatch.mindspore as mw

    reducer = mw.DistributedGradReducer(optimizer.parameters, mean=True)   # in place of nn.DistributedGradReducer

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(reducer(grads))
        return loss, grads

    with mw.start_run(config, network=net, optimizer=optimizer, grad_reducer=reducer) as run:
        ...

It reduces the gradients exactly as ``nn.DistributedGradReducer`` does (same arguments, one instance of it inside),
and sums the signal vector (:mod:`mindwatch.mindspore.rank_signal`) with one more small ``AllReduce`` in the same
compiled step, in the gradients' fusion group, with the norm of the gradients it is given (before their reduction) in
this rank's slot: ``run.step`` records it as ``local_grad_norm``. ``run.step`` writes this rank's slots before each
step and reads the sum after it: every rank acts at the step it asked at, as with ``Model.train``'s train cells, and
the loop makes no collective call of its own (without ``grad_reducer``, ``start_run`` sums the vector with a separate
``AllReduce`` every ``distributed.coordination.loop_every`` calls, and acts at those). The cost is one small
``AllReduce`` a step in the gradients' fusion group: where the backend does not fuse it (CPU), the mean step was 1.07
of the bare loop's against 1.03 for ``loop_every`` sums (``python -m bench loop``).
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch.mindspore.rank_signal import local_norm_slot, routing_parameters, signal_size, sum_signal, with_local_norm


class DistributedGradReducer(nn.Cell):
    """``nn.DistributedGradReducer`` (the same arguments) that also sums mindwatch's signal; see the module docstring."""

    def __init__(self, parameters: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(auto_prefix=False)
        from mindspore.communication import get_group_size, get_rank

        self.reducer = nn.DistributedGradReducer(parameters, *args, **kwargs)
        zeros = np.zeros(signal_size(get_group_size()), np.float32)
        #: This rank's slots, written by ``run.step`` before a step (``RankSignal.send``).
        self.mindwatch_signal = ms.Parameter(ms.Tensor(zeros), name="mindwatch_signal", requires_grad=False)
        #: Every rank's slots summed by the step, read by ``run.step`` after it.
        self.mindwatch_signal_sum = ms.Parameter(ms.Tensor(zeros), name="mindwatch_signal_sum", requires_grad=False)
        self._signal_sum = ops.AllReduce().add_prim_attr("fusion", 1)
        #: This rank's ``local_grad_norm`` slot: the norm of the gradients it is given, before their reduction.
        self._local_norm_slot = local_norm_slot(get_rank(), get_group_size())
        #: The model's RouterStats vectors, summed with the signal (``start_run`` sets them: :meth:`sum_routing`).
        self.routing_values = self.mindwatch_routing_sum = None

    def sum_routing(self, network: Any) -> None:
        """Sum ``network``'s ``RouterStats`` vectors over the ranks with the signal, before the step compiles
        (``start_run`` calls it): every rank records the whole batch's routing."""
        self.routing_values, self.mindwatch_routing_sum = routing_parameters(network)

    def construct(self, grads):
        reduced = self.reducer(grads)
        signal = with_local_norm(self.mindwatch_signal, grads, self._local_norm_slot)
        summed = sum_signal(self._signal_sum, signal, self.routing_values, self.mindwatch_routing_sum)
        return ops.depend(reduced, ops.assign(self.mindwatch_signal_sum, summed))
