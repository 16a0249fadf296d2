"""Probes that read what a step did: the learning rate it used, memory, attention entropy."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindwatch import metrics as vocab
from mindwatch.system import nvml_handle

log = logging.getLogger("mindwatch")


class LrProbe:
    """The learning rate a step used: the optimizer's rate at the optimizer's own ``global_step`` as the step ran.

    Example::

        probe = LrProbe(optimizer)
        probe.before(step)                    # before a step that is recorded: the global_step it runs at
        ...                                   # the step
        lr = probe.used(step, applied=True)   # after it: the rate it used (``applied``: whether the optimizer ran)
        probe(step + 1)                       # between steps: the rate the next step will use

    ``global_step`` (a Parameter; one scalar read) counts the updates the optimizer applied: a skipped step (the
    optimizer did not run) or a restart that did not restore it leaves it apart from the step count, and the rate
    follows it, not the count. At step end it has advanced if the step updated: a step read :meth:`before` uses that
    value; another (a skipped step, recorded only because it was skipped, or the first) is read after it, one less
    when ``applied``. An optimizer without ``global_step`` falls back to the step count. A fixed rate and a
    per-step list are held on the host; a ``LearningRateSchedule`` is evaluated in a compiled call (its first one
    compiles). Call :meth:`invalidate` after changing the rate. Training thread only.
    """

    def __init__(self, optimizer: nn.Optimizer | None) -> None:
        self.optimizer = optimizer
        self._global_step: ms.Parameter | None = getattr(optimizer, "global_step", None)
        self._fixed: float | None = None
        self._table: np.ndarray | None = None
        self._schedule: Callable[[Any], Any] | None = None
        self._evaluate: Callable[[Any], Any] | None = None
        #: ``(step, global_step)`` read by :meth:`before`: the index ``step`` runs at.
        self._before: tuple[int, int] | None = None
        self.invalidate()

    def invalidate(self) -> None:
        """Read the optimizer's kind of rate again (after ``lr_backoff`` or a wrap of its schedule)."""
        opt = self.optimizer
        self._fixed = self._table = self._schedule = self._evaluate = None
        if opt is None:
            return
        lr = opt.learning_rate
        if isinstance(lr, (tuple, list, ms.ParameterTuple)) or getattr(opt, "is_group_lr", False):
            lr = lr[0]
        if not getattr(opt, "dynamic_lr", False):
            self._fixed = float(lr.asnumpy()) if hasattr(lr, "asnumpy") else float(lr)
        elif type(lr).__name__ == "_IteratorLearningRate":
            self._table = lr.learning_rate.asnumpy().reshape(-1)
        else:
            self._schedule = lr

    def before(self, step: int) -> None:
        """Before step ``step`` runs: the ``global_step`` it will run at (a fixed rate reads nothing)."""
        if self._fixed is None and self._global_step is not None:
            self._before = (step, self._read_global_step())

    def used(self, step: int, *, applied: bool = True) -> float | None:
        """The rate step ``step``, which just ended, used; ``applied``: whether its update was applied (not skipped)."""
        if self._fixed is not None:
            return self._fixed
        if self._global_step is None:
            return self._at(step - 1)
        if self._before is not None and self._before[0] == step:
            return self._at(self._before[1])
        return self._at(self._read_global_step() - (1 if applied else 0))

    def __call__(self, step: int) -> float | None:
        """The rate the next step, step ``step``, will use (at ``global_step`` now): what ``lr_backoff`` reports."""
        if self._fixed is not None:
            return self._fixed
        return self._at(self._read_global_step() if self._global_step is not None else step - 1)

    def _read_global_step(self) -> int:
        assert self._global_step is not None
        return int(self._global_step.item())  # one value, copied: ~1 us here (asnumpy() ~4 us, more inside a training)

    def _at(self, index: int) -> float | None:
        index = max(index, 0)
        if self._table is not None:
            return float(self._table[min(index, len(self._table) - 1)])
        if self._schedule is None:
            return None
        global_step = ms.Tensor(index, ms.int32)
        if self._evaluate is None:
            self._evaluate = _compiled(self._schedule)
            try:
                return float(self._evaluate(global_step).asnumpy())
            except Exception:  # a schedule the graph compiler refuses: op by op, as a PyNative optimizer runs it
                log.debug("mindwatch: the lr schedule does not compile; it is evaluated op by op", exc_info=True)
                self._evaluate = self._schedule
        return float(self._evaluate(global_step).asnumpy())


