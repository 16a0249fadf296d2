"""A run's best evaluation, one definition for every view: the best finite value of its primary evaluation metric.

Example::

    bests = EvalBests(primary=None, mode=None)    # the writer's: evaluation.primary and evaluation.mode of the config
    bests.add({"step": 20, "epoch": 1, "eval/loss": 0.9, "eval/accuracy": 0.70})
    bests.add({"step": 40, "epoch": 2, "eval/loss": 0.8, "eval/accuracy": 0.69})
    bests.best()                  # BestEval(metric='eval/loss', value=0.8, step=40, mode='min', epoch=2, t=None)
    bests.best("eval/accuracy")   # BestEval(metric='eval/accuracy', value=0.7, step=20, mode='max', epoch=1, t=None)
    EvalBests.of_columns(cols)    # the same from a rank's columns: the full summary, the report, a resumed writer

The metric is the primary (:func:`mindwatch.metrics.eval_primary` of the first evaluation's names, as the training's
rules choose it): ``evaluation.primary``, else ``eval/loss``, else ``eval/eval_loss``, else the first by name; better
is smaller or larger by :func:`mindwatch.metrics.eval_mode` (``evaluation.mode`` for the primary). The best is the
first evaluation with the best finite value (a later equal one does not take over), and every evaluation counts, as
early stopping and ``evaluation.keep_best`` count them: one on a branch a rewind abandoned rated weights that existed
(``best.ckpt`` may hold them), so, unlike the best loss (:mod:`mindwatch.store.best_loss`), it stays. The writer keeps
these as records come (the status file's ``best_eval``, which the runs page lists); the full summary reads them from
the columns with :meth:`EvalBests.of_columns`, the same class fed the same evaluations in the order written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from mindwatch.metrics import EPOCH, EVAL_PREFIX, eval_mode, eval_primary, is_eval
from mindwatch.store.columns import RankColumns

Mode = Literal["min", "max"]
#: One evaluation as the columns hold it: ``(step, epoch, t, {eval/<name>: value})``.
EvalRecord = tuple[int, int | None, float | None, dict[str, float]]


@dataclass(frozen=True)
class BestEval:
    """The best evaluation of one metric: its value, the step (and epoch, and time) it ran after, and which way is better."""

    metric: str
    value: float
    step: int
    mode: Mode
    epoch: int | None = None
    t: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """As the status file and the API hold it: ``{metric, value, step, mode, epoch, t}``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> BestEval | None:
        """A status file's ``best_eval`` (None for anything else: an older writer's file, a torn value)."""
        if not isinstance(d, Mapping):
            return None
        value, step, metric, mode = _finite(d.get("value")), d.get("step"), d.get("metric"), d.get("mode")
        if value is None or type(step) is not int or not isinstance(metric, str) or mode not in ("min", "max"):
            return None
        return cls(metric, value, step, mode, _whole(d.get("epoch")), _finite(d.get("t")))


@dataclass(frozen=True)
class _Evaluation:
    value: float
    step: int
    epoch: int | None
    t: float | None


