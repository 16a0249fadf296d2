"""The metric vocabulary: every built-in metric name and family, its unit, its chart and how it aggregates.

Example::

    from mindwatch import metrics

    metrics.get("step_time").unit            # 's'
    metrics.family_of("attention_entropy/blocks.0.attn")   # ('attention_entropy', 'blocks.0.attn')
    metrics.get("grad_norm").same_on_every_rank             # True: all-reduced gradients
    [g.id for g in metrics.CHART_GROUPS]     # ['loss', 'lr', 'grad_norm', 'throughput', ...]
    metrics.vocabulary()                     # the JSON the dashboard's pages read from /api/vocabulary

This is the one owner of a metric's meaning (the metric-name contract in docs/architecture.md): the
config, the store, the sinks, the analysis, the report and the dashboard read names from here, and no
other module holds a list of them. It is the bottom floor: it imports nothing of mindwatch. User
metrics keep their own names and are not in here.

A *family* is a metric recorded once per layer: ``<family>/<layer>`` (``grad_norm/blocks.0.mlp``,
``attention_entropy/blocks.0.attn``); Prometheus exports a family as one metric with a ``layer`` label.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

#: How a metric's values of one step combine across ranks: ``same`` (identical on every rank, e.g. after the
#: gradient all-reduce: one rank speaks for the run), ``mean``, ``max`` (the slowest or fullest rank), ``sum``.
Aggregation = Literal["same", "mean", "max", "sum"]
#: What a family is recorded per: each measured layer, each attention layer (``AttentionStats``), each weight
#: matrix (a Parameter's full name), each MoE layer (``RouterStats``) or each expert of one (``<layer>/<expert>``).
Per = Literal["step", "layer", "attention layer", "weight", "moe layer", "expert"]


@dataclass(frozen=True)
class Metric:
    """One built-in metric (``per="step"``) or family of metrics (``<name>/<layer>``)."""

    name: str
    #: What it is, in one line, with its unit in words.
    doc: str
    #: The unit as an axis reads it (``s``, ``GB``, ``%``, ``1/s``); empty for a pure number.
    unit: str = ""
    #: The chart group (:data:`CHART_GROUPS`) it is drawn in; families are drawn by their own view.
    group: str = ""
    per: Per = "step"
    #: How it combines across ranks.
    across_ranks: Aggregation = "mean"
    #: Whether ``metrics:`` includes it when a config lists none.
    default: bool = True
    #: The ``monitor_config.metrics`` name that switches it on (its own name, or the family that brings it).
    switch: str = ""
    #: Drawn with a min..max band across ranks, and watched by rank 0's straggler rules.
    band: bool = False
    #: A short title for a view (the layers view's statistic picker, the report's heat maps).
    title: str = ""
    #: A per-layer statistic the report draws as a layers x steps heat map and the dashboard as a layer's curve.
    heat: bool = False
    #: A flag that is 1 at the steps something happened (``skipped``): its group's chart marks those steps, as it
    #: marks alerts, and draws no curve of it (a 0/1 line on an outlier-clipped axis reads as noise).
    event: bool = False

    @property
    def same_on_every_rank(self) -> bool:
        """Whether every rank records the same value (so an alert on it concerns the run, not a rank)."""
        return self.across_ranks == "same"

    @property
    def prefix(self) -> str:
        """``<name>/`` for a family; ``""`` for a per-step metric."""
        return f"{self.name}/" if self.per != "step" else ""


LOSS, LR, GRAD_NORM, LOSS_SCALE, OVERFLOW = "loss", "lr", "grad_norm", "loss_scale", "overflow"
PERPLEXITY = "perplexity"
STABLE_RANK = "stable_rank"
#: A mixture of experts' routing (``RouterStats``): each expert's share of the routed token choices
#: (``expert_load/<layer>/<expert>``), the largest share x the experts, the router's entropy, the share over capacity.
EXPERT_LOAD, MOE_IMBALANCE, ROUTER_ENTROPY, MOE_DROPPED = "expert_load", "moe_imbalance", "router_entropy", "moe_dropped"
#: The ``metrics:`` switch of the routing statistics (on by default: adding a ``RouterStats`` to the model opts in).
MOE = "moe"
LOCAL_GRAD_NORM = "local_grad_norm"
#: The epoch a record's step is in (recorded when known); a coordinate, not a curve.
EPOCH = "epoch"
STEP_TIME, DATA_TIME, SAMPLES_PER_SECOND, TOKENS_PER_SECOND = "step_time", "data_time", "samples_per_second", "tokens_per_second"
HOST_RSS_GB, DEVICE_MEM_GB, DEVICE_MEM_PEAK_GB = "host_rss_gb", "device_mem_gb", "device_mem_peak_gb"
DEVICE_UTIL, DEVICE_MEM_UTIL = "device_util", "device_mem_util"
ATTENTION_ENTROPY, ATTENTION_MAX_LOGIT = "attention_entropy", "attention_max_logit"
WEIGHT_NORM, UPDATE_RATIO = "weight_norm", "update_ratio"
ADAM_M_NORM, ADAM_V_NORM = "adam_m_norm", "adam_v_norm"
SKIPPED = "skipped"
#: 1 on the steps a profile recorded (the ``profile`` action) and the step after, which pays its stop.
PROFILED = "profiled"
BATCH_SIZE = "batch_size"
TFLOPS, MFU = "tflops", "mfu"
THROUGHPUT_LINEARITY = "throughput_linearity"
ITERATION = "iteration"

#: The per-step metrics, in the order tables and reports list them.
STEP_METRICS: tuple[Metric, ...] = (
    Metric(LOSS, "the training loss", group="loss", switch=LOSS, band=True),
    Metric(
        PERPLEXITY,
        "exp(loss): the perplexity of a token cross-entropy loss (recorded with evaluation.perplexity: true)",
        group="perplexity",
        default=False,
    ),
    Metric(LR, "the learning rate the optimizer used this step", group="lr", across_ranks="same", switch=LR),
    Metric(GRAD_NORM, "the global L2 norm of the gradients", group="grad_norm", across_ranks="same", switch=GRAD_NORM),
    Metric(
        LOCAL_GRAD_NORM,
        "the L2 norm of this rank's own gradients, before the data-parallel all-reduce (every rank's reaches rank 0 "
        "in the step's signal: the source of a shared anomaly)",
        group="grad_norm",
        across_ranks="max",
        switch=LOCAL_GRAD_NORM,
        band=True,
    ),
    Metric(LOSS_SCALE, "the dynamic loss scale", group="loss_scale", across_ranks="same", switch=LOSS_SCALE),
    Metric(
        OVERFLOW,
        "1 when the loss scale overflowed and the step was skipped",
        group="loss_scale",
        across_ranks="same",
        switch=OVERFLOW,
    ),
    Metric(
        SKIPPED,
        "1 when skip_steps skipped the step's update (its metric was sigma standard deviations above its rolling mean)",
        group="loss",
        across_ranks="max",
        switch=SKIPPED,
        event=True,
    ),
    Metric(
        BATCH_SIZE,
        "samples in the step's batch on this rank (recorded with a DynamicBatch, whose size changes during the run)",
        group="batch_size",
        across_ranks="sum",
        switch=BATCH_SIZE,
    ),
    Metric(STEP_TIME, "wall time of one step, in seconds", "s", "time", across_ranks="max", switch=STEP_TIME, band=True),
    Metric(
        DATA_TIME, "time the step waited for its batch, in seconds", "s", "time", across_ranks="max", switch=DATA_TIME, band=True
    ),
    Metric(
        PROFILED,
        "1 on the steps a profile recorded and the step after (the profile action): their times include the profiler's",
        group="time",
        across_ranks="max",
        switch=PROFILED,
        event=True,
    ),
    Metric(
        SAMPLES_PER_SECOND, "samples per second", "1/s", "throughput", across_ranks="sum", switch=SAMPLES_PER_SECOND, band=True
    ),
    Metric(TOKENS_PER_SECOND, "tokens per second", "1/s", "tokens", across_ranks="sum", switch=TOKENS_PER_SECOND, band=True),
    Metric(
        THROUGHPUT_LINEARITY,
        "this device's samples per second over throughput.baseline (one device's alone): 1 is linear scaling",
        group="linearity",
        switch=THROUGHPUT_LINEARITY,
        band=True,
    ),
    Metric(
        TFLOPS,
        "model TFLOPS per device: a step's model FLOPs (throughput.flops_per_step, else 6 x trainable parameters x tokens) "
        "over its step time, in 10^12 per second",
        "TFLOPS",
        "flops",
        switch=TFLOPS,
    ),
    Metric(
        MFU,
        "model FLOPs utilization: tflops over the device's peak (throughput.peak_tflops, else the known device's), in percent",
        "%",
        "flops",
        switch=TFLOPS,
    ),
    Metric(HOST_RSS_GB, "resident memory of the process, in GB", "GB", "memory", across_ranks="max", switch=HOST_RSS_GB),
    Metric(DEVICE_MEM_GB, "device memory in use, in GB", "GB", "memory", across_ranks="max", switch=DEVICE_MEM_GB),
    Metric(DEVICE_MEM_PEAK_GB, "peak device memory, in GB", "GB", "memory", across_ranks="max", switch=DEVICE_MEM_PEAK_GB),
    Metric(DEVICE_UTIL, "device (AI core / SM) utilization, in percent", "%", "device_util", switch=DEVICE_UTIL),
    Metric(DEVICE_MEM_UTIL, "device memory in use, in percent of the device's", "%", "device_util", switch=DEVICE_MEM_UTIL),
    # a coordinate, not a curve (NOT_CHARTED); recorded only once a rewind has set it apart from step, never switched
    Metric(
        ITERATION,
        "after a rewind: the batches the framework ran up to this step, by its own count (cur_step_num from the "
        "resumed step: MindFormers' log lines and checkpoint names; a loop's run.step calls), ahead of step by the "
        "steps run again and the batches passed over",
        across_ranks="same",
    ),
)

#: The per-layer statistics every measured step has, in the order of a layer row (``layers.rank<R>/``,
#: docs/run-directory.md); :data:`MOMENT_FAMILIES` follow them with an Adam-family optimizer.
MEASURED_FAMILIES: tuple[Metric, ...] = (
    Metric(GRAD_NORM, "L2 norm of a layer's gradients", per="layer", across_ranks="same", title="gradient norm", heat=True),
    Metric(WEIGHT_NORM, "L2 norm of a layer's weights", per="layer", across_ranks="same", title="weight norm"),
    Metric(
        UPDATE_RATIO,
        "norm of a step's update over the weights' norm",
        per="layer",
        across_ranks="same",
        title="update ratio",
        heat=True,
    ),
)

#: The optimizer's state per layer (``Adam``, ``AdamWeightDecay``, ``Lamb``), after the step's update: the health of
#: its moments, where an instability often shows first (MindFormers' ``optimizer_state``).
MOMENT_FAMILIES: tuple[Metric, ...] = (
    Metric(
        ADAM_M_NORM,
        "L2 norm of the optimizer's first moment (Adam's m) of a layer's parameters, after the step's update",
        per="layer",
        across_ranks="same",
        title="Adam m norm",
        heat=True,
    ),
    Metric(
        ADAM_V_NORM,
        "L2 norm of the optimizer's second moment (Adam's v) of a layer's parameters, after the step's update",
        per="layer",
        across_ranks="same",
        title="Adam v norm",
        heat=True,
    ),
)

LAYER_FAMILIES: tuple[Metric, ...] = MEASURED_FAMILIES + MOMENT_FAMILIES

#: A rank's own per-layer gradient norms, before the data-parallel all-reduce (mindwatch's MindFormers wrapper): after
#: the others in a layer row, recorded and drawn per rank, judged by no per-layer rule (one rank's batch is not the
#: training's; the reduced ``grad_norm/<layer>`` every rank shares is).
LOCAL_FAMILIES: tuple[Metric, ...] = (
    Metric(
        LOCAL_GRAD_NORM,
        "L2 norm of a layer's gradients on this rank, before the data-parallel all-reduce",
        per="layer",
        across_ranks="max",
        title="local gradient norm (this rank's)",
    ),
)

#: The attention statistics, in the order of ``AttentionStats``' values; ``metrics: [attention_entropy]`` brings both.
ATTENTION_FAMILIES: tuple[Metric, ...] = (
    Metric(
        ATTENTION_ENTROPY,
        "entropy of the attention probabilities over the keys, in nats",
        "nats",
        per="attention layer",
        default=False,
        switch=ATTENTION_ENTROPY,
        title="attention entropy (nats)",
    ),
    Metric(
        ATTENTION_MAX_LOGIT,
        "the largest attention logit (the score before the softmax)",
        per="attention layer",
        default=False,
        switch=ATTENTION_ENTROPY,
        title="attention max logit",
    ),
)

#: Per weight matrix, every ``layers.stable_rank_every`` steps (``mindspore/stable_rank.py``): in the metrics file, each
#: weight a metric of its own (``stable_rank/<parameter>``, ``stable_rank/<parameter>/<expert>``).
WEIGHT_FAMILIES: tuple[Metric, ...] = (
    Metric(
        STABLE_RANK,
        "||W||_F^2 / sigma_max(W)^2 of a weight matrix: how many directions carry its norm (1: one; its smaller side at "
        "most); a weight whose stable rank falls has stopped using its width",
        per="weight",
        across_ranks="same",
        title="stable rank",
    ),
)

#: Per MoE layer (the cell holding a ``RouterStats``), every ``moe.every`` steps (``mindspore/router_stats.py``): in the
#: metrics file, summed over the data-parallel ranks inside the step (every rank records the same).
MOE_FAMILIES: tuple[Metric, ...] = (
    Metric(
        EXPERT_LOAD,
        "the share of a MoE layer's routed token choices that went to one expert (a layer's shares sum to 1)",
        per="expert",
        across_ranks="same",
        switch=MOE,
        title="expert load (share of routed tokens)",
    ),
    Metric(
        MOE_IMBALANCE,
        "the largest expert's share x the number of experts (1: balanced; the number of experts: one expert takes all)",
        per="moe layer",
        across_ranks="same",
        switch=MOE,
        title="MoE imbalance (largest share x experts)",
    ),
    Metric(
        ROUTER_ENTROPY,
        "mean entropy of the router's probabilities over the experts, in nats (ln(experts): undecided; 0: certain)",
        "nats",
        per="moe layer",
        across_ranks="same",
        switch=MOE,
        title="router entropy (nats)",
    ),
    Metric(
        MOE_DROPPED,
        "the share of the routed token choices over an expert's capacity (or naming no expert)",
        per="moe layer",
        across_ranks="same",
        switch=MOE,
        title="dropped share (over capacity)",
    ),
)

FAMILIES: tuple[Metric, ...] = LAYER_FAMILIES + LOCAL_FAMILIES + ATTENTION_FAMILIES + WEIGHT_FAMILIES + MOE_FAMILIES


@dataclass(frozen=True)
class ChartGroup:
    """One chart card of the run page: the metrics (of :data:`STEP_METRICS`, in that order) it draws or marks."""

    id: str
    title: str
    #: One y-axis name per metric (the last repeats) when the metrics have scales of their own.
    axes: tuple[str, ...] = ()

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(m.name for m in STEP_METRICS if m.group == self.id)

    @property
    def events(self) -> tuple[str, ...]:
        """Its metrics that are events (:attr:`Metric.event`): marked at the steps they are 1, not drawn as curves."""
        return tuple(m.name for m in STEP_METRICS if m.group == self.id and m.event)


#: The run page's chart cards, in page order; a metric of none of them gets a card of its own.
CHART_GROUPS: tuple[ChartGroup, ...] = (
    ChartGroup("loss", "loss"),
    ChartGroup("perplexity", "perplexity"),
    ChartGroup("lr", "learning rate"),
    ChartGroup("grad_norm", "gradient norm"),
    # samples/s and tokens/s differ by the sequence length: on one chart's twin axes their lines hide each other
    ChartGroup("throughput", "samples per second"),
    ChartGroup("tokens", "tokens per second"),
    ChartGroup("linearity", "throughput linearity (samples/s over one device's alone)"),
    # mfu is tflops over a constant peak: one curve, read on either axis
    ChartGroup("flops", "TFLOPS per device / MFU", ("TFLOPS", "MFU (%)")),
    ChartGroup("time", "step time vs data wait (s)"),
    ChartGroup("batch_size", "batch size"),
    ChartGroup("memory", "memory (GB)"),
    ChartGroup("device_util", "device utilization (%)"),
    ChartGroup("loss_scale", "loss scale / overflow", ("scale", "overflow")),
)

#: Names ``monitor_config.metrics`` accepts besides the switches (users' words) and what each switches on.
ALIASES: dict[str, tuple[str, ...]] = {
    "memory_usage": (HOST_RSS_GB, DEVICE_MEM_GB, DEVICE_MEM_PEAK_GB),
    "memory": (HOST_RSS_GB, DEVICE_MEM_GB, DEVICE_MEM_PEAK_GB),
    "global_rank": (),  # the rank is recorded with every step anyway
    "rank": (),
    "throughput": (SAMPLES_PER_SECOND, TOKENS_PER_SECOND, TFLOPS, MFU, THROUGHPUT_LINEARITY),
    MFU: (TFLOPS, MFU),  # mfu is tflops over the peak: it comes with tflops, where a peak is known
    "utilization": (DEVICE_UTIL, DEVICE_MEM_UTIL),
    "global_norm": (GRAD_NORM,),
    "learning_rate": (LR,),
    ATTENTION_MAX_LOGIT: (ATTENTION_ENTROPY,),  # the attention statistics are measured together
}

#: The signals of a broken training: watched for non-finite values and spikes by default, counted from the start.
TRAINING_SIGNALS: tuple[str, ...] = (LOSS, GRAD_NORM)
#: What a train step's outputs may carry (``mindspore/outputs.py`` records these out of a layout).
STEP_OUTPUTS: tuple[str, ...] = (LOSS, OVERFLOW, LOSS_SCALE, LR, GRAD_NORM)
#: What the callback records out of a train step's outputs: those, and ``skipped`` (our cells with ``skip_steps``).
RECORDED_OUTPUTS: tuple[str, ...] = (*STEP_OUTPUTS, SKIPPED)
#: What ``skip_steps.metric`` may judge.
SKIP_METRICS: tuple[str, ...] = (GRAD_NORM, LOSS)
#: The times a slow rank shows in, the data wait first (rank 0's straggler rule; the page's outlier ranks).
STRAGGLER_METRICS: tuple[str, ...] = (DATA_TIME, STEP_TIME)  # also each rank's slots of the cross-rank signal, in order
#: Record keys that are not charted: where a step is (its epoch, its batch in the epoch, the framework's count).
NOT_CHARTED: tuple[str, ...] = (EPOCH, "batch", ITERATION, "eval_time", "eval_samples")

_BY_NAME = {m.name: m for m in STEP_METRICS}
_FAMILY = {m.name: m for m in FAMILIES}


def get(name: str) -> Metric | None:
    """The built-in per-step metric or family ``name`` (``"loss"``, ``"attention_entropy/blocks.0"``); None for a user's."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    family, slash, _ = name.partition("/")
    return _FAMILY.get(family) if slash else None


