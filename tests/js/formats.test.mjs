// The pure functions of mindwatch/assets/charts.js (the dashboard's and the report's): the number and duration formats,
// the robust y range, the axis ticks, the smoothing.
import assert from "node:assert/strict";
import test from "node:test";

import { page } from "./helpers.mjs";

const { fmtNumber, formatDuration, robustRange, niceStep, ema } = await page("assets/charts.js");

test("numbers: 6 significant digits, 4 in exponent form when very small or large, trailing zeros dropped", () => {
  assert.equal(fmtNumber(1.23456789), "1.23457");
  assert.equal(fmtNumber(0.000123456), "1.235e-4");
  assert.equal(fmtNumber(0.00017), "1.7e-4");
  assert.equal(fmtNumber(123456), "1.235e+5");
  assert.equal(fmtNumber(0), "0");
  assert.equal(fmtNumber(null), "");
});

test("durations read as mindwatch.units.format_duration writes them", () => {
  assert.equal(formatDuration(3723), "1h 02m 03s");
  assert.equal(formatDuration(83), "1m 23s");
  assert.equal(formatDuration(4.3), "4.3 s");
  assert.equal(formatDuration(4.25), "4.2 s"); // a tie to the even tenth, as Python's f"{x:.1f}"
  assert.equal(formatDuration(null), "-");
  assert.equal(formatDuration(Infinity), "-");
});

test("the robust y range leaves a spike out of the axis, and keeps a range without one as it is", () => {
  const flat = Array.from({ length: 200 }, (_, i) => 1 + (i % 10) / 100);
  assert.deepEqual(robustRange(flat, false), {});
  const spiked = flat.concat([1000]);
  const r = robustRange(spiked, false);
  assert.ok(r.max < 2 && r.max > 1.09, JSON.stringify(r));
  assert.equal(r.min, undefined);
});

test("axis steps are 1, 2, 2.5 or 5 times a power of ten", () => {
  assert.equal(niceStep(10), 2);
  assert.equal(niceStep(1), 0.2);
  assert.equal(niceStep(12, 4), 5);
  assert.equal(niceStep(0.9), 0.2);
});

test("smoothing is TensorBoard's debiased EMA, a gap kept a gap", () => {
  assert.deepEqual(
    ema(
      [
        [1, 2],
        [2, null],
      ],
      0,
    ),
    [
      [1, 2],
      [2, "-"],
    ],
  );
  const out = ema(
    [
      [1, 2],
      [2, 4],
      [3, null],
    ],
    0.5,
  );
  assert.deepEqual(out[0], [1, 2]); // debiased: the first value as it is
  assert.ok(Math.abs(out[1][1] - (0.5 * 0.5 * 2 + 0.5 * 4) / (1 - 0.25)) < 1e-12);
  assert.deepEqual(out[2], [3, "-"]);
});
