"""What both ways of training share: one run's session, the step's state, and the per-step recording.

Example::

    recorder = StepRecorder.start(config, Training(opt, saved=net, network=net))   # every part, from what was found
    recorder.plan(step)                       # before a step: what it measures (layers, attention), its global_step
    if recorder.due(steps_since_recorded):    # after it
        rec = {"step": step, "epoch": 1, "t": time.time(), "rank": recorder.rank, "loss": 2.3}
        recorder.record(rec, step, steps_since_recorded, time.perf_counter())   # rec is the worker's from here
    recorder.act(step, boundary)              # recorded or not: the actions due at this boundary
    recorder.finish("finished")

``MonitorCallback`` (``Model.train``) and ``Run`` (:func:`mindwatch.mindspore.start_run`, a loop of your
own) are two thin front doors over this: each reads its step's values its own way (the train cell's
outputs, or one compiled reduction of the loop's tensors) and hands the record here; what else both follow
(starting, ending, a user's own metrics) is :mod:`~mindwatch.mindspore.front_door`'s, and what a fault of ours in a
step hook does is :mod:`~mindwatch.mindspore.failures`'. How a recording begins reads in one place: each door states
what it found as one :class:`Training`, and :meth:`StepRecorder.start` builds every part from it before the worker
starts. The pieces, one
concern each: :class:`~mindwatch.mindspore.timing.StepTimer` (timing, throughput; TFLOPS and MFU from :func:`flops_basis`,
the trainable parameters counted once here at start),
:class:`~mindwatch.mindspore.layer_watch.LayerWatch` (per-layer statistics),
:class:`~mindwatch.mindspore.attention_watch.AttentionWatch` (attention statistics),
:class:`~mindwatch.mindspore.actions.Interventions` (actions), :class:`~mindwatch.mindspore.probes.LrProbe`
(the learning rate) and the session's plan (progress, ETA). Training thread only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mindspore as ms

from mindwatch import metrics as vocab
from mindwatch.config import MonitorConfig
from mindwatch.device_peaks import known_device
from mindwatch.mindspore.actions import Interventions, StepBoundary, network_and_optimizer, prepare_optimizer
from mindwatch.mindspore.attention import attention_stats_cells
from mindwatch.mindspore.attention_watch import AttentionWatch
from mindwatch.mindspore.dynamic_batch import DynamicBatch, warn_unagreed
from mindwatch.mindspore.evaluation import Evaluations, perplexity
from mindwatch.mindspore.layer_stats import LayerGrouping, moments_settle_steps
from mindwatch.mindspore.layer_watch import LayerWatch
from mindwatch.mindspore.probes import AttentionEntropy, LrProbe, attention_cells, device_memory_sampler, model_seq_length
from mindwatch.mindspore.rank_signal import RankSignal, SignalExchange
from mindwatch.mindspore.ranks import NotATrainingRank, discover
from mindwatch.mindspore.rewind import Rewinds, snapshots_wanted
from mindwatch.mindspore.router_stats import router_stats_cells
from mindwatch.mindspore.routing_watch import RoutingWatch
from mindwatch.mindspore.stable_rank import StableRanks
from mindwatch.mindspore.timing import FlopsBasis, StepTimer
from mindwatch.monitor.worker import Sampler
from mindwatch.session import RunSession
from mindwatch.store.attempts import resumed_step
from mindwatch.store.layerfiles import row_stats
from mindwatch.system import device_name, device_util_sampler, host_memory_available_gb, host_memory_sampler

log = logging.getLogger("mindwatch")
_perf = time.perf_counter


def rewind_state(network: Any, optimizer: Any) -> dict[str, Any]:
    """What a rewind snapshots and restores: ``network``'s and ``optimizer``'s Parameters by name, but for our train
    cell's own (the signal, the flags, ``skip_steps``' statistics); mindwatch's lr scale, the optimizer's, is kept."""
    kept = {p.name for p in optimizer.get_parameters()} if optimizer is not None else set()
    mine = {p.name for p in network.get_parameters() if p.name.startswith("mindwatch_")} if network is not None else set()
    mine -= kept
    return {n: p for n, p in (network_and_optimizer(network, optimizer) or {}).items() if n not in mine}


@dataclass(frozen=True)
class LayersFound:
    """The layers a training can measure: their grouping, the histograms' bins (0: none), and whether the optimizer's
    moments are measured too (``adam_m_norm``, ``adam_v_norm``), or the gradient norms alone (MindFormers'
    ``local_norm``: taken before the all-reduce)."""

    grouping: LayerGrouping
    bins: int = 0
    moments: bool = False
    local_norm: bool = False
    #: The rows also hold this rank's own gradient norms, before the all-reduce (``local_grad_norm``; our MindFormers
    #: wrapper in data parallel).
    local_grad_norms: bool = False
    #: Every step's output holds its gradients' squared sums (our train cells: a NaN traced to its layer on any step);
    #: False: only a measured step's (our MindFormers wrapper).
    grads_every_step: bool = True

    @property
    def stats(self) -> tuple[str, ...]:
        """What a row of these layers holds: only what is measured."""
        if self.local_norm:
            return (vocab.GRAD_NORM,)
        return row_stats(self.moments) + ((vocab.LOCAL_GRAD_NORM,) if self.local_grad_norms else ())


@dataclass(frozen=True)
class Training:
    """What a front door found about the training it records, stated once: the recorder builds every part from it
    before the worker starts, and no door writes into the recorder's parts afterwards."""

    optimizer: Any
    #: What a ``checkpoint`` saves: the train network, or a loop's ``{name: Parameter}``.
    saved: Any
    network: Any = None
    total_steps: int | None = None
    #: The run and attempt to join (a rank > 0 that learnt rank 0's through the step's signal); None: its own.
    run_id: str | None = None
    attempt: int | None = None
    #: Rank 0's lifeline (``host:port``) to join, as the signal announced it (ranks > 0).
    lifeline: str | None = None
    #: The cross-rank signal the step (or the loop) sums: the ranks agree on actions through it; None: none.
    signal: RankSignal | None = None
    #: The training's DynamicBatch, whose size each step's record and throughput follow; None: a fixed batch size.
    batch: DynamicBatch | None = None
    #: The layers measured (None: none).
    layers: LayersFound | None = None
    #: The model whose ``AttentionStats`` cells are recorded (None: none).
    attention: Any = None
    #: The model whose attention softmax cells PyNative forward hooks sample, where it has no ``AttentionStats``.
    entropy_hooks: Any = None
    #: In data parallel: the Parameter our step sums the ``RouterStats``' vectors over the ranks into (the train cell's,
    #: ``DistributedGradReducer``'s ``mindwatch_routing_sum``); None: each rank's own are read.
    routing_sum: Any = None
    #: How a rewind passes over batches (``Rewinds``' ``pass_over``): the train cell's switch, True (the front door
    #: does, ``run.batches``) or False (it cannot).
    pass_over: Callable[[bool], None] | bool = True
    #: The front door's count of the last step before recording begins; None: the run's own (a resumed run's last).
    recorded: int | None = 0
    #: ``perf_counter()`` recording begins at (the first step's time, the watchdog's first-step limit); None: now.
    began: float | None = None


