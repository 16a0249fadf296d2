"""CSV as mindwatch writes it: the table of ``mindwatch export`` and the dashboard's per-chart download (``/api/csv``).

Example::

    from mindwatch.store.csvfile import csv_text, number_cells, text_cells
    steps = number_cells(np.array([1, 2]))                    # ['1', '2']
    values = number_cells(np.array([2.5, np.nan]))            # ['2.5', 'nan']
    csv_text(["step", "loss"], [steps, values])               # 'step,loss\n1,2.5\n2,nan\n'

A number is written as Python's ``repr`` (what reads back to the same float), a whole-number column without its
``.0`` (``whole``), a NaN or Inf as ``nan``, ``inf``, ``-inf`` (:func:`~mindwatch.store.jsonl.nonfinite_text`, the run
store's spelling), an absent value as an empty cell; text cells are quoted where CSV needs it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mindwatch.store.jsonl import nonfinite_text


def number_cells(
    values: np.ndarray, present: np.ndarray | None = None, *, whole: bool = False, missing: str = "", quoted: bool = False
) -> list[str]:
    """One column of numbers as cells (see the module docstring). ``present``: False where a value is absent (written
    as ``missing``); ``quoted``: a non-finite value in double quotes (``"nan"``: JSON's string, for a JSONL table)."""
    if values.dtype.kind in "iub":
        cells = list(map(str, values.tolist()))
        if present is not None:
            for i in np.flatnonzero(~present).tolist():
                cells[i] = missing
        return cells
    floats = values.tolist()
    cells = list(map(_whole_or_repr if whole else repr, floats))  # NaN/Inf and absent values are set below
    special = ~np.isfinite(values) if present is None else ~np.isfinite(values) | ~present
    for i in np.flatnonzero(special).tolist():  # few: absent values and NaN/Inf
        if present is not None and not present[i]:
            cells[i] = missing
        else:
            text = nonfinite_text(floats[i])
            cells[i] = f'"{text}"' if quoted else text
    return cells


def text_cells(texts: Sequence[str]) -> list[str]:
    """Text as CSV cells: in double quotes (a quote doubled) where it holds a comma, a quote or a line break."""
    return [_quoted(t) for t in texts]


def csv_text(header: Sequence[str], columns: Sequence[Sequence[str]]) -> str:
    """The header and the rows of ``columns`` (cells, one list a column), one line each."""
    return "".join(csv_lines(header, columns))


def csv_lines(header: Sequence[str], columns: Sequence[Sequence[str]]) -> list[str]:
    """:func:`csv_text` as lines, for a file written line by line."""
    return [",".join(text_cells(header)) + "\n", *(",".join(row) + "\n" for row in zip(*columns, strict=True))]


def point_cells(steps: np.ndarray, times: np.ndarray, metric: str, rank: int, values: np.ndarray) -> list[list[str]]:
    """One series' points as the columns of a long table, ``step, time, metric, rank, value`` (the time empty where a
    line has none)."""
    n = len(steps)
    name = text_cells([metric])[0]
    return [number_cells(steps), number_cells(times, ~np.isnan(times)), [name] * n, [str(rank)] * n, number_cells(values)]


def _whole_or_repr(v: float) -> str:
    return str(int(v)) if math.isfinite(v) and v.is_integer() else repr(v)


def _quoted(text: str) -> str:
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text
