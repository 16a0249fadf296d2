"""Alert rules on synthetic series: spikes fire and noise does not, cooldown holds, thresholds mean what seed 003 says."""

from __future__ import annotations

import math
import random
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindwatch.alerts.alert import Cooldown
from mindwatch.alerts.engine import RuleEngine
from mindwatch.alerts.registry import build_rules
from mindwatch.alerts.rules import (
    DataWaitRule,
    DivergenceRule,
    MemoryRule,
    NonFiniteRule,
    SpikeRule,
    ThroughputDropRule,
    threshold_rules,
)
from mindwatch.alerts.rules.layer_collapse import LayerCollapseRule
from mindwatch.alerts.rules.layer_frozen import LayerFrozenRule
from mindwatch.alerts.rules.layer_spike import LayerSpikeRule
from mindwatch.alerts.rules.layer_vanishing import LayerVanishingRule
from mindwatch.alerts.rules.nonfinite import checked_in_step
from mindwatch.config import load_config
from mindwatch.monitor.control import Control
from mindwatch.store.layerfiles import LAYER_KEY, LAYER_STATS, LayerRow


def records(metric: str, values: list[float], **extra: float) -> list[dict]:
    return [{"step": i + 1, "t": 1000.0 + i, metric: v, **extra} for i, v in enumerate(values)]


def fired_steps(rule, recs: list[dict]) -> list[int]:
    return [a["step"] for rec in recs for a in rule.check(rec)]


def noisy(n: int, level: float, rel_noise: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rel_noise * (2 * rng.random() - 1)) for _ in range(n)]


# -- spike -------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    level=st.floats(1e-3, 1e3),
    noise=st.floats(0.0, 0.5),  # +-50 % uniform noise never reaches 3 x the median
    seed=st.integers(0, 10_000),
)
def test_spike_rule_stays_quiet_on_noise(level: float, noise: float, seed: int) -> None:
    rule = SpikeRule("grad_norm", factor=3.0, window=50, warmup=20, count=3)
    assert fired_steps(rule, records("grad_norm", noisy(300, level, noise, seed))) == []


@settings(max_examples=60, deadline=None)
@given(
    level=st.floats(1e-3, 1e3),
    height=st.floats(4.0, 1e4),  # times the level: above factor x median even with the noise
    at=st.integers(30, 250),
    length=st.integers(3, 10),
    seed=st.integers(0, 10_000),
)
def test_spike_rule_fires_once_per_spike_of_count_steps(level: float, height: float, at: int, length: int, seed: int) -> None:
    values = noisy(300, level, 0.2, seed)
    for i in range(at, at + length):
        values[i] = level * height
    rule = SpikeRule("grad_norm", factor=3.0, window=50, warmup=20, count=3)
    # fires on the third spiking step (step numbers are 1-based), once per spike
    assert fired_steps(rule, records("grad_norm", values)) == [at + 3]


def test_spike_shorter_than_count_does_not_fire_and_warmup_is_respected() -> None:
    values = noisy(100, 1.0, 0.1, 1)
    values[40] = values[41] = 50.0  # two spiking steps, count is 3
    values[5:8] = [50.0, 50.0, 50.0]  # inside the warm-up
    rule = SpikeRule("loss", factor=3.0, window=50, warmup=20, count=3)
    assert fired_steps(rule, records("loss", values)) == []


def test_spike_with_count_one_reports_value_and_threshold() -> None:
    values = [1.0] * 30 + [10.0]
    rule = SpikeRule("loss", count=1, warmup=20)
    alerts = [a for rec in records("loss", values) for a in rule.check(rec)]
    assert len(alerts) == 1
    a = alerts[0]
    assert (a["rule"], a["metric"], a["value"], a["threshold"], a["step"], a["severity"]) == (
        "spike",
        "loss",
        10.0,
        3.0,
        31,
        "warning",
    )
    assert a["t"] == 1030.0  # the anomalous step's wall time


# -- cooldown ----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cooldown_holds_a_flapping_rule_and_counts_what_it_held_back() -> None:
    clock = FakeClock()
    out: list[dict] = []
    engine = RuleEngine(threshold_rules({"loss": 5.0}), out.append, cooldown_secs=60)
    engine.cooldown = Cooldown(60, clock=clock)
    for i in range(100):  # loss flaps above and below the limit every step, one step per second
        clock.now = float(i)
        engine.write([{"step": i, "t": float(i), "loss": 6.0 if i % 2 else 4.0}])
    assert [a["step"] for a in out] == [1, 61]
    assert "suppressed" not in out[0]
    assert out[1]["suppressed"] == 29  # odd steps 3..59 were held back


