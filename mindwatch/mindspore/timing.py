"""Step timing: how long a step took, how long it waited for its batch, and the throughput that gives.

Example::

    timer = StepTimer(batch_size=32, seq_length=None, flops=FlopsBasis(parameters=124_000_000, peak_tflops=989.0))
    timer.restart(time.perf_counter())          # training begins
    timer.waited(0.004)                         # the loop waited 4 ms for a batch
    timer.add(rec, steps=1, now=time.perf_counter())   # step_time, data_time, samples_per_second (tokens_per_second,
                                                       # tflops and mfu once the tokens per step are known)

Both front doors use it (training thread only): ``MonitorCallback`` counts the time between a step's
end and the next step's begin as the data wait; ``Run.batches`` times the iterator's ``next``.
TFLOPS come from numbers already there: a step's FLOPs (known once, at start or from the first batch's
shape) over its step time; no tensor is read for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Integer dtypes whose 2-D batches are token ids, ``(batch, sequence)``; names, so this module needs no MindSpore.
_INTEGER_DTYPES = frozenset({"Int8", "Int16", "Int32", "Int64", "UInt8", "int8", "int16", "int32", "int64", "uint8"})


@dataclass(frozen=True)
class FlopsBasis:
    """What ``tflops`` and ``mfu`` are computed from (meta.json's ``throughput``): the model FLOPs of one step on one
    device (``throughput.flops_per_step``), else the trainable parameters for ``6 x parameters x tokens``; the
    device's name and its peak TFLOPS (None: no MFU) with where that peak comes from."""

    flops_per_step: float | None = None
    parameters: int | None = None
    device: str | None = None
    peak_tflops: float | None = None
    peak_source: str | None = None

    def step_flops(self, tokens: int | None) -> float | None:
        """The model FLOPs of a step of ``tokens`` tokens (None: not a token model); None when unknown."""
        if self.flops_per_step:
            return self.flops_per_step
        if self.parameters and tokens:
            return 6.0 * self.parameters * tokens  # forward 2, backward 4 FLOPs per parameter and token
        return None

    def meta(self) -> dict[str, Any]:
        """For meta.json: ``flops`` says which estimate ``tflops`` is."""
        flops = "throughput.flops_per_step" if self.flops_per_step else "6 x parameters x tokens per step"
        return {
            "flops": flops,
            "flops_per_step": self.flops_per_step,
            "parameters": self.parameters,
            "device": self.device,
            "peak_tflops": self.peak_tflops,
            "peak_source": self.peak_source,
        }


class StepTimer:
    """Seconds per step and per data wait between two recorded steps, samples (tokens) per second, TFLOPS and MFU."""

    def __init__(
        self,
        batch_size: int | None = None,
        seq_length: int | None = None,
        flops: FlopsBasis | None = None,
        baseline: float | None = None,
    ) -> None:
        """``baseline``: one device's samples per second alone (``throughput.baseline``): ``throughput_linearity``."""
        #: Samples per step, and tokens per sample; None until known (the config, or the first batch's shape).
        self.batch_size = batch_size
        self.seq_length = seq_length
        #: What TFLOPS come from; None: no TFLOPS (switched off).
        self.flops = flops
        #: The model FLOPs of one step, and the device's peak; None while unknown.
        self.step_flops: float | None = None
        self._peak = flops.peak_tflops if flops is not None else None
        self._baseline = baseline
        self._count_flops()
        #: Whether the batch shape still has to be read (only what the config leaves open is).
        self.shape_pending = batch_size is None or seq_length is None
        #: perf_counter() of the last recorded step's end.
        self.last_recorded = 0.0
        #: Seconds waited for data since the last recorded step.
        self.data_wait = 0.0
        #: Samples the steps since the last recorded one took, counted step by step where the batch size changes (a
        #: DynamicBatch); 0: every step took ``batch_size``.
        self.samples = 0

    def restart(self, now: float) -> None:
        """Training (or a new ``Model.train`` call) begins at ``now``."""
        self.last_recorded = now
        self.data_wait = 0.0
        self.samples = 0

    def paused(self, secs: float) -> None:
        """The training stood still ``secs`` (an evaluation between its steps): not a step's time, nor its throughput."""
        self.last_recorded += secs

    def waited(self, secs: float) -> None:
        """The loop waited ``secs`` for a batch."""
        self.data_wait += secs

    def add(self, rec: dict[str, Any], steps: int, now: float) -> None:
        """Put the timings of the ``steps`` steps since the last recorded one into ``rec``; start counting anew."""
        elapsed = now - self.last_recorded
        samples = self.samples or (self.batch_size or 0) * steps
        if steps > 0 and elapsed > 0:
            rec["step_time"] = elapsed / steps
            rec["data_time"] = self.data_wait / steps
            if samples:
                rec["samples_per_second"] = per_second = samples / elapsed
                if self._baseline:
                    rec["throughput_linearity"] = per_second / self._baseline
                if self.seq_length:
                    rec["tokens_per_second"] = samples * self.seq_length / elapsed
            if self.step_flops:
                # a step's FLOPs are of a batch of batch_size samples: steps of other sizes count in proportion
                flops = self.step_flops * (samples / self.batch_size if self.batch_size else steps)
                tflops = flops / elapsed / 1e12
                rec["tflops"] = tflops
                if self._peak:
                    rec["mfu"] = 100.0 * tflops / self._peak
        self.last_recorded = now
        self.data_wait = 0.0
        self.samples = 0

    def read_shape(self, batch: Any) -> None:
        """Learn the batch size (and, for 2-D integer token ids, the sequence length) from a batch: a Tensor or a tuple."""
        self.shape_pending = False
        first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
        if isinstance(first, dict):
            first = next(iter(first.values()), None)
        shape = tuple(getattr(first, "shape", ()) or ())
        if self.batch_size is None and shape:
            self.batch_size = int(shape[0])
        if self.seq_length is None and len(shape) == 2 and str(getattr(first, "dtype", "")) in _INTEGER_DTYPES:
            self.seq_length = int(shape[1])
        self._count_flops()

    def _count_flops(self) -> None:
        if self.flops is not None:
            tokens = self.batch_size * self.seq_length if self.batch_size and self.seq_length else None
            self.step_flops = self.flops.step_flops(tokens)