def family_of(name: str) -> tuple[str, str] | None:
    """``("attention_entropy", "blocks.0.attn")`` for a built-in family member; None otherwise."""
    family, slash, layer = name.partition("/")
    return (family, layer) if slash and layer and family in _FAMILY else None


def is_layer_metric(name: str) -> bool:
    """Whether ``name`` is a per-layer statistic (``grad_norm/<layer>``, ...), not a metric of its own."""
    found = family_of(name)
    return found is not None and _FAMILY[found[0]].per == "layer"


def layer_stat_names(moments: bool = True) -> tuple[str, ...]:
    """The per-layer statistics in layer-row order: ``('grad_norm', 'weight_norm', 'update_ratio', 'adam_m_norm',
    'adam_v_norm')``; ``moments=False``: the first three, what a row holds without an Adam-family optimizer."""
    return tuple(m.name for m in (LAYER_FAMILIES if moments else MEASURED_FAMILIES))


def moe_names() -> tuple[str, ...]:
    """The routing statistics of a MoE layer: ``('expert_load', 'moe_imbalance', 'router_entropy', 'moe_dropped')``."""
    return tuple(m.name for m in MOE_FAMILIES)


def attention_names() -> tuple[str, ...]:
    """The attention statistics in ``AttentionStats``' order: ``('attention_entropy', 'attention_max_logit')``."""
    return tuple(m.name for m in ATTENTION_FAMILIES)


