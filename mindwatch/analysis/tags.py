"""A run's tags as every view reads them: meta.json's ``tags`` is a list (``["baseline"]``) or a mapping (``{"mode": "graph"}``).

Example::

    from mindwatch.analysis.tags import tag_pairs, tag_texts

    tag_texts({"mode": "graph", "seed": 1})    # ['mode=graph', 'seed=1']: the runs page, the report, `mindwatch runs`
    tag_texts(["baseline"])                    # ['baseline']
    tag_pairs(["baseline"])                    # [('baseline', True)]: the runs filter's ``tag.baseline`` column

The dashboard gets the texts from the API (``tag_texts`` of ``/api/runs``' rows and of ``/api/run``), so no page
reads the tags' shape itself (``tests/test_one_owner.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def tag_pairs(tags: Any) -> list[tuple[str, Any]]:
    """Each tag as ``(name, value)``: a mapping's items, a listed (or lone) tag's name with the value True."""
    if isinstance(tags, Mapping):
        return [(str(k), v) for k, v in tags.items()]
    if isinstance(tags, (list, tuple)):
        return [(str(t), True) for t in tags]
    return [(str(tags), True)] if tags else []


def tag_texts(tags: Any) -> list[str]:
    """Each tag as a person reads it: a mapping's ``name=value``, a listed tag's name."""
    listed = not isinstance(tags, Mapping)
    return [name if listed else f"{name}={value}" for name, value in tag_pairs(tags)]
