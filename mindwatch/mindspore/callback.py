"""``MonitorCallback``: the MindSpore callback that feeds a mindwatch run.

Example::

    from mindwatch.mindspore import MonitorCallback
    model.train(epochs, ds, callbacks=[MonitorCallback("monitor.yaml")])

Per recorded step it puts one small record on the Monitor's queue: step, epoch, wall time,
rank, loss (and lr / grad_norm / overflow / loss_scale when the train cell returns them),
step_time, data_time (the wait for the batch), samples/s, tokens/s, attention entropy on
sampled steps. Memory is sampled on the worker thread. Nothing here writes files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore.train import Callback

from mindwatch import metrics as vocab
from mindwatch.config import MonitorConfig
from mindwatch.mindspore.actions import StepBoundary, checkpoint_files, prepare_optimizer
from mindwatch.mindspore.front_door import (
    ConfigLike,
    failure_text,
    listed_ids,
    log_metrics,
    merged_config,
    set_up_or_stop,
    start_recorder,
    stop_reason,
)
from mindwatch.mindspore.layer_stats import LayerGrouping
from mindwatch.mindspore.outputs import MINDFORMERS_LAYOUTS, decode_outputs, output_layout
from mindwatch.mindspore.rank_signal import Announcement, RankSignal, SignalExchange
from mindwatch.mindspore.ranks import discover
from mindwatch.mindspore.recorder import StepRecorder
from mindwatch.session import RunSession
from mindwatch.store.layerfiles import HISTOGRAM_BINS
from mindwatch.store.layout import fallback_run_id

log = logging.getLogger("mindwatch")
_perf = time.perf_counter
_wall = time.time


class MonitorCallback(Callback):
    """Record a MindSpore training into a mindwatch run directory.

    Example::

        cb = MonitorCallback({"project": "gpt", "interval": 10})
        model.train(2, dataset, callbacks=[cb])
        cb.run_dir        # where the run went

    ``config`` is a :class:`~mindwatch.config.MonitorConfig`, a dict, a YAML string or a path
    to a YAML file (a top-level ``monitor_config:`` key is accepted). ``enable: false`` makes
    the callback a no-op. A loop of your own uses :func:`mindwatch.mindspore.start_run` instead.
    """

    def __init__(self, config: ConfigLike = None, **overrides: Any) -> None:
        super().__init__()
        self.config = merged_config(config, overrides)
        self.enabled = self.config.enable
        #: The current (or last) training's recording; None until train begin.
        self.recorder: StepRecorder | None = None
        self._cell: _TrainCell | None = None
        #: Reads one of MindSpore's callback params: ``dict.__getitem__`` when they are a dict (see on_train_begin).
        self._read_arg: Callable[[Any, str], Any] = getattr
        #: The cur_step_num this Model.train call ends at (see planned_steps); None: unknown.
        self._planned: int | None = None
        # perf_counter() of this step's begin and of the last step's end: the gap between them is the data wait
        self._step_begin = self._prev_step_end = 0.0
        #: Data parallel with our train cell: the cross-rank signal its step sums (rank_signal.py), and its output.
        self._signal: RankSignal | None = None
        self._exchange: SignalExchange | None = None
        self._signal_output = -1
        #: A rank > 0 with the signal starts recording after its first step, in the run rank 0 announced in it.
        self._deferred: tuple[Any, Any] | None = None
        self._boundary = _Boundary()
        #: Where the step's batch came from: steps per epoch (for its index) and the sample ids' column (-1: none).
        self._per_epoch = 0
        self._ids_column = -1

    # -- public ------------------------------------------------------------
    @property
    def session(self) -> RunSession | None:
        """The run's session (directory, Monitor, Control) once training began."""
        return self.recorder.session if self.recorder else None

    @property
    def run_dir(self) -> Path | None:
        """The run directory of the current (or last) training, once it started."""
        return self.recorder.session.run_dir if self.recorder else None

    def log(self, step: int, **metrics: float) -> None:
        """Record user metrics for ``step`` (names of your own; values must be numbers)."""
        log_metrics(self.recorder, step, metrics)

    # -- MindSpore hooks ------------------------------------------------------
    def on_train_begin(self, run_context: Any) -> None:
        if not self.enabled:
            return
        self.recorder = None
        self._exchange = self._signal = None
        self._deferred = None
        cb = run_context.original_args()
        train_network = _param(cb, "train_network", None)
        optimizer = _param(cb, "optimizer", None) or getattr(train_network, "optimizer", None)
        self._planned = planned_steps(cb)
        # MindSpore's callback params are a dict whose attribute access raises and catches an
        # AttributeError first (~1 us each): read them as dict items on the hot path.
        self._read_arg = dict.__getitem__ if isinstance(cb, dict) else getattr
        if self.config.layers.enabled:
            prepare_cell(self.config, train_network)  # every rank's graph alike, a rank that starts late too
        self._setup_signal(train_network)
        switch_skip_steps(self.config, train_network)  # before the graph compiles, on every rank
        self._per_epoch = steps_per_epoch(cb) or 0
        self._ids_column = ids_column(self.config.callback.sample_ids, _param(cb, "train_dataset", None))
        if self._signal is not None and self._signal.rank > 0:
            # never wait at start for another host's file: learn the run from rank 0's first step
            prepare_optimizer(self.config, optimizer)  # before the graph compiles, as on rank 0
            if self.config.layers.enabled and "layer_stats" in (getattr(train_network, "mindwatch_outputs", None) or ()):
                train_network.measure_layers(True)  # the first step is measured on every rank
            self._deferred = (optimizer, train_network)
            self._step_begin = self._prev_step_end = _perf()
            return
        self._begin(cb, optimizer, train_network, run_id=None)
        if self._signal is not None and self.recorder is not None:
            session = self.recorder.session
            lifeline = getattr(session.lifeline, "address", None)
            self._signal.announce(Announcement(session.run_dir.name, lifeline, session.attempt))

    def _setup_signal(self, train_network: Any) -> None:
        param = getattr(train_network, "mindwatch_signal", None)
        declared = getattr(train_network, "mindwatch_outputs", None) or ()
        if param is None or "signal" not in declared:
            return
        who = discover()
        if who.world_size > 1:
            self._signal = RankSignal(param, rank=who.rank, world_size=who.world_size)
            self._signal_output = declared.index("signal")

    def _begin(
        self,
        cb: Any,
        optimizer: Any,
        train_network: Any,
        run_id: str | None,
        began: float | None = None,
        attempt: int | None = None,
    ) -> None:
        collective = self._signal is not None
        start = start_recorder(
            self.config,
            optimizer=optimizer,
            saved=train_network,
            network=_param(cb, "network", None) or train_network,
            total_steps=self._planned,
            run_id=run_id,
            attempt=attempt,
            collective=collective,
        )

        def watch(recorder: StepRecorder) -> None:  # the train cell's outputs, else attention entropy through hooks
            self._cell = _TrainCell(recorder, train_network)
            if recorder.attention is None:  # PyNative forward hooks, for models without AttentionStats
                recorder.watch_entropy_hooks(_param(cb, "network", None) or train_network)

        self.recorder = set_up_or_stop(start, watch)
        if self.recorder is None:
            self.enabled = False
            return
        if self._signal is not None:
            self._exchange = SignalExchange(self._signal, self.recorder.session)
        now = _perf()
        if began is None:
            self._step_begin = self._prev_step_end = now
        self.recorder.timer.restart(now if began is None else began)
        self.recorder.state.recorded = int(_param(cb, "cur_step_num", 0) or 0) if began is None else 0
        if self.recorder.watchdog is not None:
            self.recorder.watchdog.started = now  # from here, compilation and the first batch have first_step_timeout

    def on_train_step_begin(self, run_context: Any) -> None:
        if not self.enabled:
            return
        self._step_begin = _perf()
        if self._exchange is not None:
            self._exchange.before_step()
        cell = self._cell
        if cell is not None and cell.plans:
            state = self.recorder.state  # type: ignore[union-attr]
            cell.plan(self._read_arg(run_context.original_args(), "cur_step_num") + state.offset, self._step_begin)

    def on_train_step_end(self, run_context: Any) -> None:
        if not self.enabled:
            return
        now = _perf()
        if self._deferred is not None:
            self._start_deferred(run_context.original_args())
            if not self.enabled:
                return
        recorder = self.recorder
        assert recorder is not None
        state = recorder.state
        cb = run_context.original_args()
        arg = self._read_arg
        step = arg(cb, "cur_step_num")
        waited = self._step_begin - self._prev_step_end
        if self._exchange is not None:  # what every rank asked for, the same vector on every rank
            self._exchange.after_step(arg(cb, "net_outputs")[self._signal_output].asnumpy(), step + state.offset)
            self._exchange.timed(step + state.offset, now - self._prev_step_end, waited)  # out with the next step
        if recorder.watchdog is not None:
            recorder.watchdog.last_beat = now
        recorder.timer.data_wait += waited
        self._prev_step_end = now
        n = step - state.recorded
        cell = self._cell
        assert cell is not None
        if not recorder.due(n) and not (cell.skip_output >= 0 and cell.skipped(arg(cb, "net_outputs"))):
            recorder.act(step + state.offset, self._boundary.at(run_context, cb))
            return
        if state.first_pending:
            self._first_step(cb)
        rec: dict[str, Any] = {"step": step + state.offset, "epoch": arg(cb, "cur_epoch_num"), "t": _wall()}
        rec["rank"] = recorder.rank
        if self._per_epoch:
            rec["batch"] = (step + state.offset - 1) % self._per_epoch
        if self._ids_column >= 0:
            rec["sample_ids"] = sample_ids(_param(cb, "train_dataset_element", None), self._ids_column)
        cell.read(arg(cb, "net_outputs"), rec)
        if recorder.timer.shape_pending:
            recorder.timer.read_shape(_param(cb, "train_dataset_element", None))
        state.recorded = step
        recorder.record(rec, step + state.offset, n, now, self._boundary.at(run_context, cb))

    def on_train_end(self, run_context: Any) -> None:
        if not self.enabled or self.recorder is None:
            return
        self._finish("stopped" if run_context.get_stop_requested() else "finished")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # MindSpore's callback manager is an ExitStack: this runs when Model.train raises, too.
        if self.enabled and self.recorder is not None and exc is not None:
            self._finish("failed", error=failure_text(exc_type, exc))
        # never swallow the user's exception: return None

    # -- internals ------------------------------------------------------------
    def _start_deferred(self, cb: Any) -> None:
        """A rank > 0 after its first step: join the run rank 0 announced in the signal (or record alone)."""
        optimizer, train_network = self._deferred  # type: ignore[misc]
        self._deferred = None
        signal = self._signal
        assert signal is not None
        announced = signal.announced(self._read_arg(cb, "net_outputs")[self._signal_output].asnumpy())
        run_id = announced.run_id
        if run_id is None:  # rank 0 records nothing (no callback there): a run of this rank's own
            run_id = fallback_run_id(self.config.run_name, signal.rank)
            log.warning("mindwatch: rank 0 announced no run; rank %d records into %s", signal.rank, run_id)
        began = self._step_begin
        self._begin(cb, optimizer, train_network, run_id=run_id, began=self._prev_step_end, attempt=announced.attempt)
        self._step_begin = began
        if announced.lifeline and self.recorder is not None:
            self.recorder.session.join_lifeline(announced.lifeline)
        cell = self._cell
        if self.recorder is not None and cell is not None and cell.switching is not None:
            # the step that ran measured (set at train begin): the recorder reads it so; the next step plans afresh
            self.recorder.plan(int(self._read_arg(cb, "cur_step_num")) + step_offset(cb))
            cell.switching.measure_layers(False)
            cell.switched, cell.graphs_run = (False, False), {True}

    def _first_step(self, cb: Any) -> None:
        state = self.recorder.state  # type: ignore[union-attr]
        state.offset = step_offset(cb)
        if state.offset and self._planned is not None:
            self.recorder.session.plan(self._planned + state.offset)  # type: ignore[union-attr]  # the plan in global steps

    def _finish(self, state: str, error: str | None = None) -> None:
        recorder = self.recorder
        assert recorder is not None
        if self._cell is not None:  # the cell may train again without us
            self._cell.off()
        recorder.finish(state, error=error, reason=stop_reason(recorder, state, "stop requested by a callback"))


