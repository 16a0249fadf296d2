"""``TrainCell``: what the callback reads from a ``Model.train`` train cell's outputs, and what it switches in it.

Example::

    bins = prepare_cell(config, train_network)       # train begin, before the graph compiles, on every rank
    switch_skip_steps(config, train_network)
    cell = TrainCell(recorder, train_network, bins)  # once the run started
    cell.plan(step, time.perf_counter())             # before a step: the graph that measures what the step wants
    cell.read(net_outputs, rec)                      # after it: the step's values into its record
    cell.off()                                       # train end: the cell may train again without us

Our train cells (``train_step.py``) declare their outputs in ``mindwatch_outputs``; MindFormers' are known by
their number (``outputs.py``). Training thread only.
"""

from __future__ import annotations

import logging
from typing import Any

import mindspore as ms
import numpy as np

from mindwatch import metrics as vocab
from mindwatch.config import MonitorConfig
from mindwatch.mindspore.layer_stats import LayerGrouping
from mindwatch.mindspore.outputs import MINDFORMERS_LAYOUTS, decode_outputs, output_layout
from mindwatch.mindspore.recorder import StepRecorder
from mindwatch.store.layerfiles import HISTOGRAM_BINS

log = logging.getLogger("mindwatch")


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


def switch_pass_over(train_network: Any, snapshots: bool) -> bool:
    """A run that takes snapshots (``snapshots``): let our train cell pass over batches after a rewind (before the graph
    compiles, on every rank); True when it can."""
    if not snapshots:
        return False
    switch = getattr(train_network, "can_pass_over", None)
    if switch is None:
        log.warning(
            "mindwatch: a rewind passes over batches with mindwatch's train cell only (TrainOneStepWithGradNorm or "
            "TrainOneStepWithGradNormAndLossScale); with this one a rewind restores the state and passes over none"
        )
        return False
    switch()
    return True


class TrainCell:
    """What the callback reads from the train cell's outputs, and the graphs it switches between steps.

    Our train cells declare their outputs (``mindwatch_outputs``): the loss, grad_norm, lr, ... and, switched
    on, the per-layer statistics, histograms and attention statistics; MindFormers' are known by length.
    """

    def __init__(self, recorder: StepRecorder, train_network: Any, bins: int) -> None:
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
            self._setup_layers(bins)
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

    def _setup_layers(self, bins: int) -> None:
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
        moments = bool(getattr(net, "mindwatch_layer_moments", False))
        recorder.watch_layers(LayerGrouping(params, recorder.config.layers.group), bins, moments=moments)
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
