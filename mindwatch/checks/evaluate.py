"""``mindwatch check``: evaluate CI rules against a run; exit 0 when all pass, 1 when any fails, 2 on a bad rule.

Example::

    import mindwatch
    from mindwatch.checks.evaluate import check_run

    results = check_run(mindwatch.open_run(path), ["max(grad_norm, last=100) < 1e5", "alerts(severity='error') == 0"])
    [(r.rule, r.value, r.passed) for r in results]
    check_run(run, ["best(eval/loss) < 0.5", "final(eval/accuracy) >= 0.9"])   # a run's evaluations (docs/evaluation.md)

Rules are parsed by :mod:`mindwatch.checks.language` (never ``eval``) and evaluated here on numpy
arrays read through :func:`mindwatch.open_run`. A metric with no values makes its call
"missing" and the rule fails; NaN compares false (use ``nonfinite(loss) == 0`` to say it).

``best(m)`` is the best finite value of one rank (the lowest that recorded ``m``, or ``rank=R``): the smallest, or the
largest where :func:`mindwatch.metrics.eval_mode` says ``max`` (an accuracy, an f1). An evaluation's ``eval/<name>``
is judged as the run's best evaluation is everywhere (:class:`mindwatch.store.best_eval.EvalBests`: every evaluation
counts, and the run's ``evaluation.mode`` decides for its primary metric); any other metric on the line the training
kept, as the run's best loss (:mod:`mindwatch.store.best_loss`: a rewind's abandoned steps are not the best).
``eval/<name>`` has one value per evaluation, so ``final(eval/accuracy)`` is the last evaluation's.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mindwatch import metrics as vocab
from mindwatch.analysis.summary import listed, lowest_rank_with, run_values
from mindwatch.checks.language import Binary, Call, CheckRule, Compare, Constant, Name, Node, RuleError, Unary, parse_rule
from mindwatch.store.best_eval import EvalBests, configured
from mindwatch.store.best_loss import kept
from mindwatch.store.catalog import last_step
from mindwatch.store.reader import Run


class Missing:
    """The value of a call that found no data; every operation on it is missing too and the rule fails."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"missing ({self.why})"


Value = float | str | bool | Missing


@dataclass
class CheckResult:
    """One rule's outcome: ``passed`` and the values of the calls it made (``{call text: value}``)."""

    rule: str
    passed: bool
    values: dict[str, Value] = field(default_factory=dict)

    @property
    def value_text(self) -> str:
        if len(self.values) == 1:
            return format_value(next(iter(self.values.values())))
        return "\n".join(f"{k} = {format_value(v)}" for k, v in self.values.items())


def format_value(v: Value) -> str:
    if isinstance(v, Missing):
        return repr(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.6g}"
    return repr(v)


