"""The stable rank of every weight matrix, ||W||_F^2 / sigma_max^2, against numpy's SVD of the same weights after
the same step's update; and ``rank_collapse`` when a weight is made rank one during a real training.

The reference is the test's own: a callback after mindwatch's reads every 2-D Parameter at the measured steps and
takes ``np.linalg.svd`` of it.
"""

from __future__ import annotations

import shutil
from urllib.parse import quote

import mindspore as ms
import numpy as np
import pytest
from conftest import CHROMIUM
from mindspore import ops
from mindspore.train import Callback
from test_report import report_data

import mindwatch
from mindwatch.alerts.rules.rank_collapse import RankCollapseRule
from mindwatch.demo.train import DemoSettings, build_training
from mindwatch.mindspore import MonitorCallback
from mindwatch.report.html import render_report

EVERY, STEPS, COLLAPSE_AT = 10, 120, 85


def numpy_stable_rank(w: np.ndarray) -> float:
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    return float((s**2).sum() / s[0] ** 2)


class Reference(Callback):
    """At each measured step, numpy's stable rank of every 2-D weight; at ``COLLAPSE_AT`` one weight is replaced by
    its best rank-one approximation (its top singular direction alone)."""

    def __init__(self, net, collapse: str | None) -> None:
        self.weights = [p for p in net.trainable_params() if len(p.shape) == 2 and min(p.shape) > 1]
        self.collapse = collapse
        self.at: dict[int, dict[str, float]] = {}

    def on_train_step_end(self, run_context) -> None:
        step = int(run_context.original_args().cur_step_num)
        if step % EVERY == 0:
            self.at[step] = {p.name: numpy_stable_rank(p.asnumpy()) for p in self.weights}
        if step == COLLAPSE_AT:
            (p,) = [p for p in self.weights if p.name == self.collapse]
            u, s, vt = np.linalg.svd(p.asnumpy())
            ops.assign(p, ms.Tensor((s[0] * np.outer(u[:, 0], vt[0])).astype(np.float32)))


@pytest.mark.slow  # 6-7 s a training
@pytest.mark.parametrize(("mode", "steps"), [("graph", STEPS), ("pynative", 3 * EVERY)])
def test_stable_rank_is_numpys_and_a_weight_made_rank_one_is_named(tmp_path, mode: str, steps: int, request) -> None:
    """GRAPH: a training that collapses one weight at step 85; PyNative (slower a step): the values alone."""
    settings = DemoSettings(steps=steps, mode=mode, layers=1, d_model=32, heads=2, batch_size=8, seq_length=32, layer_stats=False)
    model, data = build_training(settings)
    net = model.train_network.network.network  # TrainOneStepWithGradNorm(LanguageModelLoss(TinyGPT))
    names = [p.name for p in net.trainable_params() if len(p.shape) == 2 and min(p.shape) > 1]
    collapse = "network.blocks.0.mlp.0.weight"  # the first feed-forward matrix, 128 x 32
    assert collapse in names, names
    reference = Reference(net, collapse)
    config = {"save_dir": str(tmp_path), "project": "p", "interval": 60, "layers": {"stable_rank_every": EVERY}}
    monitor = MonitorCallback(config)
    model.train(1, data, callbacks=[monitor, reference], dataset_sink_mode=False)
    run = mindwatch.open_run(monitor.run_dir)

    measured = sorted(reference.at)
    assert measured == list(range(EVERY, steps + 1, EVERY))
    assert sorted(m for m in run.metrics if m.startswith("stable_rank/")) == sorted(f"stable_rank/{n}" for n in names)
    for name in names:
        s = run.series(f"stable_rank/{name}")
        assert s.step.tolist() == measured, name
        for i, step in enumerate(measured):
            if i >= 2:  # from the third measurement on: warm-started from the last
                assert s.value[i] == pytest.approx(reference.at[step][name], rel=0.02), (name, step)
    # the report's heat map, weights x steps: the recorded values (fewer steps than its buckets: one a column)
    weights = report_data(render_report([run]))["weights"]
    assert weights["steps"] == measured and weights["title"] == "stable rank per weight"
    assert sorted(weights["layers"]) == sorted(names)
    drawn = {(j, li): v for j, li, v in weights["values"]}
    for li, name in enumerate(weights["layers"]):
        recorded = run.series(f"stable_rank/{name}").value.tolist()
        assert [drawn[(j, li)] for j in range(len(measured))] == pytest.approx(recorded, rel=1e-5), name
    if mode == "graph" and shutil.which(CHROMIUM):  # the run page's heat map, weights x steps, in Chromium
        drawn_in_page(run, request.getfixturevalue("browser"), measured)
    if steps < COLLAPSE_AT:
        return  # the values alone (too few measurements for the rule)
    fired = [a for a in run.alerts if a["rule"] == "rank_collapse"]
    after = [step for step in measured if step > COLLAPSE_AT]
    assert reference.at[after[0]][collapse] < 1.5, "the test's own weight is rank one, near enough"
    # the default count: the second measurement in a row below half its rolling median; nothing before, from the
    # freshly initialised weights' fast fall in the first steps
    assert [(a["metric"], a["step"]) for a in fired] == [(f"stable_rank/{collapse}", after[1])], fired


