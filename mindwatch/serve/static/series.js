// One series as every view holds it (the run page's chart cards, the compare page, the layers view): the one place its
// points are loaded, zoomed, banded and merged live. A view draws what a store holds (charts.js's line() reads
// points, nonfinite, abandoned and band off it) and changes it through these methods only.
//
// The wire shape is mindwatch/analysis/lines.py's: {points: [[x, y | null]], nonfinite: [[x, "nan"]], abandoned}; the
// live stream sends the metrics file's new rows, [step, time, value], whose value is a number or "nan" / "inf" / "-inf"
// (the run store's spelling): a non-number is a gap in the line and a mark, as the server's line_points makes it.

import { api } from "./api.js";

/** Points per series the server sends: the overview, and the detail of a zoomed window. */
export const POINTS = 2000;

/** A live value as the line draws it: a number, or null (a gap) for "nan", "inf", "-inf". */
export const drawnValue = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

export class SeriesStore {
  /** key: {metric, rank, run?}; look: how the chart draws it ({name, color, yAxisIndex}). */
  constructor(key, look = {}) {
    Object.assign(this, look);
    this.metric = key.metric;
    this.rank = key.rank;
    this.run = key.run;
    this.points = [];
    this.overview = [];
    this.nonfinite = [];
    this.abandoned = [];
    this.band = undefined;
  }

  /** Whether the overview has arrived. */
  get loaded() {
    return this.overview.length > 0;
  }

  /** What the server sent (/api/series, one series of /api/compare): the overview, or with win = [lo, hi] the detail
   * of that window, the overview outside it. */
  take(wire, win) {
    if (win) {
      const before = this.overview.filter((p) => p[0] < win[0]);
      this.points = before.concat(
        wire.points,
        this.overview.filter((p) => p[0] > win[1]),
      );
      return;
    }
    this.overview = wire.points;
    this.points = wire.points.slice();
    this.nonfinite = wire.nonfinite || [];
    this.abandoned = wire.abandoned || []; // the steps a rewind went back over, drawn faint
  }

  /** Fetch and take the overview, or the detail of window win; x: "step", "time" or "elapsed". */
  async load(x, win) {
    const q = { run: this.run, metric: this.metric, rank: this.rank, x, points: POINTS };
    if (win) Object.assign(q, { lo: win[0], hi: win[1] });
    this.take(await api.series(q), win);
  }

  /** Back to the overview after a zoom out. */
  showOverview() {
    this.points = this.overview.slice();
  }

  /** The live stream's new rows [step, t, value]; x "step" takes the step, else the time (an elapsed axis draws it from
   * its origin). Rows at or before the last x are drawn already (the page loaded after they were written). Returns how
   * many points were added. */
  append(rows, x) {
    let added = 0;
    let last = this.points.length ? this.points[this.points.length - 1][0] : -Infinity;
    for (const [step, t, v] of rows) {
      const px = x === "step" ? step : t;
      if (px <= last) continue;
      const y = drawnValue(v);
      this.points.push([px, y]);
      this.overview.push([px, y]);
      if (y === null) this.nonfinite.push([px, v]);
      last = px;
      added++;
    }
    return added;
  }

  /** The min..max band across ranks behind the line (/api/band's [[step, min, mean, max]]): the lower edge and the
   * height above it, as a stacked area draws it ("-": no value). */
  takeBand(points) {
    this.band = {
      lower: points.map((p) => [p[0], p[1] ?? "-"]),
      upper: points.map((p) => [p[0], p[3] === null || p[1] === null ? "-" : p[3] - p[1]]),
    };
  }
}

/** Append one "points" message of the live stream ({rank, metrics: {name: rows}}) to the stores of its rank; returns
 * how many points were added in all. */
export function mergePoints(stores, message, x) {
  let added = 0;
  for (const store of stores) {
    if (store.rank !== message.rank) continue;
    const rows = message.metrics[store.metric];
    if (rows) added += store.append(rows, x);
  }
  return added;
}

/** The steps (or times) at which an event's series is 1: where a chart marks it. */
export const eventXs = (points) => points.filter((p) => p[1] > 0).map((p) => p[0]);
