"""``TrainCell``: what the callback reads from a ``Model.train`` train cell's outputs, and what it switches in it.

Example::

    bins = prepare_cell(config, train_network)       # train begin, before the graph compiles, on every rank
    switch_skip_steps(config, train_network)
    found = layers_found(config, train_network, bins)  # what it measures: the recorder starts from it
    cell = TrainCell(recorder, train_network)        # once the run started
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

from mindwatch import metrics as vocab
from mindwatch.config import MonitorConfig
from mindwatch.mindspore.layer_stats import LayerGrouping
from mindwatch.mindspore.outputs import MINDFORMERS_LAYOUTS, decode_outputs, output_layout
from mindwatch.mindspore.recorder import LayersFound, StepRecorder
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


def layers_found(config: MonitorConfig, net: Any, bins: int) -> LayersFound | None:
    """The layers ``net``'s outputs measure (``bins``: its histograms', :func:`prepare_cell`): our cell's
    ``layer_stats``, or MindFormers' ``local_norm`` (gradient norms only); None: none, or ``layers`` is off."""
    if not config.layers.enabled:
        return None
    params = getattr(net, "mindwatch_layer_params", None)
    group = config.layers.group
    if _mindformers_local_norm(net):
        names = [p.name for p in getattr(net, "weights", ())]
        return LayersFound(LayerGrouping(names, group), local_norm=True) if names else None
    if not params or "layer_stats" not in (getattr(net, "mindwatch_outputs", None) or ()):
        return None
    moments = bool(getattr(net, "mindwatch_layer_moments", False))
    return LayersFound(
        LayerGrouping(params, group),
        bins,
        moments,
        local_grad_norms=bool(getattr(net, "mindwatch_local_grad_norms", False)),  # our MindFormers wrapper, data parallel
        grads_every_step=getattr(net, "mindwatch_grads_every_step", True),
    )


def attention_found(net: Any) -> Any:
    """The model whose ``AttentionStats`` cells ``net``'s outputs carry (None: it declares no attention output)."""
    return net.network if "attention" in (getattr(net, "mindwatch_outputs", None) or ()) else None


def _mindformers_local_norm(net: Any) -> bool:
    """MindFormers' wrapper with ``local_norm``: 7 outputs, the gradients' squared sums per parameter among them."""
    return getattr(net, "local_norm", False) is True and not getattr(net, "mindwatch_layer_params", None)


class TrainCell:
    """What the callback reads from the train cell's outputs, and the graphs it switches between steps.

    Our train cells declare their outputs (``mindwatch_outputs``): the loss, grad_norm, lr, ... and, switched
    on, the per-layer statistics, histograms and attention statistics; MindFormers' are known by length.
    """

    def __init__(self, recorder: StepRecorder, train_network: Any) -> None:
        """The outputs of ``train_network`` that ``recorder`` reads (its layers and attention, from :func:`layers_found`
        and :func:`attention_found` at start)."""
        self.recorder = recorder
        self.network = train_network
        self.declared: tuple[str, ...] | None = getattr(train_network, "mindwatch_outputs", None)
        declared = self.declared or ()
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
        if recorder.layers is not None:
            if _mindformers_local_norm(train_network):
                self.layer_output = MINDFORMERS_LAYOUTS[7].index("local_norm")
                self.local_norm = True
            else:
                self.switching = train_network
                self.layer_output = declared.index("layer_stats")
                if recorder.layers.bins:
                    self.hist_output = declared.index("layer_histograms")
        if recorder.attention is not None:
            self.attention_output = declared.index("attention")
        #: Whether anything is planned per step (layers, attention or routing statistics, hooks, stable ranks).
        self.plans = recorder.plans_steps
        #: Our cell with ``skip_steps`` on: the output that says the step was skipped (read every step), else -1.
        self.skip_output = declared.index(vocab.SKIPPED) if vocab.SKIPPED in declared else -1

    def skipped(self, outputs: Any) -> bool:
        """Whether ``skip_steps`` skipped this step (a step not otherwise recorded is recorded when it was)."""
        return bool(outputs[self.skip_output].item())

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
                squares = squares.reshape(1, -1)
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