# -- evaluation ------------------------------------------------------------------------------------------------------
#: The prefix of an evaluation's results among a run's metrics: ``eval/loss``, ``eval/accuracy``; one point per
#: evaluation, at the training's step it ran after (docs/evaluation.md).
EVAL_PREFIX = "eval/"
#: Recorded beside an evaluation's results: its seconds, its samples, the epoch it ran after.
EVAL_TIME, EVAL_SAMPLES = "eval_time", "eval_samples"
#: The train metric an evaluation's chart draws its ``eval/loss`` beside.
EVAL_LOSS = f"{EVAL_PREFIX}{LOSS}"
#: ``Model.fit``'s own evaluation loss (``eval_results["eval_loss"]``).
EVAL_FIT_LOSS = f"{EVAL_PREFIX}eval_loss"
#: The title of the chart that draws the evaluations beside the training (the run page's card, the report's section).
EVAL_TITLE = "Evaluation"
#: Words in a result's name that mean higher is better (``mode: max`` when ``evaluation.mode`` is not given).
_HIGHER_IS_BETTER = ("acc", "precision", "recall", "f1", "auc", "top", "bleu", "rouge", "score", "map", "iou", "dice")


def is_eval(name: str) -> bool:
    """Whether ``name`` is an evaluation's result (``eval/<name>``)."""
    return name.startswith(EVAL_PREFIX)