def prepare_cell(config: MonitorConfig, net: Any) -> int:
    """Before the train cell's graph compiles, on every rank: what the config switches on in it (the layer
    histograms); returns the histograms' bins (0: none). Called again, it changes nothing."""
    params = getattr(net, "mindwatch_layer_params", None)
    declared = getattr(net, "mindwatch_outputs", None) or ()
    if not config.layers.enabled or not params or "layer_stats" not in declared:
        return 0
    if "layer_histograms" in declared:
        return HISTOGRAM_BINS
    net.measure_layers(False)
    if config.layers.histogram_every and hasattr(net, "enable_layer_histograms"):
        net.enable_layer_histograms(LayerGrouping(params, config.layers.group).groups, HISTOGRAM_BINS)
        return HISTOGRAM_BINS
    return 0


class _Boundary(StepBoundary):
    """A ``Model.train`` step boundary: stop through ``run_context``, the checkpoints ``ModelCheckpoint`` wrote.
    One per callback, pointed at each step's ``run_context`` (two stores on the hot path, no object made)."""

    __slots__ = ("cb", "run_context")

    def __init__(self) -> None:  # the base's fields are methods here, read from run_context and cb
        self.run_context: Any = None
        self.cb: Any = None

    def at(self, run_context: Any, cb: Any) -> _Boundary:
        self.run_context, self.cb = run_context, cb
        return self

    def request_stop(self) -> None:  # type: ignore[override]
        self.run_context.request_stop()

    def checkpoints(self) -> list[Path]:  # type: ignore[override]
        return checkpoint_files(_param(self.cb, "list_callback", None), _param(self.cb, "latest_ckpt_file", None))

    @property
    def steps_per_epoch(self) -> int | None:  # type: ignore[override]
        return _param(self.cb, "batch_num", None)


