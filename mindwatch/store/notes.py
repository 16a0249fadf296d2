"""A person's name and note for a run, kept in its directory (``notes.json``); the run id never changes.

Example::

    from mindwatch.store.notes import read_notes, write_notes
    write_notes(run_dir, name="baseline lr 3e-4")            # mindwatch rename RUN NAME
    write_notes(run_dir, note="diverged after the reshuffle")  # mindwatch note RUN TEXT; the name stays
    read_notes(run_dir)   # {"name": "baseline lr 3e-4", "note": "diverged ...", "updated_at": ..., "updated_by": ...}

The training never writes it; ``mindwatch rename`` / ``note`` and the dashboard (``--allow-control``) do,
atomically (tmp + rename), so every reader (the runs table, the run page, the report, ``mindwatch runs``)
sees the old file or the new one. An empty name or note removes it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mindwatch.store.layout import RunLayout, is_run_dir, read_json, write_json_atomic

#: The longest name and note kept (a name is a label; a note a few lines).
MAX_NAME, MAX_NOTE = 200, 4000


def read_notes(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's ``notes.json`` (``{}`` when it has none)."""
    return read_json(RunLayout(Path(run_dir)).notes) or {}


def write_notes(
    run_dir: str | os.PathLike[str], *, name: str | None = None, note: str | None = None, by: str | None = None
) -> dict[str, Any]:
    """Set the run's display ``name`` and/or ``note`` (None: keep it; ``""``: remove it); returns the new notes.

    Raises ValueError (with what to do) for a folder that is not a run directory or a text too long.
    """
    path = Path(run_dir)
    if not is_run_dir(path):
        raise ValueError(f"{path} is not a run directory (it has no meta.json and no rank files): give a run's folder")
    notes = read_notes(path)
    for key, value, most in (("name", name, MAX_NAME), ("note", note, MAX_NOTE)):
        if value is None:
            continue
        value = value.strip()
        if len(value) > most:
            raise ValueError(f"the {key} is {len(value)} characters long; keep it to {most}")
        if value:
            notes[key] = value
        else:
            notes.pop(key, None)
    notes["updated_at"] = time.time()
    if by:
        notes["updated_by"] = by
    write_json_atomic(RunLayout(path).notes, notes)
    return notes