@settings(max_examples=40, deadline=None)
@given(cooldown=st.floats(1, 100), times=st.lists(st.floats(0, 1000), min_size=1, max_size=200))
def test_cooldown_never_lets_two_alerts_closer_than_its_length(cooldown: float, times: list[float]) -> None:
    clock = FakeClock()
    cool = Cooldown(cooldown, clock=clock)
    let_through = []
    for t in sorted(times):
        clock.now = t
        if cool.allow(("spike", "loss")):
            let_through.append(t)
    assert let_through[0] == min(times)
    assert all(b - a >= cooldown for a, b in zip(let_through, let_through[1:], strict=False))


def test_cooldown_is_per_rule_and_metric() -> None:
    out: list[dict] = []
    engine = RuleEngine([*threshold_rules({"loss": 5.0, "grad_norm": 1.0})], out.append, cooldown_secs=300)
    engine.write([{"step": 1, "loss": 6.0, "grad_norm": 2.0}, {"step": 2, "loss": 7.0, "grad_norm": 3.0}])
    assert [(a["metric"], a["step"]) for a in out] == [("loss", 1), ("grad_norm", 1)]


# -- thresholds (seed 003's warn_on_value) -----------------------------------------------


def test_warn_on_value_bare_number_is_upper_bound_but_lower_bound_for_throughput() -> None:
    cfg = load_config(
        {"callback": {"params": {"warn_on_value": {"loss": 50.0, "tokens_per_second": 1000, "grad_norm": {"below": 0.01}}}}}
    )
    rules = {r.metric: r for r in build_rules(cfg) if r.name == "threshold"}
    assert (rules["loss"].above, rules["loss"].below) == (50.0, None)
    assert (rules["tokens_per_second"].above, rules["tokens_per_second"].below) == (None, 1000.0)
    assert (rules["grad_norm"].above, rules["grad_norm"].below) == (None, 0.01)
    assert rules["loss"].check({"step": 3, "loss": 51.0})[0]["threshold"] == 50.0
    assert rules["loss"].check({"step": 3, "loss": 49.0}) == []
    assert rules["tokens_per_second"].check({"step": 3, "tokens_per_second": 999.0})[0]["value"] == 999.0
    assert rules["tokens_per_second"].check({"step": 3, "tokens_per_second": 5000.0}) == []
    assert rules["grad_norm"].check({"step": 3, "grad_norm": 0.001})


# -- the other rules ------------------------------------------------------------------


def test_nonfinite_fires_on_nan_and_inf_and_ignores_overflow_steps() -> None:
    rule = NonFiniteRule(actions=["stop"])
    assert rule.check({"step": 1, "loss": 2.0, "grad_norm": 1.0}) == []
    (a,) = rule.check({"step": 2, "loss": "nan", "grad_norm": 1.0})  # as stored in the JSONL
    assert (a["metric"], a["severity"], a["actions"]) == ("loss", "error", ["stop"]) and math.isnan(a["value"])
    assert rule.check({"step": 3, "loss": 2.0, "grad_norm": math.inf})[0]["metric"] == "grad_norm"
    assert rule.check({"step": 4, "loss": 2.0, "grad_norm": math.inf, "overflow": True}) == []  # loss scale skips it
    scaled = {"step": 5, "loss": 2.0, "grad_norm": math.nan, "overflow": 1.0, "loss_scale": 65536.0}
    assert rule.check(scaled) == [], "a scale above 1 overflowed: the next, smaller scale cures it"
    # no scaling (MindFormers' bf16 wrappers: scale 1): the gradients every rank shares are NaN, another rank's loss
    # may have gone NaN: this rank's finite loss does not make it an overflow to ignore
    (a,) = rule.check({**scaled, "loss_scale": 1.0})
    assert a["metric"] == "grad_norm" and math.isnan(a["value"])


