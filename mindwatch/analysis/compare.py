"""The compare page's tables: each run's summary and metrics side by side, and every config key with each run's value.

Example::

    tables = compare_tables([("gpt/run_1", summarize_run(run_1), run_1.metrics, run_1.meta.get("config") or {}), ...])
    tables["runs"][0]["text"]["best_loss"]     # '2.301': the numbers as the report and `mindwatch runs` print them
    tables["config"][0]                        # {"key": "optimizer.lr", "differs": True, "values": [...], "present": [...]}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from mindwatch.analysis.config_diff import MISSING, config_diff
from mindwatch.analysis.state_text import error_headline
from mindwatch.analysis.summary import RunSummary, field_label
from mindwatch.store.jsonl import encode_number
from mindwatch.units import format_duration, format_number

#: The compare page's names of the RunSummary fields (:data:`mindwatch.analysis.summary.LABELS`).
SUMMARY_LABELS = {name: field_label(name) for name in (*(f.name for f in fields(RunSummary)), "duration", "rank_text")}


def compare_tables(runs: Sequence[tuple[str, RunSummary, list[str], dict[str, Any]]]) -> dict[str, Any]:
    """For ``(run id, its full summary, its metrics, its config)`` of each run: each run's summary (NaN/Inf in the
    run store's spelling) with its numbers in words, and every config key with each run's value (``present`` false
    where a run has none), the keys that differ marked."""
    rows = []
    for run_id, summary, metrics, _ in runs:
        values = summary.to_dict()
        row = {k: _json_value(v) for k, v in values.items() if k not in ("config", "path")}
        # its numbers as the report and `mindwatch runs` print them (units.format_number: 4 significant digits)
        text = {k: format_number(v) for k, v in values.items() if isinstance(v, float)}
        text["duration"] = format_duration(summary.duration)  # as the report's summary and `mindwatch runs` say it
        if summary.error:
            text["error"] = error_headline(summary.error) or summary.error
        rows.append({"id": run_id, "rank_text": summary.rank_text, "summary": row, "text": text, "metrics": metrics})
    keys = [
        {
            "key": k.key,
            "differs": k.differs,
            "values": [None if v is MISSING else _json_value(v) for v in k.values],
            "present": [v is not MISSING for v in k.values],
        }
        for k in config_diff([config for *_, config in runs])
    ]
    return {"runs": rows, "config": keys, "labels": SUMMARY_LABELS}


def _json_value(v: Any) -> Any:
    return encode_number(v) if isinstance(v, float) else v
