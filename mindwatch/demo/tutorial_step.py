"""The MindSpore 2.x tutorial's training step, for a loop of your own: ``value_and_grad`` over the optimizer's
parameters and ``optimizer(grads)``, compiled with ``@ms.jit``.

Example::

    from mindwatch.demo.tutorial_step import jit_train_step

    train_step = jit_train_step(LanguageModelLoss(TinyGPT(cfg)), optimizer)
    loss, grads = train_step(ids, targets)      # then run.step(loss=loss, grads=grads)

    train_step = jit_train_step(loss_net, optimizer, norm_in_step=True)
    loss, norm = train_step(ids, targets)       # then run.step(loss=loss, grad_norm=norm): the cheapest read
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mindspore as ms
from mindspore import nn

from mindwatch.mindspore.reduction import grad_norm


def jit_train_step(
    loss_net: nn.Cell, optimizer: nn.Optimizer, *, norm_in_step: bool = False
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """``train_step(inputs, targets) -> (loss, grads)``: one update of ``optimizer``, the gradients in the order of
    ``optimizer.parameters``; with ``norm_in_step``, ``(loss, grad_norm)``: the norm computed in the step's graph
    (:func:`mindwatch.mindspore.grad_norm`)."""
    grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)

    @ms.jit
    def train_step(inputs, targets):
        loss, grads = grad_fn(inputs, targets)
        optimizer(grads)
        return loss, grads

    @ms.jit
    def train_step_with_norm(inputs, targets):
        loss, grads = grad_fn(inputs, targets)
        optimizer(grads)
        return loss, grad_norm(grads)

    return train_step_with_norm if norm_in_step else train_step
