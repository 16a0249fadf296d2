"""Console summary: one line every ``interval`` seconds, on the worker thread.

Example output::

    mindwatch step 120/1,500 (8 %) | ETA 2m 51s | loss 2.3100 | lr 1.00e-04 | grad_norm 0.93 | 12.3 ms/step (data 3%)
    mindwatch step 120 | loss 2.3100 | tok/s 81,920 | TFLOPS 178.4 | MFU 36.1 % | 412.0 ms/step (data 1%)   # an LLM
    mindwatch step 120 (total unknown) | loss 2.3100 | ...      # an endless dataset: no guess
    mindwatch step 120 (epoch 3) eval | loss 0.5512 | accuracy 0.8123 | 0.4 s, 512 samples   # an evaluation, at once

The total comes from ``Model.train`` (:attr:`ConsoleSummary.total_steps`, set at train begin);
the ETA from the step rate of the last minute (:mod:`mindwatch.analysis.progress`). An evaluation's record
(``eval/<name>``, docs/evaluation.md) is a line of its own the moment it arrives (:func:`format_evaluation`, which
``mindwatch tail`` prints too), never a summary: the summary line stays the newest step's.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from mindwatch import metrics as vocab
from mindwatch.analysis.progress import Progress, StepRate
from mindwatch.store.jsonl import decode_value
from mindwatch.store.sink import BaseSink
from mindwatch.units import format_duration, format_ms, format_number

log = logging.getLogger("mindwatch")


def format_summary(rec: dict[str, Any], progress: Progress | None = None, running: bool = True) -> str:
    """The one-line summary of a record; with ``progress``, the step out of planned and the ETA lead."""
    parts = [progress.text(running)] if progress is not None else [f"step {rec.get('step')}"]

    def num(key: str, fmt: str, label: str | None = None, scale: float = 1.0, suffix: str = "") -> None:
        v = rec.get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{label or key} {format(v * scale, fmt)}{suffix}")

    num("loss", ".4f")
    num("lr", ".2e")
    num("grad_norm", ".3g")
    num("loss_scale", ".0f")
    num("tokens_per_second", ",.0f", "tok/s")
    num("samples_per_second", ",.1f", "samples/s")
    num(vocab.TFLOPS, ".4g", "TFLOPS")  # per device; significant digits, for a CPU's small numbers too
    num(vocab.MFU, ".1f", "MFU", suffix=" %")
    st, dt = rec.get("step_time"), rec.get("data_time")
    if isinstance(st, (int, float)) and st > 0:
        data = f" (data {100 * dt / st:.0f}%)" if isinstance(dt, (int, float)) else ""
        parts.append(f"{st * 1000:.1f} ms/step{data}")
    num("host_rss_gb", ".2f", "rss", suffix=" GB")
    num("device_mem_gb", ".2f", "device", suffix=" GB")
    return "mindwatch " + " | ".join(parts)


def format_evaluation(rec: dict[str, Any]) -> str:
    """An evaluation in one line: ``step 120 (epoch 3) eval | loss 0.5512 | accuracy 0.8123 | 0.4 s, 512 samples``.

    Its results without the ``eval/`` prefix (the loss first, then the vocabulary's order, then by name), 4
    significant digits (:func:`mindwatch.units.format_number`); its time and samples when recorded."""
    epoch = decode_value(rec.get("epoch"))
    where = f"step {rec.get('step')}" + (f" (epoch {int(epoch)})" if epoch is not None and epoch.is_integer() else "")
    names = sorted((k for k in rec if vocab.is_eval(k)), key=lambda k: vocab.order_key(k.removeprefix(vocab.EVAL_PREFIX)))
    parts = [f"{where} eval", *(f"{k.removeprefix(vocab.EVAL_PREFIX)} {format_number(decode_value(rec[k]))}" for k in names)]
    secs, samples = decode_value(rec.get(vocab.EVAL_TIME)), decode_value(rec.get(vocab.EVAL_SAMPLES))
    cost = []
    if secs is not None and math.isfinite(secs):
        cost.append(format_ms(secs) if secs < 0.1 else format_duration(secs))  # 40 ms, not "0.0 s"
    if samples is not None and samples.is_integer():
        cost.append(f"{format_number(int(samples))} samples")
    if cost:
        parts.append(", ".join(cost))
    return " | ".join(parts)


class ConsoleSummary(BaseSink):
    """Logs :func:`format_summary` of the newest step's record at most every ``interval`` seconds, and each
    evaluation (:func:`format_evaluation`) as it arrives."""

    def __init__(self, interval: float = 30.0, logger: logging.Logger = log, total_steps: int | None = None) -> None:
        self.interval = interval
        self.logger = logger
        #: The step the training ends at; None: unknown (the line says so). Set once at train begin.
        self.total_steps = total_steps
        self._rate = StepRate()
        self._last = -1e18
        self._newest: dict[str, Any] | None = None

    def write(self, records: list[dict[str, Any]]) -> None:
        rate, stepped = self._rate, False
        for rec in records:
            if vocab.is_evaluation(rec):  # its own line, now: an evaluation is rare and the summary would hide it
                self.logger.info("mindwatch %s", format_evaluation(rec))
                continue
            step, t = rec.get("step"), rec.get("t")
            if isinstance(step, int) and isinstance(t, (int, float)):
                rate.add(step, t)
            self._newest, stepped = rec, True
        now = time.monotonic()
        if stepped and self._newest is not None and now - self._last >= self.interval:
            self._last = now
            self.logger.info(format_summary(self._newest, self.progress()))

    def plan(self, total_steps: int | None) -> None:
        self.total_steps = total_steps

    def progress(self) -> Progress:
        """Where the newest record is out of :attr:`total_steps`, and the current rate."""
        step = self._newest.get("step") if self._newest else None
        return Progress(step if isinstance(step, int) else None, self.total_steps, self._rate.value)

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        if self._newest is not None:
            self.logger.info(format_summary(self._newest, self.progress(), running=False))
        why = f": {error or reason}" if (error or reason) else ""
        self.logger.info("mindwatch: run %s%s", state, why)