def test_with_actions_the_training_thread_checks_loss_and_grad_norm_and_the_worker_the_rest() -> None:
    acting = load_config({"alerts": {"nonfinite": {"actions": ["stop"], "metrics": ["loss", "grad_norm", "lr"]}}})
    assert checked_in_step(acting.alerts) == ("loss", "grad_norm")
    (worker,) = [r for r in build_rules(acting, checks_in_step=True) if isinstance(r, NonFiniteRule)]
    assert worker.metrics == ("lr",)
    (alone,) = [r for r in build_rules(acting) if isinstance(r, NonFiniteRule)]  # no front door checks: the worker does
    assert alone.metrics == ("loss", "grad_norm", "lr")
    watching = load_config({})  # no actions: nothing to act on at once, the worker checks everything
    assert checked_in_step(watching.alerts) == ()
    assert [r.metrics for r in build_rules(watching, checks_in_step=True) if isinstance(r, NonFiniteRule)] == [
        ("loss", "grad_norm")
    ]
    assert checked_in_step(load_config({"alerts": {"enabled": False, "nonfinite": {"actions": ["stop"]}}}).alerts) == ()


def test_divergence_fires_on_a_rising_loss_and_not_on_a_noisy_falling_one() -> None:
    rng = random.Random(3)
    falling = [3.0 * math.exp(-i / 200) + 0.05 * rng.gauss(0, 1) for i in range(400)]
    assert fired_steps(DivergenceRule(window=50), records("loss", falling)) == []
    flat_noise = [2.0 + 0.3 * rng.gauss(0, 1) for _ in range(400)]
    assert fired_steps(DivergenceRule(window=50), records("loss", flat_noise)) == []
    rising = falling[:200] + [falling[199] * (1 + 0.02 * i) + 0.05 * rng.gauss(0, 1) for i in range(100)]
    steps = fired_steps(DivergenceRule(window=50), records("loss", rising))
    assert steps and 200 < steps[0] <= 240


def test_throughput_drop_fires_when_loss_is_normal_only() -> None:
    sps = [100.0] * 40 + [30.0] * 10
    normal = [
        {"step": i + 1, "samples_per_second": v, "loss": 2.0, "step_time": 0.01, "data_time": 0.007 if v < 50 else 0.0}
        for i, v in enumerate(sps)
    ]
    rule = ThroughputDropRule(warmup=20, count=3)
    alerts = [a for rec in normal for a in rule.check(rec)]
    assert [a["step"] for a in alerts] == [43]
    assert "70 % of the step is spent waiting for data" in alerts[0]["message"]
    diverging = [dict(r, loss=2.0 if r["step"] <= 40 else 50.0) for r in normal]
    rule = ThroughputDropRule(warmup=20, count=3)
    assert [a for rec in diverging for a in rule.check(rec)] == []


def test_throughput_drop_starts_anew_when_the_batch_size_changes() -> None:
    """A DynamicBatch halved: half the samples per step is no drop; a drop at the new size still is."""
    sps = [100.0] * 40 + [45.0] * 30 + [20.0] * 5
    recs = [{"step": i + 1, "samples_per_second": v, "loss": 2.0, "batch_size": 32 if i < 40 else 16} for i, v in enumerate(sps)]
    assert fired_steps(ThroughputDropRule(warmup=20, count=3), recs) == [73]


def test_data_wait_share_above_limit_fires_after_count() -> None:
    recs = [{"step": i + 1, "step_time": 0.1, "data_time": 0.02 if i < 20 else 0.08} for i in range(40)]
    assert fired_steps(DataWaitRule(limit=0.5, warmup=5, count=5), recs) == [25]


def test_memory_rule_uses_fraction_of_total() -> None:
    rule = MemoryRule(fraction=0.9, host_total_gb=10.0, device_total_gb=64.0)
    assert rule.check({"step": 1, "host_rss_gb": 8.9, "device_mem_gb": 10.0}) == []
    (a,) = rule.check({"step": 2, "host_rss_gb": 9.5})
    assert (a["metric"], a["threshold"]) == ("host_rss_gb", 9.0)
    assert rule.check({"step": 3, "device_mem_gb": 60.0})[0]["metric"] == "device_mem_gb"


# -- per-layer rules on their arrays ------------------------------------------------------


def layer_records(stat: str, values: np.ndarray, layers: tuple[str, ...]) -> list[dict]:
    """One record a measured step, as the writer gets it: ``values[i, j]`` is layer j's ``stat`` at step i + 1."""
    out = []
    for i, row in enumerate(values):
        stats = np.ones((len(LAYER_STATS), len(layers)), np.float32)
        stats[LAYER_STATS.index(stat)] = row
        out.append({"step": i + 1, "t": 1000.0 + i, LAYER_KEY: LayerRow(layers, stats)})
    return out


