"""Decode ``net_outputs`` of a train step into named values (loss, grad_norm, lr, overflow, loss_scale).

Layouts understood:

- a Tensor or a number: the loss;
- a train cell with a ``mindwatch_outputs`` attribute (ours): names by position;
- MindFormers' layouts, by length: 3 ``(loss, overflow, scaling_sens)``,
  4 ``(..., learning_rate)``, 5 ``(..., global_norm)``, 7 ``(..., local_norm, size)``
  (as MindFormers 1.9's ``_get_loss_output`` reads them; ``global_norm`` is None without clipping);
- any other tuple: its first item is the loss (e.g. ``return_grad=True``'s ``(loss, grads)``).
"""

from __future__ import annotations

from typing import Any

from mindwatch.metrics import GRAD_NORM, LOSS, LOSS_SCALE, LR, OVERFLOW, RECORDED_OUTPUTS

#: MindFormers' train-cell output layouts, by tuple length (global_norm may be None).
MINDFORMERS_LAYOUTS: dict[int, tuple[str, ...]] = {
    3: (LOSS, OVERFLOW, LOSS_SCALE),
    4: (LOSS, OVERFLOW, LOSS_SCALE, LR),
    5: (LOSS, OVERFLOW, LOSS_SCALE, LR, GRAD_NORM),
    7: (LOSS, OVERFLOW, LOSS_SCALE, LR, GRAD_NORM, "local_norm", "size"),
}


def output_layout(net_outputs: Any, declared: tuple[str, ...] | None) -> tuple[tuple[int, str], ...]:
    """``(position, name)`` of each value to record from ``net_outputs``; position -1: the output itself is the loss.

    Worked out once per training, so the per-step decoding is a short loop.
    """
    if not isinstance(net_outputs, (tuple, list)):
        return ((-1, LOSS),)
    if declared is not None and len(declared) == len(net_outputs):
        names = declared
    else:
        names = MINDFORMERS_LAYOUTS.get(len(net_outputs), (LOSS,))
    # local_norm and size are MindFormers internals, not metrics
    return tuple((i, name) for i, name in enumerate(names) if name in RECORDED_OUTPUTS)


def to_float(value: Any) -> float | None:
    """A Tensor, numpy value or number as a float (a device sync for Tensors); None if not a number.

    A non-scalar (MindFormers' loss has shape ``(1,)``, a per-micro-batch loss more) gives its mean,
    as MindFormers' ``_get_loss_output`` does (``np.mean(loss.asnumpy())``).
    """
    if type(value) is float:
        return value
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    asnumpy = getattr(value, "asnumpy", None)
    if asnumpy is not None and getattr(value, "size", 0) == 1:
        return float(value.item())  # a Tensor of one value: item() reads it in ~2-6 us, asnumpy() in 7-47 us
    arr = asnumpy() if asnumpy is not None else value
    try:
        if getattr(arr, "size", 1) != 1:
            return float(arr.mean()) if getattr(arr, "size", 0) else None
        return float(arr)
    except (TypeError, ValueError):
        return None


def decode_outputs(net_outputs: Any, layout: tuple[tuple[int, str], ...], out: dict[str, Any]) -> None:
    """Put the values ``layout`` names (see :func:`output_layout`) into ``out`` as floats."""
    for i, name in layout:
        v = to_float(net_outputs if i < 0 else net_outputs[i])
        if v is not None:
            out[name] = v
