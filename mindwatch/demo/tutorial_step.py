"""The MindSpore 2.x tutorial's training step, for a loop of your own: ``value_and_grad`` over the optimizer's
parameters and ``optimizer(grads)``, compiled with ``@ms.jit``.

Example::

    from mindwatch.demo.tutorial_step import jit_train_step

    train_step = jit_train_step(LanguageModelLoss(TinyGPT(cfg)), optimizer)
    loss, grads = train_step(ids, targets)      # then run.step(loss=loss, grads=grads)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mindspore as ms
from mindspore import nn


def jit_train_step(loss_net: nn.Cell, optimizer: nn.Optimizer) -> Callable[[Any, Any], tuple[Any, Any]]:
    """``train_step(inputs, targets) -> (loss, grads)``: one update of ``optimizer``, the gradients in the order of
    ``optimizer.parameters``."""
    grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters)

    @ms.jit
    def train_step(inputs, targets):
        loss, grads = grad_fn(inputs, targets)
        optimizer(grads)
        return loss, grads

    return train_step