class _TrainCell:
    """What the callback reads from the train cell's outputs, and the graphs it switches between steps.

    Our train cells declare their outputs (``mindwatch_outputs``): the loss, grad_norm, lr, ... and, switched
    on, the per-layer statistics, histograms and attention statistics; MindFormers' are known by length.
    """

    def __init__(self, recorder: StepRecorder, train_network: Any) -> None:
        self.recorder = recorder
        self.network = train_network
        self.declared: tuple[str, ...] | None = getattr(train_network, "mindwatch_outputs", None)
        self.layout: tuple[tuple[int, str], ...] | None = None
        #: Our train cell with ``layer_stats=True`` (its ``measure_layers`` picks a graph); None: no switching.
        self.switching: Any = None
        #: Which of the cell's two graphs (measuring or not) have run: the first step of each compiles it.
        self.graphs_run: set[bool] = set()
        self.graph_mode = ms.get_context("mode") == ms.GRAPH_MODE
        self.switched = (False, False)
        self.layer_output = self.hist_output = self.attention_output = -1
        #: The statistics come from MindFormers' ``local_norm`` output (gradient norms only), not from our cell.
        self.local_norm = False
        if recorder.config.layers.enabled:
            self._setup_layers()
        if "attention" in (self.declared or ()):  # the model author's AttentionStats cells are the opt-in
            recorder.watch_attention(train_network.network)
            self.attention_output = self.declared.index("attention")  # type: ignore[union-attr]
        #: Whether anything is planned per step (layers or attention statistics, hooks).
        self.plans = recorder.layers is not None or recorder.attention is not None
        #: Our cell with ``skip_steps`` on: the output that says the step was skipped (read every step), else -1.
        declared = self.declared or ()
        self.skip_output = declared.index(vocab.SKIPPED) if vocab.SKIPPED in declared else -1

    def skipped(self, outputs: Any) -> bool:
        """Whether ``skip_steps`` skipped this step (a step not otherwise recorded is recorded when it was)."""
        return bool(outputs[self.skip_output].asnumpy())

    def _setup_layers(self) -> None:
        net, recorder = self.network, self.recorder
        params = getattr(net, "mindwatch_layer_params", None)
        if getattr(net, "local_norm", False) is True and not params:  # MindFormers' wrapper: 7 outputs
            names = [p.name for p in getattr(net, "weights", ())]
            if names:
                recorder.watch_layers(LayerGrouping(names, recorder.config.layers.group), 0)
                self.layer_output = MINDFORMERS_LAYOUTS[7].index("local_norm")
                self.local_norm = True
            return
        if not params or "layer_stats" not in (self.declared or ()):
            return
        grouping = LayerGrouping(params, recorder.config.layers.group)
        bins = prepare_cell(recorder.config, net)
        self.declared = net.mindwatch_outputs
        recorder.watch_layers(grouping, bins)
        self.switching = net
        self.layer_output = self.declared.index("layer_stats")  # type: ignore[union-attr]
        if bins:
            self.hist_output = self.declared.index("layer_histograms")  # type: ignore[union-attr]

    def plan(self, step: int, now: float) -> None:
        """Before global step ``step``: its measurements, and the cell's graph for them."""
        recorder = self.recorder
        recorder.plan(step)
        layers = recorder.layers
        if self.switching is None or layers is None:
            return
        wanted = (layers.measuring, layers.histograms)
        if wanted != self.switched:  # nothing to do between the measured steps
            self.switching.measure_layers(*wanted)
            self.switched = wanted
            if wanted[0] not in self.graphs_run:  # its graph compiles in this step (GRAPH mode)
                self.graphs_run.add(wanted[0])
                watchdog = recorder.watchdog
                if watchdog is not None and not recorder.state.first_pending and self.graph_mode:
                    watchdog.compiling(now)

    def read(self, outputs: Any, rec: dict[str, Any]) -> None:
        """The step's values out of ``outputs`` into ``rec``."""
        if self.layout is None:
            self._reconcile(outputs)
            self.layout = output_layout(outputs, self.declared)
        decode_outputs(outputs, self.layout, rec)
        recorder = self.recorder
        layers = recorder.layers
        if layers is not None and layers.wanted(rec) and len(outputs) > self.layer_output:
            squares = outputs[self.layer_output].asnumpy()
            if self.local_norm:  # MindFormers' local_norm: the gradients' squared sums only (weights and updates unmeasured)
                squares = np.stack([squares.reshape(-1), *np.full((2, squares.size), np.nan)])
            hist = outputs[self.hist_output].asnumpy() if layers.histograms and self.hist_output >= 0 else None
            layers.add(rec, squares, hist)
        if recorder.attention is not None and recorder.attention.sampling:
            recorder.attention.add(rec, outputs[self.attention_output].asnumpy().tolist())

    def _reconcile(self, outputs: Any) -> None:
        """A cell compiled before the histograms were switched on (an earlier ``Model.train`` of it) returns one output
        less than it declares: go on without the histograms rather than misread every output."""
        declared = self.declared
        if not declared or "layer_histograms" not in declared or not isinstance(outputs, (tuple, list)):
            return
        if len(outputs) == len(declared) - 1:
            log.warning("mindwatch: layer histograms are off: the train cell was compiled without them (train a new cell)")
            self.declared = tuple(n for n in declared if n != "layer_histograms")
            self.hist_output = -1
            if self.recorder.layers is not None:
                self.recorder.layers.histograms_off()
            if self.switching is not None:
                self.switched = (self.switched[0], False)
                self.switching.measure_layers(self.switched[0])
            if "attention" in self.declared:
                self.attention_output = self.declared.index("attention")

    def off(self) -> None:
        """Measure nothing more (the cell may train again without us)."""
        if self.switching is not None:
            self.switching.measure_layers(False)
            self.switched = (False, False)