class Evaluator:
    """Evaluates a parsed rule against a run; subclasses answer calls and bare names from other data."""

    def __init__(self, run: Run, rule: CheckRule) -> None:
        self.run = run
        self.rule = rule
        self.values: dict[str, Value] = {}

    def fail(self, message: str, node: Node) -> RuleError:
        return RuleError(message, self.rule.text, node.pos)

    def number(self, v: Value, node: Node) -> float | Missing:
        if isinstance(v, Missing):
            return v
        if isinstance(v, bool) or not isinstance(v, float):
            raise self.fail(f"expected a number here, got {format_value(v)}", node)
        return v

    def boolean(self, v: Value, node: Node) -> bool | Missing:
        if isinstance(v, (bool, Missing)):
            return v
        raise self.fail(f"expected true/false here (a comparison), got {format_value(v)}", node)

    def eval(self, node: Node) -> Value:
        if isinstance(node, Constant):
            return node.value
        if isinstance(node, Unary):
            v = self.eval(node.operand)
            if node.op == "not":
                truth = self.boolean(v, node.operand)
                return truth if isinstance(truth, Missing) else not truth
            x = self.number(v, node.operand)
            return x if isinstance(x, Missing) else (-x if node.op == "-" else x)
        if isinstance(node, Binary):
            if node.op in ("and", "or"):
                left = self.boolean(self.eval(node.left), node.left)
                right = self.boolean(self.eval(node.right), node.right)  # no short cut: show every value
                if isinstance(left, Missing) or isinstance(right, Missing):
                    known = [b for b in (left, right) if isinstance(b, bool)]
                    if node.op == "and" and False in known:
                        return False
                    if node.op == "or" and True in known:
                        return True
                    return left if isinstance(left, Missing) else right
                return (left and right) if node.op == "and" else (left or right)
            a = self.number(self.eval(node.left), node.left)
            b = self.number(self.eval(node.right), node.right)
            if isinstance(a, Missing):
                return a
            if isinstance(b, Missing):
                return b
            return _arithmetic(node.op, a, b)
        if isinstance(node, Compare):
            return self.compare(node)
        if isinstance(node, Call):
            v = self.call(node)
            self.values[self.rule.text[node.pos : node.end]] = v
            return v
        if isinstance(node, Name):
            return self.name(node)
        raise self.fail(f"cannot evaluate {type(node).__name__}", node)  # unreachable: the parser builds only these

    def compare(self, node: Compare) -> Value:
        left = self.eval(node.first)
        result: bool | Missing = True
        left_node = node.first
        for op, right_node in zip(node.ops, node.rest, strict=True):
            right = self.eval(right_node)
            if isinstance(left, Missing) or isinstance(right, Missing):
                result = left if isinstance(left, Missing) else right  # type: ignore[assignment]
            elif isinstance(left, str) or isinstance(right, str):
                if op not in ("==", "!="):
                    raise self.fail(f"strings can only be compared with == or !=, not {op}", right_node)
                ok = (left == right) if op == "==" else (left != right)
                result = result and ok if isinstance(result, bool) else result
            else:
                a, b = self.number(left, left_node), self.number(right, right_node)
                ok = _COMPARE[op](a, b)  # type: ignore[arg-type]
                result = result and ok if isinstance(result, bool) else result
            left, left_node = right, right_node
        return result

    def name(self, node: Name) -> Value:
        raise self.fail(f"{node.name!r} is not a value: metrics go inside a function, e.g. final({node.name})", node)

    def option(self, node: Call, name: str, kind: type) -> Any:
        n = node.options.get(name)
        if n is None:
            return None
        v = self.eval(n)
        if isinstance(v, Missing):
            raise self.fail(f"{name}= must be a constant, not a value from the run", n)
        if kind is int:
            if isinstance(v, bool) or not isinstance(v, float) or not v.is_integer() or v < 0:
                raise self.fail(f"{name}= must be a whole number >= 0, got {format_value(v)}", n)
            return int(v)
        if kind is float:
            return self.number(v, n)
        if not isinstance(v, str):
            raise self.fail(f"{name}= must be a string such as {name}='error', got {format_value(v)}", n)
        return v

    def known_metric(self, metric: str, node: Node) -> None:
        """A name the run does not record but one it does is close to: a typo (a usage error), not a failed run."""
        if not metric or metric in self.run.metrics or vocab.get(metric) or vocab.family_of(metric):
            return
        close = difflib.get_close_matches(metric, self.run.metrics, n=1, cutoff=0.75)
        if close:
            raise self.fail(f"the run records no metric {metric!r}: did you mean {close[0]}?", node)

    def call(self, node: Call) -> Value:
        name, run = node.name, self.run
        rank = self.option(node, "rank", int)
        if name == "abs":
            x = self.number(self.eval(node.args[0]), node.args[0])
            return x if isinstance(x, Missing) else abs(x)
        if name == "alerts":
            want = {k: self.option(node, k, str) for k in ("severity", "rule", "metric")}
            n = 0
            for a in run.alerts:
                if all(v is None or str(a.get(k)) == v for k, v in want.items()) and (rank is None or a.get("rank") == rank):
                    n += 1
            return float(n)
        if name == "steps":
            if rank is not None:
                step = last_step({rank: run.statuses.get(rank, {})}, {rank: run.last_record.get(rank, {})})
                return float(step) if step is not None else Missing(f"rank {rank} recorded no step")
            step = listed(run).last_step
            return float(step) if step is not None else Missing("no step recorded")
        if name == "duration":
            summary = listed(run)
            if summary.started_at is None or (summary.ended_at or summary.last_time) is None:
                return Missing("no start or end time")
            return float(summary.duration or 0.0)
        if name == "state":
            return listed(run).state
        metric = node.metric or ""
        self.known_metric(metric, node)
        if name in ("first", "final"):
            r = rank if rank is not None else lowest_rank_with(run, metric)
            s = run.series(metric, rank=r) if r is not None else None
            if s is None or not len(s):
                return Missing(_no_data(metric, rank))
            return float(s.value[0] if name == "first" else s.value[-1])
        if name == "best":
            return self.best(metric, rank)
        values = run_values(run, metric, rank=rank, last=self.option(node, "last", int))
        if name == "count":
            return float(len(values))
        if name == "nonfinite":
            return float(np.count_nonzero(~np.isfinite(values)))
        if not len(values):
            return Missing(_no_data(metric, rank))
        if name == "percentile":
            qn = node.args[0] if node.args else node.options["q"]
            q = self.number(self.eval(qn), qn)
            if isinstance(q, Missing) or not 0 <= q <= 100:
                raise self.fail("the percentile must be a number from 0 to 100", qn)
            return float(np.percentile(values, q))
        reducer = _REDUCERS[name]
        return float(reducer(values))

    def best(self, metric: str, rank: int | None) -> Value:
        """``best(metric)`` of ``rank`` (default: the lowest that recorded it); see the module docstring."""
        run = self.run
        r = rank if rank is not None else lowest_rank_with(run, metric)
        cols = run.columns.get(r) if r is not None else None
        if cols is None:
            return Missing(_no_data(metric, rank))
        if vocab.is_eval(metric):
            found = EvalBests.of_columns(cols, *configured(run.meta)).best(metric)
            return found.value if found is not None else Missing(_no_finite(metric, rank))
        line, value = cols.raw_column(metric)  # in the order written: a rewind's abandoned branch is not the best
        values = value[kept(cols.steps[line]) & np.isfinite(value)]
        if not len(values):
            return Missing(_no_finite(metric, rank))
        return float(values.max() if vocab.eval_mode(metric) == "max" else values.min())