def test_rank_collapse_fires_once_a_streak_below_its_own_median() -> None:
    rule = RankCollapseRule(factor=2.0, window=10, warmup=3, count=1)  # settings of its own: each value counts
    values = [40.0, 41.0, 39.0, 40.5, 12.0, 11.0, 38.0, 15.0]
    fired = [a for i, v in enumerate(values) for a in rule.check({"step": 100 * (i + 1), "stable_rank/w": v})]
    # 12 < median/2 fires; 11 continues the streak; 38 ends it; 15 (below its median 39.5 / 2) fires again
    assert [(a["step"], a["metric"]) for a in fired] == [(500, "stable_rank/w"), (800, "stable_rank/w")]
    assert "the stable rank of w fell to 12" in fired[0]["message"]


def test_each_experts_matrix_of_a_3d_weight_is_measured_on_its_own() -> None:
    """A (experts, rows, columns) Parameter: ``stable_rank/<name>/<e>`` for each expert, each numpy's, warm-started."""
    from mindwatch.mindspore.stable_rank import StableRanks
    from mindwatch.monitor.worker import DEFERRED

    rng = np.random.default_rng(0)
    experts = rng.standard_normal((4, 48, 16)).astype(np.float32)
    experts[2] = np.outer(rng.standard_normal(48), rng.standard_normal(16))  # expert 2: rank one
    weight = ms.Parameter(ms.Tensor(experts), name="moe.experts.w1")
    ranks = StableRanks([weight, ms.Parameter(ms.Tensor(np.ones(16, np.float32)), name="bias")], every=1)
    assert [p.name for p in ranks.params] == ["moe.experts.w1"], "a vector has no stable rank"
    for _ in range(3):  # the third measurement warm-started from the second's vectors
        rec: dict = {}
        ranks.attach(rec, 1)
        values = rec.pop(DEFERRED)()
    assert sorted(values) == [f"stable_rank/moe.experts.w1/{e}" for e in range(4)]
    for e in range(4):
        assert values[f"stable_rank/moe.experts.w1/{e}"] == pytest.approx(numpy_stable_rank(experts[e]), rel=0.02), e
    assert values["stable_rank/moe.experts.w1/2"] == pytest.approx(1.0, rel=1e-3)


HEAT = """() => {
  const el = document.querySelector('#chart-stable-rank');
  const c = el && echarts.getInstanceByDom(el);
  if (!c) return null;
  const o = c.getOption();
  return {steps: o.xAxis[0].data, weights: o.yAxis[0].data, values: o.series[0].data, title: o.title[0].text};
}"""


def drawn_in_page(run, browser, measured: list[int]) -> None:
    """The dashboard's run page draws ``stable_rank/<weight>`` as weights x steps with the recorded values."""
    from conftest import wait_for

    from mindwatch.serve.process import DashboardProcess

    with DashboardProcess(run.path.parent.parent, port=0) as dash:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(f"{dash.url}#/run/{quote(f'{run.path.parent.name}/{run.path.name}', safe='')}")
        heat = wait_for(lambda: page.evaluate(HEAT), 60, "the stable-rank heat map")
    assert heat["title"] == "stable rank per weight" and [int(s) for s in heat["steps"]] == measured
    drawn = {(int(j), int(li)): v for j, li, v in heat["values"]}
    assert sorted(heat["weights"]) == sorted(m for m in run.metrics if m.startswith("stable_rank/"))
    for li, metric in enumerate(heat["weights"]):  # each row named by its metric, as the attention map's
        recorded = run.series(metric).value.tolist()
        assert [drawn[(j, li)] for j in range(len(measured))] == pytest.approx(recorded, rel=1e-5), metric
