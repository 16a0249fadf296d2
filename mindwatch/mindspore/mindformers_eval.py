"""MindFormers' evaluation in training (``do_eval``), recorded: its ``EvalCallBack`` only logs the result.

Example::

    watch_evaluations()                         # once MindFormers is imported: register() calls it
    listen(callback.evaluated)                  # the callback, at train begin (it wraps the trainer too, once)
    trainer.train()                             # each do_eval's result reaches callback.evaluated(result, ...)
    stop_listening(callback.evaluated)          # the callback, when its run ends

MindFormers 1.9's ``BaseTrainer`` evaluates in training through ``_evaluate_in_training(model, eval_dataset)``, which
calls ``model.eval`` without callbacks and hands the result (``{'PerplexityMetric': {'loss': 5.55, 'PPL': 257.6}}``)
to ``EvalCallBack``, which logs it. This wraps that method: its result, its seconds and the samples evaluated go to
the callbacks listening (the ``MonitorCallback`` training), on the training thread, at the step boundary it ran at.
Imports nothing of the front doors (``callback.py`` listens; ``mindformers.py``'s ``register()`` patches early).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("mindwatch")

#: ``listener(results, eval_time=secs, samples=n)``: who hears of an evaluation (the callbacks training now).
Listener = Callable[..., None]
_listeners: list[Listener] = []
_TRAINER = "mindformers.trainer.base_trainer"


def watch_evaluations() -> bool:
    """Wrap MindFormers' ``BaseTrainer._evaluate_in_training`` (once; only where MindFormers is imported already).
    True when it is wrapped."""
    module = sys.modules.get(_TRAINER)
    trainer = getattr(module, "BaseTrainer", None)
    evaluate = getattr(trainer, "_evaluate_in_training", None)
    if evaluate is None:
        return False
    if getattr(evaluate, "mindwatch", False):
        return True

    def _evaluate_in_training(self: Any, model: Any, eval_dataset: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        output = evaluate(self, model, eval_dataset, *args, **kwargs)
        secs = time.perf_counter() - began
        samples = None
        with contextlib.suppress(Exception):  # a dataset that cannot say: the samples are left out
            samples = int(eval_dataset.get_dataset_size()) * int(eval_dataset.get_batch_size())
        for listener in list(_listeners):
            try:
                listener(output, eval_time=secs, samples=samples)
            except Exception as e:  # noqa: BLE001  # the monitor never breaks the training's evaluation
                log.warning("mindwatch: MindFormers' evaluation could not be recorded: %r", e)
        return output

    _evaluate_in_training.mindwatch = True  # type: ignore[attr-defined]
    trainer._evaluate_in_training = _evaluate_in_training  # type: ignore[union-attr]
    return True


def listen(listener: Listener) -> None:
    """``listener`` hears of each MindFormers evaluation in training, until :func:`stop_listening`."""
    watch_evaluations()
    if listener not in _listeners:
        _listeners.append(listener)


def stop_listening(listener: Listener) -> None:
    with contextlib.suppress(ValueError):
        _listeners.remove(listener)
