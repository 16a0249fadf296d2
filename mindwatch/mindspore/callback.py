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

from mindspore.train import Callback

from mindwatch.metrics import ITERATION, LOCAL_GRAD_NORM
from mindwatch.mindspore.actions import checkpoint_files, prepare_optimizer
from mindwatch.mindspore.dynamic_batch import DynamicBatch, batch_axis_dynamic
from mindwatch.mindspore.failures import StepFailures
from mindwatch.mindspore.front_door import (
    ConfigLike,
    could_not_start,
    failure_text,
    listed_ids,
    log_metrics,
    merged_config,
    start_recorder,
    stop_reason,
)
from mindwatch.mindspore.mindformers_eval import listen, stop_listening
from mindwatch.mindspore.rank_signal import Announcement, RankSignal, SignalExchange
from mindwatch.mindspore.ranks import discover
from mindwatch.mindspore.recorder import StepRecorder, StepState, Training
from mindwatch.mindspore.rewind import snapshots_wanted
from mindwatch.mindspore.train_cell import (
    TrainCell,
    attention_found,
    layers_found,
    prepare_cell,
    switch_pass_over,
    switch_skip_steps,
)
from mindwatch.mindspore.train_params import TrainParams, ids_column
from mindwatch.session import ResumeError, RunSession
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
    the callback a no-op. A loop of your own uses :func:`mindwatch.mindspore.start_run` instead. ``batch``: the
    :class:`~mindwatch.mindspore.DynamicBatch` the dataset is batched by (``dataset.batch(batch_size=batch)``), whose
    size the ``shrink_batch`` / ``grow_batch`` actions change; each step records its size.
    """

    def __init__(self, config: ConfigLike = None, *, batch: DynamicBatch | None = None, **overrides: Any) -> None:
        super().__init__()
        self.config = merged_config(config, overrides)
        #: The DynamicBatch of the training (None: a fixed batch size).
        self.batch = batch
        #: Whether the train cell's batch axis is still to be made dynamic (before its first step compiles).
        self._dynamic_pending = False
        self.enabled = self.config.enable
        #: The current (or last) training's recording; None until train begin.
        self.recorder: StepRecorder | None = None
        self._cell: TrainCell | None = None
        #: This Model.train call's callback params as they were at train begin; None until then.
        self._params: TrainParams | None = None
        #: How a callback param is read on the hot path (``TrainParams.read``: a dict item).
        self._read: Callable[..., Any] = getattr
        #: The layer histograms' bins our train cell was prepared with at train begin (0: none).
        self._bins = 0
        # perf_counter() of this step's begin and of the last step's end: the gap between them is the data wait
        self._step_begin = self._prev_step_end = 0.0
        #: Data parallel with our train cell: the cross-rank signal its step sums (rank_signal.py), and its output.
        self._signal: RankSignal | None = None
        self._exchange: SignalExchange | None = None
        self._signal_output = -1
        #: A rank > 0 with the signal starts recording after its first step, in the run rank 0 announced in it.
        self._deferred = False
        self._boundary = _Boundary()
        #: The column of the step's batch that holds its sample ids (-1: none).
        self._ids_column = -1
        #: Our train cell can pass over batches after a rewind (``can_pass_over`` at train begin).
        self._passes_over = False
        #: What a fault of ours in a hook does (``strict``, ``max_failed_steps``): caught, said, counted.
        self._failures = StepFailures(self.config)
        #: ``cur_step_num`` of the last step end (what a fault at the next step begin is said at).
        self._last_step = 0
        #: When the evaluation under way began (``on_eval_begin``); None: none is.
        self._eval_began: float | None = None
        #: Batches of the evaluation under way (its samples: these x the validation set's batch size).
        self._eval_steps = 0

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
        try:
            self._train_begin(run_context.original_args())
        except Exception as e:  # a fault of ours at start: this training goes on without mindwatch
            if self.config.strict or isinstance(e, ResumeError):  # resume: must asks to stop here
                raise
            could_not_start(e, self.recorder)
            self.enabled = False

    def _train_begin(self, cb: Any) -> None:
        listen(self.evaluated)  # MindFormers' do_eval, which evaluates without callbacks
        self.recorder = self._exchange = self._signal = self._cell = None
        self._deferred = False
        params = self._params = TrainParams(cb)
        self._read = params.read
        self._boundary.params = params
        train_network = params.train_network
        self._bins = prepare_cell(self.config, train_network)  # every rank's graph alike, a rank that starts late too
        self._setup_signal(train_network)
        switch_skip_steps(self.config, train_network)  # before the graph compiles, on every rank
        sink = bool(params.read(cb, "dataset_sink_mode", False))
        snapshots = snapshots_wanted(self.config)
        if snapshots and sink:
            log.warning("mindwatch: in dataset sink mode a rewind passes over no batch (a step end is a whole sink)")
            snapshots = False
        self._passes_over = switch_pass_over(train_network, snapshots)
        self._ids_column = ids_column(self.config.callback.sample_ids, params.dataset)
        self._dynamic_pending = self.batch is not None and self.config.dynamic_batch.compile == "once"
        if self.batch is not None and sink:
            log.warning(
                "mindwatch: a DynamicBatch needs dataset_sink_mode=False (a sink runs many batches in one call); "
                "its size may not change as announced"
            )
        if self._signal is not None and self._signal.rank > 0:
            # never wait at start for another host's file: learn the run from rank 0's first step
            prepare_optimizer(self.config, params.optimizer)  # before the graph compiles, as on rank 0
            if self.config.layers.enabled and "layer_stats" in (getattr(train_network, "mindwatch_outputs", None) or ()):
                train_network.measure_layers(True)  # the first step is measured on every rank
            self._deferred = True
            self._step_begin = self._prev_step_end = _perf()
            return
        self._begin(Announcement())
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

    def _training(self, announced: Announcement, began: float | None) -> Training:
        """What this ``Model.train`` call is, for the recorder: the train cell's outputs, the signal, the batch."""
        params = self._params
        assert params is not None
        train_network = params.train_network
        return Training(
            optimizer=params.optimizer,
            saved=train_network,
            network=params.network,
            total_steps=params.planned,
            run_id=announced.run_id,
            attempt=announced.attempt,
            lifeline=announced.lifeline,
            signal=self._signal,
            batch=self.batch,
            layers=layers_found(self.config, train_network, self._bins),
            attention=attention_found(train_network),
            entropy_hooks=params.network,
            routing_sum=getattr(train_network, "mindwatch_routing_sum", None),
            pass_over=train_network.pass_over if self._passes_over else False,
            recorded=params.first_step if began is None else 0,
            began=began,
        )

    def _begin(self, announced: Announcement, began: float | None = None) -> None:
        """Start recording (``began``: a rank > 0 after its first step, from that step's end)."""
        params = self._params
        assert params is not None
        self.recorder = recorder = start_recorder(self.config, self._training(announced, began))
        if recorder is None:
            self.enabled = False
            return
        self._exchange = recorder.exchange
        self._failures.attach(recorder.rank, recorder.session.monitor.alert)
        self._boundary.state = recorder.state
        self._cell = TrainCell(recorder, params.train_network)
        if began is None:
            self._step_begin = self._prev_step_end = recorder.timer.last_recorded

    def on_train_step_begin(self, run_context: Any) -> None:
        if not self.enabled:
            return
        self._step_begin = _perf()
        try:
            self._step_starts(run_context.original_args())
        except Exception as e:
            self._failures.failed(e, step=self._last_step + 1, where="on_train_step_begin")

    def _step_starts(self, cb: Any) -> None:
        if self._dynamic_pending:  # before the first step compiles: one graph for every batch size
            self._dynamic_pending = False
            params = self._params
            assert params is not None
            batch_axis_dynamic(params.train_network, self._read(cb, "train_dataset_element", None))
        if self._deferred:
            return
        step = self._read(cb, "cur_step_num") + self.recorder.state.offset  # type: ignore[union-attr]
        if self._exchange is not None:
            self._exchange.before_step(step)
        cell = self._cell
        if cell is not None and cell.plans and not self._failures.given_up:
            cell.plan(step, self._step_begin)

    def on_train_step_end(self, run_context: Any) -> None:
        """Three parts, each a fault of its own: what the other ranks and the watchdog count on (the beat, the signal,
        the batch taken), the record (none once ``max_failed_steps`` in a row failed), the actions due."""
        if not self.enabled:
            return
        now = _perf()
        cb = run_context.original_args()
        failures = self._failures
        step = None
        try:
            step = self._read(cb, "cur_step_num")
            self._last_step = step
            if self._deferred:
                self._start_deferred(cb)
                if not self.enabled:
                    return
            recorder = self.recorder
            assert recorder is not None
            self._keep_up(recorder, cb, step, now)
            if failures.given_up:
                pass
            elif recorder.rewinds is not None and recorder.rewinds.passing:  # passed over after a rewind: no record
                self._passed_over(recorder, cb, step)
            else:
                self._record(recorder, cb, step, now)
        except Exception as e:
            failures.failed(e, step=step, where="on_train_step_end")
            self._gave_up()
        recorder = self.recorder
        if recorder is None or step is None:
            return
        try:
            recorder.act(step + recorder.state.offset, self._boundary.at(run_context, cb))
        except Exception as e:
            failures.failed(e, step=step, where="on_train_step_end (actions)")
            self._gave_up()
        else:
            failures.ok(step)

    def _outputs(self, cb: Any) -> Any:
        params = self._params
        assert params is not None
        return params.outputs(cb)

    def _keep_up(self, recorder: StepRecorder, cb: Any, step: int, now: float) -> None:
        """What goes on whatever the recording does: the watchdog's beat, every rank's requests and timings from the
        step's signal, the data wait, the batch the step took."""
        if recorder.watchdog is not None:
            recorder.watchdog.last_beat = now
        state = recorder.state
        waited = self._step_begin - self._prev_step_end
        if self._exchange is not None:  # what every rank asked for, the same vector on every rank
            self._exchange.after_step(self._outputs(cb)[self._signal_output].asnumpy(), step + state.offset)
            self._exchange.timed(step + state.offset, now - self._prev_step_end, waited)  # out with the next step
        recorder.timer.waited(waited)
        self._prev_step_end = now
        if state.first_pending:
            self._first_step(cb)
        if recorder.batch is not None and not (recorder.rewinds is not None and recorder.rewinds.passing):
            recorder.took(step + state.offset)

    def _record(self, recorder: StepRecorder, cb: Any, step: int, now: float) -> None:
        """The step's record, when it is due (or the step was skipped)."""
        state, arg = recorder.state, self._read
        n = step - state.recorded
        cell = self._cell
        assert cell is not None
        if not recorder.due(n) and not (cell.skip_output >= 0 and cell.skipped(self._outputs(cb))):
            return
        rec: dict[str, Any] = {"step": step + state.offset, "epoch": arg(cb, "cur_epoch_num"), "t": _wall()}
        rec["rank"] = recorder.rank
        params = self._params
        assert params is not None
        ran = state.batches_taken(step)
        if per_epoch := params.steps_per_epoch:
            rec["batch"] = (ran - 1) % per_epoch
        if state.rewound:  # a rewind numbered steps again; MindFormers' log and checkpoint names count on
            rec[ITERATION] = ran
        if self._ids_column >= 0:
            rec["sample_ids"] = _batch_ids(arg(cb, "train_dataset_element", None), self._ids_column)
        cell.read(self._outputs(cb), rec)
        if self._exchange is not None and self._exchange.local_norm is not None:
            rec[LOCAL_GRAD_NORM] = self._exchange.local_norm  # this rank's own, before the all-reduce
        if recorder.timer.shape_pending:
            recorder.timer.read_shape(arg(cb, "train_dataset_element", None))
        state.recorded = step
        recorder.record(rec, step + state.offset, n, now)

    def _gave_up(self) -> None:
        """After ``max_failed_steps`` failing steps in a row: the cell measures nothing more (its graph stays the
        plain one)."""
        if self._failures.given_up and self._cell is not None and self._cell.switching is not None:
            try:
                self._cell.off()
            except Exception as e:  # noqa: BLE001  # said with the others: nothing more to do
                self._failures.failed(e, step=self._last_step, where="TrainCell.off")

    def on_eval_begin(self, run_context: Any) -> None:
        """``Model.fit``'s evaluation (or ``Model.eval`` with this callback) begins: its time is no step's."""
        self._eval_began = _perf()

    def on_eval_step_end(self, run_context: Any) -> None:
        recorder = self.recorder
        self._eval_steps += 1
        if self.enabled and recorder is not None and recorder.watchdog is not None:
            recorder.watchdog.last_beat = _perf()  # an evaluation is no stall

    def on_eval_end(self, run_context: Any) -> None:
        """The evaluation's results (``eval_results`` in ``Model.fit``: the metrics and ``eval_loss``; ``metrics`` from
        ``Model.eval``) as ``eval/<name>`` at the training's last step, with ``eval_time``; the time it took is left out
        of the next step's time, data wait and throughput."""
        if not self.enabled or self.recorder is None or self.recorder.state.closed:
            return
        now = _perf()
        secs = now - (self._eval_began or now)
        self._eval_began = None
        steps, self._eval_steps = self._eval_steps, 0
        try:
            cb = run_context.original_args()
            results = self._read(cb, "eval_results", None) or self._read(cb, "metrics", None)
            valid = self._read(cb, "valid_dataset", None)
            samples = steps * int(valid.get_batch_size()) if valid is not None and steps else None
        except Exception as e:
            self._failures.failed(e, step=self._last_step, where="on_eval_end")
            return
        self.evaluated(results, eval_time=secs, samples=samples)

    def evaluated(self, results: Any, *, eval_time: float | None = None, samples: int | None = None) -> None:
        """Record an evaluation this callback's hooks did not see (MindFormers' ``do_eval``, which evaluates without
        callbacks: heard through :mod:`~mindwatch.mindspore.mindformers_eval`; one of your own between steps) as
        ``eval/<name>`` at the training's last step and epoch: ``results`` is ``{name: value}`` (a nested
        ``{metric: {name: value}}`` too); ``eval_time`` (s) is left out of the next step's time. Early stopping may
        stop the training at this boundary."""
        recorder = self.recorder
        if not self.enabled or recorder is None or recorder.state.closed:
            return
        try:
            if eval_time is not None:
                recorder.timer.paused(eval_time)
                self._prev_step_end += eval_time
            # the training's run_context (MindSpore gives an evaluation one of its own): a stop ends this epoch / step
            boundary = self._boundary if self._boundary.run_context is not None else None
            epoch = self._read(self._boundary.cb, "cur_epoch_num", None) if self._boundary.cb is not None else None
            step = self._last_step + recorder.state.offset
            recorder.evaluations.add(step, epoch, results, secs=eval_time, samples=samples, boundary=boundary)
        except Exception as e:
            self._failures.failed(e, step=self._last_step, where="evaluated")

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
        self._deferred = False
        signal, params = self._signal, self._params
        assert signal is not None and params is not None
        announced = signal.announced(self._outputs(cb)[self._signal_output].asnumpy())
        if announced.run_id is None:  # rank 0 records nothing (no callback there): a run of this rank's own
            run_id = fallback_run_id(self.config.run_name, signal.rank)
            log.warning("mindwatch: rank 0 announced no run; rank %d records into %s", signal.rank, run_id)
            announced = Announcement(run_id, None, announced.attempt, announced.resumed_step)
        began = self._step_begin
        self._begin(announced, began=self._prev_step_end)
        self._step_begin = began
        cell = self._cell
        if self.recorder is not None and cell is not None and cell.switching is not None:
            # the step that ran measured (set at train begin): the recorder reads it so; the next step plans afresh
            self.recorder.plan(int(self._read(cb, "cur_step_num")) + params.step_offset(cb))
            cell.switching.measure_layers(False)
            cell.switched, cell.graphs_run = (False, False), {True}

    def _passed_over(self, recorder: StepRecorder, cb: Any, step: int) -> None:
        """The step that ended passed over its batch (a rewind's ``skip``): named, not recorded, not counted."""
        state, params = recorder.state, self._params
        assert params is not None and recorder.rewinds is not None
        per_epoch = params.steps_per_epoch
        index = (state.batches_taken(step) - 1) % per_epoch if per_epoch else None
        ids = _batch_ids(self._read(cb, "train_dataset_element", None), self._ids_column) if self._ids_column >= 0 else None
        state.offset -= 1
        state.recorded = step
        recorder.passed_over(self._read(cb, "cur_epoch_num"), index, ids, now=_perf())

    def _first_step(self, cb: Any) -> None:
        recorder, params = self.recorder, self._params
        assert recorder is not None and params is not None
        state = recorder.state
        state.offset = params.step_offset(cb)
        if state.offset and params.planned is not None:
            recorder.session.plan(params.planned + state.offset)  # the plan in global steps

    def _finish(self, state: str, error: str | None = None) -> None:
        recorder = self.recorder
        assert recorder is not None
        stop_listening(self.evaluated)
        self._failures.close()
        try:
            if self._cell is not None:  # the cell may train again without us
                self._cell.off()
        finally:
            recorder.finish(state, error=error, reason=stop_reason(recorder, state, "stop requested by a callback"))


