// Which metrics share a chart (run_charts.js's chartGroups, from the server's vocabulary) and the chart view in the URL.
import assert from "node:assert/strict";
import test from "node:test";

import { fixture, page } from "./helpers.mjs";

const { loadVocabulary } = await page("vocabulary.js");
const { chartGroups } = await page("run_charts.js");
const { chartViewFromParams, setChartViewParams } = await page("chart_view.js");
await loadVocabulary();

test("a run's metrics make the vocabulary's chart groups, loss first, and nothing it does not chart", () => {
  const run = fixture("run");
  const vocabulary = fixture("vocabulary");
  const groups = chartGroups(run.metrics);
  assert.equal(groups[0].id, "loss");
  const drawn = groups.flatMap((g) => g.metrics);
  for (const m of vocabulary.not_charted) assert.ok(!drawn.includes(m), `${m} is not charted`);
  assert.equal(drawn.length, new Set(drawn).size, "each metric on one chart");
  for (const m of drawn) assert.ok(run.metrics.includes(m), `${m} is one of the run's`);
  const known = new Map(vocabulary.groups.map((g) => [g.id, g.metrics]));
  for (const g of groups) if (known.has(g.id)) for (const m of g.metrics) assert.ok(known.get(g.id).includes(m));
});

test("a metric of no group gets a chart of its own, named after it", () => {
  const groups = chartGroups(["loss", "my_metric"]);
  const own = groups.find((g) => g.id === "my_metric");
  assert.deepEqual([own.title, own.metrics, own.events], ["my_metric", ["my_metric"], []]);
});

test("the chart view goes into the URL and comes back the same; a bad value is the default", () => {
  const view = { x: "elapsed", smoothing: 0.6, log: true, robust: false };
  const q = setChartViewParams(new URLSearchParams(), view);
  assert.equal(q.toString(), "x=elapsed&smoothing=0.6&log=1&y=all");
  assert.deepEqual(chartViewFromParams(q), view);
  assert.deepEqual(chartViewFromParams(new URLSearchParams("x=sideways&smoothing=7")), {
    x: "step",
    smoothing: 0,
    log: false,
    robust: true,
  });
  assert.equal(setChartViewParams(new URLSearchParams(), chartViewFromParams(new URLSearchParams())).toString(), "");
});

test("the families recorded per member are heat maps, not a card each: attention layers, weights, MoE layers, experts", async () => {
  const { expertFamilies, heatFamilies, isFamilyMetric, perWords } = await page("vocabulary.js");
  const { chartGroups } = await page("run_charts.js");
  const families = fixture("vocabulary").families;
  const perMember = ["attention layer", "weight", "moe layer"];
  const expected = families.filter((f) => perMember.includes(f.per)).map((f) => f.prefix);
  assert.deepEqual(
    heatFamilies().map((f) => f.prefix),
    expected,
  );
  for (const prefix of ["stable_rank/", "attention_entropy/", "moe_imbalance/", "router_entropy/"])
    assert.ok(expected.includes(prefix), `${prefix} in ${expected.join(", ")}`);
  assert.deepEqual(
    expertFamilies().map((f) => f.prefix),
    ["expert_load/"],
  );
  assert.deepEqual(
    heatFamilies().map((f) => `${f.name} per ${perWords(f)}`),
    families
      .filter((f) => perMember.includes(f.per))
      .map((f) => `${f.name} per ${f.per === "moe layer" ? "MoE layer" : f.per === "weight" ? "weight" : "layer"}`),
  );
  const members = [
    "stable_rank/blocks.0.attn.qkv.weight",
    "stable_rank/moe.experts.w1/3",
    "expert_load/blocks.0.moe/3",
    "moe_imbalance/blocks.0.moe",
    "router_entropy/blocks.0.moe",
  ];
  assert.ok(members.every(isFamilyMetric));
  const drawn = chartGroups(["loss", ...members]).flatMap((g) => g.metrics);
  assert.deepEqual(drawn, ["loss"], "no card of its own for a weight's stable rank, an expert's load or a MoE layer's");
});

test("the expert load's grid (rows <layer>/<expert> x steps) at one step is MoE layers x experts, split at the last /", async () => {
  const { expertsAt } = await page("assets/charts.js");
  // mindwatch.analysis.heatmap.family_grid's shape: rows in model order, [column, row, value] cells
  const grid = {
    layers: [
      "expert_load/blocks.0.moe/0",
      "expert_load/blocks.0.moe/1",
      "expert_load/blocks.1.moe/0",
      "expert_load/blocks.1.moe/1",
    ],
    steps: [10, 20],
    values: [
      [0, 0, 0.75],
      [0, 1, 0.25],
      [0, 2, 0.5],
      [0, 3, 0.5],
      [1, 0, 0.625],
      [1, 1, 0.375],
      [1, 3, 0.875],
    ],
  };
  assert.deepEqual(expertsAt(grid, 1, "expert_load/"), {
    layers: ["blocks.0.moe", "blocks.1.moe"],
    steps: ["0", "1"],
    values: [
      [0, 0, 0.625],
      [1, 0, 0.375],
      [1, 1, 0.875],
    ],
  });
  const at0 = expertsAt(grid, 0, "expert_load/");
  assert.deepEqual(at0.values, [
    [0, 0, 0.75],
    [1, 0, 0.25],
    [0, 1, 0.5],
    [1, 1, 0.5],
  ]);
  // without the prefix cut, the layer keeps the family's name; a layer name with "/" in it stays whole
  assert.deepEqual(expertsAt({ layers: ["a/b.moe/0", "a/b.moe/12"], steps: [5], values: [] }, 0), {
    layers: ["a/b.moe"],
    steps: ["0", "12"],
    values: [],
  });
});

test("the expert load's step follows a live run while it shows the newest, and stays near its step otherwise", async () => {
  const { columnAfter } = await page("assets/charts.js");
  assert.equal(columnAfter([10, 20, 30], 2, [10, 20, 30, 40]), 3, "at the newest: the new newest");
  assert.equal(columnAfter([], -1, [10]), 0, "the first measured step");
  assert.equal(columnAfter([10, 20, 30], 1, [10, 20, 30, 40]), 1, "a step picked: still that step");
  assert.equal(columnAfter([10, 20, 30], 0, [15, 35]), 0, "buckets that moved: the nearest");
  assert.equal(columnAfter([10, 20, 30], 1, [12, 24, 36]), 1);
});