def _no_finite(metric: str, rank: int | None) -> str:
    return f"no finite values of {metric!r}" + (f" on rank {rank}" if rank is not None else "")


def _no_data(metric: str, rank: int | None) -> str:
    return f"no values of {metric!r}" + (f" on rank {rank}" if rank is not None else "")


_COMPARE = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


_REDUCERS: dict[str, Callable[[np.ndarray], Any]] = {
    "min": np.min,
    "max": np.max,
    "mean": np.mean,
    "median": np.median,
    "std": np.std,
    "sum": np.sum,
}
_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": np.divide,
    "%": np.fmod,
    "**": np.power,
}


def _arithmetic(op: str, a: float, b: float) -> float:
    # numpy float64 under errstate: 10 ** 1e10 is inf, 1 / 0 is inf, never an exception or a big integer
    x, y = np.float64(a), np.float64(b)
    with np.errstate(all="ignore"):
        ufunc = _ARITHMETIC[op]
        return float(ufunc(x, y))


def evaluate(run: Run, rule: CheckRule | str) -> CheckResult:
    """Evaluate one rule on a run; raises :class:`RuleError` for a rule that does not make sense."""
    parsed = parse_rule(rule) if isinstance(rule, str) else rule
    ev = Evaluator(run, parsed)
    result = ev.eval(parsed.tree)
    if not isinstance(result, (bool, Missing)):
        raise RuleError(f"a rule must be true or false, e.g. '{parsed.text} < 1', got {format_value(result)}", parsed.text, 0)
    if not ev.values:
        ev.values[parsed.text] = result
    return CheckResult(parsed.text, result is True, ev.values)