def _param(cb: Any, name: str, default: Any = None) -> Any:
    """One of MindSpore's callback params, or ``default`` (they are a dict whose missing keys raise KeyError)."""
    if isinstance(cb, dict):
        return cb.get(name, default)
    return getattr(cb, name, default)


def switch_skip_steps(config: MonitorConfig, train_network: Any) -> bool:
    """``skip_steps.enabled``: switch the decision on in our train cell (once: a cell compiled with it keeps it); True if on."""
    if not config.skip_steps.enabled:
        return False
    if getattr(train_network, "skip_decision", None) is not None:
        return True
    switch = getattr(train_network, "skip_steps", None)
    if switch is None:
        log.warning(
            "mindwatch: skip_steps needs mindwatch's train cell (TrainOneStepWithGradNorm or "
            "TrainOneStepWithGradNormAndLossScale); this training skips no step"
        )
        return False
    switch(config.skip_steps)
    return True


def steps_per_epoch(cb: Any) -> int | None:
    """The steps of one epoch: the dataset's size (``batch_num`` in sink mode, or when the dataset cannot say)."""
    dataset = _param(cb, "train_dataset", None)
    if not _param(cb, "dataset_sink_mode", False) and dataset is not None:
        try:
            return int(dataset.get_dataset_size()) or None
        except Exception:  # a dataset that cannot tell its size: batch_num
            log.debug("mindwatch: train_dataset.get_dataset_size() failed; using batch_num", exc_info=True)
    per_epoch = _param(cb, "batch_num", None)
    return per_epoch if isinstance(per_epoch, int) and per_epoch > 0 else None


