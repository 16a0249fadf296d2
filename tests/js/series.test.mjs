// The series store (mindwatch/serve/static/series.js) against the server's real responses (helpers.mjs).
import assert from "node:assert/strict";
import test from "node:test";

import { fixture, page, requested } from "./helpers.mjs";

const { SeriesStore, mergePoints, drawnValue, POINTS } = await page("series.js");
const wire = fixture("series_loss");
const key = { run: wire.run, metric: "loss", rank: 0 };

test("the overview is what /api/series sent: its points, its non-finite marks and a rewind's abandoned branch", async () => {
  const store = new SeriesStore(key);
  await store.load("step");
  assert.deepEqual(store.points, wire.points);
  assert.deepEqual(store.overview, wire.points);
  assert.ok(store.loaded);
  assert.deepEqual(store.nonfinite, wire.nonfinite);
  assert.ok(
    store.nonfinite.some(([, v]) => v === "nan"),
    "the capture's NaN loss is marked",
  );
  assert.ok(
    store.points.some(([, y]) => y === null),
    "and is a gap in the line",
  );
  assert.deepEqual(store.abandoned, wire.abandoned);
  assert.ok(store.abandoned.length > 0, "the rewind's abandoned branch came with it");
  const asked = new URL(requested.at(-1), "http://d").searchParams;
  assert.deepEqual(Object.fromEntries(asked), { run: wire.run, metric: "loss", rank: "0", x: "step", points: String(POINTS) });
});

test("a zoomed window takes the window's detail and keeps the overview outside it; zooming out restores the overview", async () => {
  const store = new SeriesStore(key);
  await store.load("step");
  const detail = fixture("series_loss_window");
  await store.load("step", [20, 35]);
  const inside = store.points.filter((p) => p[0] >= 20 && p[0] <= 35);
  assert.deepEqual(inside, detail.points);
  assert.deepEqual(
    store.points.filter((p) => p[0] < 20 || p[0] > 35),
    wire.points.filter((p) => p[0] < 20 || p[0] > 35),
  );
  store.showOverview();
  assert.deepEqual(store.points, wire.points);
});

test("live rows after the last point are appended, a value that is not a number as a gap and a mark", () => {
  const live = fixture("live_points"); // the server's own "points" message for the last rows written
  const rows = live.metrics.loss;
  const first = rows[0][0];
  const store = new SeriesStore(key);
  store.take({ ...wire, points: wire.points.filter((p) => p[0] < first), nonfinite: [] }); // opened before they came
  assert.equal(store.append(rows, "step"), rows.length);
  assert.deepEqual(
    store.points.slice(-rows.length),
    rows.map(([s, , v]) => [s, drawnValue(v)]),
  );
  const notNumbers = rows.filter(([, , v]) => typeof v !== "number");
  assert.ok(notNumbers.length > 0, "the capture's last loss is NaN");
  assert.deepEqual(
    store.nonfinite,
    notNumbers.map(([s, , v]) => [s, v]),
  );
  assert.equal(store.append(rows, "step"), 0, "rows already drawn are not drawn twice");
});

test("on a time or elapsed axis a live row is placed at its time", () => {
  const rows = fixture("live_points").metrics.loss;
  const store = new SeriesStore(key);
  assert.equal(store.append(rows, "elapsed"), rows.length);
  assert.deepEqual(
    store.points.map((p) => p[0]),
    rows.map((r) => r[1]),
  );
});

test("a live message goes to the stores of its rank and metric only", () => {
  const live = fixture("live_points");
  const mine = new SeriesStore({ metric: "loss", rank: live.rank });
  const otherRank = new SeriesStore({ metric: "loss", rank: live.rank + 1 });
  const otherMetric = new SeriesStore({ metric: "lr", rank: live.rank });
  assert.equal(mergePoints([mine, otherRank, otherMetric], live, "step"), live.metrics.loss.length);
  assert.equal(otherRank.points.length + otherMetric.points.length, 0);
});

test("the band across ranks: its lower edge is the min, its height the max above it", () => {
  const band = fixture("band_loss");
  const store = new SeriesStore(key);
  store.takeBand(band.points);
  assert.equal(store.band.lower.length, band.points.length);
  band.points.forEach(([step, lo, , hi], i) => {
    assert.deepEqual(store.band.lower[i], [step, lo ?? "-"]);
    assert.deepEqual(store.band.upper[i], [step, lo === null || hi === null ? "-" : hi - lo]);
  });
});

test("elapsed time has one origin, the server's: the run's and the series' agree, and /api/compare counts from it", () => {
  const run = fixture("run");
  const timed = fixture("series_loss_time");
  assert.equal(typeof run.elapsed_origin, "number");
  assert.equal(timed.elapsed_origin, run.elapsed_origin);
  const compared = fixture("compare_loss").series[0];
  const store = new SeriesStore({ metric: "loss", rank: 0, run: compared.run });
  store.take(compared);
  assert.equal(store.points.length, timed.points.length);
  store.points.forEach(([x], i) => assert.ok(Math.abs(x - (timed.points[i][0] - run.elapsed_origin)) < 1e-6));
});