@dataclass(slots=True)
class StepState:
    """Where the training is (the front door's step count) and what it was asked to do."""

    #: The last step recorded, in the front door's own count (``cur_step_num``, or the loop's step).
    recorded: int = 0
    #: Global step minus the front door's count (a resumed ``Model.train``), known at the first step.
    offset: int = 0
    #: The first step is always recorded (in GRAPH mode its time includes compilation).
    first_pending: bool = True
    #: Set at the step boundary a ``stop`` is carried out at.
    should_stop: bool = False
    #: Steps numbered again after rewinds, the batches passed over included: the batches consumed are this many more
    #: than the global step says.
    rewound: int = 0
    closed: bool = False

    def batches_taken(self, count: int) -> int:
        """The batches the framework ran up to the step it counts ``count`` (``cur_step_num``), from the resumed step:
        its own numbering (``batch``, ``iteration``, checkpoint names), which a rewind does not take back."""
        return count + self.offset + self.rewound


class StepRecorder:
    """One training's recording. Build it with :meth:`start`; see the module docstring."""

    def __init__(
        self, session: RunSession, training: Training, *, flops: FlopsBasis | None = None, weights: Sequence[Any] = ()
    ) -> None:
        """Every part from ``training`` (the worker has not started: what it reads first is set here)."""
        cfg = session.config
        self.session = session
        #: The Parameters the training updates (:func:`trained_weights`, listed once at start).
        self.weights = list(weights)
        self.config = cfg
        self.rank = rank = session.rank
        self.state = StepState(recorded=resumed_step(session.meta) if training.recorded is None else training.recorded)
        began = _perf() if training.began is None else training.began
        baseline = cfg.throughput.baseline if vocab.THROUGHPUT_LINEARITY in cfg.enabled_metrics else None
        self.timer = StepTimer(cfg.batch_size, cfg.seq_length or model_seq_length(training.network), flops, baseline)
        self.timer.restart(began)
        optimizer = training.optimizer
        self.lr_probe = LrProbe(optimizer) if vocab.LR in cfg.enabled_metrics else None
        probe = self.lr_probe or LrProbe(optimizer)
        if prepare_optimizer(cfg, optimizer):  # before the graph compiles: a schedule that lr_backoff can scale
            probe.invalidate()
        #: The snapshots a ``rewind`` goes back to (None: the config asks for no rewind).
        self.rewinds = self._rewinds(training) if snapshots_wanted(cfg) else None
        collective = training.signal is not None
        self.actions = Interventions(
            session,
            optimizer=optimizer,
            saved=training.saved,
            lr_probe=probe,
            rank=rank,
            batch=training.batch,
            rewinds=self.rewinds,
            collective=collective,
            rewound=lambda: self.state.rewound,
        )
        #: The run's evaluations: recorded, agreed across ranks, judged (early stopping), the best kept.
        self.evaluations = self._evaluations(training)
        #: ``evaluation.perplexity``: each step's record gets exp(loss).
        self._perplexity = cfg.evaluation.perplexity
        #: The training's DynamicBatch (``batch=``), whose size each step's record and throughput follow; None: none.
        self.batch: DynamicBatch | None = training.batch
        warn_unagreed(training.batch, session.world_size, agreed=collective)
        #: The size of the batch the last step took (a DynamicBatch's).
        self._batch_size = 0
        #: The ranks' signal: what every rank asked for, filed for the step boundary every rank reads it at.
        self.exchange = SignalExchange(training.signal, session, batch=self.actions.batch) if training.signal else None
        self.layers = self._layers(training.layers, optimizer)
        self.attention = _attention(training.attention, cfg)
        self.entropy = _entropy_hooks(training.entropy_hooks, cfg) if self.attention is None else None
        #: A mixture of experts' routing, every ``moe.every`` steps (None: no ``RouterStats`` in the model).
        self.routing = _routing(training, cfg, session.world_size)
        #: The stable rank of every weight matrix, every ``layers.stable_rank_every`` steps (None: not measured).
        self.stable_ranks = _stable_ranks(self.weights, cfg)
        #: Whether the step being run measures something in the graph (such a step is always recorded).
        self.measuring = False
        self._interval = cfg.step_interval
        self._control = session.control
        self._submit = session.monitor.record
        self._guard_nonfinite = self.actions.guard_nonfinite
        self.watchdog = session.watchdog
        if self.watchdog is not None:
            self.watchdog.started = began  # from here, compilation and the first batch have first_step_timeout
        if training.lifeline and rank > 0:
            session.join_lifeline(training.lifeline)

    @classmethod
    def start(cls, config: MonitorConfig, training: Training) -> StepRecorder:
        """Start the run's session for this process's rank and the recording of ``training`` (raises
        ``SaveDirUnavailable``, ``ResumeError``, ``RankError``, ``NotATrainingRank``)."""
        who = discover()
        if who.role == "MS_SCHED":  # a script that never calls init() trains in msrun's scheduler process too
            raise NotATrainingRank(f"this process is the scheduler of the launch at {who.scheduler} (MS_ROLE=MS_SCHED)")
        target, device_id = str(ms.get_context("device_target")), int(ms.get_context("device_id") or 0)
        weights = trained_weights(training.optimizer, training.network)
        flops = None
        if vocab.TFLOPS in config.enabled_metrics:
            try:
                flops = flops_basis(config, weights, device_name(target, device_id))
            except Exception as e:  # weights of no shape, a device probe that fails: no TFLOPS, the rest is recorded
                log.warning("mindwatch: no TFLOPS for this run (%r)", e)
        batch = training.batch
        session = RunSession.start(
            config,
            rank=who.rank,
            world_size=who.world_size,
            samplers=_samplers(config.enabled_metrics, target, device_id),
            versions={"mindspore": ms.__version__},
            checks_in_step=True,  # Interventions checks the step's NaN/Inf (``nonfinite.checked_in_step``)
            launch_key=who.launch_key,
            launch_meta=who.as_meta()
            | ({"throughput": flops.meta()} if flops is not None else {})
            | ({"dynamic_batch": batch.meta()} if batch is not None else {}),
            run_id=training.run_id,
            attempt=training.attempt,
            collective=training.signal is not None,
            begin=False,
        )
        try:
            recorder = cls(session, training, flops=flops, weights=weights)
            session.plan(training.total_steps)
            session.begin()
        except BaseException:
            session.close("stopped", reason="mindwatch could not start")
            raise
        return recorder

    def _rewinds(self, training: Training) -> Rewinds | None:
        """The run's snapshots of the network and the optimizer (:func:`rewind_state`); their memory goes into
        ``meta.json``."""
        state = rewind_state(training.network, training.optimizer)
        if not state:
            log.warning("mindwatch: rewind needs the network and the optimizer (start_run(network=, optimizer=)); none")
            return None
        rewinds = Rewinds(self.config.rewind, state, emit=self.session.monitor.alert, pass_over=training.pass_over)
        memory = rewinds.memory()
        needed, available = memory["bytes"] / 1e9, host_memory_available_gb()
        if needed > available / 2:
            log.warning(
                "mindwatch: rewind's %d snapshots will take %.2f GB of host memory, %.2f GB is available now: lower "
                "rewind.keep, or give the host more memory",
                self.config.rewind.keep,
                needed,
                available,
            )
        session = self.session
        if session.role.keeps_meta and session.meta:
            session.meta["rewind"] = memory  # written with total_steps: start() plans the run next
        return rewinds

    def _evaluations(self, training: Training) -> Evaluations:
        """The run's evaluations; the best copy's size (``early_stopping.restore_best``) goes into ``meta.json``."""
        cfg = self.config
        restore = cfg.alerts.early_stopping.enabled and cfg.alerts.early_stopping.restore_best
        state = rewind_state(training.network, training.optimizer) if restore else None
        evaluations = Evaluations(self.session, state=state, saved=training.saved, act=self.actions.act)
        memory = evaluations.memory()
        session = self.session
        if memory is not None and session.role.keeps_meta and session.meta:
            session.meta["evaluation"] = memory  # written with total_steps: start() plans the run next
        return evaluations

    def _layers(self, found: LayersFound | None, optimizer: Any) -> LayerWatch | None:
        """Per-layer statistics of ``found``'s layers: the writer's layer files and the inbox's live settings; the rules
        judge ``optimizer``'s moments once they settled."""
        if found is None:
            return None
        layers = self.config.layers
        local = found.local_norm and self.session.world_size > 1
        if local:
            log.info(
                "mindwatch: the per-layer gradient norms are each rank's own, before the all-reduce (MindFormers' "
                "local_norm): recorded per rank, judged by no per-layer rule"
            )
        watch = LayerWatch(
            found.grouping,
            every=layers.every,
            histogram_every=layers.histogram_every,
            bins=found.bins,
            stats=found.stats,
            local=local,
            grads_every_step=found.grads_every_step,
            moments_settle=moments_settle_steps(optimizer) if found.moments else 0,
        )
        self.session.writer.set_layers(list(watch.layers), found.bins, found.stats)
        if self.session.inbox is not None:  # mindwatch set RUN layers.every=N
            self.session.inbox.settings.update(watch.live_settings())
        return watch

    # -- per step ----------------------------------------------------------------
    @property
    def plans_steps(self) -> bool:
        """Whether :meth:`plan` has anything to decide before a step (something measured on some steps only)."""
        parts = (self.layers, self.attention, self.entropy, self.routing, self.stable_ranks)
        return any(part is not None for part in parts)

    def plan(self, step: int) -> None:
        """Before global step ``step``: what it measures (the layers, the attention statistics) and, when it will be
        recorded, the optimizer's ``global_step`` it runs at (the rate it uses)."""
        measuring = False
        if self.layers is not None:
            layers_on, hist = self.layers.plan(step, first=self.state.first_pending)
            measuring = layers_on or hist
        if self.attention is not None:
            measuring = self.attention.plan(step) or measuring
        if self.entropy is not None:
            self.entropy.sampling = step % self.config.attention_entropy.every == 0
        if self.routing is not None:
            measuring = self.routing.plan(step) or measuring
        if self.stable_ranks is not None and self.stable_ranks.due(step):
            measuring = True  # recorded: its record carries the stable ranks
        self.measuring = measuring
        state = self.state
        # a step that will be recorded: the optimizer's global_step it runs at (not the first: the optimizer may be
        # restored between start and the first step, and a first step is read after it)
        if self.lr_probe is not None and not state.first_pending and self.due(step - state.offset - state.recorded):
            self.lr_probe.before(step)

    def took(self, step: int) -> None:
        """Global step ``step`` took its batch from the DynamicBatch: its size counts for throughput and is recorded."""
        size = self.batch.took(step + self.state.rewound)  # type: ignore[union-attr]  # its count never goes back
        self._batch_size = size
        self.timer.samples += size

    def passed_over(self, epoch: int | None, index: int | None, ids: list[Any] | None = None, *, now: float) -> None:
        """A rewind's ``skip`` passed over a batch (not trained on, not a step): it still counts among the batches
        taken, and the next step is timed from ``now`` (no step_time of many batches)."""
        assert self.rewinds is not None
        self.state.rewound += 1
        self.timer.restart(now)
        self.rewinds.passed(epoch, index, ids)

    def due(self, steps: int) -> bool:
        """Whether the step that just ended, ``steps`` after the last recorded one, is recorded."""
        return steps >= self._interval or self.state.first_pending or self.measuring

    def record(self, rec: dict[str, Any], step: int, steps: int, now: float) -> None:
        """Complete ``rec`` (global step ``step``, ``steps`` since the last recorded), ask for what must act on this
        very step, and hand it to the worker: from there it is the worker's, never touched here again."""
        if self.lr_probe is not None and vocab.LR not in rec:  # a train cell that returns the lr gives it itself
            lr = self.lr_probe.used(step, applied=not (rec.get(vocab.SKIPPED) or rec.get(vocab.OVERFLOW)))
            if lr is not None:
                rec[vocab.LR] = lr
        if self.batch is not None:
            rec[vocab.BATCH_SIZE] = self._batch_size
        self.timer.add(rec, steps, now)
        if self.entropy is not None and self.entropy.values:
            rec.update(self.entropy.take())
        self.state.first_pending = False
        if self._perplexity and "loss" in rec:
            rec[vocab.PERPLEXITY] = perplexity(rec["loss"])
        if self.routing is not None and self.routing.sampling:
            self.routing.add(rec, self.routing.read())
        if self.actions.profiles.taken and self.actions.profiles.profiled(step):
            rec[vocab.PROFILED] = 1
        if self.stable_ranks is not None and self.stable_ranks.due(step):
            self.stable_ranks.attach(rec, step)  # the weights after this step's update; the worker does the arithmetic
        if self._guard_nonfinite and not math.isfinite(rec.get("loss", 0.0) + rec.get("grad_norm", 0.0)):
            self.actions.nonfinite(rec)  # NaN/Inf: ask for the non-finite rule's actions on this very step
        if rec.get(vocab.SKIPPED):
            self.actions.skipped(rec)  # skip_steps skipped its update: the skip alert (and actions) on this very step
        self._submit(rec)

    def act(self, step: int, boundary: StepBoundary) -> None:
        """At the boundary after global step ``step``, recorded or not: carry out what is due (a rule asked for
        stop / checkpoint / lr_backoff / dump_stacks / rewind ...), then a snapshot when one is due."""
        if self._control.pending:
            self.actions.carry_out(step, boundary)
        if self.actions.profiles.busy:
            self.actions.profiles.after_step(step)
        if self.rewinds is not None:
            self.rewinds.after_step(step)

    def finish(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        """End the run (once): switch the measurements off and close the session."""
        if self.state.closed:
            return
        self.state.closed = True
        if self.actions.batch is not None:
            self.actions.batch.close()
        if self.attention is not None:
            self.attention.off()
        if self.routing is not None:
            self.routing.off()
        if self.entropy is not None:
            self.entropy.remove()
            self.entropy = None
        self.measuring = False
        try:
            self.actions.profiles.close()
        except Exception as e:  # a profiler that breaks at the end: the run still closes
            log.warning("mindwatch: closing the profiles failed (%r)", e)
        self.evaluations.close(state)
        self.session.close(state, error=error, reason=reason)


def _samplers(metrics: frozenset[str], target: str, device_id: int) -> list[Sampler]:
    """What the worker samples into the newest record: the host's memory, the device's memory and utilization."""
    samplers: list[Sampler | None] = []
    if vocab.HOST_RSS_GB in metrics:
        samplers.append(host_memory_sampler())
    if metrics & {vocab.DEVICE_MEM_GB, vocab.DEVICE_MEM_PEAK_GB}:
        samplers.append(device_memory_sampler())
    if metrics & set(vocab.in_group("device_util")):
        samplers.append(device_util_sampler(target, device_id))
    return [s for s in samplers if s is not None]


def _routing(training: Training, config: MonitorConfig, world_size: int) -> RoutingWatch | None:
    """The routing of the model's :class:`~mindwatch.mindspore.router_stats.RouterStats` cells (``moe.every``; off
    without one, or when ``metrics`` leaves ``moe`` out)."""
    cells = router_stats_cells(training.network) if training.network is not None else []
    if not cells or vocab.MOE not in config.enabled_metrics:
        return None
    if world_size > 1 and training.routing_sum is None:
        log.warning(
            "mindwatch: each rank records its own MoE routing: the step does not sum it over the ranks (train with "
            "TrainOneStepWithGradNorm, or a loop with mindwatch.mindspore.DistributedGradReducer, to record the whole "
            "batch's)"
        )
    return RoutingWatch(cells, every=config.moe.every, summed=training.routing_sum)


def _stable_ranks(weights: Sequence[Any], config: MonitorConfig) -> StableRanks | None:
    """The stable ranks of the trained weight matrices (``layers.stable_rank_every``; off with ``layers.enabled:
    false`` or without a weight matrix)."""
    every = config.layers.stable_rank_every
    if not config.layers.enabled or every is None:
        return None
    ranks = StableRanks(weights, every)
    return ranks if ranks else None


def _attention(network: Any, config: MonitorConfig) -> AttentionWatch | None:
    """The attention statistics of ``network``'s :class:`~mindwatch.mindspore.attention.AttentionStats` cells."""
    cells = attention_stats_cells(network) if network is not None else []
    return AttentionWatch(cells, every=config.attention_entropy.every) if cells else None


def _entropy_hooks(network: Any, config: MonitorConfig) -> AttentionEntropy | None:
    """Attention entropy through PyNative forward hooks, for models without AttentionStats."""
    if vocab.ATTENTION_ENTROPY not in config.enabled_metrics or network is None:
        return None
    if ms.get_context("mode") == ms.GRAPH_MODE:
        log.warning(
            "mindwatch: attention_entropy is off in GRAPH mode: forward hooks with Python side effects "
            "cannot run inside a compiled graph. Give the attention cell an AttentionStats "
            "(mindwatch.mindspore.attention, docs/layers.md), or train in PyNative mode to record it."
        )
        return None
    cells = attention_cells(network, config.attention_entropy.cells)
    if not cells:
        log.warning("mindwatch: attention_entropy found no attention softmax cells; set attention_entropy.cells")
        return None
    return AttentionEntropy(cells)


def trained_weights(optimizer: Any, network: Any) -> list[Any]:
    """The Parameters the training updates: ``optimizer.parameters``, else ``network``'s trainable ones."""
    weights = list(optimizer.parameters) if optimizer is not None else []
    if not weights and network is not None:
        try:
            weights = list(network.trainable_params())
        except Exception as e:  # not a Cell, or one that cannot list them: no TFLOPS nor layers, the rest is recorded
            log.warning("mindwatch: could not list the network's trainable parameters (%r): no TFLOPS nor layers", e)
    return weights


def flops_basis(config: MonitorConfig, weights: Sequence[Any], device: str | None) -> FlopsBasis:
    """What TFLOPS and MFU come from: the config's ``throughput``, else the ``weights``' size (their shapes, counted
    once; no tensor is read) and the peak of the ``device`` named so in :mod:`mindwatch.device_peaks`."""
    t = config.throughput
    known = known_device(device)
    if t.peak_tflops is not None:
        peak, source = t.peak_tflops, "throughput.peak_tflops"
    elif known is not None:
        peak, source = known
    else:
        peak, source = None, None
    parameters = sum(math.prod(w.shape) for w in weights) if t.flops_per_step is None else None
    return FlopsBasis(t.flops_per_step, parameters or None, device, peak, source)