def ids_column(name: str | None, dataset: Any) -> int:
    """The position of the ``callback.sample_ids`` column among the dataset's columns; -1 when none (a warning if missing)."""
    if name is None or dataset is None:
        return -1
    try:
        names = list(dataset.get_col_names())
    except Exception:
        names = []
    if name not in names:
        log.warning("mindwatch: callback.sample_ids names the column %r, which the dataset lacks (its columns: %s)", name, names)
        return -1
    return names.index(name)


def sample_ids(element: Any, column: int) -> list[Any] | None:
    """The ids of this step's batch out of ``train_dataset_element``, as a list (None when not there)."""
    if not isinstance(element, (tuple, list)) or len(element) <= column:
        return None
    return listed_ids(element[column])


def planned_steps(cb: Any) -> int | None:
    """The ``cur_step_num`` this ``Model.train`` call ends at; None when unknown (an endless dataset).

    ``epoch_num`` is the epochs of this call (``epoch - initial_epoch``) and ``cur_step_num`` starts at
    its ``initial_step``. An epoch is ``batch_num`` steps in sink mode (``sink_size``, or the dataset's
    size), else the dataset's size: where sink mode falls back (on CPU), ``batch_num`` still holds the
    sink size but every epoch runs the whole dataset.
    """
    dataset = _param(cb, "train_dataset", None)
    try:
        if dataset is not None and dataset.get_repeat_count() == -1:
            return None  # repeat() without a count: the epoch never ends
        sink = bool(_param(cb, "dataset_sink_mode", False))
        per_epoch = _param(cb, "batch_num", None) if sink or dataset is None else dataset.get_dataset_size()
        epochs = _param(cb, "epoch_num", None)
        start = int(_param(cb, "cur_step_num", 0) or 0)
    except Exception:  # a dataset that cannot say its size: no total rather than no training
        return None
    if not isinstance(per_epoch, int) or not isinstance(epochs, int) or per_epoch <= 0 or epochs <= 0:
        return None
    return start + epochs * per_epoch


