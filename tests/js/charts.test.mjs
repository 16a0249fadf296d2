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

test("the families recorded per member are heat maps, not a card each: the attention layers' and every weight's stable rank", async () => {
  const { heatFamilies, isFamilyMetric } = await page("vocabulary.js");
  const { chartGroups } = await page("run_charts.js");
  const families = fixture("vocabulary").families;
  const expected = families.filter((f) => f.per === "attention layer" || f.per === "weight").map((f) => f.prefix);
  assert.deepEqual(
    heatFamilies().map((f) => f.prefix),
    expected,
  );
  assert.ok(expected.includes("stable_rank/") && expected.includes("attention_entropy/"), expected.join(", "));
  const weights = ["stable_rank/blocks.0.attn.qkv.weight", "stable_rank/moe.experts.w1/3"];
  assert.ok(weights.every(isFamilyMetric));
  const drawn = chartGroups(["loss", ...weights]).flatMap((g) => g.metrics);
  assert.deepEqual(drawn, ["loss"], "no card of its own for a weight's stable rank");
});