class EvalBests:
    """Each evaluation metric's lowest and highest finite value so far, in the order its names were first written."""

    def __init__(self, primary: str | None = None, mode: Mode | None = None) -> None:
        """``primary``/``mode``: the config's ``evaluation.primary`` and ``evaluation.mode`` (None: from the names)."""
        self.configured_primary = primary
        self.configured_mode = mode
        #: The first evaluation's names: the primary is chosen from them, as the training's rules chose it.
        self._first: list[str] | None = None
        #: metric -> [its first lowest, its first highest] evaluation (None until a finite one).
        self._extremes: dict[str, list[_Evaluation | None]] = {}

    def add(self, record: Mapping[str, Any]) -> None:
        """Count one record's evaluations (a record with no ``eval/<name>`` or no integer step counts nothing)."""
        names = [k for k in record if k.startswith(EVAL_PREFIX)]  # every record passes here: no call per key
        step = record.get("step")
        if not names or type(step) is not int:
            return
        self.add_values(names, record, step, _whole(record.get(EPOCH)), _finite(record.get("t")))

    def add_values(self, names: list[str], values: Mapping[str, Any], step: int, epoch: int | None, t: float | None) -> None:
        """One evaluation's ``names`` out of ``values``."""
        names = sorted(names)
        if self._first is None:
            self._first = names
        for name in names:
            self.add_value(name, values[name], step, epoch, t)

    def add_value(self, name: str, value: Any, step: int, epoch: int | None = None, t: float | None = None) -> None:
        """One evaluation of ``name`` (NaN, Inf or not a number: the name is known, no value counts)."""
        ext = self._extremes.setdefault(name, [None, None])
        v = _finite(value)
        if v is None:
            return
        if ext[0] is None or v < ext[0].value:
            ext[0] = _Evaluation(v, step, epoch, t)
        if ext[1] is None or v > ext[1].value:
            ext[1] = _Evaluation(v, step, epoch, t)

    @property
    def names(self) -> list[str]:
        """The evaluation metrics seen, in the order first written."""
        return list(self._extremes)

    @property
    def primary(self) -> str | None:
        """The metric the run is judged by (:func:`mindwatch.metrics.eval_primary`); None before any evaluation."""
        return eval_primary(self._first or (), self.configured_primary)

    def mode_of(self, name: str) -> Mode:
        """Whether a smaller or a larger ``name`` is better (``evaluation.mode`` counts for the primary alone)."""
        return eval_mode(name, self.configured_mode if name == self.primary else None)

    def best(self, name: str | None = None) -> BestEval | None:
        """The best evaluation of ``name`` (default: the primary); None when it has no finite value."""
        name = name or self.primary
        ext = self._extremes.get(name) if name else None
        if name is None or ext is None:
            return None
        mode = self.mode_of(name)
        found = ext[0] if mode == "min" else ext[1]
        return BestEval(name, found.value, found.step, mode, found.epoch, found.t) if found else None

    def bests(self) -> dict[str, BestEval]:
        """Every evaluation metric's best (those with a finite value), in the order first written."""
        return {name: b for name in self._extremes if (b := self.best(name)) is not None}

    @classmethod
    def of_columns(cls, cols: RankColumns, primary: str | None = None, mode: Mode | None = None) -> EvalBests:
        """The evaluations of one rank's columns (``cols`` refreshed), fed in the order written."""
        return cls.of_rows(evaluations(cols), primary, mode)

    @classmethod
    def of_rows(cls, rows: list[EvalRecord], primary: str | None = None, mode: Mode | None = None) -> EvalBests:
        """The evaluations :func:`evaluations` read, fed in the order written."""
        out = cls(primary, mode)
        for step, epoch, t, values in rows:
            out.add_values(list(values), values, step, epoch, t)
        return out


def configured(meta: dict[str, Any]) -> tuple[str | None, Mode | None]:
    """The run's ``evaluation.primary`` and ``evaluation.mode`` from its meta.json's config snapshot (None: not given):
    what :class:`EvalBests` takes of a run that is read, not written."""
    config = meta.get("config")
    section = config.get("evaluation") if isinstance(config, dict) else None
    if not isinstance(section, dict):
        return None, None
    primary, mode = section.get("primary"), section.get("mode")
    return (primary if isinstance(primary, str) and primary else None), (mode if mode in ("min", "max") else None)


def evaluation_lines(cols: RankColumns, after: int = -1, beside: tuple[str, ...] = ()) -> list[tuple[int, dict[str, float]]]:
    """The records of ``cols`` with an evaluation after line ``after``, in the order written: ``(line, {eval/<name>:
    value, and each of ``beside`` the record holds})``, the results in alphabetical order (NaN and Inf as they are).
    The one reader of a rank's evaluations: :func:`evaluations` and ``mindwatch tail`` build on it."""
    by_line: dict[int, dict[str, float]] = {}
    for name in sorted(k for k in cols.keys if is_eval(k)):
        line, value = cols.raw_column(name)
        start = int(np.searchsorted(line, after, side="right"))
        for at, v in zip(line[start:].tolist(), value[start:].tolist(), strict=True):
            by_line.setdefault(at, {})[name] = v
    if not by_line:
        return []
    lines = np.array(sorted(by_line), dtype=np.int64)
    for name in beside:
        line, value = cols.raw_column(name)
        if not len(line):
            continue
        at = np.minimum(np.searchsorted(line, lines), len(line) - 1)
        hit = line[at] == lines
        for ln, v in zip(lines[hit].tolist(), value[at[hit]].tolist(), strict=True):
            by_line[ln][name] = v
    return [(ln, by_line[ln]) for ln in lines.tolist()]


def evaluations(cols: RankColumns) -> list[EvalRecord]:
    """Every record of ``cols`` with an evaluation, in the order written: ``(step, epoch, t, {eval/<name>: value})``,
    the names of a record in alphabetical order (NaN and Inf as they are)."""
    found = evaluation_lines(cols, beside=(EPOCH,))
    if not found:
        return []
    lines = np.array([ln for ln, _ in found], dtype=np.int64)
    times = cols.time_of_lines(lines).tolist()
    out = []
    for (_, values), step, t in zip(found, cols.steps[lines].tolist(), times, strict=True):
        epoch = values.pop(EPOCH, None)
        out.append((int(step), _whole(epoch), _finite(t), values))
    return out


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _whole(v: Any) -> int | None:
    """An epoch: a whole number (the columns hold it as a float), else None."""
    f = _finite(v)
    return int(f) if f is not None and f.is_integer() else None
