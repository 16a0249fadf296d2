"""Cells a model holds that measure on some steps only (``AttentionStats``, ``RouterStats``): found by type, named by
the layer that holds them, switched on and off by a flag Parameter of each.

Example::

    cells = owned_cells(network, RouterStats)      # [("blocks.0.moe", <RouterStats>), ...]
    flags = MeasuredCells(cells, every=10)
    flags.plan(step)                               # before a step: on at every 10th, off between (no write otherwise)

The flags are written with ``ops.assign``: in place, so a graph compiled by ``ms.jit`` around the user's own step sees
them (``set_data`` replaces the buffer such a graph holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mindspore as ms
from mindspore import ops

_ON, _OFF = ms.Tensor(1, ms.int32), ms.Tensor(0, ms.int32)
#: The wrappers a train network puts around the model: not part of a layer's name.
_WRAPPERS = ("network.", "_backbone.", "backbone.")


def owned_cells(network: Any, kind: type) -> list[tuple[str, Any]]:
    """Every cell of type ``kind`` under ``network``, with the name of the cell that holds it (the layer)."""
    out = []
    for name, cell in network.cells_and_names():
        if isinstance(cell, kind):
            owner = name.rpartition(".")[0] or name
            while owner.startswith(_WRAPPERS):
                owner = owner.split(".", 1)[1]
            out.append((owner, cell))
    return out


class MeasuredCells:
    """The measured steps (every ``every``) of cells with an ``on`` flag Parameter and a ``values`` Parameter."""

    def __init__(self, cells: Sequence[tuple[str, Any]], *, every: int) -> None:
        self.layers = tuple(name for name, _ in cells)
        self.cells = [cell for _, cell in cells]
        self.every = every
        #: Whether the step being run measures (what the flags hold).
        self.sampling = False
        self._set(False)

    def plan(self, step: int) -> bool:
        """Measure global step ``step`` or not; the flags change only when that changes."""
        on = step % self.every == 0
        if on != self.sampling:
            self._set(on)
        return on

    def off(self) -> None:
        """Measure nothing (the training ends; the cells may train again without us)."""
        if self.sampling:
            self._set(False)

    def values(self) -> list[Any]:
        """The cells' value Parameters (for one compiled read)."""
        return [cell.values for cell in self.cells]

    def _set(self, on: bool) -> None:
        for cell in self.cells:
            ops.assign(cell.on, _ON if on else _OFF)
        self.sampling = on
