"""An evaluation's results: recorded as ``eval/<name>``, agreed across ranks, judged, and the best weights kept.

Example::

    evaluations = Evaluations(session, state=rewind_state(net, opt), saved=train_net, act=interventions.act)
    evaluations.add(step=120, epoch=3, results={"loss": 0.55, "accuracy": 0.81}, secs=0.4, samples=512, boundary=b)
    evaluations.close("finished")      # alerts.early_stopping.restore_best: the best evaluation's weights back

Both front doors hand an evaluation here (``Model.fit``'s ``eval_results`` and ``Model.eval``'s ``metrics`` from the
callback's ``on_eval_end``, a loop's ``run.eval``), at the boundary after the training step it ran after:

- **recorded**: one record at that step, ``eval/<name>`` for each scalar result, the ``epoch``, ``eval_time`` (s) and
  ``eval_samples``; ``eval/perplexity`` (exp of ``eval/loss``, else ``eval/eval_loss``) with
  ``evaluation.perplexity``. A result that is not a scalar (``nn.ConfusionMatrix``'s matrix) is not a metric: it is
  kept in ``evaluations.rank<R>.jsonl`` (a table the report shows), never a crash.
- **agreed**: in a multi-rank run where something acts on it (early stopping, the non-finite rule's actions) every rank
  evaluates, and the value judged is the primary metric's (rank 0's, or the ranks' mean: ``evaluation.ranks``), summed
  over the ranks in one small ``AllReduce`` at this boundary, the same on every rank. So every rank decides alike, at
  the same evaluation. Where nothing acts, there is no collective: a loop may evaluate on rank 0 alone.
- **judged**: ``alerts.early_stopping`` (``base.Progress``) acts at this boundary, on every rank: its ``stop``
  lands at the end of the epoch (or loop step) whose evaluation decided it. A NaN/Inf result is a ``nonfinite``
  alert (the agreed primary with the rule's actions).
- **kept**: at each new best, ``evaluation.keep_best`` saves ``checkpoints/best.ckpt`` (rank 0) and
  ``early_stopping.restore_best`` copies the weights and the optimizer's state into host memory (one snapshot, the
  rewind's); :meth:`Evaluations.close` puts it back before the run ends.

No per-step work: nothing here runs between evaluations. Training thread only.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import mindspore as ms
import numpy as np

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert, make_alert
from mindwatch.alerts.rules.base import Evaluation, Progress, not_improved
from mindwatch.mindspore.rank_signal import sum_over_ranks
from mindwatch.mindspore.rewind import Snapshots
from mindwatch.units import format_number

if TYPE_CHECKING:
    from mindwatch.mindspore.actions import StepBoundary
    from mindwatch.session import RunSession

log = logging.getLogger("mindwatch")
_wall = __import__("time").time


def eval_metrics(results: Any, secs: float | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """An evaluation's ``results`` (``{name: value}``) as the metrics a record holds, ``eval/<name>`` for each scalar (a
    Tensor or numpy value of one element too; NaN and Inf as they are) and ``eval_time`` (s), and the results that are
    not scalars (``{name: nested list}``: a confusion matrix), kept apart."""
    out: dict[str, float] = {}
    tables: dict[str, Any] = {}
    for name, value in flattened(results).items():
        number = _scalar(value)
        if number is not None:
            out[f"{vocab.EVAL_PREFIX}{name}"] = number
            continue
        table = _table(value)
        if table is None:
            log.warning("mindwatch: the evaluation's %r is not a number (%s): not recorded", name, type(value).__name__)
        else:
            tables[name] = table
    if out and secs is not None:
        out[vocab.EVAL_TIME] = float(secs)
    return out, tables


def flattened(results: Any) -> dict[str, Any]:
    """``{name: value}`` of an evaluation's results: a metric's own dict (MindFormers' ``{'PerplexityMetric': {'loss':
    5.55, 'PPL': 257.6}}``) gives its names as they are when it is the only metric, else ``<metric>/<name>``."""
    results = dict(results or {})
    nested = [k for k, v in results.items() if isinstance(v, dict)]
    out: dict[str, Any] = {}
    for name, value in results.items():
        if isinstance(value, dict):
            for inner, v in value.items():
                out[str(inner) if len(results) == 1 else f"{name}/{inner}"] = v
        else:
            out[str(name)] = value
    return out if nested else results


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    if isinstance(value, ms.Tensor):
        value = value.asnumpy()
    if isinstance(value, np.ndarray) and value.size == 1:
        return float(value.reshape(-1)[0])
    return None


def _table(value: Any) -> Any:
    """A result that is not a scalar as JSON (a matrix's rows), or None when it is not numbers."""
    if isinstance(value, ms.Tensor):
        value = value.asnumpy()
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if array.ndim == 0 or array.size > 100_000:
        return None
    return [None if not math.isfinite(v) else v for v in array.reshape(-1).tolist()] if array.ndim == 1 else _rows(array)


def _rows(array: np.ndarray) -> list[Any]:
    return [_table(row) for row in array]


class Evaluations:
    """A run's evaluations (see the module docstring). ``act(alert, step, boundary)`` carries out an alert's actions at
    this boundary (``Interventions.act``); ``state``: what a best copy holds (the rewind's Parameters), ``saved``: what
    ``best.ckpt`` holds (the train network, or a loop's ``{name: Parameter}``)."""

    def __init__(
        self,
        session: RunSession,
        *,
        state: dict[str, ms.Parameter] | None,
        saved: Any,
        act: Callable[[Alert, int, StepBoundary], None],
    ) -> None:
        cfg = session.config
        self.session = session
        self.settings = cfg.evaluation
        stopping = cfg.alerts.early_stopping
        #: ``alerts.early_stopping`` when on (None: off).
        self.stopping = stopping if cfg.alerts.enabled and stopping.enabled else None
        self.rank, self.world_size = session.rank, session.world_size
        self._act = act
        self.primary: str | None = None
        self.progress: Progress | None = None
        #: The best evaluation's state in host memory (``restore_best``); None: not kept.
        self.best_copy = Snapshots(state, keep=1) if self.stopping and self.stopping.restore_best and state else None
        if self.stopping and self.stopping.restore_best and not state:
            log.warning(
                "mindwatch: early_stopping.restore_best needs the network and the optimizer (start_run(network=, optimizer=))"
            )
        self.saved = saved if self.settings.keep_best and self.rank == 0 else None
        if self.settings.keep_best and self.rank == 0 and saved is None:
            log.warning("mindwatch: evaluation.keep_best needs the network (start_run(network=)): no best.ckpt")
        self.count = 0
        self._stopped = False
        #: Whether anything acts on the agreed value (early stopping, the non-finite rule's actions): only then do
        #: the ranks agree on it in a collective, which every rank must then reach at every evaluation.
        self._acts = self.stopping is not None or bool(cfg.alerts.nonfinite.enabled and cfg.alerts.nonfinite.actions)
        self._said_missing = False
        self._said_unagreed = False

    def memory(self) -> dict[str, Any] | None:
        """What ``meta.json`` states of the best copy: its bytes (None: none is kept)."""
        return {"best_copy_bytes": self.best_copy.nbytes} if self.best_copy is not None else None

    # -- an evaluation ---------------------------------------------------------------------------------------------
    def add(
        self,
        step: int,
        epoch: int | None,
        results: Any,
        *,
        secs: float | None = None,
        samples: int | None = None,
        boundary: StepBoundary | None = None,
    ) -> None:
        """Record, agree on, judge and keep the evaluation after ``step`` (see the module docstring). Whatever fails
        here (a fault of ours, said by the caller's failure policy), this rank still takes part in the ranks' sum."""
        try:
            metrics, rec = self._record(step, epoch, results, secs, samples)
        except BaseException:
            if self.world_size > 1 and self._acts:
                self._agreed({})  # the other ranks sum at this evaluation: no rank waits for this one
            raise
        value = self._agreed(metrics)
        if rec is None:
            return
        ev = Evaluation(int(step), rec.get("epoch"), value) if value is not None else None
        self._nonfinite(rec, ev, boundary)
        if ev is None or self.progress is None:
            return
        if self.progress.add(ev):
            self._new_best(ev)
        stopping = self.stopping
        if stopping is not None and not self._stopped and self.progress.waited >= stopping.patience:
            self._stopped = True
            assert self.primary is not None
            self._decide(
                make_alert(
                    "early_stopping",
                    step=ev.step,
                    rank=self.rank,
                    message=f"early stopping: {not_improved(self.primary, self.progress)}",
                    metric=self.primary,
                    value=ev.value,
                    threshold=self.progress.best.value if self.progress.best else None,
                    actions=stopping.actions,
                    epoch=ev.epoch,
                    best_step=self.progress.best.step if self.progress.best else None,
                    best_epoch=self.progress.best.epoch if self.progress.best else None,
                ),
                int(step),
                boundary,
            )

    def _record(
        self, step: int, epoch: int | None, results: Any, secs: float | None, samples: int | None
    ) -> tuple[dict[str, float], dict[str, Any] | None]:
        """The evaluation's metrics and the record handed to the worker (None: it holds no scalar result)."""
        metrics, tables = eval_metrics(results, secs)
        if tables:
            self._keep_tables(step, epoch, tables)
        if not metrics:
            return metrics, None
        self.count += 1
        if self.settings.perplexity:
            loss = metrics.get(vocab.EVAL_LOSS, metrics.get(vocab.EVAL_FIT_LOSS))
            if loss is not None:
                metrics[f"{vocab.EVAL_PREFIX}{vocab.PERPLEXITY}"] = perplexity(loss)
        rec: dict[str, Any] = {"step": int(step), "t": _wall(), "rank": self.rank}
        if epoch is not None:
            rec["epoch"] = int(epoch)
        rec.update(metrics)
        if samples is not None:
            rec[vocab.EVAL_SAMPLES] = int(samples)
        self.session.monitor.record(rec)
        return metrics, rec

    def close(self, state: str) -> None:
        """The run ends ``state``: with ``restore_best``, the best evaluation's weights back first (a training that
        ended on its own or was stopped; a failed one is left as it failed)."""
        copy, best = self.best_copy, self.progress.best if self.progress is not None else None
        if copy is None or not copy.held or best is None or state not in ("finished", "stopped"):
            return
        try:
            copy.restore(copy.held[-1])
        except Exception as e:  # noqa: BLE001  # the run ends anyway: say it, keep the weights as they are
            log.warning("mindwatch: the best evaluation's weights could not be put back: %r", e)
            return
        self.session.monitor.alert(
            make_alert(
                "intervention",
                step=best.step,
                rank=self.rank,
                message=f"put back the weights of the best evaluation ({self.primary} {format_number(best.value)} at "
                f"{best.where()}) before the run ended",
                severity="info",
                actions=["restore_best"],
                cause="early_stopping",
                metric=self.primary,
                value=best.value,
            )
        )

    # -- internals -------------------------------------------------------------------------------------------------
    def _agreed(self, metrics: dict[str, float]) -> float | None:
        """The primary metric's value the rules judge: this rank's alone, or agreed over the ranks (every rank calls
        this at every evaluation, whatever it recorded, so the collective always matches)."""
        if self.primary is None:
            self.primary = vocab.eval_primary(metrics, self.settings.primary)
            if self.primary is not None:
                self.progress = Progress(vocab.eval_mode(self.primary, self.settings.mode), self._min_delta())
        own = metrics.get(self.primary) if self.primary is not None else None
        if own is None and metrics and not self._said_missing:
            self._said_missing = True
            self._missing(metrics)
        if self.world_size <= 1 or not self._acts:
            return own  # nothing acts on it: no collective (a loop may evaluate on rank 0 alone)
        share = self.settings.ranks == "mean" or self.rank == 0
        vector = np.zeros(3, np.float32)  # the value in two float32 parts (the collective takes no float64), present
        if own is not None and share:
            high = np.float32(own)
            vector[:] = (high, np.float32(own - float(high)) if math.isfinite(own) else 0.0, 1.0)
        try:
            summed = sum_over_ranks(ms.Tensor(vector))
        except Exception as e:  # noqa: BLE001  # no collective here: no value every rank shares, so no rule acts on one
            if not self._said_unagreed:
                self._said_unagreed = True
                log.warning("mindwatch: the ranks could not agree on the evaluation (%r): early stopping acts on none", e)
            return None
        count = float(summed[2])
        return (float(summed[0]) + float(summed[1])) / count if count > 0 else None

    def _min_delta(self) -> float:
        return self.stopping.min_delta if self.stopping is not None else 0.0

    def _missing(self, metrics: dict[str, float]) -> None:
        recorded = ", ".join(k for k in metrics if vocab.is_eval(k)) or "nothing"
        message = (
            f"evaluation.primary is {self.primary}, which this evaluation did not record (it recorded {recorded}): set "
            "evaluation.primary to one of those"
        )
        if self.stopping is not None and not self._stopped:
            message += "; early stopping judges nothing until it is recorded"
        log.error("mindwatch: %s", message)
        self.session.monitor.alert(make_alert("evaluation", step=None, rank=self.rank, message=message, severity="error"))

    def _nonfinite(self, rec: dict[str, Any], ev: Evaluation | None, boundary: StepBoundary | None) -> None:
        """A NaN/Inf result: alerted like a NaN loss; the agreed primary's with the non-finite rule's actions."""
        bad = [k for k, v in rec.items() if vocab.is_eval(k) and isinstance(v, float) and not math.isfinite(v)]
        nonfinite = self.session.config.alerts.nonfinite
        if not bad or not nonfinite.enabled:
            return
        agreed_bad = ev is not None and not math.isfinite(ev.value)  # every rank sees it: every rank acts
        names = ", ".join(f"{k} = {rec[k]}" for k in bad)
        alert = make_alert(
            "nonfinite",
            step=rec["step"],
            rank=self.rank,
            message=f"the evaluation after step {rec['step']} gave {names}",
            metric=bad[0],
            value=rec[bad[0]],
            severity="error",
            actions=nonfinite.actions if agreed_bad else [],
            epoch=rec.get("epoch"),
        )
        self._decide(alert, rec["step"], boundary)

    def _decide(self, alert: Alert, step: int, boundary: StepBoundary | None) -> None:
        """Raise ``alert`` (rank 0 speaks for the run when every rank decided alike) and carry out its actions here."""
        if self.rank == 0 or self.world_size <= 1 or not alert.get("actions"):
            self.session.monitor.alert(alert)
        if alert.get("actions") and boundary is not None:
            self._act(alert, step, boundary)

    def _new_best(self, ev: Evaluation) -> None:
        if self.best_copy is not None:
            self.best_copy.take(int(ev.step or 0))
        if self.saved is not None:
            directory = self.session.run_dir / "checkpoints"
            try:
                directory.mkdir(parents=True, exist_ok=True)
                part = directory / "best.part.ckpt"  # save_checkpoint adds .ckpt to a name without it
                ms.save_checkpoint(self.saved, str(part))
                os.replace(part, directory / "best.ckpt")
            except Exception as e:  # noqa: BLE001  # a full disk: the training goes on
                log.warning("mindwatch: checkpoints/best.ckpt could not be saved: %r", e)

    def _keep_tables(self, step: int, epoch: int | None, tables: dict[str, Any]) -> None:
        """Results that are not scalars, one line per evaluation in ``evaluations.rank<R>.jsonl``."""
        line = json.dumps({"step": int(step), "epoch": epoch, "rank": self.rank, "tables": tables}) + "\n"
        path = self.session.layout.evaluation_tables(self.rank)

        def write() -> None:  # on the worker, the run directory's writer
            try:
                with open(path, "a", encoding="utf-8") as f:
                    f.write(line)
            except OSError as e:
                log.warning("mindwatch: the evaluation's tables could not be written to %s: %r", path, e)

        self.session.monitor.call(write)


def perplexity(loss: float) -> float:
    """exp(``loss``) of a token cross-entropy loss (inf past what a float holds; NaN stays NaN)."""
    return math.exp(loss) if loss < 709.0 else math.inf if loss == loss else loss