class _Boundary:
    """A ``Model.train`` step boundary (a :class:`~mindwatch.mindspore.actions.StepBoundary`): stop through
    ``run_context``, the checkpoints ``ModelCheckpoint`` wrote. One per callback, pointed at each step's
    ``run_context`` (two stores on the hot path, no object made)."""

    __slots__ = ("cb", "params", "run_context", "state")

    def __init__(self) -> None:
        self.run_context: Any = None
        self.cb: Any = None
        self.params: TrainParams | None = None
        self.state: StepState | None = None

    def at(self, run_context: Any, cb: Any) -> _Boundary:
        self.run_context, self.cb = run_context, cb
        return self

    def request_stop(self) -> None:
        self.run_context.request_stop()

    @property
    def iteration(self) -> int:
        """``cur_step_num`` from the resumed step: the batches MindSpore ran, which a rewind does not take back."""
        state, params = self.state, self.params
        assert state is not None and params is not None
        return state.batches_taken(int(params.read(self.cb, "cur_step_num")))

    def rewound(self, to_step: int, from_step: int) -> None:
        """The next step is numbered ``to_step + 1`` (``cur_step_num`` goes on: the offset to the global step falls)."""
        state = self.state
        assert state is not None
        state.offset -= from_step - to_step
        state.rewound += from_step - to_step

    def checkpoints(self) -> list[Path]:
        params = self.params
        assert params is not None
        return checkpoint_files(params.callbacks, params.read(self.cb, "latest_ckpt_file", None))

    @property
    def steps_per_epoch(self) -> int | None:
        """``batch_num``: what ``ModelCheckpoint`` numbers its files' steps by."""
        return self.params.batch_num if self.params is not None else None


def _batch_ids(element: Any, column: int) -> list[Any] | None:
    """The ids of this step's batch out of ``train_dataset_element`` (None when not there)."""
    if not isinstance(element, (tuple, list)) or len(element) <= column:
        return None
    return listed_ids(element[column])
