"""``TrainParams``: what MindSpore's callback params say at train begin, read once, and the one way to read them.

Example::

    cb = run_context.original_args()
    params = TrainParams(cb)                  # on_train_begin: the networks, the dataset, steps per epoch, the plan
    read = params.read                        # per step: read(cb, "cur_step_num"), a dict item
    offset = params.step_offset(cb)           # at the first step: the global step of a resumed training

``Model.train`` fills one dict (``cb_params``) for its callbacks; the callback reads what stays fixed for the call
here, at train begin, and only what changes per step (``cur_step_num``, ``net_outputs``, ...) at each step.
Training thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("mindwatch")


def reader(cb: Any) -> Callable[..., Any]:
    """How to read ``cb``'s params, ``read(cb, name[, default])``. MindSpore's are a dict whose attribute access
    raises and catches an AttributeError first (~1 us each): read them as dict items; any other object by attribute."""
    return dict.get if isinstance(cb, dict) else getattr


class TrainParams:
    """One ``Model.train`` call's callback params, as they are at train begin (see the module docstring)."""

    __slots__ = (
        "batch_num",
        "callbacks",
        "dataset",
        "first_step",
        "initial_step",
        "network",
        "optimizer",
        "planned",
        "read",
        "steps_per_epoch",
        "train_network",
    )

    def __init__(self, cb: Any) -> None:
        """Read ``cb`` (``run_context.original_args()``) at train begin."""
        #: How every param is read (:func:`reader`).
        self.read: Callable[..., Any] = reader(cb)
        read = self.read
        self.train_network: Any = read(cb, "train_network", None)
        #: The model (``network``), else the train network: what TFLOPS count and the attention hooks watch.
        self.network: Any = read(cb, "network", None) or self.train_network
        #: ``optimizer``, else the train network's.
        self.optimizer: Any = read(cb, "optimizer", None) or getattr(self.train_network, "optimizer", None)
        self.optimizer = getattr(self.optimizer, "mindwatch_wrapped", self.optimizer)  # our MindFormers wrapper's gate
        self.dataset: Any = read(cb, "train_dataset", None)
        #: ``batch_num``: what ``ModelCheckpoint`` numbers its files' steps by.
        self.batch_num: Any = read(cb, "batch_num", None)
        #: The steps of one epoch (:func:`steps_per_epoch`); None: unknown.
        self.steps_per_epoch = steps_per_epoch(self.dataset, bool(read(cb, "dataset_sink_mode", False)), self.batch_num)
        #: ``cur_step_num`` at train begin: the steps before this call.
        self.first_step = int(read(cb, "cur_step_num", 0) or 0)
        #: The ``cur_step_num`` this call ends at (:func:`planned_steps`); None: unknown.
        self.planned = planned_steps(self.dataset, read(cb, "epoch_num", None), self.first_step, self.steps_per_epoch)
        #: MindFormers' ``initial_step`` (a resume from a checkpoint); None when not set.
        self.initial_step: Any = read(cb, "initial_step", None)
        #: ``list_callback``: the user's callbacks (``ModelCheckpoint`` among them).
        self.callbacks: Any = read(cb, "list_callback", None)

    def outputs(self, cb: Any) -> Any:
        """The step's ``net_outputs``, and after them the Parameters our MindFormers wrapper keeps its own values in
        (``mindwatch_side_outputs``, :mod:`~mindwatch.mindspore.mindformers_wrapper`): what ``mindwatch_outputs`` names."""
        out = self.read(cb, "net_outputs")
        side = getattr(self.train_network, "mindwatch_side_outputs", None)
        return out if side is None else (*out, *side)

    def step_offset(self, cb: Any) -> int:
        """What to add to ``cur_step_num`` (it counts the steps of this ``Model.train`` call) for the global step.

        MindFormers' ``initial_step`` (a resume from a checkpoint) when set; else the epochs before
        ``initial_epoch``: ``(cur_epoch_num - 1) x steps per epoch``, less the epochs of this call so far.
        """
        initial = self.initial_step
        if isinstance(initial, int) and not isinstance(initial, bool):
            return initial
        epoch, step = int(self.read(cb, "cur_epoch_num", None) or 1), int(self.read(cb, "cur_step_num", None) or 1)
        if epoch <= 1:
            return 0
        per_epoch = self.steps_per_epoch or 0
        if per_epoch <= 0:
            return 0
        return max(0, (epoch - 1 - (step - 1) // per_epoch) * per_epoch)


def steps_per_epoch(dataset: Any, sink: bool, batch_num: Any) -> int | None:
    """The steps of one epoch: in sink mode ``batch_num`` (the sink size), else the dataset's size (``batch_num`` when
    it cannot tell). Where a sink request trains without sinking (on CPU), ``batch_num`` still holds the sink size,
    but every epoch runs the whole dataset."""
    if not sink and dataset is not None:
        try:
            size = int(dataset.get_dataset_size())
            return size if size > 0 else None
        except Exception:  # a dataset that cannot tell its size: batch_num
            log.debug("mindwatch: train_dataset.get_dataset_size() failed; using batch_num", exc_info=True)
    return batch_num if isinstance(batch_num, int) and batch_num > 0 else None


def planned_steps(dataset: Any, epochs: Any, start: int, per_epoch: int | None) -> int | None:
    """The ``cur_step_num`` a ``Model.train`` call of ``epochs`` epochs (``epoch_num``: ``epoch - initial_epoch``) of
    ``per_epoch`` steps ends at, from ``start`` (its ``initial_step``); None when unknown (an endless dataset)."""
    try:
        if dataset is not None and dataset.get_repeat_count() == -1:
            return None  # repeat() without a count: the epoch never ends
    except Exception:  # a dataset that cannot say how often it repeats: no total rather than no training
        return None
    if per_epoch is None or not isinstance(epochs, int) or epochs <= 0:
        return None
    return start + epochs * per_epoch


def ids_column(name: str | None, dataset: Any) -> int:
    """The position of the ``callback.sample_ids`` column among the dataset's columns; -1 when none (a warning if missing)."""
    if name is None or dataset is None:
        return -1
    try:
        names = list(dataset.get_col_names())
    except Exception as e:  # a dataset that cannot list its columns: no ids, and the reason rather than "no columns"
        log.warning(
            "mindwatch: callback.sample_ids names the column %r, but the dataset's column names could not be read "
            "(get_col_names() raised %r): no sample ids are recorded",
            name,
            e,
        )
        return -1
    if name not in names:
        log.warning("mindwatch: callback.sample_ids names the column %r, which the dataset lacks (its columns: %s)", name, names)
        return -1
    return names.index(name)
