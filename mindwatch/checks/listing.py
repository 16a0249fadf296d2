"""The runs page's filter: a rule of the ``check`` language evaluated over a run's listing, not its metrics.

Example::

    from mindwatch.checks.listing import RunFilter, run_columns
    keep = RunFilter("lr > 1e-3 and final(loss) < 2 and mode == 'graph'")
    [row for row in rows if keep(row)]            # rows: run_columns(listing.to_dict())

A row holds the columns of one run (:func:`run_columns`): ``config.<dotted key>`` from meta.json's
config snapshot, ``tag.<key>`` from its tags, and the summary values ``final_loss``, ``best_loss``,
``best_eval`` (the best value of the run's primary evaluation metric: ``best_eval < 0.5``), ``steps``,
``duration``, ``alerts``, ``state``, ``project``, ``run``, ``last_time`` (:data:`SUMMARY_COLUMNS`: each
column's :class:`~mindwatch.analysis.summary.RunSummary` field, whose label is its header). A bare name resolves to the
column of that name, else ``config.<name>``, else ``tag.<name>``, else the one config key that ends
in ``.<name>`` (``lr`` finds ``optimizer.lr``). The functions read the summary:
``final(loss)``, ``min(loss)`` (the best loss), ``steps()``, ``duration()``, ``alerts()``, ``state()``.
Nothing reads the metrics files, so filtering 5,000 runs costs microseconds per run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from mindwatch.analysis.config_diff import flatten
from mindwatch.analysis.state_text import error_headline
from mindwatch.analysis.summary import field_label
from mindwatch.analysis.tags import tag_pairs, tag_texts
from mindwatch.checks.evaluate import Evaluator, Missing, Value
from mindwatch.checks.language import Call, CheckRule, Name, RuleError, parse_rule
from mindwatch.store.jsonl import encode_number

#: The summary columns every run has, beside its config keys and tags: the column (the filter's name) -> its field of
#: :class:`~mindwatch.analysis.summary.RunSummary`.
SUMMARY_COLUMNS = {
    "run": "run_id",
    "project": "project",
    "state": "state",
    "steps": "last_step",
    "total_steps": "total_steps",
    "final_loss": "final_loss",
    "best_loss": "best_loss",
    "best_eval": "best_eval",
    "duration": "duration",
    "alerts": "alert_count",
    "started_at": "started_at",
    "last_time": "last_time",
}
#: What a cell of a summary column says beside its value: the listing's field that names it (the best eval's metric).
COLUMN_NOTES = {"best_eval": "best_eval_metric"}
#: The runs page's header of each summary column: its field's label (:data:`mindwatch.analysis.summary.LABELS`).
COLUMN_LABELS = {column: field_label(field_name) for column, field_name in SUMMARY_COLUMNS.items()}
#: An example filter, shown in the runs page's empty filter box.
FILTER_EXAMPLE = "lr > 1e-3 and final(loss) < 2"
_CALLS = {("final", "loss"): "final_loss", ("min", "loss"): "best_loss", ("steps", None): "steps",
          ("duration", None): "duration", ("alerts", None): "alerts", ("state", None): "state"}  # fmt: skip


def run_columns(listing: Mapping[str, Any]) -> dict[str, Any]:
    """Every column of one run from its listing (:func:`mindwatch.analysis.summary.list_run` ``.to_dict()`` plus ``id``)."""
    row: dict[str, Any] = {column: listing.get(field_name) for column, field_name in SUMMARY_COLUMNS.items()}
    for key, value in flatten(listing.get("config") or {}).items():
        row[f"config.{key}"] = value
    row.update({f"tag.{name}": value for name, value in tag_pairs(listing.get("tags"))})
    return row


class RunFilter:
    """A runs-page filter: ``RunFilter(text)(row)`` is True when the rule holds for the run (missing values: False)."""

    def __init__(self, text: str) -> None:
        self.rule = parse_rule(text, names=True)

    def __call__(self, row: Mapping[str, Any]) -> bool:
        return _RowEvaluator(row, self.rule).eval(self.rule.tree) is True


class _RowEvaluator(Evaluator):
    def __init__(self, row: Mapping[str, Any], rule: CheckRule) -> None:
        self.row = row
        self.rule = rule
        self.values: dict[str, Value] = {}

    def name(self, node: Name) -> Value:
        row, name = self.row, node.name
        for key in (name, f"config.{name}", f"tag.{name}"):
            if key in row:
                return _value(row[key], key)
        ends = [k for k in row if k.startswith("config.") and k.endswith(f".{name}")]
        if len(ends) > 1:
            raise self.fail(f"{name!r} is ambiguous: {', '.join(k[7:] for k in ends[:5])}; write the full key", node)
        return _value(row[ends[0]], ends[0]) if ends else Missing(f"no column {name!r}")

    def call(self, node: Call) -> Value:
        if node.name == "abs":
            return super().call(node)
        column = _CALLS.get((node.name, node.metric))
        if column is None or node.options:
            known = ", ".join(f"{f}({m or ''})" for f, m in _CALLS)
            raise self.fail(f"the runs filter reads the run's summary: {known}; other functions need `mindwatch check`", node)
        return _value(self.row.get(column), column)


def _value(v: Any, column: str) -> Value:
    if v is None:
        return Missing(f"no {column}")
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        return v
    return json.dumps(v, default=str)


def sort_key(value: Any) -> tuple[int, Any]:
    """Order of a column's values: numbers, then text, then missing (None, NaN) last."""
    if isinstance(value, bool):
        return (0, float(value))
    if isinstance(value, (int, float)):
        return (0, value) if not math.isnan(value) else (2, 0)
    if value is None:
        return (2, 0)
    return (1, str(value))


