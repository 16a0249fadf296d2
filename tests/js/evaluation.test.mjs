// The run's evaluations on the page: the Evaluation card (run_charts.js's evaluationGroup, from /api/run's evaluation,
// mindwatch.analysis.eval_table), a card of its own for every other evaluation metric, the best evaluation's mark
// (charts.js's bestMark) and the epoch a tooltip names (valueAt), on a real run's responses (tests/js_fixtures.py).
import assert from "node:assert/strict";
import test from "node:test";

import { fixture, page } from "./helpers.mjs";

const { loadVocabulary } = await page("vocabulary.js");
const { chartGroups, evaluationGroup } = await page("run_charts.js");
const { bestMark, valueAt } = await page("assets/charts.js");
await loadVocabulary();

const run = fixture("run");
const ev = fixture("vocabulary").evaluation;

test("the Evaluation card draws the evaluation loss beside the training's loss on one axis, right after the loss card", () => {
  const groups = chartGroups(run.metrics, run.evaluation);
  assert.equal(groups[0].id, "loss");
  const card = groups[1];
  assert.deepEqual(
    [card.title, card.metrics, card.marked, card.context, card.axes.length],
    [ev.title, [ev.beside, ev.loss], [ev.loss], [ev.epoch], 1],
  );
  const drawn = groups.flatMap((g) => g.metrics);
  assert.equal(drawn.filter((m) => m === ev.loss).length, 1, "the evaluation loss on the Evaluation card alone");
  for (const m of run.evaluation.metrics.filter((m) => m !== ev.loss)) {
    const own = groups.filter((g) => g.metrics.includes(m));
    assert.equal(own.length, 1, m);
    assert.deepEqual([own[0].id, own[0].marked, own[0].context], [m, [m], [ev.epoch]], `${m}: points, its best, the epoch`);
  }
  for (const g of groups.filter((g) => g !== card)) assert.ok(!g.metrics.includes(ev.epoch), "the epoch is no curve");
});

test("without an evaluation there is no Evaluation card, and each evaluation metric is a card of points", () => {
  assert.equal(evaluationGroup(run.metrics, null), null);
  const groups = chartGroups(run.metrics);
  assert.ok(!groups.some((g) => g.id === "evaluation"));
  const own = groups.find((g) => g.id === ev.loss);
  assert.deepEqual(own.marked, [ev.loss]);
  // a run whose evaluations hold no loss: its primary alone on the card, no training loss beside it
  const accuracy = run.evaluation.metrics.find((m) => m !== ev.loss);
  const alone = evaluationGroup(["loss", accuracy], { curve: accuracy, beside: null });
  assert.deepEqual([alone.metrics, alone.marked, alone.context], [[accuracy], [accuracy], []]);
});

test("the best evaluation is marked at the lowest evaluation loss the card draws", () => {
  const best = run.evaluation.bests[ev.loss];
  const drawn = fixture("series_eval_loss").points.filter((p) => p[1] !== null);
  const lowest = drawn.reduce((a, b) => (b[1] < a[1] ? b : a));
  const mark = bestMark(best, "step");
  assert.deepEqual([mark.x, mark.y], lowest);
  assert.match(mark.name, new RegExp(`at step ${best.step}, epoch ${best.epoch} \\(min\\)`));
  assert.equal(bestMark(best, "time").x, best.t);
  assert.equal(bestMark(best, "elapsed", best.t - 12).x, 12);
  assert.equal(bestMark(undefined, "step"), undefined);
  const highest = run.evaluation.bests[run.evaluation.metrics.find((m) => m !== ev.loss)];
  assert.equal(highest.mode, "max");
});

test("the tooltip's epoch is the epoch of the last point at or before the step", () => {
  const epochs = [
    [10, 1],
    [20, 2],
    [30, 3],
  ];
  assert.deepEqual(
    [5, 10, 15, 20, 29, 30, 99].map((x) => valueAt(epochs, x)),
    [undefined, 1, 1, 2, 2, 3, 3],
  );
  assert.equal(valueAt([], 3), undefined);
  const best = run.evaluation.bests[ev.loss];
  assert.equal(valueAt([[best.step, best.epoch]], best.step), best.epoch);
});
