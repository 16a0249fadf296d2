"""Monitor a training loop of your own: ``start_run`` / ``run.step`` / ``run.finish``.

Example::

    import mindwatch.mindspore as mw

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss, grads

    with mw.start_run("monitor.yaml", network=net, optimizer=optimizer, total_steps=10_000) as run:
        for x, y in run.batches(dataset.create_tuple_iterator()):   # data_time measured
            loss, grads = train_step(x, y)
            run.step(loss=loss, grads=grads)                       # or run.step(loss=loss, grads=grads, tokens=n)
            if run.should_stop:
                break

``run.step`` records what :class:`~mindwatch.mindspore.MonitorCallback` records for the same training
(both are front doors over :class:`~mindwatch.mindspore.recorder.StepRecorder`): loss, the learning
rate the optimizer used, ``grad_norm`` of ``grads``, step and data time, throughput, memory, progress,
and with a ``layers`` section in the config the per-layer statistics. The step's tensors are read in
one compiled call. Rules, the stall watchdog, notifications and actions all work: ``stop`` sets
:attr:`Run.should_stop` on the step it fires, ``checkpoint`` saves ``network`` and ``optimizer``,
``lr_backoff`` changes the optimizer's rate from the next step (call ``start_run`` before the first
``train_step``, so that a ``LearningRateSchedule`` is made scalable before it is compiled).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import mindspore as ms

from mindwatch import metrics as vocab
from mindwatch.mindspore.actions import network_and_optimizer
from mindwatch.mindspore.dynamic_batch import DynamicBatch
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
from mindwatch.mindspore.layer_stats import LayerGrouping, optimizer_moments
from mindwatch.mindspore.rank_signal import Announcement, RankSignal, SignalExchange, sum_over_ranks
from mindwatch.mindspore.ranks import RankError, RankInfo, discover
from mindwatch.mindspore.recorder import LayersFound, StepRecorder, Training, trained_weights
from mindwatch.mindspore.reduction import LoopLayerStats, StepReduction
from mindwatch.store.attempts import resumed_step
from mindwatch.store.layerfiles import HISTOGRAM_BINS
from mindwatch.store.layout import fallback_run_id

log = logging.getLogger("mindwatch")
_perf = time.perf_counter
_wall = time.time


def start_run(
    config: ConfigLike = None,
    *,
    network: Any = None,
    optimizer: Any = None,
    total_steps: int | None = None,
    grad_reducer: Any = None,
    batch: DynamicBatch | None = None,
    **overrides: Any,
) -> Run:
    """Start monitoring a training loop of your own; returns the :class:`Run` to call ``step`` on.

    Example::

        run = start_run({"project": "gpt", "save_dir": "./monitor_output"}, network=net, optimizer=opt, total_steps=1000)

    ``config``: every form :class:`~mindwatch.mindspore.MonitorCallback` takes (a path to a YAML file, a dict, a
    ``MonitorConfig``), with keyword overrides. ``network`` is what a ``checkpoint`` action saves (with
    ``optimizer``'s state) and where the attention statistics are found; ``optimizer`` gives the learning rate,
    the parameter names of ``grads`` and what ``lr_backoff`` changes; ``total_steps`` gives progress and ETA.
    ``grad_reducer``: the :class:`~mindwatch.mindspore.DistributedGradReducer` your step reduces its gradients with
    (data parallel): the ranks' signal is then summed in your step, every step, and actions are taken at the very
    step (else every ``distributed.coordination.loop_every`` calls). ``batch``: the
    :class:`~mindwatch.mindspore.DynamicBatch` your dataset is batched by, whose size ``shrink_batch`` / ``grow_batch``
    change (compile your step for any batch size: ``@ms.jit(dynamic=1)``, docs/training-loop.md).
    Call it before the first compiled step. When
    monitoring cannot start (an unwritable ``save_dir``, ...) a warning says why and the run records nothing
    (``strict: true`` raises instead).
    """
    if grad_reducer is not None and not hasattr(grad_reducer, "mindwatch_signal_sum"):
        raise TypeError(
            f"start_run(grad_reducer=...) takes mindwatch.mindspore.DistributedGradReducer, not {type(grad_reducer).__name__}: "
            "build your reducer as mw.DistributedGradReducer(optimizer.parameters, mean=True) (the same arguments)"
        )
    config_ = merged_config(config, overrides)
    return Run(config_, network=network, optimizer=optimizer, total_steps=total_steps, grad_reducer=grad_reducer, batch=batch)


class Run:
    """One monitored run of a training loop; made by :func:`start_run`. Training thread only."""

    def __init__(
        self,
        config: Any,
        *,
        network: Any,
        optimizer: Any,
        total_steps: int | None,
        grad_reducer: Any = None,
        batch: DynamicBatch | None = None,
    ) -> None:
        self.config = config
        self.network = network
        self.optimizer = optimizer
        self._epoch = 0
        self._step = 0
        #: The index within its epoch of the batch ``batches`` gave last (-1: none yet, or not iterated through it).
        self._batch = -1
        self._reduce = StepReduction()
        self._sum_every = config.distributed.coordination.loop_every
        #: ``step`` calls in this attempt: when the signal is summed (never a step number, which a resume may set
        #: apart on one rank: every rank calls ``step`` alike, so every rank joins every sum).
        self._calls = 0
        #: The step this attempt resumed after: the loop's own count of its steps is this plus ``_calls`` (a rewind
        #: numbers steps again; the loop's count, what its log and checkpoints go by, counts on).
        self._resumed = 0
        self._layer_stats: LoopLayerStats | None = None
        self._boundary = _LoopBoundary(self)
        self.recorder: StepRecorder | None = None
        #: Under msrun: the cross-rank signal this loop sums with one small AllReduce a step (rank_signal.py). Kept
        #: even when this rank records nothing: every rank must take part in every sum.
        self._signal: RankSignal | None = None
        #: ``grad_reducer``'s sum of the MoE routing over the ranks (None: none, or each rank's own).
        self._routing_sum: Any = None
        #: The step's own sum of the signal (``grad_reducer``), read after each step; None: the loop sums it itself.
        self._summed_in_step: Any = None
        self._exchange: SignalExchange | None = None
        #: Since the last sum: when it was (perf_counter), at which call, and the seconds waited for batches.
        self._summed_at, self._summed_calls = 0.0, 0
        self._waited = 0.0
        #: What a fault of ours in ``step`` or ``batches`` does (``strict``, ``max_failed_steps``): caught, said, counted.
        self._failures = StepFailures(config)
        if config.enable:
            self._start(total_steps, grad_reducer, batch)

    def _start(self, total_steps: int | None, grad_reducer: Any, batch: DynamicBatch | None) -> None:
        """Begin recording: every rank learns rank 0's run through the signal's first sum (rank 0 announces it)."""
        try:
            who = discover()
        except RankError as e:
            if self.config.strict:
                raise
            could_not_start(e)
            return
        if who.world_size > 1 and self.config.distributed.coordination.enabled:
            if grad_reducer is not None:
                self._summed_in_step = grad_reducer.mindwatch_signal_sum
                grad_reducer.sum_routing(self.network)  # before the step compiles: the MoE routing rides on the signal
                self._routing_sum = grad_reducer.mindwatch_routing_sum
            parameter = grad_reducer.mindwatch_signal if grad_reducer is not None else None
            self._signal = RankSignal(parameter, rank=who.rank, world_size=who.world_size)
        signal = self._signal
        announced = Announcement()
        if signal is not None and who.rank > 0:  # never wait for another host's file: rank 0 says which run
            announced = signal.announced(sum_over_ranks(signal.tensor()))
        try:
            self.recorder = start_recorder(self.config, self._training(who, announced, total_steps, batch))
            if self.recorder is not None and who.rank == 0:
                announced = self._announcement()
        finally:
            if signal is not None and who.rank == 0:  # the other ranks wait in the sum for the run id (or none)
                signal.announce(announced)
                sum_over_ranks(signal.tensor())
                signal.announce(None)
        #: The step the run resumes after: rank 0's (from meta.json), announced to every rank, so they number alike.
        self._step = self._resumed = announced.resumed_step
        recorder = self.recorder
        if recorder is None:
            return
        self._exchange = recorder.exchange
        self._failures.attach(recorder.rank, recorder.session.monitor.alert)
        self._summed_at = recorder.timer.last_recorded
        try:
            self._plan(self._step + 1)
        except Exception as e:
            if self.config.strict:
                raise
            could_not_start(e, recorder)
            self.recorder = None

    def _training(self, who: RankInfo, announced: Announcement, total_steps: int | None, batch: Any) -> Training:
        """What this loop is, for the recorder: its network and optimizer, the layers it measures, the signal."""
        network, optimizer, signal = self.network, self.optimizer, self._signal
        layers = self.config.layers
        weights = trained_weights(optimizer, network)
        found = None
        if "layers" in self.config.model_fields_set and layers.enabled and weights:  # a loop has no layer_stats cell
            grouping = LayerGrouping([w.name for w in weights], layers.group)
            bins = HISTOGRAM_BINS if layers.histogram_every else 0
            moments = optimizer_moments(optimizer)
            self._layer_stats = LoopLayerStats(weights, grouping.groups, bins, moments)
            found = LayersFound(grouping, bins, moments is not None)
        fallback = fallback_run_id(self.config.run_name, who.rank) if who.rank > 0 and signal else None
        return Training(
            optimizer=optimizer,
            saved=network_and_optimizer(network, optimizer),
            network=network,
            total_steps=total_steps,
            run_id=announced.run_id or fallback,
            attempt=announced.attempt,
            lifeline=announced.lifeline,
            signal=signal,
            batch=batch,
            layers=found,
            attention=network,
            routing_sum=self._routing_sum,
            recorded=None if who.rank == 0 else announced.resumed_step,
        )

    # -- public ------------------------------------------------------------
    @property
    def run_dir(self) -> Path | None:
        """Where this run records; None when monitoring is off."""
        return self.recorder.session.run_dir if self.recorder else None

    @property
    def stop_reason(self) -> str | None:
        """Why the run is to stop (the alert behind the ``stop`` action), once :attr:`should_stop` is true."""
        return self.recorder.actions.stop_reason if self.recorder is not None else None

    @property
    def should_stop(self) -> bool:
        """True once an action asked the training to stop (e.g. ``nonfinite: {actions: [stop]}``): leave the loop."""
        return self.recorder is not None and self.recorder.state.should_stop

    def batches(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``iterable`` (one epoch of batches), timing each wait for a batch as ``data_time``.

        Example::

            for x, y in run.batches(dataset.create_tuple_iterator()):
                ...
        """
        self._epoch += 1
        self._batch = -1
        it = iter(iterable)
        while True:
            began = _perf()
            try:
                batch = next(it)
            except StopIteration:
                return
            try:
                passed = self._took_batch(batch, began)
            except Exception as e:  # a fault of ours never holds a batch back
                self._failures.failed(e, step=self._step + 1, where="run.batches")
                passed = False
            if not passed:
                yield batch

    def _took_batch(self, batch: Any, began: float) -> bool:
        """``batch`` came after a wait since ``began``: time it; True when a rewind passes over it (not trained on)."""
        self._batch += 1
        recorder = self.recorder
        if recorder is None:
            return False
        waited = _perf() - began
        timer = recorder.timer
        timer.waited(waited)
        self._waited += waited
        if timer.shape_pending:
            timer.read_shape(batch)
        if recorder.rewinds is not None and recorder.rewinds.passing:
            recorder.passed_over(self._epoch, self._batch, now=_perf())
            return True
        return False

    def step(
        self, loss: Any = None, grads: Any = None, *, step: int | None = None, sample_ids: Any = None, **metrics: Any
    ) -> None:
        """Record the step that just ended: its ``loss`` and ``grads`` (Tensors, as ``value_and_grad`` returns them,
        in the order of ``optimizer.parameters``) and scalars of your own (``tokens=...``). ``step``: the global
        step (default: one more than the last, counting from 1 or from the resumed run's last step).
        ``sample_ids``: the ids of the step's batch (a Tensor or a list), named by its anomaly alerts;
        ``skipped``: what :class:`~mindwatch.mindspore.SkipStep` returned (a step it skipped is always recorded).

        Three parts, each a fault of its own: what the other ranks and the watchdog count on (the beat, the ranks'
        sum, the batch taken), the record (none once ``max_failed_steps`` in a row failed), the actions due."""
        self._calls += 1
        number = self._step + 1
        recorder, failures = self.recorder, self._failures
        if step is not None:
            try:
                number = int(step)
            except (TypeError, ValueError) as e:
                failures.failed(e, step=number, where="run.step(step=...)")
        self._step = number
        if recorder is None or recorder.state.closed:
            if self._signal is not None and self._summed_in_step is None and self._calls % self._sum_every == 0:
                sum_over_ranks(self._signal.tensor())  # the other ranks sum it at this call: take part
            return
        now = _perf()
        try:
            if recorder.watchdog is not None:
                recorder.watchdog.last_beat = now
            if recorder.batch is not None:
                recorder.took(number)
            if self._exchange is not None:
                self._exchange_signal(self._exchange, number, now, loss, grads)
            if not failures.given_up:
                self._record(recorder, number, now, loss, grads, sample_ids, metrics)
        except Exception as e:  # a bad value or a fault of ours never ends the training
            failures.failed(e, step=number, where="run.step")
        try:
            recorder.act(number, self._boundary)
            if not failures.given_up:
                self._plan(self._step + 1)  # after a rewind, the step after the snapshot's
        except Exception as e:
            failures.failed(e, step=number, where="run.step (actions)")
        else:
            failures.ok(number)

    def _record(
        self,
        recorder: StepRecorder,
        number: int,
        now: float,
        loss: Any,
        grads: Any,
        sample_ids: Any,
        metrics: dict[str, Any],
    ) -> None:
        """Step ``number``'s record, when it is due (or the step was skipped)."""
        n = number - recorder.state.recorded
        if not (recorder.due(n) or _skipped(metrics.get(vocab.SKIPPED))):
            return
        rec = self._read(number, loss, grads, metrics)
        if self._exchange is not None and self._exchange.local_norm is not None:
            rec[vocab.LOCAL_GRAD_NORM] = self._exchange.local_norm  # summed in grad_reducer, before the reduction
        if sample_ids is not None:
            rec["sample_ids"] = listed_ids(sample_ids)
        if recorder.state.rewound:  # a rewind numbered steps again; the loop's own count goes on
            rec[vocab.ITERATION] = self._boundary.iteration
        recorder.state.recorded = number
        recorder.record(rec, number, n, now)

    def _exchange_signal(self, exchange: SignalExchange, number: int, now: float, loss: Any, grads: Any) -> None:
        """Every rank's requests and timings, at the same ``run.step`` call on every rank: summed in the step that ended
        (``grad_reducer``), or by the loop's own ``AllReduce`` every ``loop_every`` calls, once the step has ended (an
        ``AllReduce`` issued to run behind the step and read a call later costs more: its read then spins until the
        slower rank gets there). The loop's own sum is made whatever fails before it: the ranks' sums stay in step."""
        in_step = self._summed_in_step
        if in_step is None and self._calls % self._sum_every:
            return
        try:
            k = max(1, self._calls - self._summed_calls)  # the step and data time per step since the last sum
            exchange.timed(number, (now - self._summed_at) / k, self._waited / k)
            self._summed_at, self._summed_calls, self._waited = now, self._calls, 0.0
            _wait_for_the_step(loss, grads)
            if in_step is not None:  # summed in the step that ended; this rank's slots go with the next
                exchange.after_step(in_step.asnumpy(), number)
                exchange.before_step(number + 1)
                return
            exchange.before_step(number)
        except Exception as e:
            if in_step is not None:
                raise
            self._failures.failed(e, step=number, where="run.step (before the ranks' sum)")
        exchange.after_step(sum_over_ranks(exchange.signal.tensor()), number)  # one small AllReduce on every rank, at this call

    def log(self, step: int | None = None, **metrics: float) -> None:
        """Record scalars of your own at ``step`` (default: the last step), without counting a step."""
        log_metrics(self.recorder, self._step if step is None else step, metrics)

    def eval(
        self,
        step: int | None = None,
        *,
        eval_time: float | None = None,
        epoch: int | None = None,
        samples: int | None = None,
        **results: Any,
    ) -> None:
        """Record an evaluation's ``results`` as ``eval/<name>`` at ``step`` (default: the last step), e.g.
        ``run.eval(loss=0.41, accuracy=0.87)``; ``eval_time``: the seconds it took, recorded beside them and left out of
        the next step's time and throughput; ``epoch`` and ``samples`` (evaluated), recorded beside them. A result that
        is not a number is kept apart (a matrix) or left out with a warning. In a multi-rank run every rank calls it
        at the same step (the ranks agree on the value the rules judge). ``alerts.early_stopping`` may set
        :attr:`should_stop` here."""
        for name, value in (("eval_time", eval_time), ("samples", samples), ("epoch", epoch)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise TypeError(f"run.eval({name}=...) takes a number, got {value!r}")
        recorder = self.recorder
        if recorder is None:
            return
        if eval_time is not None:
            recorder.timer.paused(float(eval_time))
        at = self._step if step is None else step
        try:
            recorder.evaluations.add(
                at, epoch, results, secs=eval_time, samples=None if samples is None else int(samples), boundary=self._boundary
            )
        except Exception as e:  # a fault of ours: said by the failure policy, never the loop's
            self._failures.failed(e, step=at, where="run.eval")

    def finish(self, state: str | None = None, *, error: str | None = None) -> None:
        """End the run: ``stopped`` (with the reason) after a stop, ``failed`` with ``error``, else ``finished``."""
        recorder = self.recorder
        if recorder is None or recorder.state.closed:
            return
        self._failures.close()
        if state is None:
            state = "failed" if error else "stopped" if self.should_stop else "finished"
        recorder.finish(state, error=error, reason=stop_reason(recorder, state, "stopped by the training loop"))

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None:
            self.finish("failed", error=failure_text(exc_type, exc))
        else:
            self.finish()
        # never swallow the user's exception: return None

    # -- internals ------------------------------------------------------------
    def _read(self, number: int, loss: Any, grads: Any, metrics: dict[str, Any]) -> dict[str, Any]:
        """The step's record: its tensors (the scalars, the gradients' squared sums) read in one compiled call."""
        recorder = self.recorder
        assert recorder is not None
        if recorder.state.first_pending and vocab.SKIPPED not in metrics and self.config.skip_steps.enabled:
            log.warning(  # once: the first step is the first record
                "mindwatch: skip_steps is enabled but run.step got no skipped= at the first step: this loop skips no "
                "update. In a loop of your own it takes mw.SkipStep: build skip_step = mw.SkipStep(optimizer, run=run), "
                "call skipped = skip_step(grads) in your jit step in place of optimizer(grads), and pass "
                "run.step(..., skipped=skipped) (docs/training-loop.md, Skipping a bad step)"
            )
        rec: dict[str, Any] = {"step": number, "epoch": max(self._epoch, 1), "t": _wall(), "rank": recorder.rank}
        if self._batch >= 0:
            rec["batch"] = self._batch
        named = {"loss": loss, **metrics} if loss is not None else metrics
        tensors = {k: v for k, v in named.items() if isinstance(v, ms.Tensor)}
        for k, v in named.items():
            if k not in tensors:
                rec[k] = float(v)
        grads = tuple(grads) if grads is not None else ()
        if tensors or grads:
            layers = recorder.layers if self._layer_stats is not None else None
            per_tensor = layers is not None and (layers.measuring or layers.histograms)
            values = self._reduce(list(tensors.values()), grads, per_tensor=per_tensor)
            for i, k in enumerate(tensors):
                rec[k] = float(values[i])
            if grads:
                grad_sq = values[len(tensors) :]
                rec["grad_norm"] = math.sqrt(float(grad_sq.sum()))
                if layers is not None and layers.wanted(rec):
                    if not per_tensor:  # a NaN/Inf norm on an unmeasured step: the squares per tensor, to name the layer
                        grad_sq = self._reduce([], grads)
                    squares, hist = self._layer_stats.measure(grad_sq, grads, layers.histograms)  # type: ignore[union-attr]
                    layers.add(rec, squares, hist)
        attention = recorder.attention
        if attention is not None and attention.sampling:
            attention.add(rec, StepReduction.stack(attention.values()).tolist())
        return rec

    def _plan(self, next_step: int) -> None:
        """Before ``next_step`` runs: what it measures; a measured step starts from a copy of the weights."""
        recorder = self.recorder
        assert recorder is not None
        recorder.plan(next_step)
        if recorder.layers is not None and self._layer_stats is not None and recorder.layers.measuring:
            self._layer_stats.snapshot()

    def _announcement(self) -> Announcement:
        """Rank 0 (or a single process): this run, its lifeline, this attempt and the step it resumes after."""
        assert self.recorder is not None
        session = self.recorder.session
        lifeline = getattr(session.lifeline, "address", None)
        return Announcement(session.run_dir.name, lifeline, session.attempt, resumed_step(session.meta))


def _wait_for_the_step(loss: Any, grads: Any) -> None:
    """Wait for the step that returned ``loss`` (or ``grads``) to end. A Parameter the step assigns, or an op queued
    behind it, read while the step still runs, spins a core until it ends (~0.3 s of CPU a step on the demo model);
    an output Tensor's host read waits without spinning."""
    first = grads[0] if isinstance(grads, (tuple, list)) and grads else grads
    for out in (loss, first):
        if isinstance(out, ms.Tensor):
            out.asnumpy()
            return


def _skipped(value: Any) -> bool:
    """Whether a ``skipped`` that :class:`SkipStep` returned says so (a read of one scalar; False when absent)."""
    if value is None:
        return False
    return bool(value.asnumpy()) if isinstance(value, ms.Tensor) else bool(value)


class _LoopBoundary:
    """A loop's step boundary (a :class:`~mindwatch.mindspore.actions.StepBoundary`): ``stop`` sets
    :attr:`Run.should_stop`; a loop has no checkpoint callbacks of its own, nor epochs they are named by."""

    __slots__ = ("run",)
    steps_per_epoch = None

    def __init__(self, run: Run) -> None:
        self.run = run

    def request_stop(self) -> None:
        recorder = self.run.recorder
        assert recorder is not None
        recorder.state.should_stop = True

    def checkpoints(self) -> list[Path]:
        return []

    @property
    def iteration(self) -> int:
        """The loop's own count of its steps: ``run.step`` calls from the resumed step (batches passed over are none)."""
        return self.run._resumed + self.run._calls

    def rewound(self, to_step: int, from_step: int) -> None:
        """The next ``run.step`` is step ``to_step + 1``; ``run.batches`` passes over the batches a rewind skips."""
        run = self.run
        recorder = run.recorder
        assert recorder is not None
        run._step = to_step
        recorder.state.recorded = to_step
        recorder.state.rewound += from_step - to_step
        if run._batch < 0 and recorder.rewinds is not None and recorder.rewinds.passing:
            log.warning("mindwatch: a rewind passes over batches that run.batches(...) gives; this loop's go on unskipped")
            recorder.rewinds.passing = 0