__all__ = ["COLUMN_LABELS", "FILTER_EXAMPLE", "SUMMARY_COLUMNS", "RuleError", "RunFilter", "flatten", "run_columns", "sort_key"]


def filter_and_sort(
    listings: list[dict[str, Any]], filter_text: str = "", sort: str = ""
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], set[str]]:
    """The runs page's rows: ``(listing, its columns' values)`` of each run ``filter_text`` keeps (a :class:`RunFilter`
    rule; a bad one raises :class:`RuleError`), sorted by ``sort`` (a column, ``-column`` descending; a run without a
    value last either way; by default the newest first), and every column some run has a value in."""
    keep = RunFilter(filter_text) if filter_text.strip() else None
    available: set[str] = set()
    rows = []
    for listing in listings:
        values = run_columns(listing)
        available.update(values)
        if keep is None or keep(values):
            rows.append((listing, values))
    key = sort.lstrip("-")
    if not key:
        rows.sort(key=lambda r: -(r[0].get("started_at") or 0))
        return rows, available
    present = [r for r in rows if sort_key(r[1].get(key))[0] < 2]
    present.sort(key=lambda r: sort_key(r[1].get(key)), reverse=sort.startswith("-"))
    return present + [r for r in rows if sort_key(r[1].get(key))[0] == 2], available


def runs_page(listings: list[dict[str, Any]], columns: list[str], filter_text: str, sort: str, now: float) -> dict[str, Any]:
    """The runs page: every run's listing with the chosen ``columns``' values, filtered and sorted
    (:func:`filter_and_sort`; a bad filter raises :class:`RuleError`), as the page and ``GET /api/runs`` send it."""
    rows, available = filter_and_sort(listings, filter_text, sort)
    out = []
    for listing, values in rows:
        row = {k: v for k, v in listing.items() if k != "config"}
        row["final_loss"] = _json_value(row.get("final_loss"))
        row["error_headline"] = error_headline(row.get("error"))  # what went wrong; the whole error stays in "error"
        row["tag_texts"] = tag_texts(row.get("tags"))
        row["values"] = {c: _json_value(values.get(c)) for c in columns}
        row["value_notes"] = {c: note for c in columns if c in COLUMN_NOTES and (note := listing.get(COLUMN_NOTES[c]))}
        out.append(row)
    return {
        "runs": out,
        "total": len(listings),
        "columns": [*SUMMARY_COLUMNS, *sorted(available.difference(SUMMARY_COLUMNS))],
        "labels": {**COLUMN_LABELS, "tags": field_label("tags")},
        "filter_example": f"filter, e.g. {FILTER_EXAMPLE}",
        "now": now,
    }


def _json_value(v: Any) -> Any:
    return encode_number(v) if isinstance(v, float) else v