def is_evaluation(record: Any) -> bool:
    """Whether a record is an evaluation's (it holds ``eval/<name>`` results), not a training step's."""
    return any(is_eval(key) for key in record)


def eval_primary(names: Any, configured: str | None = None) -> str | None:
    """The evaluation metric the run is judged by: ``configured`` (``evaluation.primary``; ``eval/`` is added to a bare
    name), else ``eval/loss`` when recorded, else MindSpore's own ``eval/eval_loss`` (``Model.fit``'s), else the first
    ``eval/<name>`` of ``names`` by name (None: none). By name, not in the order recorded: the column files a reader
    opens keep no order, and every view must pick the one the rules judged."""
    if configured:
        return configured if is_eval(configured) else f"{EVAL_PREFIX}{configured}"
    found = sorted(n for n in names if is_eval(n))
    for preferred in (EVAL_LOSS, EVAL_FIT_LOSS):
        if preferred in found:
            return preferred
    return found[0] if found else None


def eval_mode(name: str, configured: str | None = None) -> Literal["min", "max"]:
    """Whether a smaller (``min``) or a larger (``max``) ``name`` is better: ``configured`` (``evaluation.mode``), else
    ``max`` for a name that reads as a score (accuracy, f1, precision, recall, auc, top-k ...), ``min`` otherwise."""
    if configured in ("min", "max"):
        return configured  # type: ignore[return-value]
    leaf = name.removeprefix(EVAL_PREFIX).lower()
    return "max" if any(word in leaf for word in _HIGHER_IS_BETTER) and "loss" not in leaf else "min"