def step_offset(cb: Any) -> int:
    """What to add to ``cur_step_num`` (it counts the steps of this ``Model.train`` call) for the global step.

    MindFormers' ``initial_step`` (a resume from a checkpoint) when set; else the epochs before
    ``initial_epoch``: ``(cur_epoch_num - 1) x steps per epoch``, less the epochs of this call so far.
    Steps per epoch: ``batch_num`` in sink mode (the sink size), else the dataset size (on CPU a
    sink request trains without sinking, and ``batch_num`` is still the sink size).
    """
    get = lambda k, d=None: _param(cb, k, d)  # noqa: E731
    initial = get("initial_step")
    if isinstance(initial, int) and not isinstance(initial, bool):
        return initial
    epoch, step = int(get("cur_epoch_num") or 1), int(get("cur_step_num") or 1)
    if epoch <= 1:
        return 0
    per_epoch = int(get("batch_num") or 0)
    dataset = get("train_dataset")
    if not get("dataset_sink_mode") and dataset is not None:
        try:
            per_epoch = int(dataset.get_dataset_size()) or per_epoch
        except Exception:  # a dataset that cannot tell its size: batch_num
            log.debug("mindwatch: train_dataset.get_dataset_size() failed; using batch_num", exc_info=True)
    if per_epoch <= 0:
        return 0
    return max(0, (epoch - 1 - (step - 1) // per_epoch) * per_epoch)