def test_layer_collapse_fires_once_when_a_moment_falls_below_its_rolling_median_over_factor() -> None:
    layers = ("steady", "collapses", "dips", "never_moved", "early")
    v = 1e-4 * np.random.default_rng(0).uniform(0.8, 1.25, (30, len(layers)))  # +-25 %: never 10 x below the median
    v[19:, 1] = 2e-6  # from step 20 on: ~50 x below its median
    v[19:, 2] = 2e-5  # ~5 x below: within the factor
    v[:, 3] = 0.0  # a median of 0 is not judged
    v[2, 4] = 1e-9  # step 3: before the warm-up (5 measured values)
    v[10, 0] = math.nan  # the non-finite rule's; it stays out of the median
    rule = LayerCollapseRule()
    alerts = [a for rec in layer_records("adam_v_norm", v, layers) for a in rule.check(rec)]
    assert [(a["step"], a["layer"], a["metric"]) for a in alerts] == [(20, "collapses", "adam_v_norm/collapses")]
    median = float(np.median(v[:19, 1].astype(np.float32)))  # the 19 measured values before it (window 20)
    assert alerts[0]["value"] == pytest.approx(2e-6, rel=1e-6)
    assert alerts[0]["threshold"] == pytest.approx(median / 10, rel=1e-6)
    assert re.fullmatch(
        r"layer collapses: its adam_v norm collapsed to 2e-6, [\d.]+ times below its rolling median [\d.e-]+ "
        r"\(limit: the median / 10\)",
        alerts[0]["message"],
    ), alerts[0]["message"]
    # the same arrays: the first moment is not watched by default, and a spike is not a collapse
    assert [a for rec in layer_records("adam_m_norm", v, layers) for a in LayerCollapseRule().check(rec)] == []
    assert [a for rec in layer_records("adam_v_norm", v, layers) for a in LayerSpikeRule(stat="adam_v_norm").check(rec)] == []
    # a row without the moments (an optimizer not of the Adam family): nothing to judge
    without = {"step": 31, LAYER_KEY: LayerRow(layers, np.ones((3, len(layers)), np.float32))}
    assert rule.check(without) == []


def test_no_per_layer_rule_judges_one_ranks_own_gradient_norms() -> None:
    """MindFormers' local_norm in a multi-rank run: each rank's norms before the all-reduce. One rank's batch whose
    norm is 20 x its median is that rank's, not the training's: the reduced norms every rank shares are judged."""
    layers = ("embed", "block", "head")
    g = np.random.default_rng(1).uniform(0.8, 1.25, (30, len(layers)))
    g[24, 1] = 20.0
    g[10:20, 2] = 1e-9  # vanishing, ten measured steps in a row
    rows = [np.asarray(r, np.float32)[None] for r in g]  # the gradient norms alone, as MindFormers' wrapper measures

    def alerts(local: bool) -> list[tuple[str, int, str]]:
        rules = [LayerSpikeRule(), LayerVanishingRule()]
        recs = [{"step": i + 1, LAYER_KEY: LayerRow(layers, r, ("grad_norm",), local)} for i, r in enumerate(rows)]
        return [(a["rule"], a["step"], a["layer"]) for rec in recs for rule in rules for a in rule.check(rec)]

    assert ("layer_spike", 25, "block") in alerts(local=False) and any(a[0] == "layer_vanishing" for a in alerts(False))
    assert alerts(local=True) == []


def test_the_moments_are_judged_once_they_settled() -> None:
    """Adam's v grows from 0 as 1 - beta2**t: its norm at step 1 is no baseline. Rows whose moments have not settled are
    recorded but judged by no rule; the same values, settled, are (a 50 x fall from the rolling median collapses)."""
    layers = ("a", "b")
    v = np.full((30, 2), 1e-4)
    v[25:, 1] = 2e-6
    recs = layer_records("adam_v_norm", v, layers)

    def unsettled(records: list[dict]) -> list[dict]:
        return [{**r, LAYER_KEY: LayerRow(layers, r[LAYER_KEY].stats, moments_settled=False)} for r in records]

    unsettled_rule, settled_rule = LayerCollapseRule(), LayerCollapseRule()
    assert [a for rec in unsettled(recs) for a in unsettled_rule.check(rec)] == []
    assert [(a["step"], a["layer"]) for rec in recs for a in settled_rule.check(rec)] == [(26, "b")]
    # the gradient norms are judged whatever the moments' state: a spike at step 26
    g = np.ones((30, 2))
    g[25, 0] = 50.0
    grads = unsettled(layer_records("grad_norm", g, layers))
    spike = LayerSpikeRule()
    assert [(a["step"], a["layer"]) for rec in grads for a in spike.check(rec)] == [(26, "a")]