def banded() -> tuple[str, ...]:
    """The metrics drawn as a band across ranks and watched for stragglers (loss, times, throughput)."""
    return tuple(m.name for m in STEP_METRICS if m.band)


def in_group(group: str) -> tuple[str, ...]:
    """The metrics of a chart group: ``in_group("memory")`` -> ``('host_rss_gb', 'device_mem_gb', 'device_mem_peak_gb')``."""
    return tuple(m.name for m in STEP_METRICS if m.group == group)


def config_names() -> frozenset[str]:
    """Every name ``monitor_config.metrics`` accepts: the switches and the aliases."""
    return frozenset({m.switch for m in STEP_METRICS + FAMILIES if m.switch} | set(ALIASES))


def default_switches() -> tuple[str, ...]:
    """What ``metrics`` means when a config lists none (every switch but the attention statistics)."""
    return tuple(dict.fromkeys(m.switch for m in STEP_METRICS + FAMILIES if m.switch and m.default))


def expand(names: list[str] | tuple[str, ...]) -> frozenset[str]:
    """The switches ``names`` (config words) turn on, aliases expanded."""
    out: set[str] = set()
    for name in names:
        out.update(ALIASES.get(name, (name,)))
    return frozenset(out)


def order_key(name: str) -> tuple[int, str]:
    """Sort key: the vocabulary's order first, then the rest alphabetically."""
    index = _ORDER.get(name, len(_ORDER))
    return index, name


_ORDER = {m.name: i for i, m in enumerate(STEP_METRICS)}


def vocabulary() -> dict[str, Any]:
    """The vocabulary as JSON for the dashboard's pages (``GET /api/vocabulary``)."""
    return {
        "metrics": [asdict(m) for m in STEP_METRICS],
        "families": [asdict(m) | {"prefix": m.prefix} for m in FAMILIES],
        "groups": [
            {"id": g.id, "title": g.title, "metrics": list(g.metrics), "events": list(g.events), "axes": list(g.axes)}
            for g in CHART_GROUPS
        ],
        "layer_stats": list(layer_stat_names()),
        "attention": [m.prefix for m in ATTENTION_FAMILIES],
        "stragglers": list(STRAGGLER_METRICS),
        "not_charted": list(NOT_CHARTED),
        "evaluation": {
            "prefix": EVAL_PREFIX,
            "loss": EVAL_LOSS,
            "beside": LOSS,
            "time": EVAL_TIME,
            "samples": EVAL_SAMPLES,
            "epoch": EPOCH,
            "title": EVAL_TITLE,
        },
    }
