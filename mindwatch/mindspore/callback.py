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
import math
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mindspore as ms
import numpy as np
from mindspore.train import Callback

from mindwatch.config import MonitorConfig, load_config
from mindwatch.mindspore.actions import Interventions
from mindwatch.mindspore.attention import attention_stats_cells
from mindwatch.mindspore.layer_stats import LayerGrouping
from mindwatch.mindspore.outputs import MINDFORMERS_LAYOUTS, decode_outputs, output_layout
from mindwatch.mindspore.probes import (
    AttentionEntropy,
    LrProbe,
    attention_cells,
    device_memory_sampler,
)
from mindwatch.mindspore.ranks import discover
from mindwatch.session import ResumeError, RunSession, SaveDirUnavailable
from mindwatch.store.layerfiles import HISTOGRAM_BINS, HISTOGRAM_KEY, LAYER_KEY, LayerHistograms, LayerRow
from mindwatch.system import device_util_sampler, host_memory_sampler

if TYPE_CHECKING:
    from mindwatch.monitor.control import Control
    from mindwatch.monitor.watchdog import Watchdog

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
    the callback a no-op.
    """

    def __init__(self, config: MonitorConfig | dict[str, Any] | str | os.PathLike[str] | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = load_config(config)
        if overrides:
            cfg = load_config({**cfg.model_dump(exclude_unset=True), **overrides})
        self.config = cfg
        self.enabled = cfg.enable
        self.session: RunSession | None = None
        self._metrics = cfg.enabled_metrics
        self._step_interval = cfg.step_interval
        # what one training needs, set at train begin (None until then)
        self._rank = 0
        self._actions: Interventions | None = None
        self._control: Control | None = None
        self._submit: Callable[[dict[str, Any]], None] | None = None
        self._watchdog: Watchdog | None = None
        self._lr_probe: LrProbe | None = None
        self._entropy: AttentionEntropy | None = None
        #: Per-layer statistics (a train cell with ``layer_stats=True``): the grouping, the cell (its
        #: ``measure_layers`` picks the steps), the output that holds them, whether this step measures weights and updates.
        self._layers: LayerGrouping | None = None
        self._train_cell: Any = None
        #: Which of the cell's two graphs (measuring or not) have run: the first step of each compiles it.
        self._graphs_run: set[bool] = set()
        self._graph_mode = False
        self._layer_output = -1
        self._layers_on = False
        #: The statistics come from MindFormers' ``local_norm`` output (gradient norms only), not from our cell.
        self._local_norm = False
        #: Attention statistics through the graph (mindwatch.mindspore.attention): the layers, their cells' flags, the output.
        self._attention_layers: tuple[str, ...] = ()
        self._attention_flags: list[Any] = []
        self._attention_output = -1
        self._attention_on = False
        #: Histograms of each layer (``layers.histogram_every``): the output (-1: none), whether this step takes them.
        self._hist_output = -1
        self._hist_on = False
        self._guard_nonfinite = False
        #: Reads one of MindSpore's callback params: ``dict.__getitem__`` when they are a dict (see on_train_begin).
        self._read_arg: Callable[[Any, str], Any] = getattr
        self._declared_outputs: Any = None
        self._output_layout: tuple[tuple[int, str], ...] | None = None
        self._batch_size = cfg.batch_size
        self._seq_length = cfg.seq_length
        self._batch_shape_read = False
        # step timing, perf_counter seconds
        self._step_begin = self._prev_step_end = self._last_recorded_time = 0.0
        self._last_recorded_step = 0
        #: Seconds spent waiting for data since the last recorded step.
        self._data_wait = 0.0
        #: The first step is always recorded (in GRAPH mode its time includes compilation).
        self._first_pending = True
        self._closed = False
        #: The cur_step_num this Model.train call ends at (see planned_steps); None: unknown.
        self._planned: int | None = None
        #: Global step minus MindSpore's cur_step_num (a resumed training), known at the first step.
        self._offset = 0

    # -- public ------------------------------------------------------------
    @property
    def run_dir(self) -> Path | None:
        """The run directory of the current (or last) training, once it started."""
        return self.session.run_dir if self.session else None

    def log(self, step: int, **metrics: float) -> None:
        """Record user metrics for ``step`` (names of your own; values must be numbers)."""
        if self.session is not None:
            self.session.monitor.record({"step": int(step), "t": _wall(), "rank": self._rank, **metrics})

    # -- MindSpore hooks ------------------------------------------------------
    def on_train_begin(self, run_context: Any) -> None:
        if not self.enabled:
            return
        try:
            self._begin(run_context)
        except Exception as e:  # the monitor never takes the training down at start (strict: true says otherwise)
            if self.config.strict or isinstance(e, ResumeError):  # resume: must is a request to stop here
                raise
            log.warning("mindwatch: could not start monitoring (%r); this training goes on without mindwatch", e)
            self.enabled = False
            if self.session is not None:
                self.session.close("stopped", reason=f"mindwatch could not start: {e!r}")
                self.session = None

    def _begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        who = discover()
        rank, world = who.rank, who.world_size
        self._rank = rank
        samplers = []
        if "host_rss_gb" in self._metrics:
            samplers.append(host_memory_sampler())
        if self._metrics & {"device_mem_gb", "device_mem_peak_gb"}:
            dev = device_memory_sampler()
            if dev is not None:
                samplers.append(dev)
        if self._metrics & {"device_util", "device_mem_util"}:
            util = device_util_sampler(str(ms.get_context("device_target")), int(ms.get_context("device_id") or 0))
            if util is not None:
                samplers.append(util)
        try:
            self.session = self._start_session(rank, world, who, samplers)
        except SaveDirUnavailable as e:
            if self.config.strict:
                raise
            log.warning("%s; this training goes on without mindwatch", e)
            self.enabled = False
            return
        self._planned = planned_steps(cb)
        self.session.plan(self._planned)
        train_network = _param(cb, "train_network", None)
        optimizer = _param(cb, "optimizer", None) or getattr(train_network, "optimizer", None)
        self._declared_outputs = getattr(train_network, "mindwatch_outputs", None)
        self._output_layout = None
        # MindSpore's callback params are a dict whose attribute access raises and catches an
        # AttributeError first (~1 us each): read them as dict items on the hot path.
        self._read_arg = dict.__getitem__ if isinstance(cb, dict) else getattr
        self._lr_probe = LrProbe(optimizer) if "lr" in self._metrics else None
        self._actions = Interventions(
            self.session,
            optimizer=optimizer,
            train_network=train_network,
            lr_probe=self._lr_probe or LrProbe(optimizer),
            rank=rank,
        )
        self._actions.prepare()
        self._control = self.session.control
        self._submit = self.session.monitor.record
        self._guard_nonfinite = self._actions.guard_nonfinite
        self._watchdog = self.session.watchdog
        if self._watchdog is not None:
            self._watchdog.started = _perf()  # from here, compilation and the first batch have first_step_timeout
        self._setup_layers(train_network)
        self._setup_attention(train_network)
        if not self._attention_layers:  # PyNative forward hooks, for models without AttentionStats
            self._setup_entropy(_param(cb, "network", None) or train_network)
        self._batch_size = self.config.batch_size
        self._seq_length = self.config.seq_length
        self._batch_shape_read = False
        now = _perf()
        self._step_begin = self._prev_step_end = self._last_recorded_time = now
        self._last_recorded_step = int(_param(cb, "cur_step_num", 0) or 0)
        self._data_wait = 0.0
        self._first_pending = True
        self._closed = False
        self._offset = 0  # global step - cur_step_num, known at the first step (see step_offset)

    def on_train_step_begin(self, run_context: Any) -> None:
        if not self.enabled:
            return
        self._step_begin = _perf()
        if self._entropy is None and not self._attention_flags and self._layers is None:
            return
        step = self._read_arg(run_context.original_args(), "cur_step_num")
        if self._entropy is not None:
            self._entropy.sampling = step % self.config.attention_entropy.every == 0
        if self._attention_flags:
            on = step % self.config.attention_entropy.every == 0
            if on != self._attention_on:
                for flag in self._attention_flags:
                    flag.set_data(ms.Tensor(int(on), ms.int32))
                self._attention_on = on
        if self._layers is not None:
            # the first step is measured too: its graph compiles with the first step, not `every` steps later
            step += self._offset
            hist = self._hist_output >= 0 and step % (self.config.layers.histogram_every or 1) == 0
            on = self._first_pending or hist or step % self.config.layers.every == 0
            if (on, hist) != (self._layers_on, self._hist_on):  # nothing to do between the measured steps
                if self._train_cell is not None:  # (MindFormers' local_norm comes every step: nothing to switch)
                    self._train_cell.measure_layers(on, hist)
                    if on not in self._graphs_run:  # its graph compiles in this step (GRAPH mode)
                        self._graphs_run.add(on)
                        if self._watchdog is not None and not self._first_pending and self._graph_mode:
                            self._watchdog.compiling(self._step_begin)
                self._layers_on, self._hist_on = on, hist

    def on_train_step_end(self, run_context: Any) -> None:
        if not self.enabled:
            return
        now = _perf()
        cb = run_context.original_args()
        arg = self._read_arg
        step = arg(cb, "cur_step_num")
        if self._watchdog is not None:
            self._watchdog.last_beat = now
        self._data_wait += self._step_begin - self._prev_step_end
        self._prev_step_end = now
        n = step - self._last_recorded_step
        measured = self._layers_on or self._hist_on or self._attention_on  # a step measured in the graph is recorded
        if n < self._step_interval and not self._first_pending and not measured:
            if self._control.pending:
                self._actions.carry_out(run_context)
            return
        if self._first_pending:
            self._first_pending = False
            self._offset = step_offset(cb)
            if self._offset and self._planned is not None:
                self.session.plan(self._planned + self._offset)  # type: ignore[union-attr]  # the plan in global steps
        elapsed = now - self._last_recorded_time
        rec: dict[str, Any] = {"step": step + self._offset, "epoch": arg(cb, "cur_epoch_num"), "t": _wall(), "rank": self._rank}
        outputs = arg(cb, "net_outputs")
        if self._output_layout is None:
            self._reconcile_outputs(outputs)
            self._output_layout = output_layout(outputs, self._declared_outputs)
        decode_outputs(outputs, self._output_layout, rec)
        if self._lr_probe is not None and "lr" not in rec:
            lr = self._lr_probe(step + self._offset)
            if lr is not None:
                rec["lr"] = lr
        if n > 0 and elapsed > 0:
            rec["step_time"] = elapsed / n
            rec["data_time"] = self._data_wait / n
            if not self._batch_shape_read:
                self._read_batch_shape(cb)
            if self._batch_size:
                rec["samples_per_second"] = self._batch_size * n / elapsed
                if self._seq_length:
                    rec["tokens_per_second"] = self._batch_size * self._seq_length * n / elapsed
        if self._entropy is not None and self._entropy.values:
            rec.update(self._entropy.take())
        if self._layers is not None:
            self._add_layer_stats(outputs, rec)
        if self._attention_on:
            for name, (entropy, top) in zip(
                self._attention_layers, outputs[self._attention_output].asnumpy().tolist(), strict=True
            ):
                rec[f"attention_entropy/{name}"], rec[f"attention_max_logit/{name}"] = entropy, top
        self._submit(rec)
        if self._guard_nonfinite and not math.isfinite(rec.get("loss", 0.0) + rec.get("grad_norm", 0.0)):
            self._actions.nonfinite(rec)  # NaN/Inf: ask for the non-finite rule's actions on this very step
        if self._control.pending:  # an alert rule asked for stop / checkpoint / lr_backoff / dump_stacks
            self._actions.carry_out(run_context)
        self._last_recorded_step = step
        self._last_recorded_time = now
        self._data_wait = 0.0

    def on_train_end(self, run_context: Any) -> None:
        if not self.enabled or self.session is None:
            return
        stopped = run_context.get_stop_requested()
        reason = (self._actions.stop_reason or "stop requested by a callback") if stopped else None
        self._finish("stopped" if stopped else "finished", reason=reason)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # MindSpore's callback manager is an ExitStack: this runs when Model.train raises, too.
        if self.enabled and self.session is not None and exc is not None:
            text = "".join(traceback.format_exception_only(exc_type, exc)).strip()
            self._finish("failed", error=text)
        # never swallow the user's exception: return None

    # -- internals ------------------------------------------------------------
    def _finish(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        if self._closed or self.session is None:
            return
        self._closed = True
        if self._train_cell is not None:  # the cell may train again without us
            self._train_cell.measure_layers(False)
        for flag in self._attention_flags:
            flag.set_data(ms.Tensor(0, ms.int32))
        self._layers_on = self._hist_on = self._attention_on = False
        if self._entropy is not None:
            self._entropy.remove()
            self._entropy = None
        self.session.close(state, error=error, reason=reason)

    def _start_session(self, rank: int, world: int, who: Any, samplers: list[Any]) -> RunSession:
        return RunSession.start(
            self.config,
            rank=rank,
            world_size=world,
            samplers=samplers,
            versions={"mindspore": ms.__version__},
            nonfinite_checked=Interventions.nonfinite_checked(self.config),
            launch_key=who.launch_key,
            launch_meta=who.as_meta(),
        )

    def _setup_layers(self, train_network: Any) -> None:
        params = getattr(train_network, "mindwatch_layer_params", None)
        declared = self._declared_outputs or ()
        if not self.config.layers.enabled or self.session is None:
            return
        if getattr(train_network, "local_norm", False) is True and not params:  # MindFormers' wrapper: 7 outputs
            names = [p.name for p in getattr(train_network, "weights", ())]
            if names:
                self._layers = LayerGrouping(names, self.config.layers.group)
                self._layer_output = MINDFORMERS_LAYOUTS[7].index("local_norm")
                self._local_norm = True
                self.session.writer.set_layers(list(self._layers.layers))
            return
        if not params or "layer_stats" not in declared:
            return
        self._layers = LayerGrouping(params, self.config.layers.group)
        self._train_cell = train_network
        self._graphs_run = set()
        self._graph_mode = ms.get_context("mode") == ms.GRAPH_MODE
        self._layer_output = declared.index("layer_stats")
        self._layers_on = self._hist_on = False
        train_network.measure_layers(False)
        bins = 0
        if self.config.layers.histogram_every and hasattr(train_network, "enable_layer_histograms"):
            bins = HISTOGRAM_BINS
            train_network.enable_layer_histograms(self._layers.groups, bins)  # before the graph is compiled
            self._declared_outputs = train_network.mindwatch_outputs
            self._hist_output = self._declared_outputs.index("layer_histograms")
        self.session.writer.set_layers(list(self._layers.layers), bins)

    def _reconcile_outputs(self, outputs: Any) -> None:
        """A cell compiled before the histograms were switched on (an earlier ``Model.train`` of it) returns one output
        less than it declares: go on without the histograms rather than misread every output."""
        declared = self._declared_outputs
        if not declared or "layer_histograms" not in declared or not isinstance(outputs, (tuple, list)):
            return
        if len(outputs) == len(declared) - 1:
            self._histograms_off()
            self._declared_outputs = tuple(n for n in declared if n != "layer_histograms")
            if "attention" in self._declared_outputs:
                self._attention_output = self._declared_outputs.index("attention")

    def _histograms_off(self) -> None:
        """Go on without histograms: the train cell was compiled before they were switched on."""
        log.warning("mindwatch: layer histograms are off: the train cell was compiled without them (train a new cell)")
        self._hist_output, self._hist_on = -1, False
        if self._train_cell is not None:
            self._train_cell.measure_layers(self._layers_on)

    def _setup_attention(self, train_network: Any) -> None:
        declared = self._declared_outputs or ()
        if "attention" not in declared:  # the model author's AttentionStats cells are the opt-in
            return
        cells = attention_stats_cells(train_network.network)
        self._attention_layers = tuple(name for name, _ in cells)
        self._attention_flags = [cell.on for _, cell in cells]
        self._attention_output = declared.index("attention")
        self._attention_on = False
        for flag in self._attention_flags:
            flag.set_data(ms.Tensor(0, ms.int32))

    def _add_layer_stats(self, outputs: Any, rec: dict[str, Any]) -> None:
        """The step's per-layer statistics (one device read), and on a NaN/Inf gradient the first layer that had it."""
        assert self._layers is not None
        grad_norm = rec.get("grad_norm", 0.0)
        if not self._layers_on and not self._hist_on and math.isfinite(grad_norm):
            return
        if len(outputs) <= self._layer_output:
            return
        squares = outputs[self._layer_output].asnumpy()
        if self._local_norm:  # MindFormers' local_norm: the gradients' squared sums only (weights and updates unmeasured)
            squares = np.stack([squares.reshape(-1), *np.full((2, squares.size), np.nan)])
        if self._layers_on:
            rec[LAYER_KEY] = LayerRow(self._layers.layers, self._layers.stats(squares))
        if self._hist_on:
            if len(outputs) > self._hist_output:
                rec[HISTOGRAM_KEY] = LayerHistograms(self._layers.layers, outputs[self._hist_output].asnumpy())
            else:  # the graph was compiled before histograms were switched on (an earlier Model.train of this cell)
                self._histograms_off()
        if not math.isfinite(grad_norm) and (layer := self._layers.first_nonfinite(squares[0])) is not None:
            rec["nonfinite_layer"] = layer

    def _read_batch_shape(self, cb: Any) -> None:
        self._batch_shape_read = True
        element = _param(cb, "train_dataset_element", None)
        first = element[0] if isinstance(element, (tuple, list)) and element else element
        shape = tuple(getattr(first, "shape", ()) or ())
        if self._batch_size is None and shape:
            self._batch_size = int(shape[0])
        if self._seq_length is None and len(shape) == 2 and _is_integer(first):
            self._seq_length = int(shape[1])  # token ids: (batch, sequence)

    def _setup_entropy(self, network: Any) -> None:
        if "attention_entropy" not in self._metrics or network is None:
            return
        if ms.get_context("mode") == ms.GRAPH_MODE:
            log.warning(
                "mindwatch: attention_entropy is off in GRAPH mode: forward hooks with Python side effects "
                "cannot run inside a compiled graph. Give the attention cell an AttentionStats "
                "(mindwatch.mindspore.attention, docs/layers.md), or train in PyNative mode to record it."
            )
            return
        cells = attention_cells(network, self.config.attention_entropy.cells)
        if not cells:
            log.warning("mindwatch: attention_entropy found no attention softmax cells; set attention_entropy.cells")
            return
        self._entropy = AttentionEntropy(cells)


def _param(cb: Any, name: str, default: Any = None) -> Any:
    """One of MindSpore's callback params, or ``default`` (they are a dict whose missing keys raise KeyError)."""
    if isinstance(cb, dict):
        return cb.get(name, default)
    return getattr(cb, name, default)


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


def _is_integer(tensor: Any) -> bool:
    dtype = getattr(tensor, "dtype", None)
    return dtype in (ms.int32, ms.int64, ms.int16, ms.uint8) if dtype is not None else False