@pytest.mark.parametrize("why", [{"skipped": 1.0}, {"lr": 0.0}, {"overflow": 1.0}])
def test_a_step_that_applied_no_update_on_purpose_does_not_count_as_frozen(why: dict) -> None:
    """A skipped step, an lr of 0 (a warm-up's first step) or a loss-scale overflow leaves the weights as they were by
    design: three such measured steps in a row are not frozen weights; three steps that did update nothing are."""
    layers = ("a",)
    frozen = layer_records("update_ratio", np.zeros((3, 1)), layers)
    judged, excused = LayerFrozenRule(), LayerFrozenRule()
    assert [a["step"] for rec in frozen for a in judged.check(rec)] == [3]
    assert [a for rec in frozen for a in excused.check({**rec, **why})] == []


def test_layer_collapse_watches_the_moments_only_and_each_one_asked() -> None:
    both = build_rules(load_config({"alerts": {"layer_collapse": {"stats": ["adam_m_norm", "adam_v_norm"]}}}))
    assert sorted(r.stat for r in both if r.name == "layer_collapse") == ["adam_m_norm", "adam_v_norm"]
    assert [r.stat for r in build_rules(load_config({})) if r.name == "layer_collapse"] == ["adam_v_norm"]
    with pytest.raises(ValueError, match="adam_m_norm"):
        load_config({"alerts": {"layer_collapse": {"stats": ["grad_norm"]}}})
    with pytest.raises(ValueError, match="factor"):
        load_config({"alerts": {"layer_collapse": {"factor": 1}}})


# -- engine ------------------------------------------------------------------------------


def test_engine_files_actions_on_control_once_and_survives_a_broken_rule(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        name = "broken"

        def check(self, rec):
            raise ZeroDivisionError("boom")

    control, out = Control(), []
    engine = RuleEngine([Broken(), NonFiniteRule(actions=["stop", "checkpoint"])], out.append, control=control, cooldown_secs=0)
    engine.write([{"step": 7, "loss": math.nan}])
    engine.write([{"step": 7, "loss": math.nan}])  # the same step again: requested once only
    assert [a["rule"] for a in out] == ["nonfinite", "nonfinite"]
    assert control.pending
    assert [(act, a["step"]) for act, a in control.take()] == [("stop", 7), ("checkpoint", 7)]
    assert not control.pending and control.take() == []
    assert "alert rule broken failed" in caplog.text


def test_default_config_switches_on_the_documented_rules() -> None:
    names = sorted({r.name for r in build_rules(load_config({}))})
    assert names == [
        "data_wait",
        "divergence",
        "expert_collapse",
        "layer_collapse",
        "layer_frozen",
        "layer_spike",
        "layer_update_large",
        "layer_vanishing",
        "memory",
        "nonfinite",
        "overfitting",
        "rank_collapse",
        "router_imbalance",
        "spike",
        "throughput_drop",
    ]
    assert build_rules(load_config({"alerts": {"enabled": False}})) == []


def test_a_blown_up_loss_reads_in_times_not_a_wall_of_percent_digits() -> None:
    """The divergence and spike messages of a loss from ~0.09 to ~7.5e5: 'x million times', no '811638936 %'."""
    losses = [0.093 + 0.001 * (i % 3) for i in range(60)] + [7.554e5] * 6
    rule = DivergenceRule(window=50, min_rise=0.2, min_t=0.5)
    alerts = [a for rec in records("loss", losses) for a in rule.check(rec)]
    assert alerts
    msg = alerts[0]["message"]
    assert re.search(r"up [\d.,e]+ \((\d+(\.\d)?) (thousand|million) times the window's median\)", msg), msg
    assert "e+" not in msg and "%" not in msg
    spike = SpikeRule("loss", warmup=20, count=1)
    fired = [a for rec in records("loss", losses) for a in spike.check(rec)][0]["message"]
    ratio = 7.554e5 / float(sorted(losses[10:60])[25])  # the value over the median of the 50 values before it
    times = re.search(r"spiked to 755,400, ([\d.]+) million times its rolling median 0\.09\d", fired)
    assert times and float(times.group(1)) == pytest.approx(ratio / 1e6, abs=0.051), fired
    ramp = [1 + 0.01 * i for i in range(60)]
    rule = DivergenceRule(window=50, min_t=0.5)
    small = [a for rec in records("loss", ramp) for a in rule.check(rec)]
    assert small and "(+" in small[0]["message"] and "% on the window's median)" in small[0]["message"]
