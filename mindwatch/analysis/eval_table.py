"""A run's evaluations as every view shows them: the metric it is judged by, each metric's best, the table of them.

Example::

    from mindwatch.analysis.eval_table import eval_table
    ev = eval_table(mindwatch.open_run("monitor_output/gpt/run_20261129_074500"))
    ev.primary, ev.mode, ev.best          # 'eval/loss', 'min', BestEval(value=0.55, step=120, epoch=3, ...)
    ev.curve, ev.beside                   # the Evaluation chart: eval/loss drawn beside the train loss
    [row.behind for row in ev.table()]    # how far each evaluation's primary is from the best (0 at the best)
    ev.info()                             # /api/run's "evaluation": what the dashboard's cards mark

The evaluations of a run are the records of its lowest rank that has any (``eval/<name>``, one record per evaluation,
at the step it ran after: docs/evaluation.md). The primary and its mode are the config's ``evaluation.primary`` and
``evaluation.mode`` (meta.json's snapshot: :func:`mindwatch.store.best_eval.configured`), else
:func:`mindwatch.metrics.eval_primary` and :func:`mindwatch.metrics.eval_mode`; the best is
:mod:`mindwatch.store.best_eval`'s, the definition the writer's status (the runs page's "best eval") holds too. The
dashboard's Evaluation card, the report's Evaluation section and the summary's ``best_eval`` read it from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mindwatch import metrics as vocab
from mindwatch.store.best_eval import BestEval, EvalBests, EvalRecord, Mode, configured, evaluations
from mindwatch.store.jsonl import read_last_record
from mindwatch.store.reader import Run

#: What the Evaluation chart draws beside the training's loss, the first recorded: our ``eval/loss``, then
#: ``Model.fit``'s ``eval/eval_loss``; a run with neither draws its primary alone.
_EVAL_LOSSES = (vocab.EVAL_LOSS, vocab.EVAL_FIT_LOSS)


@dataclass
class EvalRow:
    """One evaluation: the step (and epoch) it ran after, its results, and how far its primary is from the best."""

    step: int
    epoch: int | None
    t: float | None
    values: dict[str, float]
    #: The primary's distance from the best, counted the way that is worse (0 at the best; None: not recorded or
    #: not finite).
    behind: float | None = None


@dataclass
class EvalTable:
    """What a run's evaluations come to (see the module docstring)."""

    rank: int
    primary: str | None
    mode: Mode
    #: The evaluation metrics, in the order first written.
    metrics: list[str]
    #: Each metric's best (those with a finite value), by its own mode (the configured mode for the primary).
    bests: dict[str, BestEval] = field(default_factory=dict)
    #: The evaluations, in the order written.
    rows: list[EvalRecord] = field(default_factory=list)

    @property
    def best(self) -> BestEval | None:
        """The primary's best evaluation."""
        return self.bests.get(self.primary) if self.primary else None

    @property
    def curve(self) -> str | None:
        """The evaluation metric the Evaluation chart draws: an evaluation loss when recorded, else the primary."""
        return next((m for m in _EVAL_LOSSES if m in self.metrics), self.primary)

    @property
    def beside(self) -> str | None:
        """The training metric drawn with :attr:`curve` on one axis: the loss, when the curve is an evaluation loss."""
        return vocab.LOSS if self.curve in _EVAL_LOSSES else None

    def table(self) -> list[EvalRow]:
        """The evaluations with the primary's distance from its best."""
        best = self.best
        out = []
        for step, epoch, t, values in self.rows:
            v = values.get(self.primary) if self.primary else None
            behind = None
            if best is not None and v is not None and math.isfinite(v):
                behind = v - best.value if best.mode == "min" else best.value - v
            out.append(EvalRow(step, epoch, t, values, behind))
        return out

    def info(self) -> dict[str, Any]:
        """As the dashboard's ``/api/run`` sends it: ``{rank, primary, mode, curve, beside, metrics, bests: {metric:
        {metric, value, step, mode, epoch, t}}}``."""
        return {
            "rank": self.rank,
            "primary": self.primary,
            "mode": self.mode,
            "curve": self.curve,
            "beside": self.beside,
            "metrics": list(self.metrics),
            "bests": {m: b.to_dict() for m, b in self.bests.items()},
        }


@dataclass(frozen=True)
class ResultTables:
    """The results of one evaluation that are not scalars (a confusion matrix): ``{name: rows}``."""

    step: int
    epoch: int | None
    tables: dict[str, Any]


def last_tables(run: Run, rank: int) -> ResultTables | None:
    """The newest evaluation's results that are not scalars on ``rank`` (``evaluations.rank<R>.jsonl``); None: none."""
    last = read_last_record(run.layout.evaluation_tables(rank), max_bytes=1 << 22)
    if not last or not isinstance(last.get("tables"), dict) or type(last.get("step")) is not int:
        return None
    epoch = last.get("epoch")
    return ResultTables(last["step"], epoch if type(epoch) is int else None, last["tables"])


def eval_table(run: Run) -> EvalTable | None:
    """The evaluations of ``run``'s lowest rank with a finite primary (else of its lowest rank with any); None when
    no rank recorded one. The listing's ``best_eval`` (each rank's status, the lowest rank with one) agrees."""
    primary, mode = configured(run.meta)
    found: list[EvalTable] = []
    for rank, cols in sorted(run.columns.items()):
        rows = evaluations(cols)
        if not rows:
            continue
        bests = EvalBests.of_rows(rows, primary, mode)
        chosen = bests.primary
        found.append(
            EvalTable(
                rank=rank,
                primary=chosen,
                mode=bests.mode_of(chosen) if chosen else "min",
                metrics=bests.names,
                bests=bests.bests(),
                rows=rows,
            )
        )
        if found[-1].best is not None:
            return found[-1]
    return found[0] if found else None