def _compiled(schedule: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``schedule`` as one compiled call: ~0.2 ms on CPU, against ~2 ms op by op in PyNative."""

    @ms.jit
    def evaluate(global_step):
        return schedule(global_step)

    return evaluate


def device_memory_sampler() -> Callable[[], dict[str, float]] | None:
    """Device memory in use and its peak, in GB, where the device reports it; None on CPU.

    MindSpore's own allocator statistics (``mindspore.runtime``) first; on NVIDIA GPUs whose
    allocator reports nothing, NVML (``pip install nvidia-ml-py``) for the device in use.
    """
    target = ms.get_context("device_target")
    if target == "CPU":
        return None
    from mindspore import runtime

    nvml = nvml_handle(int(ms.get_context("device_id") or 0)) if target == "GPU" else None
    peak = 0.0

    def sample() -> dict[str, float]:
        nonlocal peak
        used = runtime.memory_allocated()
        if used:
            return {vocab.DEVICE_MEM_GB: used / 1e9, vocab.DEVICE_MEM_PEAK_GB: runtime.max_memory_allocated() / 1e9}
        if nvml is not None:
            info = nvml[0].nvmlDeviceGetMemoryInfo(nvml[1])
            peak = max(peak, info.used / 1e9)
            return {vocab.DEVICE_MEM_GB: info.used / 1e9, vocab.DEVICE_MEM_PEAK_GB: peak}
        return {}

    return sample


def model_seq_length(network: Any) -> int | None:
    """The sequence length the model trains on, where its config says it (MindFormers' models:
    ``config.seq_length``): its ``input_ids`` hold one more token, the labels' shift, which is not trained on."""
    if not isinstance(network, nn.Cell):
        return None
    for _, cell in network.cells_and_names():
        seq = getattr(getattr(cell, "config", None), "seq_length", None)
        if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0:
            return seq
    return None


def attention_cells(network: nn.Cell, patterns: list[str]) -> list[tuple[str, nn.Cell]]:
    """Cells whose output is attention probabilities: by name pattern, or by default every
    ``Softmax`` cell under a cell whose name mentions attention."""
    found = []
    for name, cell in network.cells_and_names():
        if not name:
            continue
        if patterns:
            if any(fnmatch.fnmatch(name, p) for p in patterns):
                found.append((name, cell))
        elif isinstance(cell, nn.Softmax) and ("attn" in name.lower() or "attention" in name.lower()):
            found.append((name, cell))
    return found


class AttentionEntropy:
    """Forward hooks (PyNative only) that compute the mean entropy of attention rows on sampled steps.

    ``entropy = -sum(p * log p)`` over the key axis, averaged over batch, heads and queries, in nats.
    """

    def __init__(self, cells: list[tuple[str, nn.Cell]]) -> None:
        self.sampling = False
        self.values: dict[str, float] = {}
        self._handles = []
        for name, cell in cells:
            layer = _layer_name(name)
            self._handles.append(cell.register_forward_hook(self._hook(f"{vocab.ATTENTION_ENTROPY}/{layer}")))

    def _hook(self, key: str) -> Callable[..., None]:
        def hook(cell: nn.Cell, inputs: Any, output: Any) -> None:
            if self.sampling:
                p = output[0] if isinstance(output, (tuple, list)) else output
                p = ops.cast(p, ms.float32)
                ent = -(p * ops.log(ops.clamp(p, 1e-12, None))).sum(axis=-1).mean()
                self.values[key] = float(ent.asnumpy())

        return hook

    def take(self) -> dict[str, float]:
        out, self.values = self.values, {}
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


_WRAPPERS = ("network.", "_backbone.", "backbone.")


def _layer_name(cell_name: str) -> str:
    """``network.network.blocks.0.attn.softmax`` -> ``blocks.0.attn``: no train/loss wrapper prefixes."""
    name = cell_name
    while name.startswith(_WRAPPERS):
        name = name.split(".", 1)[1]
    return name[: -len(".softmax")] if name.endswith(".softmax") else name