def check_run(run: Run, rules: list[str]) -> list[CheckResult]:
    """Every rule's result; all rules are parsed first, so a bad one fails before any is evaluated."""
    parsed = [parse_rule(r) for r in rules]
    return [evaluate(run, r) for r in parsed]


def rules_from_config(run: Run) -> list[str]:
    """The ``checks`` list of the run's config snapshot (meta.json), if any."""
    cfg = run.meta.get("config") or {}
    checks = cfg.get("checks") if isinstance(cfg, dict) else None
    return [str(c) for c in checks] if isinstance(checks, list) else []


def rules_from_file(path: str | os.PathLike[str]) -> list[str]:
    """Rules from a file: YAML (a list, or a mapping with ``checks`` / ``monitor_config.checks``) or one rule per line."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
        if isinstance(data, dict):
            section = data if "checks" in data else data.get("monitor_config")
            data = section.get("checks") if isinstance(section, dict) else None
        if not isinstance(data, list) or not all(isinstance(r, str) for r in data):
            raise ValueError(f"{p}: expected a list of rules, or a 'checks:' list of strings")
        return list(data)
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def print_results(results: list[CheckResult], run: Run, console: Any = None) -> None:
    """The table of rules, values and pass/fail (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"mindwatch check {run.id} ({run.state})", title_justify="left")
    table.add_column("rule", overflow="fold")
    table.add_column("value", overflow="fold")
    table.add_column("result")
    for r in results:
        table.add_row(r.rule, r.value_text, "[green]pass[/]" if r.passed else "[bold red]FAIL[/]")
    console.print(table)
    failed = sum(not r.passed for r in results)
    console.print(f"{len(results) - failed} passed, {failed} failed" if failed else f"all {len(results)} rules passed")


def check_command(
    run_path: str, rules: list[str], rules_file: str | None = None, as_json: bool = False, also: Sequence[str] = ()
) -> int:
    """``mindwatch check``: 0 all pass, 1 any fails, 2 a bad rule, no rules or no run. ``also``: more folders of the run."""
    import json
    import sys

    from mindwatch.store.reader import open_run

    try:
        run = open_run(run_path, *also)
    except FileNotFoundError as e:
        print(f"mindwatch check: {e}", file=sys.stderr)
        return 2
    all_rules = list(rules)
    if rules_file:
        try:
            all_rules += rules_from_file(rules_file)
        except (OSError, ValueError) as e:
            print(f"mindwatch check: cannot read rules: {e}", file=sys.stderr)
            return 2
    if not all_rules:
        all_rules = rules_from_config(run)
    if not all_rules:
        print(
            'mindwatch check: no rules: pass --rule "final(loss) < 2.5", --rules-file FILE, '
            "or add a 'checks:' list to the run's monitor_config",
            file=sys.stderr,
        )
        return 2
    try:
        results = check_run(run, all_rules)
    except RuleError as e:
        print(f"mindwatch check: bad rule:\n{e.pointed()}", file=sys.stderr)
        return 2
    if as_json:
        out = [{"rule": r.rule, "passed": r.passed, "values": {k: _jsonable(v) for k, v in r.values.items()}} for r in results]
        print(json.dumps({"run": str(run.path), "state": run.state, "results": out}, indent=1))
    else:
        print_results(results, run)
    return 0 if all(r.passed for r in results) else 1


def _jsonable(v: Value) -> Any:
    if isinstance(v, Missing):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
